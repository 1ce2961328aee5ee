"""Few-shot versions of any registered task, sampled by seed.

  <task>_<K>shot_seed<S>    K training examples per class (balanced), drawn from the train split
  <task>_<K>total_seed<S>   K training examples in total (unbalanced)

Splits of a few-shot task:
  train       the K-shot sample,
  validation  a disjoint sample of the same size and class balance, also drawn from train
              (for model selection),
  test        the original validation split (the evaluation set of few-shot papers).

Names are resolved on demand: `ensure_registered(name)` (or `prompt_jax.tasks.get_task`)
registers a few-shot task the first time its name is used; `register_few_shot` does it directly.
The sample depends only on (task's train split order, K, seed, balanced): TFDS is read without
file shuffling and local files in file order, so it is the same on every run and machine.
"""
import re
from typing import Mapping, Optional, Sequence, Tuple

import numpy as np
import seqio
import tensorflow as tf

from prompt_jax.tasks import registration
from prompt_jax.tasks import sources

_NAME_RE = re.compile(r"^(?P<base>.+)_(?P<k>\d+)(?P<kind>shot|total)_seed(?P<seed>\d+)$")


def few_shot_name(base: str, k: int, seed: int, balanced: bool = True) -> str:
  return f"{base}_{k}{'shot' if balanced else 'total'}_seed{seed}"


def sample_indices(labels: Sequence[int], k: int, seed: int,
                   balanced: bool = True) -> Tuple[np.ndarray, np.ndarray]:
  """Indices of a K-shot train sample and a disjoint dev sample of the same size.

  Args:
    labels: the label of every training example (unlabeled ones, -1, are never drawn when
      balanced; any values when unbalanced, only their count matters).
    k: examples per class (balanced) or in total (unbalanced).
    seed: the sampling seed.
    balanced: K per class, or K in total.

  Returns:
    (train, dev): sorted index arrays, disjoint; each has K per class (balanced) or K entries.
  """
  if k <= 0:
    raise ValueError(f"few-shot K must be positive, got {k}.")
  rng = np.random.default_rng(seed)
  labels = np.asarray(labels)
  if not balanced:
    if len(labels) < 2 * k:
      raise ValueError(f"{k}-example few-shot with an equal-sized dev sample needs {2 * k} "
                       f"training examples, but the train split has {len(labels)}.")
    order = rng.permutation(len(labels))
    return np.sort(order[:k]), np.sort(order[k:2 * k])
  train, dev = [], []
  classes = sorted(int(c) for c in np.unique(labels) if c >= 0)
  if not classes:
    raise ValueError("the train split has no labeled examples to sample per class.")
  for c in classes:
    members = rng.permutation(np.flatnonzero(labels == c))
    if len(members) < 2 * k:
      raise ValueError(
          f"class {c} has {len(members)} training examples; {k} per class plus an equal dev "
          f"sample needs {2 * k}: lower K or use the unbalanced <task>_<N>total_seed<S> form.")
    train.append(members[:k])
    dev.append(members[k:2 * k])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(dev))


