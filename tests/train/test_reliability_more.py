"""More of README "When things go wrong", on the real CLI (see test_reliability.py): a resume with
another data pipeline, unwritable run subdirectories, tensorstore's disk-full error, a failed
clean-up of old checkpoints, and SIGTERM / SIGKILL during an evaluation."""
import glob
import json
import os
import shutil
import signal

import numpy as np

import pytest

from tests.train import common
from tests.train.test_reliability import checkpoint_steps, error_lines, run_argv, snapshot

EVAL_FLAGS = ["--gin.EVAL_PERIOD=2", "--gin.prompt_jax.train.eval_steps=2",
              "--gin.prompt_jax.train.infer_eval_dataset_cfg=None"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
  """4 steps of test_reliability's command: checkpoints 2 and 4."""
  d = tmp_path_factory.mktemp("short")
  proc = common.cli_subprocess(run_argv(d, 4))
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert checkpoint_steps(d) == [2, 4]
  return str(d)


# ===== A resume with another data pipeline: a configuration error, nothing moved =====

def _strip_data_config(model_dir: str) -> None:
  """Makes the checkpoints look written before the data pipeline was recorded."""
  for path in glob.glob(os.path.join(model_dir, "checkpoints", "*", "data", "metadata")):
    with open(path) as f:
      data = json.load(f)
    data.pop("data_config", None)
    with open(path, "w") as f:
      json.dump(data, f)


@pytest.mark.parametrize("change", ["shuffle", "shuffle_unrecorded", "lengths"])
def test_resume_with_another_data_pipeline_is_a_config_error(short_run, tmp_path, change):
  d = str(tmp_path / "run")
  shutil.copytree(short_run, d)
  if change == "shuffle_unrecorded":  # the iterator restore itself notices the change
    _strip_data_config(d)
  extra = (["--gin.train/prompt_jax.DatasetConfig.task_feature_lengths="
            "{'inputs': 24, 'targets': 4}"] if change == "lengths" else
           ["--gin.train/prompt_jax.DatasetConfig.shuffle=False"])
  before = snapshot(d)
  proc = common.cli_subprocess(run_argv(d, 6, *extra))
  assert proc.returncode == 2, proc.stdout[-3000:]
  lines = error_lines(proc.stdout)
  assert len(lines) == 1, proc.stdout[-3000:]
  assert "the data pipeline differs from the one checkpoint" in lines[0], lines[0]
  assert os.path.join(d, "checkpoints", "4") in lines[0]
  assert "config.gin" in lines[0] and "new MODEL_DIR" in lines[0]
  if change == "lengths":
    assert "task_feature_lengths" in lines[0]
  assert "Traceback" not in proc.stdout
  assert snapshot(d) == before  # nothing moved, config.gin not rewritten
  assert not os.path.exists(os.path.join(d, "corrupt_checkpoints"))


def test_same_data_pipeline_resumes_from_unrecorded_checkpoints(short_run, tmp_path):
  """Checkpoints written before the data pipeline was recorded still resume."""
  d = str(tmp_path / "run")
  shutil.copytree(short_run, d)
  _strip_data_config(d)
  proc = common.cli_subprocess(run_argv(d, 6))
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert "restored step 4 " in proc.stdout
  assert checkpoint_steps(d) == [2, 4, 6]


# ===== Unwritable subdirectories of MODEL_DIR: refused before anything runs =====

@pytest.mark.parametrize("sub", ["numpy_checkpoints", "train"])
def test_a_subdirectory_that_cannot_be_written_is_a_config_error(tmp_path, sub):
  d = tmp_path / "run"
  d.mkdir()
  (d / sub).write_text("not a directory")  # works as root too (chmod does not stop root)
  proc = common.cli_subprocess(run_argv(d, 4))
  assert proc.returncode == 2, proc.stdout[-3000:]
  lines = error_lines(proc.stdout)
  assert len(lines) == 1 and os.path.join(str(d), sub) in lines[0], proc.stdout[-3000:]
  assert "not a directory" in lines[0]
  assert "Traceback" not in proc.stdout
  assert sorted(os.listdir(d)) == [sub]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 555 directory anyway "
                    "(the regular-file case above covers root)")
def test_a_read_only_checkpoints_dir_is_a_config_error(short_run, tmp_path):
  d = str(tmp_path / "run")
  shutil.copytree(short_run, d)
  os.chmod(os.path.join(d, "checkpoints"), 0o555)
  try:
    proc = common.cli_subprocess(run_argv(d, 6))
  finally:
    os.chmod(os.path.join(d, "checkpoints"), 0o755)
  assert proc.returncode == 2, proc.stdout[-3000:]
  lines = error_lines(proc.stdout)
  assert len(lines) == 1 and "not writable" in lines[0], proc.stdout[-3000:]


# ===== tensorstore's disk-full error: one line, orbax's thread errors not shown =====

