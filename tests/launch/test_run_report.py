"""Acceptance 1: a 2 x 2 x 2-seed sweep on the embedded default runs end to end from one command;
SIGKILLed mid-job and re-run, done jobs are not redone and the interrupted one resumes; `sweep
report` writes report.csv, report.md and PNG figures whose data are the runs' final metrics."""
import csv
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from prompt_jax.launch import emit
from prompt_jax.launch import spec as spec_lib
from tests.launch import helpers
from tests.train import common

METRIC = "inference_eval/embedded_last_letter/accuracy"
KILLED = "PROMPT_LENGTH-8__init-uniform__seed-0"  # the 3rd job: 2 done before it


def printed_bound(x: float) -> float:
  """How far a metric's event value may lie from the trainer's printed `{x:.4f}`: half the last
  printed digit, plus float32 rounding of the event (half an ulp: |x| 2^-24; 2^-23 for margin)."""
  return 5e-5 + abs(x) * 2.0 ** -23

# `prompt-jax` as the runner finds it on PATH: the real CLI, except that in the KILLED job it
# SIGKILLs its whole process group (the sweep runner and itself, as `kill -9 -PGID` would) right
# after step 2 is saved -- once (a marker file).
KILL_SHIM = f"""#!{sys.executable}
import os, signal, sys
from prompt_jax import cli
from prompt_jax.train import checkpointing
mark = os.environ["SWEEP_TEST_KILL_MARK"]
if any(a.endswith("/{KILLED}'") for a in sys.argv) and not os.path.exists(mark):
  _export = checkpointing.export_numpy
  def export_then_kill(model_dir, step, trainable, **kw):
    out = _export(model_dir, step, trainable, **kw)
    if step == 2:
      open(mark, "w").close()
      os.killpg(os.getpgrp(), signal.SIGKILL)
    return out
  checkpointing.export_numpy = export_then_kill
sys.exit(cli.main(sys.argv[1:]))
"""


