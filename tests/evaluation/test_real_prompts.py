"""Acceptance 5: the three real prompts of google-research/prompt-tuning (T5 1.1 lm100k base,
100 x 768) load into a bank and ensemble on a T5 1.1 base-shaped model (random weights: no
real base checkpoint here) over real SuperGLUE RTE validation lines. Skips without
../shared/data."""
import json
import shutil

import numpy as np
import pytest

from prompt_jax.prompts import bank as bank_lib
from tests.evaluation.test_ensemble import run_cli

NAMES = ("sst2", "mrpc", "rte")
EXAMPLES = 6  # the first RTE validation lines (a base-sized encoder on 2 CPU cores is slow)


@pytest.fixture
def real_prompts(shared_data):
  d = shared_data("prompt_tuning_repo", "pretrained_prompts", "t5_1_1_lm100k_base")
  return {n: str(d / f"{n}.npy") for n in NAMES}


def test_real_prompts_load_into_a_bank(real_prompts):
  from prompt_jax.evaluation import ensemble  # pylint: disable=g-import-not-at-top
  members = [ensemble.load_member(n, p, None, None)
             for n, p in ensemble.prompt_sources(real_prompts)]
  table = bank_lib.build_table([m.entry for m in members], width=768)  # t5_1_1_base emb_dim
  assert table.table.shape == (3, 100, 768) and table.names == NAMES
  for i, n in enumerate(NAMES):
    np.testing.assert_array_equal(table.table[i], np.load(real_prompts[n]))


def test_real_prompts_ensemble_end_to_end_on_real_rte(real_prompts, shared_data, spm_path,
                                                       tmp_path, monkeypatch):
  from prompt_jax import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(vocab_lib.SPM_PATH_ENV, str(spm_path))
  rte = shared_data("super_glue", "RTE")
  data = tmp_path / "data" / "super_glue" / "RTE"
  data.mkdir(parents=True)
  lines = (rte / "val.jsonl").read_text().splitlines()[:EXAMPLES]
  (data / "val.jsonl").write_text("\n".join(lines) + "\n")
  shutil.copy(rte / "train.jsonl", data / "train.jsonl")
  model_dir = tmp_path / "ens"
  code, out, err = run_cli([
      "ensemble-eval", "--gin_file=models/t5_1_1_base.gin",
      "--gin.prompt_jax.t5_config.dtype='float32'", f"--data_dir={tmp_path / 'data'}",
      "--gin.MIXTURE_OR_TASK_NAME='super_glue_rte_v102'",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 96, 'targets': 8}",
      "--gin.INITIAL_CHECKPOINT_PATH=None", "--gin.BATCH_SIZE=6", f"--gin.MODEL_DIR='{model_dir}'",
      f"--gin.ENSEMBLE_PROMPTS={real_prompts!r}"])
  assert code == 0, err
  report = json.load(open(model_dir / "ensemble" / "super_glue_rte_v102-validation.json"))
  assert report["num_examples"] == EXAMPLES and report["rank_classification"]
  assert [p["length"] for p in report["prompts"]] == [100, 100, 100]
  rows = [json.loads(l) for l in open(model_dir / "ensemble" /
                                      "super_glue_rte_v102-validation-predictions.jsonl")]
  assert all(set(r["predictions"]) == set(NAMES) for r in rows)
  labels = {"entailment", "not_entailment"}
  assert all(r["majority_vote"] in labels and r["mean_log_likelihood"] in labels for r in rows)
  assert "super_glue_rte_v102" in out
