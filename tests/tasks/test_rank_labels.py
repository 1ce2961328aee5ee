"""Rank-classification candidates are the token sequences a task trains on (sentinel variants too)."""
import numpy as np
import pytest

from prompt_jax import tasks
from prompt_jax.evaluation import inference
from prompt_jax.tasks import multitask
from prompt_jax.tasks.inspect import token_examples

RTE = "super_glue_rte_v102"


def _rows(label_ids: np.ndarray):
  return [[int(t) for t in row if t] for row in label_ids]


@pytest.mark.parametrize("name", [RTE, f"{RTE}_sentinel", f"taskless_{RTE}_sentinel",
                                  "super_glue_boolq_v102_sentinel"])
def test_label_candidates_are_the_preprocessed_targets(data_root, t5_vocab, name):
  labels = inference.label_set(name)
  candidates = _rows(inference.label_tokens(labels, t5_vocab))
  examples = token_examples(name, "validation", 12)
  seen = set()
  for ex in examples:
    c = list(labels).index(ex["targets_pretokenized"])
    assert candidates[c] == list(ex["targets"]), (name, labels[c])
    seen.add(c)
  assert seen == set(range(len(labels)))  # every candidate checked against a real target
  # The winning candidate, decoded as eval/infer do, is its label's class for the metrics.
  task = tasks.get_task(name)
  for c, row in enumerate(candidates):
    text = t5_vocab.decode(inference.until_eos(row))
    assert task.postprocess_fn(text, example={}, is_target=False) == c


def test_sentinel_candidates_start_with_extra_id_0_and_others_are_unchanged(t5_vocab):
  plain = inference.label_tokens(inference.label_set(RTE), t5_vocab)
  sentinel = inference.label_tokens(inference.label_set(f"{RTE}_sentinel"), t5_vocab)
  sentinel_id = t5_vocab.vocab_size - 1
  assert sentinel_id == 32099
  for label, p, s in zip(["entailment", "not_entailment"], _rows(plain), _rows(sentinel)):
    assert p == list(t5_vocab.encode(label)) + [inference.EOS_ID]
    assert s == [sentinel_id] + p
  assert not inference.label_set(RTE).sentinel
  assert inference.label_set(f"taskless_{RTE}_sentinel").sentinel
  # Plain label texts still say nothing of the sentinel.
  assert tasks.label_set(f"{RTE}_sentinel") == ["entailment", "not_entailment"]


def test_few_shot_and_mixture_copies_keep_the_sentinel_mark():
  few_shot = f"{RTE}_sentinel_4shot_seed0"
  tasks.get_task(few_shot)
  assert inference.label_set(few_shot).sentinel
  mixture = multitask.register_multitask_mixture(
      "test_rank_labels_mixture", [f"{RTE}_sentinel", "super_glue_cb_v102"])
  sentinel_copy = multitask.copy_name(mixture, 0, f"{RTE}_sentinel")
  plain_copy = multitask.copy_name(mixture, 1, "super_glue_cb_v102")
  assert inference.label_set(sentinel_copy).sentinel
  assert not inference.label_set(plain_copy).sentinel