DISK_FULL_AT_4 = """
import sys
from etils import epath
from prompt_jax import cli
from prompt_jax.train import checkpointing
_save = checkpointing.DataIteratorHandler.save
def save(self, directory, args):
  if epath.Path(directory).parent.name.startswith("4.orbax-checkpoint-tmp"):
    raise ValueError("RESOURCE_EXHAUSTED: Error writing local file "
                     "\\"/x/checkpoints/4/state/d/abc\\": No space left on device "
                     "[os_error_code=28]")
  return _save(self, directory, args)
checkpointing.DataIteratorHandler.save = save
sys.exit(cli.main(sys.argv[1:]))
"""


def test_tensorstore_disk_full_is_one_error(tmp_path):
  d = str(tmp_path / "full")
  proc = common.cli_subprocess(run_argv(d, 6), python_code=DISK_FULL_AT_4)
  assert proc.returncode == 1, proc.stdout[-3000:]
  lines = error_lines(proc.stdout)
  assert len(lines) == 1, proc.stdout[-3000:]
  assert f"cannot write checkpoint 4 to {d} (No space left on device)" in lines[0], lines[0]
  assert f"{os.path.join(d, 'checkpoints', '2')} is intact" in lines[0]
  assert "run the same command" in lines[0]
  assert "Traceback" not in proc.stdout and "ERROR:absl" not in proc.stdout, proc.stdout[-3000:]
  assert checkpoint_steps(d) == [2]


# ===== A checkpoint written whose old ones could not be deleted: kept, exported, go on =====

def test_failed_delete_of_an_old_checkpoint_keeps_the_new_one(tmp_path, monkeypatch, caplog):
  import numpy as np  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import loop  # pylint: disable=g-import-not-at-top
  d = str(tmp_path / "run")
  for step in (2, 4, 6):
    os.makedirs(os.path.join(d, "checkpoints", str(step), "state"))

  def save(mngr, step, *args, **kwargs):  # orbax wrote 8, then failed to delete 2
    os.makedirs(os.path.join(d, "checkpoints", str(step), "state"))
    raise PermissionError(13, "Permission denied", os.path.join(d, "checkpoints", "2"))
  monkeypatch.setattr(checkpointing, "save", save)

  class State:
    params = {"encoder": {"prompt": np.ones((2, 3), np.float32)}}
  loop._write_checkpoint(None, d, 8, State(), 8, None, ())  # no RunError
  assert checkpointing.exported(d, 8)
  warning = [r.getMessage() for r in caplog.records if "could not delete" in r.getMessage()]
  assert len(warning) == 1 and warning[0].startswith("checkpoint 8 saved; could not delete "
                                                     "the old checkpoint"), warning
  assert "(Permission denied)" in warning[0]
  caplog.clear()
  os.rename(os.path.join(d, "checkpoints", "8"), os.path.join(d, "8"))
  loop._write_checkpoint(None, d, 8, State(), 8, None, (), keep=3)  # KEEP_CHECKPOINTS: named
  warning = [r.getMessage() for r in caplog.records if "could not delete" in r.getMessage()]
  assert warning[0].startswith("checkpoint 8 saved; could not delete the old checkpoint 2 ")


# ===== SIGTERM or SIGKILL during an evaluation =====

IN_EVAL = """
import os, signal, sys
from prompt_jax import cli
from prompt_jax.train import loop
_tfe = loop.teacher_forced_eval
def tfe(*args, **kwargs):
  os.kill(os.getpid(), signal.{signal})
  return _tfe(*args, **kwargs)
loop.teacher_forced_eval = tfe
sys.exit(cli.main(sys.argv[1:]))
"""


def _eval_steps(model_dir: str) -> list:
  steps = set()
  for sub in glob.glob(os.path.join(model_dir, "training_eval", "*")):
    steps |= set(common.tensorboard_scalars(
        model_dir, "eval/loss", os.path.relpath(sub, model_dir)))
  return sorted(steps)


def test_sigterm_during_evaluation_stops_after_it(tmp_path):
  d = str(tmp_path / "run")
  argv = run_argv(d, 6, *EVAL_FLAGS, "--gin.CHECKPOINT_PERIOD=100")
  proc = common.cli_subprocess(argv, python_code=IN_EVAL.format(signal="SIGTERM"))
  assert proc.returncode == 143, proc.stdout[-3000:]
  assert "preempted (SIGTERM) at step 2:" in proc.stdout, proc.stdout[-3000:]
  assert "step 3/" not in proc.stdout  # no step after the evaluation
  assert checkpoint_steps(d) == [2] and _eval_steps(d) == [2]


@pytest.mark.parametrize("sig,code,said", [("SIGTERM", 143, "preempted (SIGTERM)"),
                                            ("SIGINT", 130, "interrupted (Ctrl-C)")])
