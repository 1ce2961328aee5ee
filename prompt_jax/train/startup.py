"""The wait before training, measured the same way by `train` and `bench startup`: seconds from
the command's start to its first step, the seconds spent compiling, and what the persistent
compilation cache served. Imports neither TensorFlow nor clu (the GPU image has neither)."""
import functools
import time
import weakref
from typing import Callable, Mapping, Optional

import jax


class StartupTimer:
  """The wait before training: seconds from the start of the command (prompt_jax's import) to the
  end of the first train step, with the seconds jax spent compiling or loading XLA programs and
  what the persistent compilation cache (prompt_jax/compile_cache.py) served. Counted from
  jax.monitoring's events (the backend-compile duration t5x reports as
  `timing/compilation_seconds`, the cache's hits and writes) until `first_step_done`. A timer
  dropped without it (a run that failed) stops counting when it is garbage-collected."""
  COMPILE = "/jax/core/compile/backend_compile_duration"
  HIT = "/jax/compilation_cache/cache_hits"
  WRITE = "/jax/compilation_cache/cache_misses"  # jax's name; recorded when it writes an entry

  def __init__(self, started: Optional[float] = None,
               clock: Callable[[], float] = time.monotonic):
    if started is None:
      import prompt_jax  # pylint: disable=g-import-not-at-top
      started = prompt_jax.STARTED
    self._started, self._clock = started, clock
    self.compile_seconds, self.cache_hits, self.cache_writes = 0.0, 0, 0
    self.seconds_to_first_step: Optional[float] = None
    _listen()
    _OPEN_TIMERS.add(self)

  def on_duration(self, event: str, duration: float) -> None:
    if event == self.COMPILE:
      self.compile_seconds += duration

  def on_event(self, event: str) -> None:
    if event == self.HIT:
      self.cache_hits += 1
    elif event == self.WRITE:
      self.cache_writes += 1

  def first_step_done(self) -> str:
    """Stops counting; returns the line to log."""
    _OPEN_TIMERS.discard(self)
    self.seconds_to_first_step = self._clock() - self._started
    return (f"first step done {self.seconds_to_first_step:.1f} s after start "
            f"({self.compile_seconds:.1f} s compiling or loading XLA programs; persistent "
            f"compilation cache: {self.cache_hits} loaded, {self.cache_writes} written)")

  def scalars(self) -> Mapping[str, float]:
    return {"timing/seconds_to_first_step": self.seconds_to_first_step,
            "timing/compilation_seconds": self.compile_seconds}


# jax.monitoring listeners cannot be removed on every jax version we support: one pair for the
# process, forwarding to the open timers.
_OPEN_TIMERS: "weakref.WeakSet[StartupTimer]" = weakref.WeakSet()


@functools.cache
def _listen() -> None:
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, duration, **_: [t.on_duration(event, duration) for t in list(_OPEN_TIMERS)])
  jax.monitoring.register_event_listener(
      lambda event, **_: [t.on_event(event) for t in list(_OPEN_TIMERS)])
