"""TensorBoard summaries (clu.metric_writers, t5x's dirs) and progress log lines."""
import logging
import os
import time
from typing import Callable, Mapping, Optional

import jax
from clu import metric_writers

from prompt_jax import console

TRAIN_DIR = "train"
TRAINING_EVAL_DIR = "training_eval"
INFERENCE_EVAL_DIR = "inference_eval"


def writer(model_dir: str, *parts: str) -> metric_writers.MetricWriter:
  """A summary writer under MODEL_DIR/<parts> (just logging on processes other than 0)."""
  return metric_writers.create_default_writer(
      os.path.join(model_dir, *parts), just_logging=jax.process_index() > 0, asynchronous=False)


class Progress:
  """Formats 'step 120/1000 loss 1.234 lr 0.3 12.3 steps/s 98.4 examples/s ETA 00:01:12'.

  The rate counts training steps only: its clock runs from `start()`, which the loop calls once
  the first step (its compile included) is done and again after each evaluation, so start-up and
  evaluation time stay out of steps/s, the ETA and TensorBoard's timing/*. A line with no step
  since then shows '?'.
  """

  def __init__(self, start_step: int, total_steps: int, batch_size: int,
               clock: Callable[[], float] = time.monotonic):
    self.total_steps = total_steps
    self.batch_size = batch_size
    self._clock = clock
    self._last_step = start_step
    self._last_time: Optional[float] = None  # the clock has not started
    self.steps_per_sec: Optional[float] = None

  def start(self, step: int) -> None:
    """(Re)starts the clock at `step`, which the device has finished."""
    self._last_step, self._last_time = step, self._clock()

  def line(self, step: int, metrics: Mapping[str, float], lr: float) -> str:
    now = self._clock()
    steps_per_sec = None
    if self._last_time is not None and step > self._last_step:
      steps_per_sec = (step - self._last_step) / max(now - self._last_time, 1e-9)
    self._last_step, self._last_time = step, now
    self.steps_per_sec = steps_per_sec
    if steps_per_sec is None:
      rate = "? steps/s ? examples/s ETA ?"
    else:
      eta_str = (console.clock_text((self.total_steps - step) / steps_per_sec)
                 if steps_per_sec > 0 else "?")
      rate = (f"{steps_per_sec:.2f} steps/s {steps_per_sec * self.batch_size:.1f} examples/s "
              f"ETA {eta_str}")
    return (f"step {step}/{self.total_steps} loss {metrics['loss']:.4f} "
            f"accuracy {metrics.get('accuracy', float('nan')):.3f} lr {lr:.4g} {rate}")

  @staticmethod
  def timing(steps_per_sec: Optional[float], batch_size: int) -> Mapping[str, float]:
    """TensorBoard's timing/* scalars (none while the rate is unknown)."""
    if steps_per_sec is None:
      return {}
    return {"timing/steps_per_second": steps_per_sec,
            "timing/examples_per_second": steps_per_sec * batch_size}


class Meter(console.Meter):
  """`console.Meter` whose lines go through `log` (process 0's stdout, and logging)."""

  def __init__(self, label: str, total: int, unit: str = "examples", period_s: float = 10.0,
               clock: Callable[[], float] = time.monotonic,
               emit: Optional[Callable[[str], None]] = None):
    super().__init__(label, total, unit, period_s, clock, emit or log)


def log(message: str, *args) -> None:
  """Progress goes to stdout of process 0 (and to absl/logging everywhere)."""
  text = message % args if args else message
  logging.info(text)
  if jax.process_index() == 0:
    print(text, flush=True)