class FewShotSource(seqio.DataSource):
  """Wraps a task's source: a seeded K-shot train/dev sample of its train split, its validation
  split as test."""

  def __init__(self, base: seqio.DataSource, k: int, seed: int, balanced: bool = True,
               label_key: str = "label", train_split: str = "train",
               test_split: str = "validation"):
    super().__init__(splits=("train", "validation", "test"))
    self.base, self.k, self.seed, self.balanced = base, k, seed, balanced
    self._label_key, self._train_split, self._test_split = label_key, train_split, test_split
    # (data dir in force, (train, dev) indices): resampled if the data dir changes.
    self._cache: Optional[Tuple[Optional[str], Tuple[np.ndarray, np.ndarray]]] = None

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return False

  def list_shards(self, split: str) -> Sequence[str]:
    return [split]

  def _train_examples(self) -> tf.data.Dataset:
    return self.base.get_dataset(split=self._train_split, shuffle=False)

  def indices(self) -> Tuple[np.ndarray, np.ndarray]:
    """(train, dev) indices into the base train split; computed once per data dir."""
    data_dir = sources.get_data_dir()
    if self._cache is None or self._cache[0] != data_dir:
      ds = self._train_examples()
      if self.balanced:
        if self._label_key not in ds.element_spec:
          raise ValueError(
              f"balanced few-shot needs a '{self._label_key}' feature, which this dataset lacks; "
              f"use the unbalanced <task>_{self.k}total_seed{self.seed} form.")
        label_key = self._label_key

        def label(x):
          return tf.cast(x[label_key], tf.int64)

        batches = ds.map(label).batch(4096).as_numpy_iterator()
        labels = np.concatenate([np.zeros([0], np.int64), *batches])
      else:
        labels = np.zeros(int(ds.reduce(np.int64(0), lambda n, _: n + 1)), np.int64)
      self._cache = (data_dir, sample_indices(labels, self.k, self.seed, self.balanced))
    return self._cache[1]

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: Optional[int] = None,
                  shard_info: Optional[seqio.ShardInfo] = None, *,
                  sequence_length: Optional[Mapping[str, int]] = None, use_cached: bool = False,
                  num_epochs: Optional[int] = 1) -> tf.data.Dataset:
    del sequence_length, use_cached, num_epochs
    if split == "test":
      return self.base.get_dataset(split=self._test_split, shuffle=shuffle, seed=seed,
                                   shard_info=shard_info)
    if split not in ("train", "validation"):
      raise ValueError(f"few-shot tasks have splits train, validation, test; got {split!r}.")
    chosen = tf.constant(self.indices()[0 if split == "train" else 1], dtype=tf.int64)
    ds = self._train_examples().enumerate()
    ds = ds.filter(lambda i, _: tf.reduce_any(tf.equal(i, chosen))).map(lambda _, x: x)
    if shard_info:
      ds = ds.shard(shard_info.num_shards, shard_info.index)
    return ds

  def num_input_examples(self, split: str) -> Optional[int]:
    if split == "test":
      return self.base.num_input_examples(self._test_split)
    return len(self.indices()[0 if split == "train" else 1])


def register_few_shot(base: str, k: int, seed: int, balanced: bool = True) -> str:
  """Registers (once) and returns the few-shot version of the registered task `base`."""
  name = few_shot_name(base, k, seed, balanced)
  if name in seqio.TaskRegistry.names():
    return name
  registration.check_known(base)
  if base in seqio.MixtureRegistry.names():
    raise ValueError(f"{base!r} is a mixture; few-shot sampling applies to tasks.")
  task = seqio.get_mixture_or_task(base)
  if "train" not in task.splits:
    raise ValueError(f"task {base!r} has no train split to sample from (splits: "
                     f"{', '.join(task.splits)}).")
  test_split = next((s for s in task.splits if s.startswith("validation")), None)
  if test_split is None:
    raise ValueError(f"task {base!r} has no validation split to use as the few-shot test set.")
  seqio.TaskRegistry.add(
      name,
      source=FewShotSource(task.source, k, seed, balanced, test_split=test_split),
      output_features=task.output_features,
      preprocessors=task.preprocessors,
      postprocess_fn=task.postprocessor,
      metric_fns=task.metric_fns)
  labels = registration.registered_label_set(base)
  if labels is not None:
    registration.register_label_set(name, labels)
  return name


def ensure_registered(name: str) -> None:
  """Makes `name` usable: registers few-shot names on demand, else checks that it is known.

  Raises:
    UnknownTaskError: neither a registered task/mixture nor a few-shot name of one.
  """
  if name in seqio.TaskRegistry.names() or name in seqio.MixtureRegistry.names():
    return
  match = _NAME_RE.match(name)
  if match and match["base"] in seqio.TaskRegistry.names():
    register_few_shot(match["base"], int(match["k"]), int(match["seed"]),
                      balanced=match["kind"] == "shot")
    return
  if match and match["base"] in seqio.MixtureRegistry.names():  # (was "did you mean ...")
    first = sorted(t.name for t in seqio.get_mixture_or_task(match["base"]).tasks
                   if "train" in t.splits)[0]
    suffix = name[len(match["base"]):]
    raise registration.UnknownTaskError(
        f"{name!r}: {match['base']!r} is a mixture; few-shot sampling applies to tasks, e.g. "
        f"{first}{suffix}")
  registration.check_known(name)
