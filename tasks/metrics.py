"""T5's evaluation metrics (`t5.evaluation.metrics`), in plain numpy.

Every metric takes (targets, predictions) as produced by the task's postprocessor and returns a dict
of percentages with T5's key names:

  accuracy                      {"accuracy"}
  mean_multiclass_f1(n)         {"mean_<n>class_f1"}   unweighted mean of per-class F1 (CB)
  f1_score_with_invalid         {"f1"}                 F1 of class 1; invalid predictions are wrong
  multirc_f1_over_all_answers   {"f1"}                 the above over all MultiRC answers
  mean_group_metric(all_match)  {"exact_match"}        per-question exact match, averaged (MultiRC)
  squad                         {"em", "f1"}           max over the reference answers (SQuAD/MRQA)
  deduplicate_metric(squad)     {"em", "f1"}           one prediction per group (ReCoRD)
"""
import collections
import re
import string
from typing import Any, Callable, Dict, Mapping, Sequence

import numpy as np

_PUNCTUATION = frozenset(string.punctuation)

MetricFn = Callable[[Sequence[Any], Sequence[Any]], Dict[str, float]]


def _check_lengths(targets, predictions) -> None:
  if len(targets) != len(predictions):
    raise ValueError(
        f"got {len(targets)} targets but {len(predictions)} predictions; they must pair up.")


def accuracy(targets: Sequence[Any], predictions: Sequence[Any]) -> Dict[str, float]:
  """Percentage of predictions equal to their target."""
  _check_lengths(targets, predictions)
  return {"accuracy": 100 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def _f1(tp: int, fp: int, fn: int) -> float:
  """F1 = 2tp / (2tp + fp + fn); 0 when the class never occurs in targets or predictions."""
  denominator = 2 * tp + fp + fn
  return 2 * tp / denominator if denominator else 0.0


def mean_multiclass_f1(num_classes: int) -> MetricFn:
  """Unweighted mean over classes 0..num_classes-1 of each class's F1 (sklearn's macro F1)."""

  def fn(targets, predictions):
    _check_lengths(targets, predictions)
    t, p = np.asarray(targets), np.asarray(predictions)
    scores = [
        _f1(int(np.sum((t == c) & (p == c))), int(np.sum((t != c) & (p == c))),
            int(np.sum((t == c) & (p != c)))) for c in range(num_classes)
    ]
    return {f"mean_{num_classes}class_f1": 100 * float(np.mean(scores))}

  return fn


def f1_score_with_invalid(targets: Sequence[int], predictions: Sequence[int]) -> Dict[str, float]:
  """Binary F1 of class 1; a prediction other than 0/1 counts as the wrong class."""
  _check_lengths(targets, predictions)
  t, p = np.asarray(targets), np.asarray(predictions).copy()
  invalid = (p != 0) & (p != 1)
  p[invalid] = 1 - t[invalid]
  tp = int(np.sum((t == 1) & (p == 1)))
  return {"f1": 100 * _f1(tp, int(np.sum((t == 0) & (p == 1))), int(np.sum((t == 1) & (p == 0))))}


def all_match(targets: Sequence[Any], predictions: Sequence[Any]) -> Dict[str, float]:
  """100 if every prediction equals its target, else 0."""
  return {"exact_match": 100 * float(np.array_equal(targets, predictions))}


def mean_group_metric(metric_fn: MetricFn, group_key: str = "group",
                      value_key: str = "value") -> MetricFn:
  """Computes `metric_fn` within each group of targets (by `group_key`) and averages."""

  def fn(targets, predictions):
    _check_lengths(targets, predictions)
    grouped = collections.defaultdict(lambda: ([], []))
    for target, prediction in zip(targets, predictions):
      group = grouped[target[group_key]]
      group[0].append(target[value_key])
      group[1].append(prediction[value_key])
    scores = collections.defaultdict(list)
    for group_targets, group_predictions in grouped.values():
      for name, score in metric_fn(group_targets, group_predictions).items():
        scores[name].append(score)
    return {name: float(np.mean(values)) for name, values in scores.items()}

  return fn


def deduplicate_metric(metric_fn: MetricFn, group_key: str = "group",
                       value_key: str = "value") -> MetricFn:
  """Computes `metric_fn` on the first (target, prediction) of each group only."""

  def fn(targets, predictions):
    _check_lengths(targets, predictions)
    seen, kept_targets, kept_predictions = set(), [], []
    for target, prediction in zip(targets, predictions):
      if target[group_key] in seen:
        continue
      seen.add(target[group_key])
      kept_targets.append(target[value_key])
      kept_predictions.append(prediction[value_key])
    return metric_fn(kept_targets, kept_predictions)

  return fn


def multirc_f1_over_all_answers(targets: Sequence[Mapping[str, Any]],
                                predictions: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
  """F1 with invalid predictions over every MultiRC answer (SuperGLUE's F1a)."""
  return f1_score_with_invalid([t["value"] for t in targets], [p["value"] for p in predictions])


def normalize_squad(text: str) -> str:
  """The official SQuAD normalization: lower case, no punctuation, no articles, single spaces."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


def _token_f1(target: str, prediction: str) -> float:
  common = collections.Counter(prediction.split()) & collections.Counter(target.split())
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(prediction.split())
  recall = num_same / len(target.split())
  return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> Dict[str, float]:
  """SQuAD exact match and token F1, each maximized over an example's reference answers."""
  _check_lengths(targets, predictions)
  ems, f1s = [], []
  for answers, prediction in zip(targets, predictions):
    answers = [normalize_squad(a) for a in answers]
    prediction = normalize_squad(prediction)
    ems.append(max(float(a == prediction) for a in answers))
    f1s.append(max(_token_f1(a, prediction) for a in answers))
  return {"em": 100 * float(np.mean(ems)), "f1": 100 * float(np.mean(f1s))}
