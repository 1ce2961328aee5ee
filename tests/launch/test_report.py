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
