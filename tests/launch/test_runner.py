"""The local runner's bookkeeping with a stand-in `prompt-jax` (no training): a failed job does
not stop the others, its error line is recorded, done jobs are skipped, --retry_failed reruns,
one runner per root; stopping the runner lets running jobs save (SIGTERM), a preempted job is
resumed, a job whose command changed runs again."""
import fcntl
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.launch import runner
from prompt_jax.launch import spec as spec_lib
from tests.launch import helpers

# A finished run's final checkpoint, MODEL_DIR/checkpoints/<TRAIN_STEPS> (a done job whose
# checkpoints are gone runs again).
SAVE = """
def save():
  flag = lambda name: [a.split("=", 1)[1] for a in sys.argv if a.startswith(name + "=")][-1]
  os.makedirs(os.path.join(flag("--gin.MODEL_DIR").strip("'"), "checkpoints",
                           flag("--gin.TRAIN_STEPS")), exist_ok=True)
"""

# Exits 2 with the CLI's error line for the job named in $FAKE_FAIL until $FAKE_FIXED exists.
FAKE_TRAIN = f"""#!{sys.executable}
import os, sys
{SAVE}
print("noise before the error")
if any(a.endswith("/" + os.environ["FAKE_FAIL"] + "'") for a in sys.argv) and \\
    not os.path.exists(os.environ["FAKE_FIXED"]):
  print("prompt-jax train: error: TRAIN_STEPS=4 is below the step 9 restored from ...")
  print("trailing line")
  sys.exit(2)
save()
print("final metrics: x=1.0000")
"""


@pytest.fixture
def fake_sweep(tmp_path, monkeypatch):
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  sweep = spec_lib.build(spec, root=str(tmp_path / "root"))
  fakes = tmp_path / "bin"
  fakes.mkdir()
  helpers.write_executable(fakes, "prompt-jax", FAKE_TRAIN)
  monkeypatch.setenv("PATH", f"{fakes}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("FAKE_FAIL", sweep.jobs[1].name)
  monkeypatch.setenv("FAKE_FIXED", str(tmp_path / "fixed"))
  monkeypatch.setattr(runner, "POLL_SECONDS", 0.02)
  return sweep, tmp_path


def _status(sweep):
  with open(runner.status_path(sweep.root)) as f:
    return json.load(f)["jobs"]


def test_failed_job_does_not_stop_the_others(fake_sweep):
  sweep, tmp_path = fake_sweep
  out = io.StringIO()
  assert runner.run(sweep, parallel=3, out=out) == 1
  status = _status(sweep)
  failed = sweep.jobs[1].name
  assert [status[j.name]["state"] for j in sweep.jobs] == ["done", "failed"] + ["done"] * 6
  assert status[failed]["error"] == (
      "exit status 2: prompt-jax train: error: TRAIN_STEPS=4 is below the step 9 restored "
      "from ...")
  assert status[failed]["command"] == ["prompt-jax"] + sweep.jobs[1].train_args()
  lines = out.getvalue().strip().splitlines()
  assert "7/8 done, 1 failed" in lines[-1] and runner.status_path(sweep.root) in lines[-1]
  # The report command it names reads this root (the sweep was built with --root).
  assert lines[-1].endswith(f"report: prompt-jax sweep report {sweep.path} "
                            f"--root={sweep.root}")
  assert any("ETA" in l for l in lines)

  # Re-run: nothing to do (done skipped, failed kept).
  out = io.StringIO()
  assert runner.run(sweep, out=out) == 1
  assert " start " not in out.getvalue()
  # --retry_failed, the cause fixed: only the failed job runs again.
  open(tmp_path / "fixed", "w").close()
  out = io.StringIO()
  assert runner.run(sweep, retry_failed=True, out=out) == 0
  assert [l.split()[2] for l in out.getvalue().splitlines() if " start " in l] == [failed]
  status = _status(sweep)
  assert all(status[j.name]["state"] == "done" for j in sweep.jobs)
  assert status[failed]["attempts"] == 2 and status[failed]["error"] is None
  with open(os.path.join(sweep.root, "logs", failed + ".log")) as f:
    assert f.read().count("=== sweep tiny: attempt") == 2  # appended, not overwritten


def test_one_runner_per_root(fake_sweep):
  sweep, _ = fake_sweep
  os.makedirs(sweep.root)
  lock = os.path.join(sweep.root, runner.LOCK_FILE)
  with open(lock, "w") as held:
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    held.write("4242")
    held.flush()
    with pytest.raises(ConfigError, match=r"another `prompt-jax sweep run` \(pid 4242\) is "
                                          r"running"):
      runner.run(sweep, out=io.StringIO())
    with open(lock) as f:  # the refused runner left the holder's pid (it emptied the file)
      assert f.read() == "4242"
  assert not os.path.exists(runner.status_path(sweep.root))
  # Once it is free, the next runner takes it and writes its own pid.
  out = io.StringIO()
  runner.run(sweep, out=out)
  with open(lock) as f:
    assert f.read() == str(os.getpid())


def test_job_still_running_from_a_dead_runner_is_not_started_twice(fake_sweep):
  """The runner was SIGKILLed alone: its job lives on; a new runner must not start a second
  trainer on the same MODEL_DIR."""
  sweep, _ = fake_sweep
  job = sweep.jobs[0]
  orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             f"--gin.MODEL_DIR='{job.model_dir}'"])
  try:
    os.makedirs(sweep.root)
    runner.write_status(sweep.root, {"jobs": {job.name: {"state": "running", "attempts": 1,
                                                         "pid": orphan.pid}}})
    with pytest.raises(ConfigError, match=f"job {job.name} is still running as pid {orphan.pid}"):
      runner.run(sweep, out=io.StringIO())
  finally:
    orphan.kill()
    orphan.wait()
  assert runner.run(sweep, out=io.StringIO()) == 1  # gone: resumed (the fake fails job 1)
  assert _status(sweep)[job.name]["state"] == "done"


