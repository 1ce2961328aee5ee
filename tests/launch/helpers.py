"""Shared by the sweep tests: tiny specs on the embedded default, subprocess runners, shims."""
import contextlib
import io
import os
import socket
import sys
import textwrap
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from prompt_jax import cli
from tests.train import common

# 2 x 2 x 2 seeds on the embedded default: 4 steps of batch 8, one inference evaluation at the
# end (so every run has final metrics; no teacher-forced one, for time), a checkpoint every step
# (so a killed job resumes mid-run).
TINY_SPEC = """\
name: tiny
gin_files: [runs/embedded_default.gin]
bindings:
  TRAIN_STEPS: 4
  BATCH_SIZE: 8
  EVAL_PERIOD: 4
  CHECKPOINT_PERIOD: 1
  prompt_jax.train.eval_before_training: False
  prompt_jax.train.stats_period: 1
  prompt_jax.train.train_eval_dataset_cfg: None
  CLASS_LABELS: [a, b, c, d]
axes:
  PROMPT_LENGTH: [4, 8]
  init:
    gin_file: [prompts/uniform.gin, prompts/from_class_labels.gin]
seeds: [0, 1]
"""

# One job for the multi-host comparison: no evaluation, unshuffled data (as tests/train/common's
# FAST_FLAGS: sharded multi-process data then holds the single process's rows).
MULTIHOST_SPEC = """\
name: multihost
gin_files: [runs/embedded_default.gin]
bindings:
  TRAIN_STEPS: 3
  BATCH_SIZE: 8
  EVAL_PERIOD: 0
  CHECKPOINT_PERIOD: 1
  prompt_jax.train.eval_before_training: False
  train/prompt_jax.DatasetConfig.shuffle: False
axes:
  PROMPT_LENGTH: [8]
"""


def write_spec(directory, text: str, name: str = "spec.yaml") -> str:
  path = os.path.join(str(directory), name)
  with open(path, "w") as f:
    f.write(textwrap.dedent(text))
  return path


def sweep_cli(argv: Sequence[str]) -> Tuple[int, str, str]:
  """`prompt-jax sweep ARGV` in this process -> (exit status, stdout, stderr)."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = cli.main(["sweep", *argv])
  return rc, out.getvalue(), err.getvalue()


def job_env(extra: Optional[Dict[str, str]] = None, path_first: Sequence[str] = ()) -> Dict[str, str]:
  """The environment of sweep subprocesses: CPU, quiet TF, this venv's `prompt-jax` on PATH."""
  env = dict(os.environ)
  env.update({"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
              "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
  env["PATH"] = os.pathsep.join([*path_first, os.path.dirname(sys.executable), env["PATH"]])
  env.update(extra or {})
  return env


def write_executable(directory, name: str, text: str) -> str:
  path = os.path.join(str(directory), name)
  with open(path, "w") as f:
    f.write(textwrap.dedent(text).lstrip())
  os.chmod(path, 0o755)
  return path


def free_port(low: int, high: int) -> int:
  """A free TCP port in [low, high) (the SLURM script derives its port from the job id)."""
  rng = np.random.default_rng()
  for port in rng.permutation(np.arange(low, high))[:200]:
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", int(port)))
      except OSError:
        continue
      return int(port)
  raise RuntimeError("no free port")


def final_metrics(log: str) -> Dict[str, float]:
  """The last `final metrics: k=v ...` line a job printed (values rounded to 4 decimals)."""
  with open(log) as f:
    lines = [l for l in f.read().splitlines() if l.startswith("final metrics: ")]
  assert lines, f"no final metrics in {log}"
  return {k: float(v) for k, v in
          (item.split("=") for item in lines[-1][len("final metrics: "):].split())}


def assert_multihost_prompt_matches(multi_dir: str, single_dir: str, step: int) -> None:
  """2 processes x 1 device vs 1 process x 2 devices: bitwise equal. The training stream's rows
  are laid out the same for any number of processes (train/data.py), and an all-reduce of two
  operands is exact in any order (see tests/train/test_distributed.py)."""
  assert (common.prompt_at(multi_dir, step).tobytes()
          == common.prompt_at(single_dir, step).tobytes())


def replace_model_dir(args: List[str], model_dir: str) -> List[str]:
  return [f"--gin.MODEL_DIR='{model_dir}'" if a.startswith("--gin.MODEL_DIR=") else a
          for a in args]
