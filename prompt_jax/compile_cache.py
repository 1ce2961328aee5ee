"""The persistent XLA compilation cache: a restarted run loads its compiled step instead of
compiling it again.

  PROMPT_JAX_COMPILATION_CACHE=/path   the cache directory (default: $XDG_CACHE_HOME/prompt_jax/
                                       jax_cache, i.e. ~/.cache/prompt_jax/jax_cache)
  PROMPT_JAX_COMPILATION_CACHE=off     no persistent cache

Only programs that took at least `min_compile_secs` to compile are written (jax's
`jax_persistent_cache_min_compile_time_secs`, 1 s by default): the train and eval steps, not the
many small programs of start-up. A cache set by the user in jax's own configuration
(`JAX_COMPILATION_CACHE_DIR`) is left as it is.
"""
import os
from typing import Optional

import jax

ENV = "PROMPT_JAX_COMPILATION_CACHE"
_OFF = ("", "0", "off", "none", "false")


def default_dir() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "prompt_jax", "jax_cache")


def enable(directory: Optional[str] = None, min_compile_secs: Optional[float] = None
           ) -> Optional[str]:
  """Turns the cache on (idempotent); returns its directory, or None when it is off."""
  if jax.config.jax_compilation_cache_dir:  # the user's own JAX setting wins
    return jax.config.jax_compilation_cache_dir
  if directory is None:
    directory = os.environ.get(ENV, default_dir())
  if directory.strip().lower() in _OFF:
    return None
  directory = os.path.abspath(os.path.expanduser(directory))
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError:
    return None  # a read-only home: run without the cache rather than fail
  jax.config.update("jax_compilation_cache_dir", directory)
  if min_compile_secs is not None:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_secs))
  return directory