def test_run_needs_a_local_root(tmp_path):
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  rc, _, err = helpers.sweep_cli(["run", spec, "--root=gs://bucket/sweeps/tiny"])
  assert rc == 2 and "sweep run needs a local root, got gs://bucket/sweeps/tiny" in err


# Stands in for the trainer's preemption handling (train/guards.py): SIGTERM saves and exits
# 143 with its "preempted" line; SIGINT reaches no job (the runner starts them with it ignored,
# and the trainer keeps an ignored SIGINT ignored). Touches
# $FAKE_DIR/<pid>.started, then trains "forever" (or exits at once once $FAKE_DIR/quick exists).
SLOW_TRAIN = f"""#!{sys.executable}
import os, signal, sys, time
{SAVE}
d = os.environ["FAKE_DIR"]
if os.path.exists(os.path.join(d, "quick")):
  save()
  print("final metrics: x=1.0000")
  sys.exit(0)
def on_term(*unused):
  if os.environ.get("FAKE_IGNORE_TERM"):
    return
  save()  # what it says it saved: the next run resumes from it
  print("preempted (SIGTERM) at step 3: saved MODEL_DIR/checkpoints/3", flush=True)
  sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(d, str(os.getpid()) + ".started"), "w").close()
time.sleep(120)
"""

RUN_SWEEP = """
import sys
from prompt_jax.launch import runner, spec
runner.POLL_SECONDS = 0.02
sweep = spec.build(sys.argv[1], root=sys.argv[2])
sys.exit(runner.run(sweep, parallel=2, stop_timeout=float(sys.argv[3])))
"""


