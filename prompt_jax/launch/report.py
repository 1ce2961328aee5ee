"""`prompt-jax sweep report`: each job's final and best metrics -> report.csv, report.md, figures.

Metrics come from the TensorBoard event files the trainer writes under MODEL_DIR/{train,
training_eval,inference_eval} (read with tensorboard's event loader; gs:// works where TensorFlow
does). Names: `train/<tag>`, `training_eval/<task>/<metric>`, `inference_eval/<task>/<metric>` (as
the trainer's "final metrics:" line), and `eval/<task>/<metric>` for what the emitted eval jobs
(`prompt-jax eval`, MODEL_DIR/eval) wrote. A resumed run may have written a step twice: the later
write wins. "final" is the value at the last step, "best" the max (min for losses) of the finite
values. One metric serves a whole table or figure (the first pattern any finished job matches); a
job without it is left empty there, never shown with another metric.

Without a status file (a sweep run from emitted scripts) a job with metrics counts as finished
('done?') only if its train series reaches TRAIN_STEPS or checkpoints/<TRAIN_STEPS> exists, and
its training-time evaluations (inference_eval/, training_eval/) reach TRAIN_STEPS too (the final
evaluation comes after the last checkpoint); else it is 'incomplete' and stays out of the means.

Figures follow Lester et al. (2021) Figure 3: the metric against one axis (`x`), one line per
value of another (`lines`), a point = mean over the finished jobs there (the seeds, and any
axis on neither; a running, failed, pending or incomplete job's values are left out), error bars =
their sample standard deviation. Each PNG has a CSV beside it holding the
data read back from the drawn lines.
"""
import csv
import dataclasses
import fnmatch
import itertools
import math
import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from prompt_jax import console
from prompt_jax.errors import ConfigError, did_you_mean, make_dirs
from prompt_jax.launch import runner
from prompt_jax.launch import spec as spec_lib

# (directory under MODEL_DIR, the name its metrics get): `prompt-jax eval` of a sweep's emitted
# eval jobs writes under MODEL_DIR/eval.
SUMMARY_DIRS = (("train", "train"), ("training_eval", "training_eval"),
                ("inference_eval", "inference_eval"), ("eval/inference_eval", "eval"))
INCOMPLETE = "incomplete"  # no status file, and its run did not reach TRAIN_STEPS
DEFAULT_METRICS = ("inference_eval/*/accuracy", "inference_eval/*", "training_eval/*accuracy",
                   "train/loss")


@dataclasses.dataclass
class JobResult:
  job: spec_lib.Job
  state: str
  error: Optional[str]
  series: Dict[str, Dict[int, float]]  # metric -> step -> value

  def final(self, name: str) -> Optional[Tuple[int, float]]:
    s = self.series.get(name)
    if not s:
      return None
    step = max(s)
    return step, s[step]

  def best(self, name: str) -> Optional[Tuple[int, float]]:
    """The best finite value (a NaN or inf evaluation is never best); None if there is none."""
    s = {step: v for step, v in (self.series.get(name) or {}).items() if math.isfinite(v)}
    if not s:
      return None
    pick = min if "loss" in name.rsplit("/", 1)[-1] else max
    return pick(sorted(s.items()), key=lambda kv: kv[1])  # the earliest step on ties

  @property
  def finished(self) -> bool:
    """Its values are its run's last: done by the status file, or without one ('done?') its run
    reached TRAIN_STEPS. A running, failed, pending or incomplete job's values are mid-run."""
    return self.state in (runner.DONE, "done?")

  @property
  def step(self) -> Optional[int]:
    train = [max(v) for k, v in self.series.items() if k.startswith("train/") and v]
    return max(train) if train else None


@dataclasses.dataclass
class FigureData:
  """What a figure shows, read back from its drawn lines."""
  path: str
  x: str
  lines_axis: Optional[str]
  metric: str
  rows: List[Dict]  # {line, x, x_position, mean, std, n, values}


