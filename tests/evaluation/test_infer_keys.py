"""`prompt-jax infer` rows keep their example's `idx` and carry `targets` only where the example is
labelled, so a SuperGLUE/GLUE test split's predictions join the benchmark's rows for a submission.

Before, the feature converter had dropped `idx` (rows could be joined only by their order), and a
test split's rows carried `targets: " ⁇ unk"`, the '<unk>' that T5's preprocessors write for
label -1, decoded. Real-format files written here; the real T5 vocabulary (skips without
../shared/data); a random T5 1.1 small backbone.
"""
import json

import numpy as np
import pytest
import seqio

from prompt_jax import tasks
from prompt_jax import vocab as vocab_lib
from prompt_jax.evaluation import run as run_lib
from tests.evaluation.test_ensemble import run_cli

RTE = "super_glue_rte_v102"
LINES = {  # SuperGLUE's RTE jsonl; the test split has no label. idx as the files number them.
    "test": [{"premise": "Obama met Putin.", "hypothesis": "They met.", "idx": 7},
             {"premise": "It rains.", "hypothesis": "It is dry.", "idx": 3}],
    "val": [{"premise": "A cat sat.", "hypothesis": "A cat.", "label": "entailment", "idx": 0},
            {"premise": "B.", "hypothesis": "Not B.", "label": "not_entailment", "idx": 1}],
}


@pytest.fixture
def rte_dir(tmp_path, spm_path, monkeypatch):
  monkeypatch.setenv(vocab_lib.SPM_PATH_ENV, str(spm_path))
  data = tmp_path / "data"
  (data / "super_glue" / "RTE").mkdir(parents=True)
  for split, rows in LINES.items():
    (data / "super_glue" / "RTE" / f"{split}.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
  yield data
  tasks.set_data_dir(None)


def _infer(tmp_path, data, split, *extra):
  prompt = tmp_path / "p.npy"
  np.save(prompt, np.random.RandomState(0).randn(2, 512).astype(np.float32))  # small's emb_dim
  model_dir = tmp_path / f"out-{split}"
  code, out, err = run_cli([
      "infer", "--gin_file=models/t5_1_1_small.gin", f"--data_dir={data}",
      "--gin.prompt_jax.t5_config.dtype='float32'", "--gin.PROMPT_LENGTH=2",
      f"--gin.MIXTURE_OR_TASK_NAME='{RTE}'", f"--gin.EVAL_SPLIT='{split}'",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}",
      "--gin.INITIAL_CHECKPOINT_PATH=None", "--gin.BATCH_SIZE=2", f"--gin.MODEL_DIR='{model_dir}'",
      *(extra or [f"--gin.PROMPT_FILE='{prompt}'"])])
  assert code == 0, (out[-2000:], err[-2000:])
  name = f"{RTE}-{split}" + ("-bank" if extra else "")
  with open(model_dir / "inference" / f"{name}.jsonl") as f:
    return [json.loads(line) for line in f]


def test_infer_rows_keep_idx_and_leave_out_a_test_splits_targets(tmp_path, rte_dir):
  test_rows = _infer(tmp_path, rte_dir, "test")
  assert [r["idx"] for r in test_rows] == [7, 3]
  assert all("targets" not in r for r in test_rows), test_rows
  assert all(r["prediction"] in ("entailment", "not_entailment") for r in test_rows)
  assert test_rows[0]["inputs"] == "rte hypothesis: They met. premise: Obama met Putin."
  val_rows = _infer(tmp_path, rte_dir, "validation")
  assert [(r["idx"], r["targets"]) for r in val_rows] == [(0, "entailment"),
                                                         (1, "not_entailment")]
  # The keys in front: `idx, inputs, prediction, targets`, as a submission script reads them.
  assert list(val_rows[0]) == ["idx", "inputs", "prediction", "targets"]


def test_bank_infer_rows_keep_idx_too(tmp_path, rte_dir):
  prompt = tmp_path / "bank.npy"
  np.save(prompt, np.random.RandomState(1).randn(2, 512).astype(np.float32))
  rows = _infer(tmp_path, rte_dir, "test", f"--gin.PROMPT_BANK={{'{RTE}': '{prompt}'}}")
  assert [(r["idx"], r["prompt"]) for r in rows] == [(7, RTE), (3, RTE)]
  assert all("targets" not in r for r in rows), rows


@pytest.mark.parametrize("split,labelled", [("validation", True), ("test", False)])
def test_record_and_multirc_keys_are_their_flattened_idx_parts(tmp_path, spm_path, monkeypatch,
                                                               split, labelled):
  monkeypatch.setenv(vocab_lib.SPM_PATH_ENV, str(spm_path))
  text = "Obama met Putin.\n@highlight\nThey talked"
  answers = [{"start": 0, "end": 4, "text": "Obama"}] if labelled else []
  record = {"idx": 3, "passage": {"text": text, "entities": [{"start": 0, "end": 4},
                                                             {"start": 10, "end": 14}]},
            "qas": [{"idx": 7, "query": "@placeholder met Putin", "answers": answers}]}
  label = {"label": True} if labelled else {}
  multirc = {"idx": 4, "passage": {"text": "Hi.", "questions": [
      {"idx": 5, "question": "Who?", "answers": [{"idx": 6, "text": "Me", **label}]}]}}
  file = "val" if labelled else "test"
  for folder, line in (("ReCoRD", record), ("MultiRC", multirc)):
    (tmp_path / "super_glue" / folder).mkdir(parents=True)
    (tmp_path / "super_glue" / folder / f"{file}.jsonl").write_text(json.dumps(line) + "\n")
  tasks.set_data_dir(tmp_path)
  try:
    keys = [[run_lib.example_keys(ex) for ex in seqio.get_mixture_or_task(name).get_dataset(
        sequence_length={"inputs": 64, "targets": 8}, split=split, shuffle=False,
        use_cached=False).as_numpy_iterator()]
            for name in ("super_glue_record_v102", "super_glue_multirc_v102")]
  finally:
    tasks.set_data_dir(None)
  assert keys == [[{"idx": {"passage": 3, "query": 7}, "labelled": labelled}],
                  [{"idx": {"paragraph": 4, "question": 5, "answer": 6},
                    "labelled": labelled}]]
