"""The prefix-LM objective of the C4 LM-adaptation task."""
import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

from prompt_jax import tasks
from prompt_jax.tasks import features
from prompt_jax.tasks import preprocessors

pytestmark = pytest.mark.usefixtures("networked")  # TFDS is mocked


def _prefix_lm(token_lists, inputs_length, seed):
  ds = tf.data.Dataset.from_generator(
      lambda: ({"targets": t} for t in token_lists),
      output_signature={"targets": tf.TensorSpec([None], tf.int32)})
  with seqio.utils.map_seed_manager(seed):
    ds = preprocessors.prefix_lm(ds, {"inputs": inputs_length, "targets": 64},
                                 features.DEFAULT_OUTPUT_FEATURES)
  return [(ex["inputs"].tolist(), ex["targets"].tolist()) for ex in ds.as_numpy_iterator()]


def test_prefix_lm_splits_segments_into_prefix_and_continuation():
  documents = [list(range(100, 120)), [5, 6], []]
  examples = _prefix_lm(documents, inputs_length=8, seed=3)
  # Inputs hold at most 7 tokens (+ EOS): the 20-token document gives segments of 7, 7 and 6.
  assert [i + t for i, t in examples] == [
      list(range(100, 107)), list(range(107, 114)), list(range(114, 120)), [5, 6]]
  assert all(1 <= len(i) and 1 <= len(t) for i, t in examples)
  assert _prefix_lm(documents, inputs_length=8, seed=3) == examples  # Same seed, same split.
  splits = {tuple(len(i) for i, _ in _prefix_lm(documents, 8, seed)) for seed in range(4)}
  assert len(splits) > 1  # The split point is random.


def test_c4_task_end_to_end_with_mock_tfds(t5_vocab):
  text = " ".join(f"word{i}" for i in range(40))
  served = {"text": [text], "url": ["u"], "timestamp": ["t"]}
  with tfds.testing.mock_data(
      as_dataset_fn=lambda builder, split, **kw: tf.data.Dataset.from_tensor_slices(served)):
    task = tasks.get_task("c4_v220_prefix_lm")
    examples = list(task.get_dataset({"inputs": 16, "targets": 32}, split="train", shuffle=False,
                                     try_in_mem_cache=False, seed=0).as_numpy_iterator())
  tokens = t5_vocab.encode(text)
  rebuilt = []
  for ex in examples:
    assert ex["inputs"][-1] == ex["targets"][-1] == 1  # EOS.
    assert len(ex["inputs"]) <= 16
    rebuilt += ex["inputs"][:-1].tolist() + ex["targets"][:-1].tolist()
  assert rebuilt == tokens


def test_a_version_the_installed_tfds_cannot_load_is_one_line():
  """c4_v301_prefix_lm under tensorflow-datasets 4.9 (whose c4 has 3.1.0, 2.3.1, ...) ended in
  `error: AssertionError: Failed to construct dataset "c4", ...`, exit 1."""
  from prompt_jax.tasks import sources  # pylint: disable=g-import-not-at-top
  source = sources.LocalOrTfdsSource("C4 (en, 9.9.9)", ("train",), tfds_name="c4/en:9.9.9")
  with pytest.raises(ValueError) as e:
    source.get_dataset("train")
  assert str(e.value).startswith("C4 (en, 9.9.9): the installed tensorflow-datasets cannot load "
                                 "TFDS c4/en:9.9.9 (it reads "), str(e.value)
  assert str(e.value).endswith("): use a task of one of those versions")
  assert "3.1.0" in str(e.value) or "2.2.0" in str(e.value)
