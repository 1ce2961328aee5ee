"""Optimizers of prompt tuning: Adafactor as Lester et al. (2021), and AdamW (as DPT uses).

Each builder returns an `Optimizer`: the optax transformation and its learning-rate schedule
(the loop logs the rate; the schedule is a pure function of the step, so it costs no state).
"""
import dataclasses
import math
import numbers
from typing import Callable, Optional

import gin
import optax

from prompt_jax.errors import ConfigError, check_integer


@dataclasses.dataclass(frozen=True)
class Optimizer:
  tx: optax.GradientTransformation
  schedule: Callable[[int], float]


_FLOAT32_MAX = 3.4028234663852886e38  # np.finfo(np.float32).max


def _schedule(learning_rate: float, warmup_steps: int):
  """Constant `learning_rate` after `warmup_steps` of linear warm-up; a rate that is not a number
  >= 0 is one ConfigError here, when gin builds the optimizer before the run writes anything
  (optax took 'fast' or -1 and failed, or trained uphill, only once the steps ran)."""
  # (inf is let through: the loop's NaN/Inf guard stops such a run at its first step, saying so)
  if (isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real)
      or math.isnan(learning_rate) or learning_rate < 0):
    raise ConfigError(f"LEARNING_RATE must be a number >= 0, got {learning_rate!r}: e.g. "
                      f"--gin.LEARNING_RATE=0.3 (a number, without quotes)")
  if math.isfinite(learning_rate) and learning_rate > _FLOAT32_MAX:  # (numpy's overflow warnings)
    raise ConfigError(f"LEARNING_RATE={learning_rate!r} is beyond float32's range (at most "
                      f"{_FLOAT32_MAX:.4g}), in which the step computes: e.g. "
                      f"--gin.LEARNING_RATE=0.3")
  check_integer(warmup_steps, "warmup_steps", 0)
  if not warmup_steps:
    return optax.constant_schedule(learning_rate)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, learning_rate, warmup_steps),
       optax.constant_schedule(learning_rate)], [warmup_steps])


@gin.configurable(module="prompt_jax")
def adafactor(learning_rate: float = 0.3, decay_rate: float = 0.8,
              multiply_by_parameter_scale: bool = False, weight_decay_rate: float = 1e-5,
              factored: bool = False, clipping_threshold: Optional[float] = 1.0,
              momentum: Optional[float] = None, warmup_steps: int = 0,
              decay_offset: int = 0) -> Optimizer:
  """Lester et al.: constant lr 0.3, decay 0.8, no parameter scaling, wd 1e-5, not factored.

  The second-moment decay at the run's step t is 1 - (t - decay_offset + 1)^-decay_rate, t
  counted from the prompt's first step. t5x's Adafactor (google-research/prompt-tuning, `t5x.train`
  with gin/t5x) counts from the global step, which continues the initial checkpoint's (1,100,000
  for the lm100k checkpoints): its second moment starts at zero and barely decays, so every
  update is clipped to RMS 1 for tens of thousands of steps. `decay_offset = -<that step>` gives
  those updates exactly (tests/t5x/test_adafactor_decay.py).
  """
  schedule = _schedule(learning_rate, warmup_steps)
  tx = optax.adafactor(learning_rate=schedule, decay_rate=decay_rate, decay_offset=decay_offset,
                       multiply_by_parameter_scale=multiply_by_parameter_scale,
                       weight_decay_rate=weight_decay_rate, factored=factored,
                       clipping_threshold=clipping_threshold, momentum=momentum)
  return Optimizer(tx, schedule)


@gin.configurable(module="prompt_jax")
def adamw(learning_rate: float = 0.3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 1e-5, warmup_steps: int = 0,
          clip_norm: Optional[float] = None) -> Optimizer:
  """AdamW (decoupled weight decay); `clip_norm` clips the global gradient norm first (DPT's
  reference code clips at 1.0)."""
  schedule = _schedule(learning_rate, warmup_steps)
  tx = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  if clip_norm is not None:
    tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
  return Optimizer(tx, schedule)
