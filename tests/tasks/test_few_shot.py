"""Few-shot sampling: deterministic per seed, exactly K per class, disjoint train/dev."""
import collections
import gzip
import json

import numpy as np
import pytest

from prompt_jax import tasks
from prompt_jax.tasks import few_shot
from prompt_jax.tasks.inspect import text_examples

# 30 of class 0, 12 of class 1, 8 of class 2 and 5 unlabeled.
LABELS = np.array([0] * 30 + [1] * 12 + [2] * 8 + [-1] * 5)


def test_balanced_sample_has_k_per_class_and_a_disjoint_dev_sample():
  train, dev = few_shot.sample_indices(LABELS, k=4, seed=0, balanced=True)
  assert collections.Counter(LABELS[train].tolist()) == {0: 4, 1: 4, 2: 4}
  assert collections.Counter(LABELS[dev].tolist()) == {0: 4, 1: 4, 2: 4}
  assert not set(train.tolist()) & set(dev.tolist())


def test_sample_is_deterministic_per_seed():
  first = few_shot.sample_indices(LABELS, k=4, seed=7)
  again = few_shot.sample_indices(LABELS, k=4, seed=7)
  other = few_shot.sample_indices(LABELS, k=4, seed=8)
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  assert not np.array_equal(first[0], other[0])


def test_unbalanced_sample_has_k_in_total():
  train, dev = few_shot.sample_indices(LABELS, k=10, seed=1, balanced=False)
  assert (len(train), len(dev)) == (10, 10)
  assert not set(train.tolist()) & set(dev.tolist())


def test_too_small_class_is_an_error():
  with pytest.raises(ValueError, match="class 2 has 8 training examples; 5 per class"):
    few_shot.sample_indices(LABELS, k=5, seed=0)


def test_few_shot_task_on_real_rte(data_root):
  name = "super_glue_rte_v102_8shot_seed3"
  train = text_examples(name, "train", None)
  dev = text_examples(name, "validation", None)
  assert collections.Counter(ex["targets"] for ex in train) == {
      "entailment": 8, "not_entailment": 8}
  assert collections.Counter(ex["targets"] for ex in dev) == {"entailment": 8, "not_entailment": 8}
  assert not {ex["inputs"] for ex in train} & {ex["inputs"] for ex in dev}
  # The test split is the original validation split.
  assert text_examples(name, "test", 1) == text_examples("super_glue_rte_v102", "validation", 1)
  assert tasks.label_set(name) == ["entailment", "not_entailment"]
  # A fresh sampler with the same seed draws the same examples.
  source = few_shot.FewShotSource(tasks.get_task("super_glue_rte_v102").source, 8, 3)
  assert np.array_equal(source.indices()[0], tasks.get_task(name).source.indices()[0])


def test_balanced_cb_16_shot_fails_on_its_small_neutral_class(data_root):
  with pytest.raises(ValueError, match="class 2 has 16 training examples"):
    text_examples("super_glue_cb_v102_16shot_seed0", "train")
  (ex,) = text_examples("super_glue_cb_v102_16total_seed0", "train", 1)
  assert ex["inputs"].startswith("cb hypothesis: ")


def test_unlabeled_task_needs_the_total_form(tmp_path):
  qas = [{"qid": f"q{i}", "question": f"Q{i}?", "answers": [f"a{i}"]} for i in range(4)]
  path = tmp_path / "mrqa/train/SQuAD.jsonl.gz"
  path.parent.mkdir(parents=True)
  with gzip.open(path, "wt") as f:
    f.write(json.dumps({"header": {"dataset": "SQuAD", "split": "train"}}) + "\n")
    f.write(json.dumps({"context": "a0 a1 a2 a3", "qas": qas}) + "\n")
  tasks.set_data_dir(tmp_path)
  with pytest.raises(ValueError, match="needs a 'label' feature.*_2total_seed0"):
    text_examples("mrqa_squad_v001_2shot_seed0", "train")
  train = text_examples("mrqa_squad_v001_2total_seed0", "train", None)
  dev = text_examples("mrqa_squad_v001_2total_seed0", "validation", None)
  assert (len(train), len(dev)) == (2, 2)
  assert {ex["id"] for ex in train + dev} == {"q0", "q1", "q2", "q3"}


def test_task_without_train_split_is_rejected():
  with pytest.raises(ValueError, match="no train split"):
    tasks.get_task("mrqa_bioasq_v001_4total_seed0")


def test_a_few_shot_name_of_a_mixture_says_so():
  """`super_glue_v102_proportional_16shot_seed0` was "unknown task or mixture ...; did you mean
  super_glue_v102_proportional_sentinel, ...": the reason was never reached."""
  with pytest.raises(tasks.UnknownTaskError) as e:
    tasks.get_task("super_glue_v102_proportional_16shot_seed0")
  assert str(e.value) == (
      "'super_glue_v102_proportional_16shot_seed0': 'super_glue_v102_proportional' is a "
      "mixture; few-shot sampling applies to tasks, e.g. super_glue_boolq_v102_16shot_seed0")