def _run_sweep(spec, root, env, *extra):
  proc = subprocess.Popen([sys.executable, "-m", "prompt_jax", "sweep", "run", spec,
                           f"--root={root}", *extra], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    out = proc.communicate(timeout=600)[0]
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  return proc.returncode, out


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("sweep")
  spec = helpers.write_spec(tmp, helpers.TINY_SPEC)
  root = str(tmp / "root")
  shim_dir = tmp / "shim"
  shim_dir.mkdir()
  helpers.write_executable(shim_dir, "prompt-jax", KILL_SHIM)
  env = helpers.job_env({"SWEEP_TEST_KILL_MARK": str(tmp / "killed")}, [str(shim_dir)])
  killed_rc, killed_out = _run_sweep(spec, root, env)
  with open(os.path.join(root, "sweep_status.json")) as f:
    after_kill = json.load(f)
  rc, out = _run_sweep(spec, root, env, "--parallel=2")
  sweep = spec_lib.build(spec, root=root)
  return {"spec": spec, "root": root, "sweep": sweep, "killed": (killed_rc, killed_out),
          "after_kill": after_kill, "rerun": (rc, out), "env": env}


def _log(root, name):
  with open(os.path.join(root, "logs", name + ".log")) as f:
    return f.read()


def test_kill_and_rerun(sweep_run):
  root, sweep = sweep_run["root"], sweep_run["sweep"]
  names = [j.name for j in sweep.jobs]
  assert names.index(KILLED) == 2
  killed_rc, killed_out = sweep_run["killed"]
  assert killed_rc == -signal.SIGKILL, killed_out[-3000:]
  states = {n: e["state"] for n, e in sweep_run["after_kill"]["jobs"].items()}
  assert [states[n] for n in names] == ["done", "done", "running"] + ["pending"] * 5
  rc, out = sweep_run["rerun"]
  assert rc == 0, out[-3000:]
  assert f"start {KILLED} (resuming)" in out
  assert sum(" start " in l for l in out.splitlines()) == 6  # the 2 done jobs are not rerun
  last = out.strip().splitlines()[-1]
  assert "8/8 done, 0 failed" in last and os.path.join(root, "sweep_status.json") in last
  status = json.load(open(os.path.join(root, "sweep_status.json")))["jobs"]
  assert all(status[n]["state"] == "done" for n in names)
  assert {n: status[n]["attempts"] for n in names} == {n: 2 if n == KILLED else 1 for n in names}
  for name in names[:2]:  # done before the kill: trained once, untouched by the re-run
    log = _log(root, name)
    assert log.count("=== sweep tiny: attempt") == 1 and log.count("training steps 0 -> 4") == 1
  log = _log(root, KILLED)
  assert log.count("training steps 0 -> 4") == 1  # the first attempt, killed after step 2
  assert "restored step 2" in log and "training steps 2 -> 4" in log
  assert os.path.exists(os.path.join(root, KILLED, "numpy_checkpoints", "checkpoint_4"))


def test_report_holds_the_final_metrics(sweep_run):
  root, sweep = sweep_run["root"], sweep_run["sweep"]
  rc, out, err = helpers.sweep_cli(["report", sweep_run["spec"], f"--root={root}"])
  assert rc == 0, err
  report_dir = os.path.join(root, "report")
  assert os.path.join(report_dir, "report.md") in out.strip().splitlines()[-1]
  # What each job printed at its end (4 decimals; see printed_bound).
  printed = {j.name: helpers.final_metrics(os.path.join(root, "logs", j.name + ".log"))[METRIC]
             for j in sweep.jobs}
  with open(os.path.join(report_dir, "report.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [r["job"] for r in rows] == [j.name for j in sweep.jobs]
  for row, job in zip(rows, sweep.jobs):
    assert (row["PROMPT_LENGTH"], row["init"], row["seed"]) == (
        job.values["PROMPT_LENGTH"], job.values["init"], str(job.seed))
    assert row["state"] == "done" and row["step"] == "4" and row["metric"] == METRIC
    assert abs(float(row["final"]) - printed[job.name]) <= printed_bound(printed[job.name])
    assert row["final"] == row[f"final/{METRIC}"]
    assert float(row["final/train/loss"]) > 0

  # The figure "metric vs prompt length, a line per init": its data read back from the plot.
  with open(os.path.join(report_dir, "PROMPT_LENGTH_by_init.csv")) as f:
    plotted = list(csv.DictReader(f))
  assert [(p["line"], p["x"]) for p in plotted] == [
      ("uniform", "4"), ("uniform", "8"), ("from_class_labels", "4"), ("from_class_labels", "8")]
  final = {r["job"]: float(r["final"]) for r in rows}
  for p in plotted:
    seeds = [final[f"PROMPT_LENGTH-{p['x']}__init-{p['line']}__seed-{s}"] for s in (0, 1)]
    assert int(p["n"]) == 2 and float(p["x_position"]) == float(p["x"])
    # The drawn point and error bar: float64 mean and sample std of the float32 event values
    # (drawn through matplotlib's float64 arrays: a few ulps).
    np.testing.assert_allclose(float(p["mean"]), np.mean(seeds), rtol=1e-12)
    np.testing.assert_allclose(float(p["std"]), np.std(seeds, ddof=1), rtol=1e-9, atol=1e-12)
    # And against the printed values: each within e = printed_bound, so the mean within e too
    # and the std of two values, |a - b| / sqrt(2), within 2 e / sqrt(2).
    logged = [printed[f"PROMPT_LENGTH-{p['x']}__init-{p['line']}__seed-{s}"] for s in (0, 1)]
    e = max(printed_bound(v) for v in logged)
    assert abs(float(p["mean"]) - np.mean(logged)) <= e
    assert abs(float(p["std"]) - np.std(logged, ddof=1)) <= 2 * e / np.sqrt(2)
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  for stem in ("PROMPT_LENGTH_by_init", "init_by_PROMPT_LENGTH"):
    png = os.path.join(report_dir, stem + ".png")
    with open(png, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200
    assert image.std() > 0.01  # not blank
  with open(os.path.join(report_dir, "report.md")) as f:
    md = f.read()
  assert all(j.name in md for j in sweep.jobs)
  assert "![" in md and "(PROMPT_LENGTH_by_init.png)" in md
  assert f"| 4 | uniform | 2 | {np.mean([final[f'PROMPT_LENGTH-4__init-uniform__seed-{s}'] for s in (0, 1)]):.4f} ± " in md


def test_emitted_eval_job_reproduces_the_training_metric(sweep_run):
  """The per-prompt eval job of a group (here: the resumed job) evaluates its final checkpoint
  to the metric its training run printed (same checkpoint, same evaluation program)."""
  sweep = sweep_run["sweep"]
  job = next(j for j in sweep.jobs if j.name == KILLED)
  job.train_steps = 4  # what validate_gin finds from TRAIN_STEPS
  group = sweep.groups()[job.group]
  args = emit.group_eval_commands(sweep, group)[group.index(job)]
  proc = common.cli_subprocess(args)
  assert proc.returncode == 0, proc.stdout[-3000:]
  got = [l for l in proc.stdout.splitlines() if l.startswith("final metrics: ")][-1]
  printed = helpers.final_metrics(os.path.join(sweep_run["root"], "logs", KILLED + ".log"))
  assert got == f"final metrics: embedded_last_letter/accuracy={printed[METRIC]:.4f}"
