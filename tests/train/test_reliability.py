"""Nothing a user trained is lost (README "When things go wrong"), proved on the real CLI.

Every run is `python -m prompt_jax train` in a subprocess (tests/train/common.py), killed with
SIGKILL or SIGTERM at chosen points, on checkpoints damaged on purpose, or driven to a NaN loss.
The reference is one uninterrupted run of the same command: a resumed run must end with a prompt
bitwise equal to it (same program, same data order: exact equality, no tolerance).
"""
import concurrent.futures
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.train import common

STEPS = 12
# Shuffled data (the iterator state then includes a shuffle buffer), a checkpoint every 2 steps,
# 3 kept, no evaluation.
RUN_FLAGS = ["--gin.train/prompt_jax.DatasetConfig.shuffle=True",
             "--gin.prompt_jax.train.eval_before_training=False",
             "--gin.CHECKPOINT_PERIOD=2", "--gin.KEEP_CHECKPOINTS=3"]


def run_argv(model_dir, steps=STEPS, *extra):
  return ["train"] + common.flags(str(model_dir), steps, *RUN_FLAGS, *extra)


def checkpoint_steps(model_dir) -> list:
  d = os.path.join(model_dir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def error_lines(text: str) -> list:
  return [l for l in text.splitlines() if l.startswith("prompt-jax train: error:")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  d = tmp_path_factory.mktemp("reference")
  proc = common.cli_subprocess(run_argv(d))
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert checkpoint_steps(d) == [8, 10, 12]
  return str(d)


# ===== 1. SIGKILL anywhere: the same command resumes, bitwise =====

# Runs the CLI and SIGKILLs itself at one point: after a train step ("step"), inside orbax's
# save once the state is written but before the checkpoint is committed ("checkpoint"), or
# halfway through the .npy export ("export").
KILL_AT = """
import os, signal, sys
from etils import epath
from prompt_jax import cli
from prompt_jax.train import checkpointing, guards
STEP, WHERE = {step}, {where!r}
def die():
  os.kill(os.getpid(), signal.SIGKILL)
if WHERE == "step":
  _requested = guards.PreemptionWatch.requested
  def requested(self, step):
    if step == STEP:
      die()
    return _requested(self, step)
  guards.PreemptionWatch.requested = requested
elif WHERE == "checkpoint":
  _save = checkpointing.DataIteratorHandler.save
  def save(self, directory, args):
    _save(self, directory, args)
    if epath.Path(directory).parent.name.startswith(f"{{STEP}}.orbax-checkpoint-tmp"):
      die()  # state and data position written, the checkpoint not yet committed
  checkpointing.DataIteratorHandler.save = save
elif WHERE == "export":
  _export = checkpointing.export_numpy
  def export(model_dir, step, trainable, **kw):
    if step == STEP:
      tmp = epath.Path(model_dir) / "numpy_checkpoints" / f"checkpoint_{{step}}.tmp"
      tmp.mkdir(parents=True, exist_ok=True)
      (tmp / "encoder.prompt.prompt.prompt.npy").write_bytes(b"\\x93NUMPY half")
      die()
    return _export(model_dir, step, trainable, **kw)
  checkpointing.export_numpy = export
sys.exit(cli.main(sys.argv[1:]))
"""


# Seed -> kill places, in order (seed 0 is killed twice: a resumed run is killed again). Steps
# are drawn from the seed; "checkpoint" and "export" happen at save steps (even).
PLACES = {0: ("step", "checkpoint"), 1: ("export",), 2: ("checkpoint",)}


def kill_plan(seed: int):
  rng = random.Random(seed)
  plan, low = [], 1
  for i, where in enumerate(PLACES[seed]):
    high = STEPS - 2 * (len(PLACES[seed]) - i)
    step = rng.randint(low, high)
    if where != "step":
      step += step % 2
    plan.append((step, where))
    low = step + 2
  return plan


def run_kill_chain(model_dir: str, plan) -> list:
  """Launches the same command, killed per `plan`, then once more to the end; returns logs."""
  logs = []
  for step, where in plan:
    proc = common.cli_subprocess(run_argv(model_dir),
                                 python_code=KILL_AT.format(step=step, where=where))
    logs.append(proc.stdout)
    assert proc.returncode == -signal.SIGKILL, (step, where, proc.stdout[-3000:])
  final = common.cli_subprocess(run_argv(model_dir))
  logs.append(final.stdout)
  assert final.returncode == 0, final.stdout[-3000:]
  return logs


def test_sigkill_at_random_points_resumes_bitwise(reference, tmp_path):
  seeds = (0, 1, 2)
  plans = {seed: kill_plan(seed) for seed in seeds}
  with concurrent.futures.ThreadPoolExecutor(len(seeds)) as pool:
    futures = {seed: pool.submit(run_kill_chain, str(tmp_path / f"seed{seed}"), plans[seed])
               for seed in seeds}
    logs = {seed: f.result() for seed, f in futures.items()}
  want = common.prompt_at(reference, STEPS).tobytes()
  for seed in seeds:
    d = str(tmp_path / f"seed{seed}")
    for (step, where), log in zip(plans[seed], logs[seed][1:]):
      # The run after a kill restores the newest committed checkpoint before the kill point.
      committed = {"step": step - step % 2, "checkpoint": step - 2, "export": step}[where]
      if committed:
        assert f"restored step {committed} " in log, (seed, step, where, log[-2000:])
      assert f"training steps {committed} -> {STEPS}" in log, (seed, step, where)
      assert "replaying" not in log  # positioned from the saved iterator state, not by skipping
    assert common.prompt_at(d, STEPS).tobytes() == want, (seed, plans[seed])
    assert checkpoint_steps(d) == [8, 10, 12]
    # Every .npy export exists whole (a kill during an export is redone on resume).
    for step in (8, 10, 12):
      np.testing.assert_array_equal(common.prompt_at(d, step), common.prompt_at(reference, step))
    assert not [n for n in os.listdir(os.path.join(d, "numpy_checkpoints")) if ".tmp" in n]
    # ... and no save a kill cut short is left behind (they stayed, never read)
    assert not [n for n in os.listdir(os.path.join(d, "checkpoints")) if "tmp" in n], seed


# ===== 2. Damaged checkpoints =====

def _state_data_file(model_dir: str, step: int) -> str:
  """The largest OCDBT data file of checkpoint `step` (it holds the prompt)."""
  d = os.path.join(model_dir, "checkpoints", str(step), "state", "ocdbt.process_0", "d")
  return max((os.path.join(d, f) for f in os.listdir(d)), key=os.path.getsize)


def flip_byte(path: str) -> None:
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(path, "wb").write(bytes(data))


def truncate(path: str) -> None:
  data = open(path, "rb").read()
  open(path, "wb").write(data[:len(data) // 2])


def snapshot(root: str) -> dict:
  """Every file under `root`: (size, mtime, sha256)."""
  out = {}
  for d, _, files in os.walk(root):
    for f in files:
      p = os.path.join(d, f)
      out[os.path.relpath(p, root)] = (os.path.getsize(p), os.path.getmtime(p),
                                       hashlib.sha256(open(p, "rb").read()).hexdigest())
  return out


def test_damaged_latest_checkpoints_fall_back_to_newest_intact(reference, tmp_path):
  d = str(tmp_path / "damaged")
  shutil.copytree(reference, d)
  # Keep 8 intact; damage 10 (a flipped byte in its data: orbax restores it without complaint,
  # only the fingerprint notices) and 12 (a truncated data file).
  flip_byte(_state_data_file(d, 10))
  truncate(_state_data_file(d, 12))
  proc = common.cli_subprocess(run_argv(d, 14))
  assert proc.returncode == 0, proc.stdout[-3000:]
  warning = [l for l in proc.stdout.splitlines() if "cannot be restored" in l]
  assert len(warning) == 1, proc.stdout[-3000:]
  assert os.path.join(d, "checkpoints", "12") in warning[0]
  assert os.path.join(d, "checkpoints", "8") in warning[0] and "(and 10)" in warning[0]
  assert "restored step 8 " in proc.stdout and "training steps 8 -> 14" in proc.stdout
  # Broken checkpoints are moved aside, never deleted; only intact ones are kept (3).
  assert sorted(os.listdir(os.path.join(d, "corrupt_checkpoints"))) == ["10", "12"]
  # Each keeps its .npy export, which retraining that step would otherwise have replaced.
  np.testing.assert_array_equal(np.load(os.path.join(
      d, "corrupt_checkpoints", "12", "numpy_checkpoints", common.PROMPT_NPY)),
      common.prompt_at(reference, 12))
  assert checkpoint_steps(d) == [10, 12, 14]
  # Steps 9..12 were recomputed from checkpoint 8: the same values as the first time.
  np.testing.assert_array_equal(common.prompt_at(d, 12), common.prompt_at(reference, 12))
  # A later run resumes from 14 without warnings.
  again = common.cli_subprocess(run_argv(d, 14))
  assert again.returncode == 0 and "cannot be restored" not in again.stdout


def test_no_intact_checkpoint_is_one_error_and_changes_nothing(reference, tmp_path):
  d = str(tmp_path / "all_broken")
  shutil.copytree(reference, d)
  flip_byte(_state_data_file(d, 8))
  os.remove(os.path.join(d, "checkpoints", "10", "state", "_METADATA"))  # metadata gone
  with open(os.path.join(d, "checkpoints", "12", "data", "metadata"), "w") as f:
    f.write('{"position": 12, "finger')  # garbled metadata
  before = snapshot(d)
  proc = common.cli_subprocess(run_argv(d, 14))
  assert proc.returncode == 1, proc.stdout[-3000:]
  lines = error_lines(proc.stdout)
  assert len(lines) == 1 and "no intact checkpoint" in lines[0], proc.stdout[-3000:]
  for step in (8, 10, 12):
    assert f"step {step}:" in lines[0]
  # (the exported prompts are intact: it said only "restore from a copy, or start over")
  npy = os.path.join(d, "numpy_checkpoints", "checkpoint_12", "encoder.prompt.prompt.prompt.npy")
  assert lines[0].endswith(f"; the prompt of a step survives as {npy} (eval / infer it with "
                           f"--gin.PROMPT_FILE, or start a new run from it: "
                           f"prompts/from_file.gin)"), lines[0]
  assert "Traceback" not in proc.stdout
  assert snapshot(d) == before


# ===== 3. Non-finite loss =====

def _assert_nothing_non_finite(model_dir: str) -> None:
  from prompt_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  saved = checkpoint_steps(model_dir)
  for step in saved:
    for value in checkpointing.read_params(model_dir, step).values():
      assert np.all(np.isfinite(value)), step
  for name in os.listdir(os.path.join(model_dir, "numpy_checkpoints")):
    step = int(name.split("_")[1])
    assert np.all(np.isfinite(common.prompt_at(model_dir, step))), name


@pytest.mark.parametrize("caught_by", ["loss", "parameters"])
def test_non_finite_stops_without_saving_it(reference, tmp_path, caught_by):
  d = str(tmp_path / "nan")
  shutil.copytree(reference, d)
  # Resuming at learning rate 1e999 (= inf): step 13's loss is finite but its update makes the
  # prompt infinite, so step 14's loss is NaN.
  #  loss: statistics every step catch the flag at step 14 (before the save at 16);
  #  parameters: a save at step 13 with no statistics in between catches the parameters.
  extra = (["--gin.prompt_jax.train.stats_period=1", "--gin.CHECKPOINT_PERIOD=4"]
           if caught_by == "loss" else
           ["--gin.prompt_jax.train.stats_period=100", "--gin.CHECKPOINT_PERIOD=1"])
  proc = common.cli_subprocess(run_argv(d, 20, "--gin.prompt_jax.adafactor.learning_rate=1e999",
                                        *extra))
  assert proc.returncode == 1, proc.stdout[-3000:]
  lines = error_lines(proc.stdout)
  assert len(lines) == 1, proc.stdout[-3000:]
  step = 14 if caught_by == "loss" else 13
  what = "the loss or the gradients" if caught_by == "loss" else "the parameters"
  assert f"{what} became NaN or Inf at step {step}; stopped at step {step} without saving" in \
      lines[0], lines[0]
  assert f"the last good checkpoint is {os.path.join(d, 'checkpoints', '12')}" in lines[0]
  assert "Traceback" not in proc.stdout
  assert checkpoint_steps(d) == [8, 10, 12]
  _assert_nothing_non_finite(d)


# ===== 5. A disk that fills up during the run =====

# No file may grow past 256 KiB (RLIMIT_FSIZE; writes then fail with EFBIG as they fail with
# ENOSPC on a full disk): the start-up check passes, the data iterator state (the shuffle
# buffer, ~0.5 MB) of the first checkpoint cannot be written.
SMALL_FILES = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (262144, 262144))
from prompt_jax import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_failed_checkpoint_write_is_one_error(tmp_path):
  d = str(tmp_path / "full")
  proc = common.cli_subprocess(run_argv(d, 4), python_code=SMALL_FILES)
  assert proc.returncode == 1, proc.stdout[-3000:]
  lines = error_lines(proc.stdout)
  assert len(lines) == 1 and f"cannot write checkpoint 2 to {d}" in lines[0], proc.stdout[-3000:]
  assert "no checkpoint was written" in lines[0] and "run the same command" in lines[0]
  assert "Traceback" not in proc.stdout
  assert checkpoint_steps(d) == []  # nothing half-written counts as a checkpoint


# ===== 4. SIGTERM (preemption) =====

@pytest.mark.parametrize("sig,code,said", [("SIGTERM", 143, "preempted (SIGTERM)"),
                                            ("SIGINT", 130, "interrupted (Ctrl-C)")])
def test_sigterm_saves_and_the_same_command_resumes(reference, tmp_path, sig, code, said):
  """A preemption (SIGTERM) or a user's Ctrl-C (SIGINT) saves the steps trained since the last
  checkpoint (Ctrl-C used to lose them) and the same command resumes bitwise."""
  d = str(tmp_path / "preempted")
  # No periodic checkpoint before the end: what is saved is the preemption checkpoint.
  argv = run_argv(d, STEPS, "--gin.CHECKPOINT_PERIOD=100")
  # The signal after step 3's log line, from inside (common.SIGNAL_AT_STEP): no race with the end.
  proc = common.cli_subprocess(argv, timeout=300, python_code=common.SIGNAL_AT_STEP.format(
      step=3, signal=sig, times=1))
  text = proc.stdout
  assert proc.returncode == code, text[-3000:]
  line = [l for l in text.splitlines() if f"{said} at step" in l]
  assert len(line) == 1, text[-3000:]
  step = int(line[0].split("at step ")[1].split(":")[0])
  assert 3 <= step < STEPS and checkpoint_steps(d) == [step]
  assert os.path.join(d, "checkpoints", str(step)) in line[0]
  resumed = common.cli_subprocess(run_argv(d, STEPS))
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  assert f"restored step {step} " in resumed.stdout
  assert common.prompt_at(d, STEPS).tobytes() == common.prompt_at(reference, STEPS).tobytes()


def test_a_resume_with_other_settings_keeps_the_config_its_steps_trained_with(tmp_path):
  """Resuming with --gin.LEARNING_RATE=0.01 replaced config.gin without a word: nothing recorded
  that steps 1-4 trained at 0.3. The old file is kept, the change is said; the same command
  again keeps nothing more."""
  d = str(tmp_path / "changed")
  first = common.cli_subprocess(run_argv(d, 4))
  assert first.returncode == 0, first.stdout[-3000:]
  old = open(os.path.join(d, "config.gin")).read()
  assert "LEARNING_RATE = 0.3\n" in old
  second = common.cli_subprocess(run_argv(d, 6, "--gin.LEARNING_RATE=0.01"))
  assert second.returncode == 0, second.stdout[-3000:]
  kept = os.path.join(d, "config_to_step4.gin")
  assert open(kept).read() == old
  assert "LEARNING_RATE = 0.01\n" in open(os.path.join(d, "config.gin")).read()
  assert (f"settings changed at step 4 (LEARNING_RATE 0.3 -> 0.01, TRAIN_STEPS 4 -> 6): "
          f"config.gin has the new ones, {kept} the ones steps 0-4 trained with"
          ) in second.stdout, second.stdout[-3000:]
  again = common.cli_subprocess(run_argv(d, 6, "--gin.LEARNING_RATE=0.01"))
  assert again.returncode == 0 and "settings changed" not in again.stdout, again.stdout[-3000:]
  assert sorted(n for n in os.listdir(d) if n.endswith(".gin")) == ["config.gin",
                                                                     "config_to_step4.gin"]


@pytest.mark.parametrize("sig,code,by", [("SIGINT", 130, "Ctrl-C"), ("SIGTERM", 143, "SIGTERM")])
def test_a_signal_twice_stops_at_once_without_saving(tmp_path, sig, code, by):
  """The second Ctrl-C (or SIGTERM) stops at once: no checkpoint, one line, no traceback. Two
  SIGTERMs ended with no last line, the one before having said a checkpoint would be saved."""
  d = str(tmp_path / "twice")
  proc = common.cli_subprocess(run_argv(d, STEPS, "--gin.CHECKPOINT_PERIOD=100"), timeout=300,
                               python_code=common.SIGNAL_AT_STEP.format(step=3, signal=sig,
                                                                        times=2))
  assert proc.returncode == code, proc.stdout[-3000:]
  assert (f"prompt-jax train: interrupted ({by} twice): stopped at once, without saving; the "
          f"same command resumes from the newest checkpoint in MODEL_DIR/checkpoints\n"
          ) in proc.stdout, proc.stdout[-3000:]
  if sig == "SIGINT":
    assert "Ctrl-C again: stop now" in proc.stdout
  assert proc.stdout.count("interrupted") == 1 and "Traceback" not in proc.stdout, \
      proc.stdout[-3000:]
  assert checkpoint_steps(d) == []


def test_ctrl_c_while_the_program_shuts_down_ends_it_quietly(tmp_path):
  """A Ctrl-C after the command's work is done (JAX's and orbax's atexit handlers run; a second
  Ctrl-C after an interrupted run saved) printed those handlers' tracebacks."""
  code = ("import os, signal, sys\nfrom prompt_jax import cli\ncode = cli.console_main()\n"
          "os.kill(os.getpid(), signal.SIGINT)\nprint('after the Ctrl-C')\nsys.exit(code)\n")
  proc = subprocess.run([sys.executable, "-c", code, "tasks", "--filter", "glue_rte"],
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr
  assert "glue_rte" in proc.stdout and "after the Ctrl-C" not in proc.stdout
  assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr


def test_ctrl_c_ignored_by_the_parent_stays_ignored(tmp_path):
  """`sweep run` starts its jobs with SIGINT ignored (a Ctrl-C at its terminal is the runner's,
  which sends the jobs SIGTERM): the trainer keeps it ignored and trains on."""
  d = str(tmp_path / "ignored")
  code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + \
      common.SIGNAL_AT_STEP.format(step=3, signal="SIGINT", times=1)
  proc = common.cli_subprocess(run_argv(d, STEPS, "--gin.CHECKPOINT_PERIOD=100"), timeout=300,
                               python_code=code)
  assert proc.returncode == 0 and "Ctrl-C" not in proc.stdout, proc.stdout[-3000:]
  assert checkpoint_steps(d) == [STEPS]


# Ctrl-C while the run starts, where library code catches the KeyboardInterrupt: inside
# TensorFlow's import (a user's Ctrl-C 2-2.5 s after `prompt-jax train` was lost and the run
# trained to its end, exit 0), and inside a garbage-collection callback (JAX has one; Python only
# prints "Exception ignored in ...").
CTRL_C_SWALLOWED = {
    "tensorflow_import": """
import os, signal, sys
from prompt_jax import cli, console
def import_catching_ctrl_c(silence_import=True):
  try:
    os.kill(os.getpid(), signal.SIGINT)
    sum(range(1000))
  except KeyboardInterrupt:
    pass
  import tensorflow as tf
  return tf
console.import_tensorflow = import_catching_ctrl_c
sys.exit(cli.main(sys.argv[1:]))
""",
    "gc_callback": """
import gc, os, signal, sys
from prompt_jax import cli
check = cli.check_against_run
def check_with_ctrl_c_in_a_gc_callback(*args, **kwargs):
  fired = []
  def callback(phase, info):
    if not fired:
      fired.append(phase)
      os.kill(os.getpid(), signal.SIGINT)
      sum(range(1000))
  gc.callbacks.append(callback)
  try:
    gc.collect()
  finally:
    gc.callbacks.remove(callback)
  assert fired
  return check(*args, **kwargs)
cli.check_against_run = check_with_ctrl_c_in_a_gc_callback
sys.exit(cli.main(sys.argv[1:]))
"""}


@pytest.mark.parametrize("where", sorted(CTRL_C_SWALLOWED))
def test_ctrl_c_while_starting_that_a_library_swallows_still_stops_the_run(tmp_path, where):
  d = str(tmp_path / where)
  proc = common.cli_subprocess(run_argv(d, STEPS), timeout=300,
                               python_code=CTRL_C_SWALLOWED[where])
  assert proc.returncode == 130, proc.stdout[-3000:]
  assert proc.stdout.endswith("prompt-jax train: interrupted\n"), proc.stdout[-3000:]
  assert "Traceback" not in proc.stdout and "Exception ignored" not in proc.stdout
  assert checkpoint_steps(d) == [] and "step 1/" not in proc.stdout


def test_a_remembered_ctrl_c_does_not_outlive_its_command():
  """A Ctrl-C remembered during one command (or raised by a deferral outside any) must not stop
  a later run in the same process (a notebook) at its start."""
  from prompt_jax import console  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import guards  # pylint: disable=g-import-not-at-top
  before = signal.getsignal(signal.SIGINT)
  signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with console.ctrl_c_remembered():
      with pytest.raises(KeyboardInterrupt):
        with console.sigint_deferred():
          os.kill(os.getpid(), signal.SIGINT)
          sum(range(1000))  # held back: no KeyboardInterrupt here
      assert console.ctrl_c_seen()
    assert not console.ctrl_c_seen()
    with pytest.raises(KeyboardInterrupt):
      with console.sigint_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))
    assert not console.ctrl_c_seen()
    guards.PreemptionWatch().install().uninstall()  # does not raise
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  finally:
    signal.signal(signal.SIGINT, before)


def test_a_failed_run_leaves_no_signal_handler_behind(tmp_path):
  """A run ending in an error (here the NaN guard) restores the SIGINT/SIGTERM handlers: in a
  notebook a later Ctrl-C would otherwise only ask a finished loop to save."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
  err = io.StringIO()
  with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
    code = cli.main(run_argv(str(tmp_path / "nan"), STEPS,
                             "--gin.prompt_jax.adafactor.learning_rate=1e999"))
  gin.clear_config()
  assert code == 1 and "NaN" in err.getvalue(), err.getvalue()
  assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# ===== Every damage is noticed (in-process, the trainer's own restore) =====

def _train_cfg(batch_size=8):
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  return data_lib.DatasetConfig(
      mixture_or_task_name="embedded_last_letter", task_feature_lengths={"inputs": 16,
                                                                         "targets": 4},
      split="train", batch_size=batch_size, shuffle=True, seed=0,
      module="prompt_jax.embedded.task")


def _restore_newest(model_dir: str, stream):
  """(step, state leaves, next batch) as the trainer restores them (into `stream`'s
  iterators), or the RunError text."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from prompt_jax.errors import RunError  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  # The state's structure, from the undamaged checkpoint 8 (as the trainer builds it from gin).
  meta = ocp.StandardCheckpointHandler().metadata(
      epath.Path(model_dir) / "checkpoints" / "8" / "state")
  tree = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype),
                                getattr(meta, "tree", meta))
  abstract = state_lib.TrainState(tree["step"], tree["params"], tree["opt_state"])
  mngr = checkpointing.manager(model_dir, period=2, keep=3, read_only=True)
  try:
    restored = checkpointing.restore_latest(mngr, model_dir, abstract, stream)
  except RunError as e:
    return str(e)
  finally:
    mngr.close()
  leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(restored.state.as_dict())]
  return restored.step, leaves, next(stream)