def _gfile():
  from tensorboard.compat import tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def read_series(model_dir: str) -> Dict[str, Dict[int, float]]:
  """metric name -> {step: value} from a run's event files (the latest write of a step wins)."""
  from tensorboard.backend.event_processing import event_file_loader  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  gfile = _gfile()
  latest: Dict[Tuple[str, int], Tuple[float, float]] = {}
  for sub, prefix in SUMMARY_DIRS:
    base = spec_lib.join(model_dir, *sub.split("/"))
    if not gfile.isdir(base):
      continue
    for dirpath, _, files in gfile.walk(base):
      rel = prefix + dirpath[len(base):].replace(os.sep, "/").rstrip("/")
      for f in sorted(files):
        if "tfevents" not in f:
          continue
        for event in event_file_loader.EventFileLoader(spec_lib.join(dirpath, f)).Load():
          for v in event.summary.value:
            if sub == "train":
              if not v.tag.startswith("train/"):
                continue  # learning rate, timing
              name = v.tag
            else:
              name = rel + "/" + (v.tag.split("/", 1)[1] if v.tag.startswith("eval/") else v.tag)
            if v.HasField("tensor"):
              value = float(tensor_util.make_ndarray(v.tensor))
            else:
              value = float(v.simple_value)
            key = (name, int(event.step))
            if key not in latest or event.wall_time >= latest[key][0]:
              latest[key] = (event.wall_time, value)
  series: Dict[str, Dict[int, float]] = {}
  for (name, step), (_, value) in sorted(latest.items()):
    series.setdefault(name, {})[step] = value
  return series


def _run_int(job: spec_lib.Job, macro: str) -> Optional[int]:
  """The integer macro `macro` of the job: from its bindings (the last one), else the run's
  MODEL_DIR/config.gin; None if neither gives one (no config.gin, or unreadable)."""
  for k, v in reversed(job.bindings):
    if k == macro:
      try:
        return int(v.strip())
      except ValueError:
        break
  try:
    with _gfile().GFile(spec_lib.join(job.model_dir, "config.gin")) as f:
      m = re.search(rf"^{macro}\s*=\s*(\d+)\s*$", f.read(), re.M)
    return int(m.group(1)) if m else None
  except Exception:  # pylint: disable=broad-except
    return None


def train_steps(job: spec_lib.Job) -> Optional[int]:
  """The steps the job trains: from its gin config (validated), its bindings, else the run's
  MODEL_DIR/config.gin (None: not known to have finished)."""
  if job.train_steps is not None:
    return job.train_steps
  return _run_int(job, "TRAIN_STEPS")


def reached_end(job: spec_lib.Job, series: Mapping[str, Mapping[int, float]]) -> bool:
  """Its train series reaches TRAIN_STEPS, or checkpoints/<TRAIN_STEPS> exists; and so does
  each of its training-time evaluations (`inference_eval/`, `training_eval/`): the trainer
  writes the last step's summaries and checkpoint before its final evaluation, so a run killed
  (or still running) there has not finished. With EVAL_PERIOD 0 the trainer evaluates at most
  before training; with it unknown, a series that evaluated after step 0 must reach the end."""
  steps = train_steps(job)
  if steps is None:
    return False
  period = _run_int(job, "EVAL_PERIOD")
  for k, v in series.items():
    if k.startswith(("inference_eval/", "training_eval/")) and v and max(v) < steps and \
        (period or (period is None and max(v) > 0)):
      return False
  if any(k.startswith("train/") and v and max(v) >= steps for k, v in series.items()):
    return True
  try:
    return _gfile().exists(spec_lib.join(job.model_dir, "checkpoints", str(steps)))
  except Exception:  # pylint: disable=broad-except
    return False


def collect(sweep: spec_lib.Sweep) -> List[JobResult]:
  status = runner.read_status(sweep.root).get("jobs", {}) if sweep.local else {}
  results = []
  for job in sweep.jobs:
    series = read_series(job.model_dir)
    entry = status.get(job.name, {})
    state = entry.get("state")
    if not state:  # no status (a sweep run from emitted scripts): judge by what it wrote
      state = ("done?" if reached_end(job, series) else INCOMPLETE) if series else "pending"
    results.append(JobResult(job, state, entry.get("error"), series))
  return results


