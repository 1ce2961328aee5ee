"""Shared by the trainer tests: a small, fast embedded-default configuration and runners."""
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

PROMPT_NPY = "encoder.prompt.prompt.prompt.npy"
# The embedded default shrunk for speed: no eval, tiny batches, unshuffled data (so sharded
# multi-process data gives the same global batches, as a set, as one process does).
FAST_FLAGS = [
    "--gin_file=runs/embedded_default.gin",
    "--gin.BATCH_SIZE=8",
    "--gin.EVAL_PERIOD=0",
    "--gin.CHECKPOINT_PERIOD=1",
    "--gin.prompt_jax.train.stats_period=1",
    "--gin.train/prompt_jax.DatasetConfig.shuffle=False",
]


def flags(model_dir: str, steps: int, *extra: str) -> List[str]:
  return FAST_FLAGS + [f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}",
                       *extra]


def prompt_at(model_dir: str, step: int) -> np.ndarray:
  return np.load(os.path.join(model_dir, "numpy_checkpoints", f"checkpoint_{step}", PROMPT_NPY))


def cli_subprocess(argv: Sequence[str], devices: int = 1, timeout: float = 240,
                   env: Optional[Dict[str, Optional[str]]] = None, wait: bool = True,
                   python_code: Optional[str] = None):
  """Runs `python -m prompt_jax <argv>` (or `python -c python_code <argv>`) with `devices`
  fake CPU devices; `env` adds to (a None value removes from) the environment."""
  full_env = dict(os.environ)
  full_env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  full_env["JAX_PLATFORMS"] = "cpu"
  full_env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  full_env.update(env or {})
  full_env = {k: v for k, v in full_env.items() if v is not None}  # env={NAME: None}: unset
  cmd = ([sys.executable, "-c", python_code, *argv] if python_code
         else [sys.executable, "-m", "prompt_jax", *argv])
  if not wait:
    return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
  return subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True, timeout=timeout)


# `prompt-jax` that sends itself SIGTERM right after logging step {step} (the argument of
# .format): the preemption arrives at a known step however fast the machine runs, where a test
# that signals on reading the line from outside races the run's end.
SIGTERM_AT_STEP = """
import os, signal, sys
from prompt_jax import cli
from prompt_jax.train import summaries
_log = summaries.log
def log_then_sigterm(message, *args):
  _log(message, *args)
  if (message % args if args else message).startswith("step {step}/"):
    os.kill(os.getpid(), signal.SIGTERM)
summaries.log = log_then_sigterm
sys.exit(cli.main(sys.argv[1:]))
"""
