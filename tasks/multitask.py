"""Multi-task mixtures: each task sets the feature `task_index` ([1]: its position in the
mixture), which the feature converter (`train.data.EncDecFeatureConverter`) passes on to the model
as `task_ids` [B]; multi-task prompt methods (prompts/multitask.py, prompts/mpt.py) pick each
example's task prompt by it.

  register_multitask_mixture("my_mix", ["task_a", "task_b"])   # task_a -> 0, task_b -> 1
"""
import re
from typing import List, Optional, Sequence, Tuple

import seqio
import tensorflow as tf

from prompt_jax.tasks import registration

TASK_INDEX = "task_index"
# [1] int32 (rank 1 of length 1: seqio's Evaluator measures every feature's length).
TASK_INDEX_FEATURE = seqio.Feature(seqio.PassThroughVocabulary(1), add_eos=False,
                                   dtype=tf.int32, rank=1, required=False)


def add_task_index(index: int):
  """A seqio preprocessor setting the feature `task_index` = [index]."""
  @seqio.map_over_dataset
  def add(ex):
    return {**ex, TASK_INDEX: tf.constant([index], tf.int32)}
  return add


def copy_name(mixture: str, index: int, task_name: str) -> str:
  """The name of the mixture's copy of its `index`-th task."""
  return f"{mixture}__{index}_{task_name}"


def tasks_of(mixture: str) -> List[Tuple[int, str, str]]:
  """[(task_index, copy's name, task's name)] of a mixture `register_multitask_mixture` made, by
  task_index; [] for any other name."""
  if mixture not in seqio.MixtureRegistry.names():
    return []
  found = [re.fullmatch(rf"{re.escape(mixture)}__(\d+)_(.+)", t.name)
           for t in seqio.get_mixture_or_task(mixture).tasks]
  return sorted((int(m[1]), m[0], m[2]) for m in found if m)


def register_multitask_mixture(name: str, task_names: Sequence[str],
                               rates: Optional[Sequence[float]] = None) -> str:
  """Registers the seqio mixture `name` of `task_names` (rates: one per task, default equal),
  each task copied as `<name>__<k>_<task>` with `task_index` = k (its position in task_names),
  so that a multi-task prompt knows each example's task. Returns the mixture name."""
  if name in seqio.MixtureRegistry.names():
    return name
  task_names = list(task_names)
  rates = [1.0] * len(task_names) if rates is None else list(rates)
  if len(rates) != len(task_names):
    raise ValueError(f"register_multitask_mixture({name!r}): {len(rates)} rates for "
                     f"{len(task_names)} tasks")
  copies = []
  for k, task_name in enumerate(task_names):
    task = seqio.get_mixture_or_task(task_name)
    copy = copy_name(name, k, task_name)
    if copy not in seqio.TaskRegistry.names():
      seqio.TaskRegistry.add(
          copy, source=task.source,
          preprocessors=list(task.preprocessors) + [add_task_index(k)],
          output_features={**task.output_features, TASK_INDEX: TASK_INDEX_FEATURE},
          postprocess_fn=task.postprocessor, metric_fns=list(task.metric_fns))
    labels = registration.registered_label_set(task_name)
    if labels:  # rank classification of the copy, as of the task
      registration.register_label_set(copy, labels)
    copies.append((copy, rates[k]))
  seqio.MixtureRegistry.add(name, copies)
  return name