def test_a_signal_during_the_evaluation_before_training_trains_no_step(tmp_path, sig, code,
                                                                      said):
  """As above for the evaluation of the untrained prompt (t5x's run_eval_before_training): the
  run compiled and trained step 1, then saved and stopped (on a real model: the whole
  evaluation, then the compile, before it stopped)."""
  d = str(tmp_path / "run")
  argv = run_argv(d, 6, *EVAL_FLAGS, "--gin.prompt_jax.train.eval_before_training=True")
  proc = common.cli_subprocess(argv, python_code=IN_EVAL.format(signal=sig))
  assert proc.returncode == code, proc.stdout[-3000:]
  assert (f"{said} at step 0, before training: nothing was trained yet; run the same command "
          f"to start again") in proc.stdout, proc.stdout[-3000:]
  assert "step 1/" not in proc.stdout and "Traceback" not in proc.stdout, proc.stdout[-3000:]
  assert checkpoint_steps(d) == [] and _eval_steps(d) == [0]


def test_evaluation_killed_is_redone_on_resume(tmp_path):
  d = str(tmp_path / "run")
  argv = run_argv(d, 4, *EVAL_FLAGS)
  proc = common.cli_subprocess(argv, python_code=IN_EVAL.format(signal="SIGKILL"))
  assert proc.returncode == -signal.SIGKILL, proc.stdout[-3000:]
  assert checkpoint_steps(d) == [2] and _eval_steps(d) == []
  resumed = common.cli_subprocess(argv)
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  assert _eval_steps(d) == [2, 4]  # step 2's evaluation redone, step 4 evaluated once
  assert resumed.stdout.count("training_eval step 4:") == 1


def test_finished_evaluation_is_not_redone_on_resume(tmp_path):
  """A run stopped after step 2's evaluation finished (recorded in MODEL_DIR/
  last_evaluation.json): the resume at step 2 does not evaluate it again."""
  d = str(tmp_path / "run")
  argv = run_argv(d, 4, *EVAL_FLAGS)
  first = common.cli_subprocess(argv + ["--gin.prompt_jax.train.stop_after_step=2"])
  assert first.returncode == 0, first.stdout[-3000:]
  assert checkpoint_steps(d) == [2] and _eval_steps(d) == [2]
  resumed = common.cli_subprocess(argv)
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  assert ("the evaluation of the restored step 2 is already recorded "
          f"({os.path.join(d, 'last_evaluation.json')}, in {os.path.join(d, 'training_eval')})"
          in resumed.stdout), resumed.stdout[-3000:]
  assert "evaluating the restored step" not in resumed.stdout
  assert "training_eval step 2:" not in resumed.stdout
  assert resumed.stdout.count("training_eval step 4:") == 1
  assert _eval_steps(d) == [2, 4]
  # The same command once more: the run is finished and its final evaluation recorded. It
  # evaluated step 4 again (a second TensorBoard point); now it says the recorded metrics.
  again = common.cli_subprocess(argv)
  assert again.returncode == 0, again.stdout[-3000:]
  assert "the evaluation of the restored step 4 is already recorded" in again.stdout
  assert "training_eval step 4:" not in again.stdout
  final = lambda out: next(l for l in out.splitlines() if l.startswith("final metrics: "))
  assert final(again.stdout) == final(resumed.stdout)
  assert _eval_steps(d) == [2, 4]


def test_evaluation_record_names_the_step_and_what_was_evaluated(tmp_path):
  """The record is for one step and one evaluation configuration: another step, task or split
  (or an evaluation added or dropped), a missing or a garbled record all evaluate again."""
  import types  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import loop  # pylint: disable=g-import-not-at-top
  d = str(tmp_path)
  # (What the record reads of a DatasetConfig; the gin-configurable class would take the
  # bindings another test of this process left.)
  cfg = lambda name, split: types.SimpleNamespace(mixture_or_task_name=name, split=split)
  train_eval, infer_eval = cfg("task_a", "validation"), cfg("task_b", "validation")
  record = loop._evaluation_record(4, train_eval, infer_eval)
  assert loop._recorded_metrics(d, record) is None  # no record yet
  loop._record_evaluation(d, record, {"training_eval/accuracy": np.float32(0.5)})
  assert os.listdir(d) == ["last_evaluation.json"]  # (no .tmp left)
  assert loop._recorded_metrics(d, record) == {"training_eval/accuracy": 0.5}
  for other in (loop._evaluation_record(2, train_eval, infer_eval),
                loop._evaluation_record(4, cfg("task_c", "validation"), infer_eval),
                loop._evaluation_record(4, train_eval, cfg("task_b", "test")),
                loop._evaluation_record(4, train_eval, None),
                loop._evaluation_record(4, None, infer_eval)):
    assert loop._recorded_metrics(d, other) is None, other
  with open(os.path.join(d, "last_evaluation.json"), "w") as f:
    f.write('{"step": 4, "train')  # cut short
  assert loop._recorded_metrics(d, record) is None
