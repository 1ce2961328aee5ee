"""One epoch of a mixture (`data.get_dataset(num_epochs=1)`, what training_eval reads) holds every
row of each of its tasks exactly once, for tasks of unequal sizes, shuffled or not, on one data
shard or across two: seqio's own mixture sampling stops at the first task to run out
(`stop_on_empty_dataset`), which dropped most of the larger task's rows (a 64 + 640 row mixture
read 131 rows) and tilted training_eval's loss and accuracy toward the smaller task.
"""
import collections

import pytest
import seqio
import tensorflow as tf

from prompt_jax.embedded import task as embedded_task
from prompt_jax.tasks import multitask
from prompt_jax.train import data as data_lib

SMALL = "test_epoch_first_letter_40"  # 40 rows of the embedded first-letter validation split
PLAIN = "test_epoch_plain_mixture"
MULTI = "test_epoch_multitask_mixture"
LENGTHS = {"inputs": 16, "targets": 4}


def _small(split, shuffle_files, seed=None):
  del shuffle_files, seed
  pairs = embedded_task.examples(split, instruction="first")[:40]
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": [p[0] for p in pairs], "targets": [p[1] for p in pairs]})


if SMALL not in seqio.TaskRegistry.names():
  seqio.TaskRegistry.add(
      SMALL, source=seqio.FunctionDataSource(_small, splits=("validation",)),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
      output_features={k: seqio.Feature(embedded_task.VOCABULARY, add_eos=True)
                       for k in ("inputs", "targets")},
      metric_fns=[embedded_task.accuracy])
if PLAIN not in seqio.MixtureRegistry.names():
  seqio.MixtureRegistry.add(PLAIN, [embedded_task.TASK_NAME, SMALL], default_rate=1.0)
multitask.register_multitask_mixture(MULTI, [embedded_task.TASK_NAME, SMALL])


def _rows(name, *, shuffle, seed, shard_id=0, num_shards=1):
  cfg = data_lib.DatasetConfig(mixture_or_task_name=name, task_feature_lengths=LENGTHS,
                               split="validation", batch_size=8, shuffle=shuffle, seed=seed)
  ds = data_lib.get_dataset(cfg, num_epochs=1, shard_id=shard_id, num_shards=num_shards,
                            drop_remainder=False).unbatch()
  return [(tuple(ex["encoder_input_tokens"]), tuple(ex["decoder_target_tokens"]),
           int(ex[data_lib.TASK_IDS]) if data_lib.TASK_IDS in ex else None)
          for ex in ds.as_numpy_iterator()]


def _expected(name, task_id, **kw):
  return collections.Counter((i, t, task_id) for i, t, _ in _rows(name, **kw))


@pytest.mark.parametrize("mixture", [PLAIN, MULTI])
@pytest.mark.parametrize("shuffle,seed", [(False, 0), (True, 1), (True, 2)])
def test_one_epoch_of_a_mixture_holds_every_row_of_its_tasks_once(mixture, shuffle, seed):
  ids = (0, 1) if mixture == MULTI else (None, None)
  for num_shards in (1, 2):
    got, want = collections.Counter(), collections.Counter()
    for shard in range(num_shards):
      kw = dict(shuffle=shuffle, seed=seed, shard_id=shard, num_shards=num_shards)
      rows = _rows(mixture, **kw)
      got.update(rows)
      for task_id, name in zip(ids, (embedded_task.TASK_NAME, SMALL)):
        want.update(_expected(name, task_id, **kw))
      if shard == 0:  # the tasks' rows interleave: an eval_steps cap sees both
        assert len({r[:2] for r in rows[:2]}) == 2
    assert sum(want.values()) == 256 + 40
    assert got == want, (mixture, shuffle, seed, num_shards, sum(got.values()))


@pytest.mark.parametrize("name", [embedded_task.TASK_NAME, MULTI])
def test_the_all_padding_batch_has_the_features_of_a_real_one(name):
  """teacher_forced_eval feeds it on a process whose data shard ran out, while the others feed
  real batches to the same program: a multi-task mixture's batches carry `task_ids`, so must it
  (it was built from the feature lengths alone, without `task_ids`)."""
  from prompt_jax.train import loop  # pylint: disable=g-import-not-at-top
  cfg = data_lib.DatasetConfig(mixture_or_task_name=name, task_feature_lengths=LENGTHS,
                               split="validation", batch_size=8, shuffle=False)
  ds = data_lib.get_dataset(cfg, num_epochs=1, shard_id=0, num_shards=1, drop_remainder=False)
  real = next(data_lib.numpy_batches(ds))
  empty = loop.empty_batch(ds.element_spec, 8)
  assert {k: (v.shape, v.dtype) for k, v in empty.items()} == {
      k: (v.shape, v.dtype) for k, v in real.items()}
  assert (data_lib.TASK_IDS in empty) == (name == MULTI)
  assert not any(v.any() for v in empty.values())
