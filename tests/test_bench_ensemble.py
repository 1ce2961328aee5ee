"""`prompt-jax bench ensemble` reports its ratios and memory (never asserted as times)."""
import re

from prompt_jax import cli


def test_bench_ensemble_reports_ratios_and_memory(capsys, tmp_path):
  record = tmp_path / "bench.md"
  assert cli.main(["bench", "ensemble", "--num_layers=1", "--examples=2", "--prompts=3",
                   "--inputs=8", "--prompt_length=3", "--targets=3", "--steps=1",
                   "--mode=greedy", f"--record={record}"]) == 0
  out = capsys.readouterr().out
  # --record keeps every figure line (it was ignored); there is no library reference.
  assert record.read_text().count("ensemble, 2 examples x 3 prompts in one batch") == 1
  assert out.splitlines()[-1] == f"recorded in {record}"
  assert cli.main(["bench", "ensemble", "--reference=peft"]) == 2
  assert "bench ensemble has no library reference" in capsys.readouterr().err
  assert re.search(r"ensemble, 2 examples x 3 prompts in one batch: [0-9.]+ s", out)
  assert re.search(r"ratio per pair: ensemble / one prompt [0-9.]+ \(target <= 1.1\); "
                   r"ensemble / sequential [0-9.]+", out)
  assert re.search(r"throughput mixed / single-task [0-9.]+", out)
  assert re.search(r"peak RSS \d+ MB; frozen weights [0-9.]+ MB \(one copy\)", out)
