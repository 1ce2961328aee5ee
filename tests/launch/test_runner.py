"""The local runner's bookkeeping with a stand-in `prompt-jax` (no training): a failed job does
not stop the others, its error line is recorded, done jobs are skipped, --retry_failed reruns,
one runner per root."""
import fcntl
import io
import json
import os
import sys

import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.launch import runner
from prompt_jax.launch import spec as spec_lib
from tests.launch import helpers

# Exits 2 with the CLI's error line for the job named in $FAKE_FAIL until $FAKE_FIXED exists.
FAKE_TRAIN = f"""#!{sys.executable}
import os, sys
print("noise before the error")
if any(a.endswith("/" + os.environ["FAKE_FAIL"] + "'") for a in sys.argv) and \\
    not os.path.exists(os.environ["FAKE_FIXED"]):
  print("prompt-jax train: error: TRAIN_STEPS=4 is below the step 9 restored from ...")
  print("trailing line")
  sys.exit(2)
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
  with open(os.path.join(sweep.root, runner.LOCK_FILE), "w") as held:
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(ConfigError, match="another `prompt-jax sweep run` is running"):
      runner.run(sweep, out=io.StringIO())
  assert not os.path.exists(runner.status_path(sweep.root))


def test_job_still_running_from_a_dead_runner_is_not_started_twice(fake_sweep):
  """The runner was SIGKILLed alone: its job lives on; a new runner must not start a second
  trainer on the same MODEL_DIR."""
  import subprocess  # pylint: disable=g-import-not-at-top
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
