"""prompt_jax: prompt tuning of frozen T5 models in JAX/Flax."""

import time as _time

__version__ = "0.1.0"
# When the command started (this package is imported first): `train` reports the time from here
# to its first step (train/startup.StartupTimer).
STARTED = _time.monotonic()