def test_every_damage_to_the_newest_checkpoint_is_noticed(reference, tmp_path):
  """Each file of checkpoint 12 removed, truncated or with one byte flipped: the restore either
  gives exactly what was saved (the file is not needed) or falls back to checkpoint 10."""
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  stream = data_lib.TrainStream(_train_cfg(), 1, (0, 8))  # restored over and over
  step, want_leaves, want_batch = _restore_newest(reference, stream)
  assert step == 12
  root = os.path.join(reference, "checkpoints", "12")
  files = sorted(os.path.relpath(os.path.join(d, f), root)
                 for d, _, fs in os.walk(root) for f in fs)
  assert any(f.startswith("data_iterators/shard-00000-of-00001") for f in files), files
  outcomes = {}
  d = str(tmp_path / "m")
  shutil.copytree(reference, d, ignore=shutil.ignore_patterns("numpy_checkpoints", "train"))
  for rel in files:
    path = os.path.join(d, "checkpoints", "12", rel)
    original = open(path, "rb").read()
    for damage in (os.remove, truncate, flip_byte):
      damage(path)
      got = _restore_newest(d, stream)
      with open(path, "wb") as f:  # undo the damage for the next case
        f.write(original)
      assert not isinstance(got, str), (rel, damage.__name__, got)
      outcomes[(rel, damage.__name__)] = got[0]
      assert got[0] in (12, 10), (rel, damage.__name__)
      if got[0] == 12:  # an unused file (commit markers, leftovers of the OCDBT merge)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got[1], want_leaves)), rel
        for k in want_batch:
          np.testing.assert_array_equal(got[2][k], want_batch[k])
  # The files holding the values and the data position are among those noticed.
  data_file = os.path.relpath(_state_data_file(reference, 12), root)
  for rel in (data_file, "state/_METADATA", "data/metadata",
              "data_iterators/shard-00000-of-00001.index"):
    for damage in ("remove", "truncate", "flip_byte"):
      assert outcomes[(rel, damage)] == 10, (rel, damage)


