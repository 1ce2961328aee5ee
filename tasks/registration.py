"""Registering a task with its standard variants and its label set.

`add_task` registers, from one list of text preprocessors:

  <name>                      T5's format,
  taskless_<name>             the first input word (the task name) dropped (Lester et al.),
  <name>_sentinel             targets prefixed with <extra_id_0> ("span corruption + sentinel"),
  taskless_<name>_sentinel    both,

(the `_sentinel` goes before a trailing `_train`/`_eval`, as T5's `_1_sentinel` does), and records
the label set used for rank classification under every name (see `label_set`). A sentinel
variant's label set is marked `sentinel`: its rank-classification candidates start with
<extra_id_0> like its training targets (`registered_label_set(name).sentinel`).
"""
import difflib
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import seqio

from prompt_jax.tasks import features
from prompt_jax.tasks import postprocessors
from prompt_jax.tasks import preprocessors


class LabelSet(tuple):
  """A task's label texts, in class-index order; `sentinel`: the task's targets start with
  <extra_id_0> (a `_sentinel` variant), so its label candidates must too."""

  sentinel: bool

  def __new__(cls, label_names: Sequence[str], sentinel: bool = False) -> "LabelSet":
    labels = super().__new__(cls, label_names)
    labels.sentinel = bool(sentinel)
    return labels

  def __repr__(self) -> str:
    return f"LabelSet({tuple(self)!r}, sentinel={self.sentinel})"


_LABEL_SETS: Dict[str, LabelSet] = {}

# Variant key -> (prefix added, sentinel added).
VARIANTS = {
    "": ("", False),
    "taskless": ("taskless_", False),
    "sentinel": ("", True),
    "taskless_sentinel": ("taskless_", True),
}


class UnknownTaskError(ValueError):
  """A task or mixture name that is not registered."""


def sentinel_name(name: str) -> str:
  """`name` with "_sentinel" inserted before a trailing _train/_eval, else appended."""
  for suffix in ("_train", "_eval"):
    if name.endswith(suffix):
      return name[:-len(suffix)] + "_sentinel" + suffix
  return name + "_sentinel"


def variant_name(name: str, variant: str) -> str:
  prefix, sentinel = VARIANTS[variant]
  name = prefix + name
  return sentinel_name(name) if sentinel else name


def register_label_set(task_name: str, label_names: Sequence[str],
                       sentinel: Optional[bool] = None) -> None:
  """Records `task_name`'s label texts; `sentinel`: its targets start with <extra_id_0>.

  `sentinel=None` keeps the mark of a `LabelSet` passed in (a few-shot or mixture copy of a
  task gets the task's), else False.
  """
  if sentinel is None:
    sentinel = getattr(label_names, "sentinel", False)
  _LABEL_SETS[task_name] = LabelSet(label_names, sentinel)


def registered_label_set(task_name: str) -> Optional[LabelSet]:
  """The label set recorded for `task_name` (a tuple of texts with `.sentinel`), or None (no
  lookup of few-shot names)."""
  return _LABEL_SETS.get(task_name)


def label_set(task_name: str) -> List[str]:
  """The fixed label texts of a classification task, in class-index order.

  Rank classification scores each of these as the target and predicts the best-scoring one;
  the task's postprocessor maps the chosen text to the class index its metrics expect.

  Raises:
    UnknownTaskError: `task_name` is not a registered task.
    ValueError: the task is generative (QA, ReCoRD, WSC, C4) and has no fixed label set.
  """
  from prompt_jax.tasks import few_shot  # pylint: disable=g-import-not-at-top  (cycle)
  few_shot.ensure_registered(task_name)
  if task_name in _LABEL_SETS:
    return list(_LABEL_SETS[task_name])
  if task_name in seqio.MixtureRegistry.names():
    raise ValueError(f"{task_name!r} is a mixture; ask label_set() for one of its tasks: "
                     f"{', '.join(t.name for t in seqio.get_mixture_or_task(task_name).tasks)}.")
  raise ValueError(f"task {task_name!r} is generative (free-text targets) and has no fixed label "
                   f"set; evaluate it by decoding instead of rank classification.")


def check_known(name: str) -> None:
  """Raises UnknownTaskError (with close matches) unless `name` is a registered task/mixture."""
  names = set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())
  if name in names:
    return
  close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.6)
  hint = f"; did you mean {', '.join(close)}?" if close else ""
  raise UnknownTaskError(
      f"unknown task or mixture {name!r}{hint} (`prompt-jax tasks` lists them; few-shot names "
      f"are <task>_<K>shot_seed<S> or <task>_<K>total_seed<S>)")


def add_task(name: str,
             *,
             source: seqio.DataSource,
             text_preprocessors: Sequence[Callable],
             postprocess_fn: Optional[Callable] = None,
             metric_fns: Sequence[Callable] = (),
             label_names: Optional[Sequence[str]] = None,
             token_preprocessors: Sequence[Callable] = (),
             variants: Sequence[str] = ("", "taskless", "sentinel", "taskless_sentinel"),
             output_features: Mapping[str, seqio.Feature] = features.DEFAULT_OUTPUT_FEATURES
             ) -> Dict[str, str]:
  """Registers `name` and its variants; returns variant key -> registered name."""
  names = {}
  for variant in variants:
    prefix, sentinel = VARIANTS[variant]
    text_steps = list(text_preprocessors)
    if prefix:
      text_steps.append(preprocessors.remove_first_text_token)
    token_steps = list(token_preprocessors)
    postprocess = postprocess_fn
    if sentinel:
      token_steps.append(preprocessors.add_sentinel_to_targets)
      postprocess = postprocessors.with_sentinel_removed(postprocess_fn)
    task_name = variant_name(name, variant)
    seqio.TaskRegistry.add(
        task_name,
        source=source,
        preprocessors=[
            *text_steps,
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            *token_steps,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=output_features,
        postprocess_fn=postprocess,
        metric_fns=list(metric_fns))
    if label_names is not None:
      register_label_set(task_name, label_names, sentinel=sentinel)
    names[variant] = task_name
  return names


def add_mixture(name: str, task_names: Mapping[str, Sequence[str]],
                rates: Optional[Sequence[float]] = None) -> None:
  """Registers one mixture per variant; `task_names[variant]` lists that variant's tasks.

  `rates` (aligned with each list) default to 1.0 each: equal mixing.
  """
  for variant, tasks in task_names.items():
    mixture = variant_name(name, variant)
    if rates is None:
      seqio.MixtureRegistry.add(mixture, list(tasks), default_rate=1.0)
    else:
      seqio.MixtureRegistry.add(mixture, list(zip(tasks, rates)))
