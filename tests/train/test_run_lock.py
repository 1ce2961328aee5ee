"""One trainer per MODEL_DIR: a second `prompt-jax train` on a MODEL_DIR that a running one
writes is one line, exit 2, and changes nothing there.

Before, the second restored the first's latest step and trained beside it: both saved the same
steps over each other (orbax saves with force), checkpoints beyond KEEP_CHECKPOINTS stayed, and
TensorBoard got two interleaved event files. A run trained with another LEARNING_RATE (which
resume accepts) would have replaced the first run's checkpoints.
"""
import os
import signal
import subprocess
import sys

from tests.train import common
from tests.train.test_run_dir import run_cli


def _files(model_dir):
  return sorted(os.path.relpath(os.path.join(d, f), model_dir)
                for d, _, fs in os.walk(model_dir) for f in fs)


def test_a_second_train_on_a_running_model_dir_is_refused(tmp_path):
  model_dir = str(tmp_path / "run")
  first = subprocess.Popen(
      [sys.executable, "-m", "prompt_jax", "train", *common.flags(model_dir, 100000)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  try:
    lines = []
    for line in first.stdout:  # until it has trained and saved a step
      lines.append(line)
      if os.path.isdir(os.path.join(model_dir, "checkpoints", "2")):
        break
    assert first.poll() is None, "".join(lines)
    first.send_signal(signal.SIGSTOP)  # held still: its files do not change meanwhile
    before = _files(model_dir)
    code, out, err = run_cli(["train", *common.flags(model_dir, 100000),
                              "--gin.LEARNING_RATE=0.01"])
    assert code == 2 and out == "", (out, err)
    assert err == (f"prompt-jax train: error: MODEL_DIR {model_dir} is in use by another "
                   f"`prompt-jax train` (it holds {model_dir}/.train.lock); wait for it to "
                   f"finish or stop it, or choose another MODEL_DIR\n")
    assert _files(model_dir) == before
  finally:
    first.send_signal(signal.SIGKILL)  # the kernel releases its lock
    first.send_signal(signal.SIGCONT)
    first.wait(timeout=60)
  # The lock went with the killed process: the run continues.
  code, out, err = run_cli(["train", *common.flags(model_dir, 3)])
  assert code == 0, err
  assert "restored step" in out and os.path.isdir(os.path.join(model_dir, "checkpoints", "3"))


def test_a_refused_train_leaves_no_model_dir_behind(tmp_path):
  """The lock creates MODEL_DIR; a run refused before it writes anything removes it again."""
  model_dir = tmp_path / "fresh"
  code, out, err = run_cli(["train", *common.flags(str(model_dir), 3),
                            "--gin.MIXTURE_OR_TASK_NAME='super_glue_rte_v102'",
                            f"--data_dir={tmp_path / 'no_data'}"])
  assert code == 2, (out, err)
  assert not model_dir.exists()
