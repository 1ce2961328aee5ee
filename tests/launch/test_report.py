"""`sweep report` on given metrics (no training): every figure of the spec gets its own files."""
import csv
import os

import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.launch import report
from prompt_jax.launch import spec as spec_lib
from tests.launch import helpers

SPEC = """\
gin_files: [runs/embedded_default.gin]
bindings: {TRAIN_STEPS: 4}
axes:
  PROMPT_LENGTH: [4, 8]
seeds: [0, 1]
report:
  figures:
    - {x: PROMPT_LENGTH, metric: "inference_eval/*/accuracy"}
    - {x: PROMPT_LENGTH, metric: "train/loss"}
    - {x: PROMPT_LENGTH, metric: "train/loss"}
"""


def _sweep(spec, tmp_path):
  """The sweep of `spec` under tmp_path/root, which exists (its jobs ran there)."""
  sweep = spec_lib.build(spec, root=str(tmp_path / "root"))
  os.makedirs(sweep.root)
  return sweep


def test_figures_of_the_same_axes_do_not_overwrite_each_other(tmp_path, monkeypatch):
  spec = helpers.write_spec(tmp_path, SPEC)
  sweep = _sweep(spec, tmp_path)

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

  # A report that fails while drawing (a full disk, a kill) leaves the last one's figures whole.
  before = {p: open(p, "rb").read() for p in paths}
  def failing_savefig(fig, path, **kwargs):
    del fig, kwargs
    with open(path, "wb") as f:
      f.write(b"\x89PNG half")
    raise OSError(28, "No space left on device")
  from matplotlib import figure as mpl_figure  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(mpl_figure.Figure, "savefig", failing_savefig)
  with pytest.raises(OSError):
    report.write(sweep)
  assert {p: open(p, "rb").read() for p in paths} == before


def test_unfinished_jobs_stay_out_of_the_means(tmp_path, monkeypatch):
  """A running or failed job's mid-run value is not averaged with the finished seeds' (it is in
  the jobs table, with its state)."""
  from prompt_jax.launch import runner  # pylint: disable=g-import-not-at-top
  spec = helpers.write_spec(tmp_path, SPEC)
  sweep = _sweep(spec, tmp_path)
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


def _fake_runs(monkeypatch, series_of):
  """report.read_series -> series_of(job name); no status file (the sweep ran from emitted
  scripts)."""
  monkeypatch.setattr(report, "read_series", lambda d: series_of(os.path.basename(d)))


def test_without_a_status_file_a_run_short_of_train_steps_is_incomplete(tmp_path, monkeypatch):
  """Emitted scripts write no status file: a job that crashed at step 1 of 4 has events too,
  but its values are not a finished run's."""
  spec = helpers.write_spec(tmp_path, SPEC)
  sweep = _sweep(spec, tmp_path)
  crashed = sweep.jobs[0]  # PROMPT_LENGTH 4, seed 0
  saved = sweep.jobs[2]  # PROMPT_LENGTH 4, seed 1: no train event at 4, but its last checkpoint
  os.makedirs(os.path.join(saved.model_dir, "checkpoints", "4"))

  def series_of(name):
    if name == crashed.name:
      return {"inference_eval/t/accuracy": {1: 0.0}, "train/loss": {1: 9.0}}
    n = float(name.split("__")[0].split("-")[1])
    return {"inference_eval/t/accuracy": {4: n / 10},
            "train/loss": {3 if name == saved.name else 4: 1.0}}
  _fake_runs(monkeypatch, series_of)
  out = report.write(sweep)
  states = {r["job"]: r["state"] for r in out["rows"]}
  assert states[crashed.name] == "incomplete"
  assert all(s == "done?" for n, s in states.items() if n != crashed.name)
  fig = next(f for f in out["figures"] if f.metric.startswith("inference_eval"))
  means = {r["x"]: (r["mean"], r["n"]) for r in fig.rows}
  assert means["4"] == (0.4, 1) and means["8"] == (0.8, 2), means
  with open(out["md"]) as f:
    md = f.read()
  assert "| PROMPT_LENGTH-4__seed-0 | incomplete |" in md
  assert "| 4 | 1 | 0.4000 | 0.4000 |" in md