def test_eval_finds_the_newest_intact_checkpoint_read_only(reference, tmp_path, caplog):
  """`latest_step` (what eval/infer resolve a run with) skips a damaged checkpoint, warns, and
  moves nothing."""
  from prompt_jax.errors import RunError  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  d = str(tmp_path / "run")
  shutil.copytree(reference, d)
  assert checkpointing.latest_step(d) == 12
  flip_byte(_state_data_file(d, 12))
  before = snapshot(d)
  assert checkpointing.latest_step(d) == 10
  assert any("cannot be restored" in r.getMessage() and "; using " in r.getMessage()
             and "checkpoints/10" in r.getMessage() for r in caplog.records)
  caplog.clear()  # eval resolves the run twice (its check, then its read): one warning
  assert checkpointing.latest_step(d) == 10
  assert not any("cannot be restored" in r.getMessage() for r in caplog.records)
  assert snapshot(d) == before
  for step in (8, 10):
    flip_byte(_state_data_file(d, step))
  with pytest.raises(RunError, match="no intact checkpoint"):
    checkpointing.latest_step(d)
  assert checkpointing.latest_step(str(tmp_path / "empty")) is None


def test_stream_rows_do_not_depend_on_the_process_layout():
  """The global batch is the same rows in the same order whether one process reads it or two
  processes read halves of it: with 1 data shard (each process keeps half of its rows) and 4
  (each process reads 2 shards). tests/train/test_distributed.py runs 2 shards on 2 processes."""
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  for shards in (1, 4):
    whole = data_lib.TrainStream(_train_cfg(), shards, (0, 8))
    halves = [data_lib.TrainStream(_train_cfg(), shards, rows) for rows in ((0, 4), (4, 8))]
    assert [h.owned for h in halves] == [list(range(0, (shards + 1) // 2)),
                                         list(range((shards + 1) // 2, shards))]
    for _ in range(3):
      got, parts = next(whole), [next(h) for h in halves]
      for k in got:
        np.testing.assert_array_equal(got[k], np.concatenate([p[k] for p in parts]))