def choose_metric(patterns: Sequence[str], results: Sequence["JobResult"]) -> Optional[str]:
  """One metric for a whole table or figure: the first pattern any finished job matches (else,
  no job finished, any job). A job without it is left empty: never another metric in its place."""
  for pool in ([r for r in results if r.finished], results):
    name = pick_metric(patterns, sorted({n for r in pool for n in r.series}))
    if name:
      return name
  return None


def pick_metric(patterns: Sequence[str], names: Sequence[str]) -> Optional[str]:
  for pattern in patterns:
    hits = sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))
    if hits:
      return hits[0]
  return None


def _mean_std(values: Sequence[float]) -> Tuple[float, float]:
  mean = sum(values) / len(values)
  if len(values) < 2:
    return mean, 0.0
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _fmt(v: Optional[float]) -> str:
  return "" if v is None else f"{v:.4f}"


def _safe(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("_")


def figure(sweep: spec_lib.Sweep, results: Sequence[JobResult], fig_spec: Mapping,
           patterns: Sequence[str], out_dir: str,
           used_stems: Optional[set] = None) -> Optional[FigureData]:
  """One design-decision figure (PNG + CSV of the plotted data); None without data.
  `used_stems`: the file names the report's other figures took (added to)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  axes = {a.name: a for a in sweep.axes}
  x_axis = axes[fig_spec["x"]]
  lines_name = fig_spec.get("lines")
  others = [a.name for a in sweep.axes if a.name != x_axis.name]
  line_axes = [lines_name] if lines_name else others
  value_kind = fig_spec.get("value", "final")
  patterns = [fig_spec["metric"]] if fig_spec.get("metric") else list(patterns)
  x_values = fig_spec.get("x_values") or {}
  numeric = all(_number(l) is not None for l in x_axis.labels) or bool(x_values)

  def x_position(label: str, index: int) -> float:
    if label in x_values:
      return float(x_values[label])
    return _number(label) if numeric else float(index)

  points: Dict[str, Dict[str, List[float]]] = {}
  name = choose_metric(patterns, results)
  for r in results:
    if not r.finished:  # a mid-run value would pull the mean of the finished seeds
      continue
    got = (r.final if value_kind == "final" else r.best)(name) if name else None
    if got is None:  # it lacks the figure's metric: no point (another metric is no substitute)
      continue
    line = _line_label(line_axes, r.job.values)
    points.setdefault(line, {}).setdefault(r.job.values[x_axis.name], []).append(got[1])
  if not points:
    return None
  line_order = _line_order(sweep, line_axes)
  fig = Figure(figsize=(6.4, 4.6))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  rows = []
  for line in sorted(points, key=lambda l: line_order.get(l, len(line_order))):
    labels = [l for l in x_axis.labels if l in points[line]]
    xs = [x_position(l, x_axis.labels.index(l)) for l in labels]
    stats = [_mean_std(points[line][l]) for l in labels]
    container = ax.errorbar(xs, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o",
                            capsize=3, label=line if line_axes else None)
    drawn_x, drawn_y = container.lines[0].get_xdata(), container.lines[0].get_ydata()
    segments = container.lines[2][0].get_segments() if container.lines[2] else []
    for i, label in enumerate(labels):
      std = (segments[i][1][1] - segments[i][0][1]) / 2 if segments else 0.0
      rows.append({"line": line, "x": label, "x_position": float(drawn_x[i]),
                   "mean": float(drawn_y[i]), "std": float(std), "n": len(points[line][label]),
                   "values": ";".join(repr(v) for v in points[line][label])})
  metric = name
  if fig_spec.get("log_x"):
    ax.set_xscale("log")
    ax.minorticks_off()
  ax.set_xticks([x_position(l, i) for i, l in enumerate(x_axis.labels)], x_axis.labels)
  ax.set_xlabel(fig_spec.get("x_label") or x_axis.name)
  ax.set_ylabel(f"{metric} ({value_kind})")
  ax.set_title(fig_spec.get("title") or f"{sweep.name}: {metric} vs {x_axis.name}", fontsize=9)
  if line_axes:
    ax.legend(title=", ".join(line_axes), fontsize=8)
  ax.grid(alpha=0.3)
  stem = _stem(x_axis.name, line_axes, fig_spec, used_stems if used_stems is not None else set())
  path = os.path.join(out_dir, stem + ".png")
  with console.missing_glyphs_quiet():  # (labels of the user's own values)
    fig.tight_layout()
    fig.savefig(path + ".tmp", dpi=110, format="png")  # (each file whole or not at all)
  os.replace(path + ".tmp", path)
  csv_path = os.path.join(out_dir, stem + ".csv")
  with open(csv_path + ".tmp", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  os.replace(csv_path + ".tmp", csv_path)
  return FigureData(path, x_axis.name, lines_name, metric, rows)


def _stem(x: str, line_axes: Sequence[str], fig_spec: Mapping, used: set) -> str:
  """`<x>_by_<lines>[_<metric>][_best]`, numbered from _2 if another figure has it: two figures
  of the same axes must not overwrite each other's PNG and CSV."""
  stem = _safe(f"{x}_by_{'_'.join(line_axes) or 'all'}"
               + (f"_{fig_spec['metric']}" if fig_spec.get("metric") else "")
               + ("_best" if fig_spec.get("value") == "best" else ""))
  base, n = stem, 2
  while stem in used:
    stem, n = f"{base}_{n}", n + 1
  used.add(stem)
  return stem


def _line_order(sweep: spec_lib.Sweep, line_axes: Sequence[str]) -> Dict[str, int]:
  axes = {a.name: a for a in sweep.axes}
  combos = itertools.product(*[axes[a].labels for a in line_axes])
  return {_line_label(line_axes, dict(zip(line_axes, c))): i for i, c in enumerate(combos)}


def _line_label(line_axes: Sequence[str], values: Mapping[str, str]) -> str:
  if not line_axes:
    return "all"
  if len(line_axes) == 1:
    return values[line_axes[0]]
  return ", ".join(f"{a}={values[a]}" for a in line_axes)


def _number(label: str) -> Optional[float]:
  try:
    return float(label)
  except ValueError:
    return None


def default_figures(sweep: spec_lib.Sweep) -> List[Dict]:
  """One figure per axis with more than one value: the metric against it, a line per
  combination of the other axes."""
  return [{"x": a.name} for a in sweep.axes if len(a.choices) > 1]


def write(sweep: spec_lib.Sweep, out_dir: Optional[str] = None,
          metric: Optional[str] = None) -> Dict[str, object]:
  """Writes report.csv, report.md and the figures; returns their paths and the figure data."""
  out_dir = out_dir or (spec_lib.join(sweep.root, "report") if sweep.local
                        else os.path.abspath(os.path.join("sweep_runs", sweep.name, "report")))
  if sweep.local and not os.path.exists(sweep.root):
    raise ConfigError(f"sweep root {sweep.root} does not exist: no job of this sweep ran there; "
                      f"give the --root its jobs ran under, or run them first: "
                      f"{sweep.command('run')}")
  results = collect(sweep)
  source = "--metric" if metric else "report.metric"
  metric = metric or sweep.report.get("metric")
  patterns = [metric] if metric else list(DEFAULT_METRICS)
  every = sorted({n for r in results for n in r.series})
  all_names = [n for n in every if not n.startswith("train/") or n == "train/loss"]
  axis_names = [a.name for a in sweep.axes]
  chosen = choose_metric(patterns, results)
  if metric and chosen is None and every:  # (no job has written metrics yet: nothing to check)
    raise ConfigError(f"{source} {metric!r} matches none of the jobs' metrics"
                      f"{did_you_mean(metric, every)} (they have "
                      f"{', '.join([n for n in every if not n.startswith('train/')] or every)}"
                      f"; a pattern may use * and ?)")
  make_dirs(out_dir, "--out")  # (after the checks: a refused report keeps the last one)

  # report.csv: one row per job.
  header = ["job", *axis_names, *spec_lib.REPORT_COLUMNS[1:]]
  for n in all_names:
    header += [f"final/{n}", f"best/{n}"]
  rows = []
  for r in results:
    name = chosen if chosen in r.series else None
    final, best = (r.final(name), r.best(name)) if name else (None, None)
    row = {"job": r.job.name, **r.job.values, "seed": "" if r.job.seed is None else r.job.seed,
           "state": r.state, "step": "" if r.step is None else r.step, "metric": name or "",
           "final": "" if final is None else final[1], "best": "" if best is None else best[1],
           "best_step": "" if best is None else best[0]}
    for n in all_names:
      f_, b_ = r.final(n), r.best(n)
      row[f"final/{n}"] = "" if f_ is None else f_[1]
      row[f"best/{n}"] = "" if b_ is None else b_[1]
    rows.append(row)
  csv_path = os.path.join(out_dir, "report.csv")
  with open(csv_path + ".tmp", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=header)
    writer.writeheader()
    writer.writerows(rows)
  os.replace(csv_path + ".tmp", csv_path)

  figs, stems = [], set()
  for fig_spec in sweep.report.get("figures") or default_figures(sweep):
    data = figure(sweep, results, fig_spec, patterns, out_dir, stems)
    if data is not None:
      figs.append(data)

  md_path = os.path.join(out_dir, "report.md")
  with open(md_path + ".tmp", "w") as f:
    f.write(_markdown(sweep, results, rows, patterns, figs, out_dir, chosen))
  os.replace(md_path + ".tmp", md_path)
  return {"csv": csv_path, "md": md_path, "figures": figs, "rows": rows, "out_dir": out_dir}


def _markdown(sweep, results, rows, patterns, figs, out_dir, chosen=None) -> str:
  axis_names = [a.name for a in sweep.axes]
  states: Dict[str, int] = {}
  for r in results:
    states[r.state] = states.get(r.state, 0) + 1
  lines = [f"# Sweep `{sweep.name}`", "",
           f"Spec `{sweep.path}`, root `{sweep.root}`: {len(results)} jobs ({sweep.shape()}); "
           + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + ".", "",
           f"Metric: `{chosen or ' | '.join(patterns)}` (of `{' | '.join(patterns)}`, the first "
           f"any finished job has; a job without it is left empty), final value and best "
           f"over the run's evaluations.", ""]
  unfinished = [r for r in results if not r.finished]
  if unfinished:
    lines += [f"Configurations and figures use the finished jobs only "
              f"({len(results) - len(unfinished)}); unfinished (running, failed, pending or "
              f"incomplete, "
              f"in the Jobs table): {len(unfinished)}.", ""]
  groups: Dict[str, List[Dict]] = {}
  for row, r in zip(rows, results):
    groups.setdefault(r.job.group, []).append(row if r.finished else
                                              {**row, "final": "", "best": ""})
  lines += ["## Configurations (mean ± std over seeds)", "",
            "| " + " | ".join(axis_names + ["n", "final", "best"]) + " |",
            "|" + "---|" * (len(axis_names) + 3)]
  for group, grows in groups.items():
    finals = [float(g["final"]) for g in grows if g["final"] != ""]
    bests = [float(g["best"]) for g in grows if g["best"] != ""]
    cells = [str(grows[0][a]) for a in axis_names] + [str(len(finals))]
    for vals in (finals, bests):
      if vals:
        m, s = _mean_std(vals)
        cells.append(f"{m:.4f} ± {s:.4f}" if len(vals) > 1 else f"{m:.4f}")
      else:
        cells.append("")
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "## Jobs", "", "| job | state | step | metric | final | best (step) |",
            "|---|---|---|---|---|---|"]
  for row, r in zip(rows, results):
    best = f"{float(row['best']):.4f} ({row['best_step']})" if row["best"] != "" else ""
    state = row["state"] + (f": {r.error}" if r.error and r.state == runner.FAILED else "")
    final = "" if row["final"] == "" else f"{float(row['final']):.4f}"
    lines.append(f"| {row['job']} | {state.replace('|', '/')} | {row['step']} | "
                 f"{row['metric']} | {final} | {best} |")
  if figs:
    lines += ["", "## Figures", ""]
    for fig in figs:
      rel = os.path.relpath(fig.path, out_dir)
      lines += [f"![{fig.metric} vs {fig.x}]({rel})", ""]
  return "\n".join(lines) + "\n"