def test_one_metric_per_table_and_figure(tmp_path, monkeypatch):
  """A job without inference_eval/*/accuracy is left empty, not shown (and averaged) with its
  train/loss in place of the others' accuracies."""
  spec = helpers.write_spec(tmp_path, SPEC.split("report:")[0])
  sweep = _sweep(spec, tmp_path)
  lacking = sweep.jobs[1]  # PROMPT_LENGTH 8, seed 0

  def series_of(name):
    n = float(name.split("__")[0].split("-")[1])
    out = {"train/loss": {4: 100 + n}}
    if name != lacking.name:
      out["inference_eval/t/accuracy"] = {4: n / 10}
    return out
  _fake_runs(monkeypatch, series_of)
  out = report.write(sweep)
  rows = {r["job"]: r for r in out["rows"]}
  assert rows[lacking.name]["metric"] == "" and rows[lacking.name]["final"] == ""
  assert all(r["metric"] == "inference_eval/t/accuracy" for n, r in rows.items()
             if n != lacking.name)
  [fig] = out["figures"]
  assert fig.metric == "inference_eval/t/accuracy"
  means = {r["x"]: (r["mean"], r["n"]) for r in fig.rows}
  assert means == {"4": (0.4, 2), "8": (0.8, 1)}, means
  with open(out["md"]) as f:
    md = f.read()
  assert "| 8 | 1 | 0.8000 | 0.8000 |" in md


def test_eval_jobs_results_reach_the_report(tmp_path):
  """`prompt-jax eval` of the emitted eval jobs writes MODEL_DIR/eval/inference_eval/<task>:
  `eval/<task>/<metric>` columns (and a metric `--metric` can name)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tensorboard.compat.proto import event_pb2, summary_pb2  # pylint: disable=g-import-not-at-top
  from tensorboard.summary.writer.event_file_writer import EventFileWriter  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  spec = helpers.write_spec(tmp_path, SPEC.split("report:")[0]
                            + "report: {metric: eval/*/accuracy}\n")
  sweep = _sweep(spec, tmp_path)

  def write(logdir, step, tag, value):
    w = EventFileWriter(logdir)
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(value)))])
    w.add_event(event_pb2.Event(step=step, wall_time=1.0, summary=summary))
    w.close()
  for i, job in enumerate(sweep.jobs):
    write(os.path.join(job.model_dir, "train"), 4, "train/loss", 1.0)
    write(os.path.join(job.model_dir, "eval", "inference_eval", "t"), 4, "accuracy", 50.0 + i)
  out = report.write(sweep)
  assert [r["final"] for r in out["rows"]] == [50.0, 51.0, 52.0, 53.0]
  assert all(r["metric"] == "eval/t/accuracy" and r["final/eval/t/accuracy"] != ""
             for r in out["rows"])


def test_without_a_status_file_a_run_killed_in_its_final_evaluation_is_incomplete(tmp_path):
  """The trainer writes the last step's train summaries and checkpoint before the last step's
  evaluation (EVAL_PERIOD > 0 always evaluates it): a run killed there, or still evaluating, has
  the previous evaluation as its last, not a final one. A separate eval job's `eval/` series
  is not the run's own."""
  from prompt_jax.train import summaries  # pylint: disable=g-import-not-at-top
  spec = helpers.write_spec(tmp_path, SPEC.split("report:")[0].replace(
      "{TRAIN_STEPS: 4}", "{TRAIN_STEPS: 4, EVAL_PERIOD: 2}"))
  sweep = _sweep(spec, tmp_path)
  killed, killed_tf = sweep.jobs[0], sweep.jobs[1]
  for job in sweep.jobs:
    os.makedirs(os.path.join(job.model_dir, "checkpoints", "4"))
    for step in (2, 4):
      summaries.writer(job.model_dir, "train").write_scalars(step, {"train/loss": 1.0 / step})
      if step == 2 or job is not killed:
        summaries.writer(job.model_dir, "inference_eval", "t").write_scalars(
            step, {"eval/accuracy": 0.1 * step})
      if step == 2 or job is not killed_tf:
        summaries.writer(job.model_dir, "training_eval", "t").write_scalars(
            step, {"eval/loss": 1.0 / step})
    summaries.writer(job.model_dir, "eval", "inference_eval", "t").write_scalars(
        2, {"eval/accuracy": 0.5})  # an eval job of checkpoint 2: not the run's own
  states = {r.job.name: r.state for r in report.collect(sweep)}
  assert states[killed.name] == states[killed_tf.name] == "incomplete", states
  assert [states[j.name] for j in sweep.jobs[2:]] == ["done?", "done?"], states
  # EVAL_PERIOD 0: evaluated at most before training, nothing at the last step to wait for.
  no_eval = spec_lib.build(spec, root=sweep.root, overrides=[("EVAL_PERIOD", "0")])
  assert report.reached_end(no_eval.jobs[0], {"train/loss": {4: 1.0},
                                              "inference_eval/t/accuracy": {0: 0.1}})


