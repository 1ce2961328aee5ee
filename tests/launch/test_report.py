"""`sweep report` on given metrics (no training): every figure of the spec gets its own files."""
import csv
import os

from prompt_jax.launch import report
from prompt_jax.launch import spec as spec_lib
from tests.launch import helpers

SPEC = """\
gin_files: [runs/embedded_default.gin]
axes:
  PROMPT_LENGTH: [4, 8]
seeds: [0, 1]
report:
  figures:
    - {x: PROMPT_LENGTH, metric: "inference_eval/*/accuracy"}
    - {x: PROMPT_LENGTH, metric: "train/loss"}
    - {x: PROMPT_LENGTH, metric: "train/loss"}
"""


def test_figures_of_the_same_axes_do_not_overwrite_each_other(tmp_path, monkeypatch):
  spec = helpers.write_spec(tmp_path, SPEC)
  sweep = spec_lib.build(spec, root=str(tmp_path / "root"))

  def fake_series(model_dir):
    n = float(os.path.basename(model_dir).split("__")[0].split("-")[1])
    return {"inference_eval/t/accuracy": {4: n / 10}, "train/loss": {4: 100 + n}}
  monkeypatch.setattr(report, "read_series", fake_series)
  out = report.write(sweep)
  paths = [f.path for f in out["figures"]]
  assert len(paths) == 3 and len(set(paths)) == 3 and all(os.path.isfile(p) for p in paths)
  for fig in out["figures"]:
    with open(fig.path[:-len(".png")] + ".csv") as f:
      means = [float(r["mean"]) for r in csv.DictReader(f)]
    assert means == ([0.4, 0.8] if fig.metric.startswith("inference_eval") else [104, 108])
  with open(out["md"]) as f:
    md = f.read()
  assert all(os.path.basename(p) in md for p in paths)


def test_unfinished_jobs_stay_out_of_the_means(tmp_path, monkeypatch):
  """A running or failed job's mid-run value is not averaged with the finished seeds' (it is in
  the jobs table, with its state)."""
  from prompt_jax.launch import runner  # pylint: disable=g-import-not-at-top
  spec = helpers.write_spec(tmp_path, SPEC)
  sweep = spec_lib.build(spec, root=str(tmp_path / "root"))
  states = {job.name: runner.DONE for job in sweep.jobs}
  mid_run = [j.name for j in sweep.jobs if j.values["PROMPT_LENGTH"] == "4" and j.seed == 1][0]
  states[mid_run] = runner.RUNNING
  monkeypatch.setattr(runner, "read_status", lambda root: {
      "jobs": {name: {"state": state} for name, state in states.items()}})

  def fake_series(model_dir):  # seed 0: 0.4 / 0.8; seed 1: 0.6 / 1.0 (the running one: 0.0)
    name = os.path.basename(model_dir)
    n = float(name.split("__")[0].split("-")[1])
    seed = int(name.rsplit("-", 1)[1])
    value = 0.0 if name == mid_run else n / 10 + 0.2 * seed
    return {"inference_eval/t/accuracy": {4: value}, "train/loss": {4: 1.0}}
  monkeypatch.setattr(report, "read_series", fake_series)
  out = report.write(sweep)
  fig = next(f for f in out["figures"] if f.metric.startswith("inference_eval"))
  means = {r["x"]: (r["mean"], r["n"]) for r in fig.rows}
  assert means["4"][1] == 1 and abs(means["4"][0] - 0.4) < 1e-12, means
  assert means["8"][1] == 2 and abs(means["8"][0] - 0.9) < 1e-12, means
  with open(out["md"]) as f:
    md = f.read()
  assert "in the Jobs table): 1." in md and mid_run in md
