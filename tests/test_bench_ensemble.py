"""`prompt-jax bench ensemble` reports its ratios and memory (never asserted as times)."""
import re

from prompt_jax import cli


def test_bench_ensemble_reports_ratios_and_memory(capsys):
  assert cli.main(["bench", "ensemble", "--num_layers=1", "--examples=2", "--prompts=3",
                   "--inputs=8", "--prompt_length=3", "--targets=3", "--steps=1",
                   "--mode=greedy"]) == 0
  out = capsys.readouterr().out
  assert re.search(r"ensemble, 2 examples x 3 prompts in one batch: [0-9.]+ s", out)
  assert re.search(r"ratio per pair: ensemble / one prompt [0-9.]+ \(target <= 1.1\); "
                   r"ensemble / sequential [0-9.]+", out)
  assert re.search(r"throughput mixed / single-task [0-9.]+", out)
  assert re.search(r"peak RSS \d+ MB; frozen weights [0-9.]+ MB \(one copy\)", out)
