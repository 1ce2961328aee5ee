"""TensorBoard summaries (clu.metric_writers, t5x's dirs) and progress log lines."""
import functools
import logging
import os
import time
import weakref
from typing import Callable, Mapping, Optional

import jax
from clu import metric_writers

TRAIN_DIR = "train"
TRAINING_EVAL_DIR = "training_eval"
INFERENCE_EVAL_DIR = "inference_eval"


def writer(model_dir: str, *parts: str) -> metric_writers.MetricWriter:
  """A summary writer under MODEL_DIR/<parts> (just logging on processes other than 0)."""
  return metric_writers.create_default_writer(
      os.path.join(model_dir, *parts), just_logging=jax.process_index() > 0, asynchronous=False)


class Progress:
  """Formats 'step 120/1000 loss 1.234 lr 0.3 12.3 steps/s 98.4 examples/s ETA 0:01:12'."""

  def __init__(self, start_step: int, total_steps: int, batch_size: int):
    self.total_steps = total_steps
    self.batch_size = batch_size
    self._last_step = start_step
    self._last_time = time.time()
    self.steps_per_sec = 0.0

  def line(self, step: int, metrics: Mapping[str, float], lr: float) -> str:
    now = time.time()
    steps_per_sec = (step - self._last_step) / max(now - self._last_time, 1e-9)
    self._last_step, self._last_time = step, now
    self.steps_per_sec = steps_per_sec
    eta = (self.total_steps - step) / steps_per_sec if steps_per_sec > 0 else float("inf")
    eta_str = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "?"
    return (f"step {step}/{self.total_steps} loss {metrics['loss']:.4f} "
            f"accuracy {metrics.get('accuracy', float('nan')):.3f} lr {lr:.4g} "
            f"{steps_per_sec:.2f} steps/s {steps_per_sec * self.batch_size:.1f} examples/s "
            f"ETA {eta_str}")

  @staticmethod
  def timing(steps_per_sec: float, batch_size: int) -> Mapping[str, float]:
    return {"timing/steps_per_second": steps_per_sec,
            "timing/examples_per_second": steps_per_sec * batch_size}


def _clock(seconds: float) -> str:
  return time.strftime("%H:%M:%S", time.gmtime(seconds))


class Meter:
  """Progress of long work with a known total, e.g. prediction over a large split:
  'eval: 1,024/8,192 examples (12%) 85.3 examples/s ETA 00:01:24', at most once per `period_s`
  seconds (so short work prints nothing), through `log` (process 0's stdout)."""

  def __init__(self, label: str, total: int, unit: str = "examples", period_s: float = 10.0,
               clock: Callable[[], float] = time.monotonic,
               emit: Optional[Callable[[str], None]] = None):
    self.label, self.total, self.unit, self.period_s = label, total, unit, period_s
    self._clock = clock
    self._emit = emit or log
    self._start = self._last = clock()

  def line(self, done: int, now: float) -> str:
    elapsed = max(now - self._start, 1e-9)
    rate = done / elapsed
    eta = _clock((self.total - done) / rate) if rate > 0 else "?"
    percent = 100.0 * done / max(self.total, 1)
    return (f"{self.label}: {done:,}/{self.total:,} {self.unit} ({percent:.0f}%) "
            f"{rate:.1f} {self.unit}/s ETA {eta}")

  def update(self, done: int) -> Optional[str]:
    """Emits (and returns) a line when `period_s` passed since the last one."""
    now = self._clock()
    if now - self._last < self.period_s or done >= self.total:
      return None
    self._last = now
    text = self.line(done, now)
    self._emit(text)
    return text


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


def log(message: str, *args) -> None:
  """Progress goes to stdout of process 0 (and to absl/logging everywhere)."""
  text = message % args if args else message
  logging.info(text)
  if jax.process_index() == 0:
    print(text, flush=True)
