"""`prompt-jax bench train_step` runs both sides and reports ratios (no wall-time assertions)."""
import re

import pytest

pytest.importorskip("torch")

from prompt_jax import cli  # noqa: E402


def test_bench_reports_time_and_memory_ratios(capsys):
  assert cli.main(["bench", "train_step", "--num_layers=1", "--batch=2", "--inputs=16",
                   "--prompt_length=2", "--steps=1"]) == 0
  out = capsys.readouterr().out
  assert re.search(r"prompt_jax \(jit\): +[0-9.]+ s/step, peak RSS \d+ MB", out)
  assert re.search(r"HF torch .*: [0-9.]+ s/step", out)
  assert re.search(r"ratio ours/reference: time [0-9.]+, memory [0-9.]+", out)


def test_bench_rejects_unknown_preset(capsys):
  assert cli.main(["bench", "train_step", "--preset=t5_9", "--reference=none"]) == 1
  assert "unknown T5 preset 't5_9'" in capsys.readouterr().err


def test_bench_records_and_reports_a_rejected_flag(tmp_path, capsys, monkeypatch):
  """--record appends the command line and the printed lines; a flag set XLA rejects is reported
  as not run instead of stopping the sweep."""
  from prompt_jax import bench  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(bench, "CPU_FLAG_SETS", (("default", ""),
                                               ("bogus", "--xla_cpu_no_such_flag=true")))
  record = tmp_path / "bench.md"
  record.write_text("# earlier\n")
  argv = ["bench", "train_step", "--num_layers=1", "--batch=2", "--inputs=16",
          "--prompt_length=2", "--steps=1", "--reference=none", "--flag_sweep",
          f"--record={record}"]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  assert re.search(r"bogus +--xla_cpu_no_such_flag=true: not run", out)
  text = record.read_text()
  assert text.startswith("# earlier\n")  # appended, nothing earlier changed
  assert f"### `prompt-jax {' '.join(argv)}`" in text and "jax 0." in text
  assert re.search(r"prompt_jax \(jit\): +[0-9.]+ s/step", text) and "not run" in text
