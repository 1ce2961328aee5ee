"""Sharded and multi-process training equal single-device training (fake CPU devices).

Each run is `python -m prompt_jax train` in a subprocess, because XLA_FLAGS (the number of
fake devices) must be set before jax is imported.
"""
import socket

import numpy as np
import pytest

from tests.train import common


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """1 process x 1 device, 5 steps."""
  d = str(tmp_path_factory.mktemp("ref1"))
  proc = common.cli_subprocess(["train"] + common.flags(d, 5), devices=1)
  assert proc.returncode == 0, proc.stdout[-3000:]
  return d


def test_4x2_mesh_equals_one_device(reference, tmp_path):
  d = str(tmp_path / "mesh")
  proc = common.cli_subprocess(["train"] + common.flags(d, 5, "--gin.NUM_PARTITIONS=2"),
                               devices=8)
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert "training steps 0 -> 5" in proc.stdout
  np.testing.assert_allclose(common.prompt_at(d, 5), common.prompt_at(reference, 5),
                             atol=1e-5, rtol=0)


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


def test_two_processes_match_one_process(tmp_path):
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
  # rows as the single process's in another order: per-device partial sums round differently
  # (observed max difference ~1.2e-5 after Adafactor's normalised lr-0.3 updates).
  np.testing.assert_allclose(common.prompt_at(multi, 3), common.prompt_at(single, 3),
                             atol=5e-5, rtol=0)
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
