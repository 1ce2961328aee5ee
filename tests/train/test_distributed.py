"""Sharded and multi-process training equal single-device training (fake CPU devices).

Each run is `python -m prompt_jax train` in a subprocess, because XLA_FLAGS (the number of
fake devices) must be set before jax is imported.
"""
import socket

import numpy as np
import pytest

from tests import numerics
from tests.train import common


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """1 process x 1 device, 5 steps."""
  d = str(tmp_path_factory.mktemp("ref1"))
  proc = common.cli_subprocess(["train"] + common.flags(d, 5), devices=1)
  assert proc.returncode == 0, proc.stdout[-3000:]
  return d


@pytest.fixture(scope="module")
def reference64(tmp_path_factory):
  """The same run in float64 (64-bit JAX, model and frozen weights in float64): the exact
  result against which float32 runs' rounding errors are measured (tests/numerics.py)."""
  d = str(tmp_path_factory.mktemp("ref64"))
  proc = common.cli_subprocess(
      ["train"] + common.flags(d, 5, "--gin.prompt_jax.t5_config.dtype='float64'",
                               "--gin.FROZEN_DTYPE='float64'"),
      devices=1, env={"JAX_ENABLE_X64": "1"})
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert common.prompt_at(d, 5).dtype == np.float64
  return d


def assert_same_training(variant: str, reference: str, reference64: str, step: int,
                         what: str) -> None:
  """A float32 run that computes the same steps in another summation order (another mesh or
  process layout) is as close to the float64 run as the single-device float32 run, up to
  numerics.FACTOR: 5 Adafactor steps at lr 0.3 amplify rounding (the normalised update divides
  by the gradient's own scale), so no fixed tolerance holds on every CPU; the ratio does."""
  numerics.assert_close(common.prompt_at(variant, step), common.prompt_at(reference, step),
                        common.prompt_at(reference64, step), what=what)


def test_4x2_mesh_equals_one_device(reference, reference64, tmp_path):
  # NUM_PARTITIONS=2 splits contractions across the 'model' axis: float32 partial sums run in
  # another order, so equality holds up to rounding (bounded as in assert_same_training).
  d = str(tmp_path / "mesh")
  proc = common.cli_subprocess(["train"] + common.flags(d, 5, "--gin.NUM_PARTITIONS=2"),
                               devices=8)
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert "training steps 0 -> 5" in proc.stdout
  assert_same_training(d, reference, reference64, 5, "4 x 2 mesh")


def test_batch_not_divisible_by_data_parallel_size(tmp_path):
  d = str(tmp_path / "bad")
  proc = common.cli_subprocess(["train"] + common.flags(d, 3, "--gin.NUM_PARTITIONS=2",
                                                        "--gin.BATCH_SIZE=6"), devices=8)
  assert proc.returncode == 2
  errors = [l for l in proc.stdout.splitlines() if l.startswith("prompt-jax train: error")]
  assert len(errors) == 1 and "BATCH_SIZE=6 is not divisible by the data-parallel size 4" in \
      errors[0], proc.stdout[-2000:]
  assert not (tmp_path / "bad").exists()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_match_one_process(reference, reference64, tmp_path):
  single = str(tmp_path / "single")
  proc = common.cli_subprocess(["train"] + common.flags(single, 3), devices=4)
  assert proc.returncode == 0, proc.stdout[-3000:]
  multi = str(tmp_path / "multi")
  port = _free_port()
  procs = [common.cli_subprocess(
      ["train"] + common.flags(multi, 3) +
      [f"--coordinator_address=127.0.0.1:{port}", "--process_count=2", f"--process_index={i}"],
      devices=2, wait=False) for i in range(2)]
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=300)[0])  # external timeout per process
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  # Each process reads its seqio shard (rows i, i+2, ...), so the global batch holds the same
  # rows as the single process's in another order: per-device partial sums round differently.
  # Both runs are bounded against the float64 run as in assert_same_training.
  assert_same_training(single, reference, reference64, 3, "1 process x 4 devices")
  assert_same_training(multi, reference, reference64, 3, "2 processes x 2 devices")
  assert "restored" not in outputs[0]


KILL_AFTER_EXPORT = """
import os, signal, sys
from prompt_jax import cli
from prompt_jax.train import checkpointing
_export = checkpointing.export_numpy
def export_then_die(model_dir, step, trainable, **kw):
  out = _export(model_dir, step, trainable, **kw)
  if step == {step}:
    os.kill(os.getpid(), signal.SIGKILL)  # killed right after step {step} was saved
  return out
checkpointing.export_numpy = export_then_die
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sigkilled_run_resumes_bitwise(reference, tmp_path):
  d = str(tmp_path / "killed")
  argv = ["train"] + common.flags(d, 5)
  killed = common.cli_subprocess(argv, python_code=KILL_AFTER_EXPORT.format(step=2))
  assert killed.returncode == -9, killed.stdout[-2000:]
  assert not (tmp_path / "killed" / "numpy_checkpoints" / "checkpoint_3").exists()
  resumed = common.cli_subprocess(argv)  # the same command again
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  assert "restored step 2" in resumed.stdout and "training steps 2 -> 5" in resumed.stdout
  assert common.prompt_at(d, 5).tobytes() == common.prompt_at(reference, 5).tobytes()
