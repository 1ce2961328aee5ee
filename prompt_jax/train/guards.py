"""What keeps a run's work safe: the non-finite guard and the preemption (SIGTERM) watch.

Non-finite loss or gradients are detected on device: the jitted step carries `first_bad`, the
first step whose loss or gradient norm was NaN/Inf (-1 while all are finite). The host reads it
only where it syncs anyway (the stats period) and before every save, so no step waits for the host.
A save also checks that the parameters themselves are finite. A non-finite run stops with a
RunError naming the step and the last good checkpoint; nothing non-finite is ever written.

SIGTERM (what TPU VMs, GCE spot VMs and SLURM send before they kill a job) sets a flag; the
loop checks it after every step, saves a checkpoint at that step and raises `Preempted`. With
several processes JAX's preemption service (started by jax.distributed.initialize) receives the
signal and `reached_preemption_sync_point` makes every process stop at the same step.
"""
import os
import signal
import sys
import threading
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from prompt_jax import console
from prompt_jax.errors import RunError

NOT_SEEN = -1


def finite_guarded(step_fn: Callable) -> Callable:
  """step(state, frozen, batch, rng) -> (state, metrics) becomes
  step(state, frozen, batch, rng, first_bad) -> (state, metrics, first_bad)."""

  def step(state, frozen, batch, rng, first_bad):
    new_state, metrics = step_fn(state, frozen, batch, rng)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    first_bad = jnp.where((first_bad == NOT_SEEN) & ~finite, state.step + 1, first_bad)
    return new_state, metrics, first_bad

  return step


def initial_flag(sharding) -> jax.Array:
  return jax.device_put(jnp.int32(NOT_SEEN), sharding)


def check_finite(first_bad: jax.Array, step: int, last_good: Callable[[], Optional[str]],
                 params_finite: Callable[[], bool] = lambda: True) -> None:
  """RunError if a step so far had a non-finite loss or gradient, or (checked only when the
  flag is clear) if `params_finite()` is False. One host read of a scalar; `last_good()` (the
  last checkpoint, for the message) is called only on failure."""
  bad = int(jax.device_get(first_bad)) if first_bad.is_fully_addressable else int(
      first_bad.addressable_data(0))
  what = "the loss or the gradients"
  if bad == NOT_SEEN:
    if params_finite():
      return
    bad, what = step, "the parameters"
  last = last_good()
  kept = f"the last good checkpoint is {last}" if last else "no checkpoint had been saved yet"
  raise RunError(f"{what} became NaN or Inf at step {bad}; stopped at step {step} without "
                 f"saving; {kept}. Lower the learning rate (--gin.LEARNING_RATE=...; or check "
                 f"the data near that step) and run again: it resumes from the last good "
                 f"checkpoint")


def stop_now(code: int = 128 + signal.SIGINT, why: str = "") -> None:
  """Ends the process at once, as a second Ctrl-C asks: one line, exit 130, no atexit handlers
  or library threads left to print tracebacks. An orbax save cut short leaves its temporary
  directory, which the next run removes (it resumes from the newest intact checkpoint)."""
  try:
    sys.stdout.flush()
  except (OSError, ValueError):
    pass
  print(f"prompt-jax train: interrupted{why}", file=sys.stderr, flush=True)
  os._exit(code)  # pylint: disable=protected-access


class PreemptionWatch:
  """`watch = PreemptionWatch().install()`; after each step `if watch.requested(step)`: save
  and stop; `watch.uninstall()` when the loop ends. SIGTERM (a preemption) and Ctrl-C (SIGINT,
  a user at the terminal) both ask for it: the steps trained since the last checkpoint are
  saved, not lost. The same signal a second time acts as it normally does (SIGTERM ends the
  process; Ctrl-C raises KeyboardInterrupt at once, without saving); the other one then changes
  nothing. A signal the process ignores (SIG_IGN) stays ignored."""
  SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}

  def __init__(self):
    self.by: Optional[str] = None  # what asked: "SIGTERM" or "Ctrl-C"; None: nothing yet
    self._previous = {}

  def install(self) -> "PreemptionWatch":
    if console.ctrl_c_seen():  # a Ctrl-C while the run started that library code swallowed
      raise KeyboardInterrupt
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      for signum in self.SIGNALS:
        # A signal the parent ignores stays ignored: `sweep run` starts its jobs with SIGINT
        # ignored, so a Ctrl-C at its terminal reaches the runner alone (which sends SIGTERM).
        if signal.getsignal(signum) is not signal.SIG_IGN:
          self._previous[signum] = signal.signal(signum, self._on_signal)
    return self

  def uninstall(self) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
    self._previous = {}

  def _on_signal(self, signum, frame) -> None:  # pylint: disable=unused-argument
    if self.by is not None:
      if self.SIGNALS[signum] == self.by:  # asked twice: stop at once, as the signal would
        self.uninstall()  # without us, with one line (a KeyboardInterrupt raised inside an
        stop_now(128 + signum,  # orbax save printed ~80 lines of its threads' tracebacks)
                 f" ({self.by} twice): stopped at once, without saving; the same command "
                 f"resumes from the newest checkpoint in MODEL_DIR/checkpoints")
      return  # the other signal: the save is already on its way
    self.by = self.SIGNALS[signum]
    again = " (Ctrl-C again: stop now, without saving)" if signum == signal.SIGINT else ""
    print(f"{self.by}: saving a checkpoint after this step, then stopping{again}", flush=True)

  def requested(self, step: int) -> bool:
    """Whether to save and stop after `step` (every process calls this at every step)."""
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      try:
        return multihost_utils.reached_preemption_sync_point(step)
      except RuntimeError:  # the preemption service is disabled
        return False
    return self.by is not None