@pytest.fixture
def slow_sweep(tmp_path, monkeypatch):
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  fakes = tmp_path / "bin"
  fakes.mkdir()
  helpers.write_executable(fakes, "prompt-jax", SLOW_TRAIN)
  monkeypatch.setenv("PATH", f"{fakes}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("FAKE_DIR", str(tmp_path))
  return spec, str(tmp_path / "root"), tmp_path


def _stop_runner(spec, root, tmp_path, sig, stop_timeout=30.0, whole_group=False):
  """Starts a runner in its own session, waits until two jobs run, sends `sig` (to the runner,
  or as a terminal's Ctrl-C does, to its whole process group); -> (exit status, output)."""
  proc = subprocess.Popen([sys.executable, "-c", RUN_SWEEP, spec, root, str(stop_timeout)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True, cwd=os.getcwd())
  try:
    deadline = time.time() + 60
    while len(list(tmp_path.glob("*.started"))) < 2:
      assert time.time() < deadline and proc.poll() is None, proc.communicate()[0]
      time.sleep(0.05)
    if whole_group:
      os.killpg(proc.pid, sig)
    else:
      proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  return proc.returncode, out


@pytest.mark.parametrize("sig,whole_group", [("SIGTERM", False), ("SIGINT", True)])
def test_stopping_the_runner_lets_running_jobs_save(slow_sweep, sig, whole_group):
  """SIGTERM to the runner, or Ctrl-C in its terminal (SIGINT to the process group): each
  running job gets SIGTERM, the trainer's cue to save a checkpoint, and is resumed next time."""
  spec, root, tmp_path = slow_sweep
  rc, out = _stop_runner(spec, root, tmp_path, getattr(signal, sig), whole_group=whole_group)
  assert rc == {"SIGTERM": 143, "SIGINT": 130}[sig], out  # SIGTERM exited 130, as Ctrl-C
  sweep = spec_lib.build(spec, root=root)
  status = _status(sweep)
  stopped = [j for j in sweep.jobs if status[j.name].get("attempts")]
  assert len(stopped) == 2
  for job in stopped:
    assert status[job.name]["state"] == "pending"
    assert "preempted (SIGTERM) at step 3: saved" in status[job.name]["error"]
    with open(os.path.join(root, "logs", job.name + ".log")) as f:
      assert "saved MODEL_DIR/checkpoints/3" in f.read()
  # The same command resumes them (and runs the rest).
  open(tmp_path / "quick", "w").close()
  out = io.StringIO()
  assert runner.run(sweep, parallel=2, out=out) == 0
  assert all(f"start {j.name} (resuming)" in out.getvalue() for j in stopped)


def test_job_that_does_not_stop_is_killed_after_the_stop_timeout(slow_sweep, monkeypatch):
  spec, root, tmp_path = slow_sweep
  monkeypatch.setenv("FAKE_IGNORE_TERM", "1")
  t0 = time.time()
  rc, out = _stop_runner(spec, root, tmp_path, signal.SIGTERM, stop_timeout=1.0)
  assert rc == 143 and time.time() - t0 < 50, out
  assert "waiting up to 1s" in out
  status = _status(spec_lib.build(spec, root=root))
  killed = [e for e in status.values() if e.get("attempts")]
  assert len(killed) == 2
  assert all(e["state"] == "pending" and "killed by SIGKILL" in e["error"] for e in killed)
  # Killed before saving anything: the next run does not call it resuming (it said so, and
  # trained from step 0).
  monkeypatch.delenv("FAKE_IGNORE_TERM")
  open(tmp_path / "quick", "w").close()
  out = io.StringIO()
  assert runner.run(spec_lib.build(spec, root=root), parallel=2, out=out) == 0
  assert out.getvalue().count("(stopped before its first checkpoint: from step 0)") == 2, \
      out.getvalue()
  assert "(resuming)" not in out.getvalue()


def test_stop_timeout_must_not_be_negative(tmp_path):
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  rc, _, err = helpers.sweep_cli(["run", spec, f"--root={tmp_path}/root", "--stop_timeout=-1"])
  assert rc == 2 and "--stop_timeout must be >= 0 seconds, got -1.0" in err


def test_preempted_job_is_resumed_not_failed(fake_sweep, monkeypatch):
  """Exit 143 (the trainer saved a checkpoint on SIGTERM): pending, and the next run resumes it
  without --retry_failed."""
  sweep, tmp_path = fake_sweep
  preempted = sweep.jobs[2].name
  helpers.write_executable(tmp_path / "bin", "prompt-jax", textwrap.dedent(f"""
      #!{sys.executable}
      import os, sys
      if any(a.endswith("/{preempted}'") for a in sys.argv) and not os.path.exists("{tmp_path}/up"):
        model_dir = [a for a in sys.argv if a.startswith("--gin.MODEL_DIR=")][-1].split("=", 1)[1]
        os.makedirs(os.path.join(model_dir.strip("'"), "checkpoints", "2"))  # as it says
        print("preempted (SIGTERM) at step 2: saved .../checkpoints/2; run the same command")
        sys.exit(143)
      print("final metrics: x=1.0000")
      """) + SAVE + "save()\n")
  out = io.StringIO()
  assert runner.run(sweep, parallel=2, out=out) == 1
  entry = _status(sweep)[preempted]
  assert entry["state"] == "pending"
  assert entry["error"] == ("preempted: exit status 143: preempted (SIGTERM) at step 2: saved "
                            ".../checkpoints/2; run the same command")
  assert "FAILED" not in out.getvalue() and "1 job(s) preempted" in out.getvalue()
  open(tmp_path / "up", "w").close()
  out = io.StringIO()
  assert runner.run(sweep, out=out) == 0
  assert [l.split()[2] for l in out.getvalue().splitlines() if " start " in l] == [preempted]
  assert f"start {preempted} (resuming)" in out.getvalue()
  assert _status(sweep)[preempted]["state"] == "done"


def test_done_job_whose_command_changed_runs_again(fake_sweep):
  """As t5x.train on the same MODEL_DIR: more TRAIN_STEPS continue each finished job (the
  trainer resumes from its checkpoint); the status records the command that ran."""
  sweep, tmp_path = fake_sweep
  open(tmp_path / "fixed", "w").close()
  assert runner.run(sweep, parallel=4, out=io.StringIO()) == 0
  longer = spec_lib.build(sweep.path, root=sweep.root, overrides=[("TRAIN_STEPS", "8")])
  out = io.StringIO()
  assert runner.run(longer, parallel=4, out=out) == 0
  started = [l for l in out.getvalue().splitlines() if " start " in l]
  assert len(started) == 8 and all("(command changed: resuming)" in l for l in started)
  status = _status(longer)
  assert all(status[j.name]["command"] == ["prompt-jax"] + j.train_args() for j in longer.jobs)
  assert all("--gin.TRAIN_STEPS=8" in status[j.name]["command"] for j in longer.jobs)
  out = io.StringIO()  # the same command again: nothing to do
  assert runner.run(longer, out=out) == 0 and " start " not in out.getvalue()
  rc, out, err = helpers.sweep_cli(["plan", sweep.path, f"--root={sweep.root}",
                                    "--gin.TRAIN_STEPS=16"])
  assert rc == 0 and out.count("(done, command changed: run resumes it)") == 8, err
  # Fewer steps than the runs trained: not a resumption (the trainer would train nothing).
  rc, out, err = helpers.sweep_cli(["plan", sweep.path, f"--root={sweep.root}"])
  assert rc == 0 and out.count("(done, command changed (--gin.TRAIN_STEPS 8 -> 4): run refuses "
                               "it") == 8, err


def _assert_run_refuses(sweep, changed, state):
  """`sweep run` with `changed` flags exits 2 with one line naming the first job (`state`) and
  the change, before anything starts, leaving the status file as it was."""
  with open(runner.status_path(sweep.root), "rb") as f:
    before = f.read()
  rc, out, err = helpers.sweep_cli(["run", sweep.path, f"--root={sweep.root}", *changed])
  assert rc == 2 and len(err.strip().splitlines()) == 1, (out, err)
  job = sweep.jobs[0]
  assert (f"prompt-jax sweep: error: job {job.name} (and 7 more job(s)) is {state} under "
          f"another command (changed: --gin.BATCH_SIZE 8 -> 16)") in err
  assert ("give the flags it ran with again, use a new --root, or remove "
          + job.model_dir) in err
  assert " start " not in out
  with open(runner.status_path(sweep.root), "rb") as f:
    assert f.read() == before


def test_done_job_whose_configuration_changed_is_refused(fake_sweep):
  """Another binding than TRAIN_STEPS: the trainer would restore the finished run's final step,
  train nothing and record the old run's results under the new command. `run` refuses (exit 2)
  before anything starts; `plan` says so; the status file and MODEL_DIRs stay as they were."""
  sweep, tmp_path = fake_sweep
  open(tmp_path / "fixed", "w").close()
  assert runner.run(sweep, parallel=4, out=io.StringIO()) == 0
  for job in sweep.jobs:
    with open(os.path.join(job.model_dir, "config.gin"), "w") as f:
      f.write("BATCH_SIZE = 8\nTRAIN_STEPS = 4\n")
  changed = ["--gin.BATCH_SIZE=16"]
  _assert_run_refuses(sweep, changed, "done")
  for job in sweep.jobs:
    with open(os.path.join(job.model_dir, "config.gin")) as f:
      assert f.read() == "BATCH_SIZE = 8\nTRAIN_STEPS = 4\n"
  rc, out, err = helpers.sweep_cli(["plan", sweep.path, f"--root={sweep.root}", *changed])
  assert rc == 0 and out.count("(done, command changed (--gin.BATCH_SIZE 8 -> 16): run refuses "
                               "it; use a new --root or remove its MODEL_DIR)") == 8, err
  # A moved root changes every MODEL_DIR flag but no configuration: nothing to run.
  shutil.copytree(sweep.root, tmp_path / "moved")
  out = io.StringIO()
  assert runner.run(spec_lib.build(sweep.path, root=str(tmp_path / "moved")), out=out) == 0
  assert " start " not in out.getvalue()
  # A new root trains the new configuration.
  rc, out, err = helpers.sweep_cli(["run", sweep.path, f"--root={tmp_path}/other", *changed])
  assert rc == 0, (out, err)


def test_done_job_whose_model_dir_is_gone_runs_again(fake_sweep):
  sweep, tmp_path = fake_sweep
  open(tmp_path / "fixed", "w").close()
  assert runner.run(sweep, parallel=4, out=io.StringIO()) == 0
  gone = sweep.jobs[3]
  shutil.rmtree(gone.model_dir)
  os.makedirs(os.path.join(gone.model_dir, "train"))  # events the user left: moved aside
  rc, out, err = helpers.sweep_cli(["plan", sweep.path, f"--root={sweep.root}"])
  assert rc == 0 and out.count("(done, MODEL_DIR gone: run runs it again)") == 1, err
  assert f"{gone.name}  (done, MODEL_DIR gone" in out
  out = io.StringIO()
  assert runner.run(sweep, out=out) == 0
  started = [l for l in out.getvalue().splitlines() if " start " in l]
  assert len(started) == 1 and f"start {gone.name} (MODEL_DIR gone: running again; the " \
      f"earlier run's files are in {gone.model_dir}.replaced-1)" in started[0]
  assert os.listdir(gone.model_dir + ".replaced-1") == ["train"]
  assert runner.has_checkpoints(gone.model_dir)
  assert _status(sweep)[gone.name]["attempts"] == 2


def test_error_while_starting_a_job_stops_the_running_ones(slow_sweep, monkeypatch):
  """Starting job 2 raises: job 1 must not be left training, orphaned and `running`."""
  spec, root, tmp_path = slow_sweep
  sweep = spec_lib.build(spec, root=root)
  monkeypatch.setattr(runner, "POLL_SECONDS", 0.02)
  real, started = subprocess.Popen, []

  def popen(*args, **kwargs):
    if started:
      raise OSError(36, "File name too long")
    started.append(real(*args, **kwargs))
    deadline = time.time() + 60
    while not list(tmp_path.glob("*.started")):
      assert time.time() < deadline
      time.sleep(0.02)
    return started[0]
  monkeypatch.setattr(runner.subprocess, "Popen", popen)
  try:
    with pytest.raises(OSError, match="File name too long"):
      runner.run(sweep, parallel=2, out=io.StringIO(), stop_timeout=10)
    assert started[0].poll() == 143  # SIGTERM: it saved and stopped
  finally:
    if started and started[0].poll() is None:
      started[0].kill()
      started[0].wait()
  entry = _status(sweep)[sweep.jobs[0].name]
  assert entry["state"] == "pending" and entry["pid"] is None


def test_failed_job_whose_command_changed_runs_again(fake_sweep):
  """The failure belonged to the old command (here: TRAIN_STEPS below the restored step, fixed
  by raising it): the new command runs without --retry_failed."""
  sweep, tmp_path = fake_sweep
  assert runner.run(sweep, parallel=4, out=io.StringIO()) == 1
  open(tmp_path / "fixed", "w").close()
  assert runner.run(sweep, out=io.StringIO()) == 1  # same command: still failed
  # What the failed run left (its TensorBoard events, no checkpoint) is moved aside: read as
  # the new command's, its steps would fill the report's series (`best` over evaluations).
  failed = sweep.jobs[1].model_dir
  os.makedirs(os.path.join(failed, "inference_eval"))
  open(os.path.join(failed, "inference_eval", "events.out.tfevents.1.old"), "w").close()
  raised = spec_lib.build(sweep.path, root=sweep.root, overrides=[("TRAIN_STEPS", "9")])
  out = io.StringIO()
  assert runner.run(raised, parallel=4, out=out) == 0, out.getvalue()
  assert f"start {sweep.jobs[1].name} (command changed: running it; the earlier run's files " \
         f"are in {failed}.replaced-1)" in out.getvalue()
  assert os.listdir(failed) == ["checkpoints"]  # the new run's only
  assert os.path.exists(os.path.join(failed + ".replaced-1", "inference_eval",
                                     "events.out.tfevents.1.old"))
  assert not any(os.path.exists(j.model_dir + ".replaced-1") for j in sweep.jobs if
                 j.model_dir != failed)


def _interrupt(sweep, states):
  """Marks the done jobs as their runner left them when it died (`running`) or was stopped or
  preempted (`pending` after an attempt); their checkpoints stay."""
  status = runner.read_status(sweep.root)
  for job, state in zip(sweep.jobs, states):
    status["jobs"][job.name].update({"state": state, "attempts": 1, "pid": None})
  runner.write_status(sweep.root, status)


def test_interrupted_job_whose_configuration_changed_is_refused(fake_sweep):
  """As for a done job: resuming an interrupted job's checkpoint under another configuration
  would continue the old run as the new command's, so `run` refuses (exit 2) before anything
  starts; more TRAIN_STEPS alone resume it; without checkpoints the new command trains anew."""
  sweep, tmp_path = fake_sweep
  open(tmp_path / "fixed", "w").close()
  assert runner.run(sweep, parallel=4, out=io.StringIO()) == 0
  _interrupt(sweep, ["running", "pending"] * 4)
  changed = ["--gin.BATCH_SIZE=16"]
  _assert_run_refuses(sweep, changed, "interrupted")
  rc, out, err = helpers.sweep_cli(["plan", sweep.path, f"--root={sweep.root}", *changed])
  assert rc == 0 and out.count("command changed (--gin.BATCH_SIZE 8 -> 16): run refuses "
                               "it") == 8, err
  assert out.count("(running, command changed") == 4 and out.count("(pending, command") == 4
  # Only more TRAIN_STEPS: resumed from the checkpoint under the new command.
  longer = spec_lib.build(sweep.path, root=sweep.root, overrides=[("TRAIN_STEPS", "8")])
  out = io.StringIO()
  assert runner.run(longer, parallel=4, out=out) == 0
  started = [l for l in out.getvalue().splitlines() if " start " in l]
  assert len(started) == 8 and all("(command changed: resuming)" in l for l in started)
  assert all("--gin.TRAIN_STEPS=8" in e["command"] for e in _status(longer).values())
  # No checkpoint to restore: the new command trains from scratch.
  _interrupt(longer, ["running", "pending"])
  for job in sweep.jobs[:2]:
    shutil.rmtree(os.path.join(job.model_dir, "checkpoints"))
  other = spec_lib.build(sweep.path, root=sweep.root, overrides=[("BATCH_SIZE", "16")])
  entries = _status(longer)
  assert [runner.rerun_verdict(entries[j.name], j) for j in other.jobs[:3]] == [
      ("run", "command changed: running it")] * 2 + [
      ("refuse", "--gin.BATCH_SIZE 8 -> 16, --gin.TRAIN_STEPS 8 -> 4")]


def test_done_job_whose_checkpoints_were_pruned_is_kept(fake_sweep):
  """Checkpoints deleted to save disk leave the run (config.gin, evaluations): the job stays
  done. More TRAIN_STEPS cannot resume it: `run` says so instead of training it anew."""
  sweep, tmp_path = fake_sweep
  open(tmp_path / "fixed", "w").close()
  assert runner.run(sweep, parallel=4, out=io.StringIO()) == 0
  for job in sweep.jobs:
    with open(os.path.join(job.model_dir, "config.gin"), "w") as f:
      f.write("TRAIN_STEPS = 4\n")
    shutil.rmtree(os.path.join(job.model_dir, "checkpoints"))
  out = io.StringIO()
  assert runner.run(sweep, out=out) == 0 and " start " not in out.getvalue()
  rc, out, err = helpers.sweep_cli(["plan", sweep.path, f"--root={sweep.root}"])
  assert rc == 0 and out.count("  (done)\n") == 8, err
  rc, out, err = helpers.sweep_cli(["run", sweep.path, f"--root={sweep.root}",
                                    "--gin.TRAIN_STEPS=8"])
  assert rc == 2 and len(err.strip().splitlines()) == 1, (out, err)
  assert ("(changed: --gin.TRAIN_STEPS 4 -> 8, but its checkpoints are gone: nothing to resume "
          "from)") in err and " start " not in out
  assert not any(runner.has_checkpoints(j.model_dir) for j in sweep.jobs)