def test_best_skips_non_finite_values():
  """A NaN first evaluation (max/min keep a leading NaN) or an inf loss is never `best`."""
  nan, inf = float("nan"), float("inf")
  r = report.JobResult(job=None, state="done", error=None, series={
      "inference_eval/t/accuracy": {1: nan, 2: 0.6, 3: 0.7, 4: nan},
      "train/loss": {1: nan, 2: 0.5, 3: inf, 4: 0.4},
      "training_eval/t/loss": {1: nan, 2: -inf}})
  assert r.best("inference_eval/t/accuracy") == (3, 0.7)
  assert r.best("train/loss") == (4, 0.4)
  assert r.best("training_eval/t/loss") is None  # as a metric the job lacks
  assert r.final("inference_eval/t/accuracy")[0] == 4  # final stays the last step's value


def test_a_root_where_nothing_ran_is_refused_not_created(tmp_path):
  """`sweep report` on a mistyped --root said `0/4 jobs with metrics` and created the root with
  an empty report: one line naming the root and what to do, nothing created, exit 2."""
  spec = helpers.write_spec(tmp_path, SPEC)
  root = tmp_path / "no_such_root"
  rc, out, err = helpers.sweep_cli(["report", spec, f"--root={root}"])
  assert rc == 2, (out, err)
  assert err.strip() == (
      f"prompt-jax sweep: error: sweep root {root} does not exist: no job of this sweep ran "
      f"there; give the --root its jobs ran under, or run them first: prompt-jax sweep run "
      f"{spec} --root={root}")
  assert not root.exists()


@pytest.mark.parametrize("metric, expected", [
    ("inference_eval/*/acuracy", "did you mean inference_eval/t/accuracy?"),
    ("f1", "(they have inference_eval/t/accuracy; a pattern may use * and ?)"),
])
def test_a_metric_no_job_has_keeps_the_last_report(tmp_path, monkeypatch, metric, expected):
  """A mistyped --metric wrote report.md/csv over the good ones with empty tables (exit 0): it
  is one line with the metrics the jobs have, and the last report stays."""
  spec = helpers.write_spec(tmp_path, SPEC.split("report:")[0])
  sweep = _sweep(spec, tmp_path)
  monkeypatch.setattr(report, "read_series", lambda d: {
      "inference_eval/t/accuracy": {4: 0.5}, "train/loss": {4: 1.0}})
  out = report.write(sweep)
  with open(out["md"]) as f:
    good = f.read()
  assert "| 4 | 2 | 0.5000 ± 0.0000 |" in good
  with pytest.raises(ConfigError) as e:
    report.write(sweep, metric=metric)
  assert str(e.value).startswith(f"--metric {metric!r} matches none of the jobs' metrics")
  assert expected in str(e.value)
  with open(out["md"]) as f:
    assert f.read() == good
  # A spec's report.metric is named as such.
  with pytest.raises(ConfigError, match=r"^report.metric 'f1' matches none"):
    report.write(spec_lib.build(helpers.write_spec(
        tmp_path, SPEC.split("report:")[0] + "report: {metric: f1}\n", "other.yaml"),
        root=sweep.root))


@pytest.mark.parametrize("command", ["plan", "run", "report"])
def test_a_file_in_the_way_of_the_root_is_one_line(tmp_path, command):
  """A --root (or a directory above it) that is a file: one line naming --root, exit 2 (was a
  NotADirectoryError, exit 1, after the runner had started)."""
  spec = helpers.write_spec(tmp_path, SPEC.split("report:")[0])
  in_the_way = tmp_path / "a_file"
  in_the_way.write_text("")
  for root in (in_the_way, in_the_way / "root"):
    rc, out, err = helpers.sweep_cli([command, spec, f"--root={root}"])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (out, err)
    if command == "report" and root != in_the_way:  # (nothing can have run there)
      assert lines[0].startswith(f"prompt-jax sweep: error: sweep root {root} does not exist")
    else:
      assert lines[0].startswith("prompt-jax sweep: error: --root"), err
      assert str(in_the_way) in lines[0] and "choose another" in lines[0], err
    assert "Traceback" not in err


def test_a_file_in_the_way_of_the_report_out_dir_is_one_line(tmp_path, monkeypatch):
  spec = helpers.write_spec(tmp_path, SPEC.split("report:")[0])
  sweep = _sweep(spec, tmp_path)
  monkeypatch.setattr(report, "read_series", lambda d: {"inference_eval/t/accuracy": {4: 0.5}})
  in_the_way = tmp_path / "a_file"
  in_the_way.write_text("")
  with pytest.raises(ConfigError, match=r"^--out: cannot create the directory .*a_file/r "
                                        r"\(Not a directory\); choose another place$"):
    report.write(sweep, out_dir=str(in_the_way / "r"))
