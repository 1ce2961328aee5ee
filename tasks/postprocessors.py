"""Postprocessors: decoded model output (or target text) -> the values the metrics compare.

seqio calls `postprocess_fn(text, example=..., is_target=...)` for predictions (is_target=False)
and for targets (is_target=True, `example` being the preprocessed example). Predictions outside a
task's label set become -1 and count as wrong (T5's convention); a *target* outside the label set
is an error, since it would silently corrupt the score.
"""
from typing import Any, Callable, Mapping, Optional, Sequence

from prompt_jax.tasks import readers

SENTINEL_0 = "<extra_id_0>"

# The determiners T5 ignores when matching a WSC referent.
_WSC_DETERMINERS = frozenset({
    "a", "an", "few", "her", "his", "each", "every", "many", "much", "my", "our", "some", "that",
    "the", "their", "these", "this", "those", "which", "whose", "your"
})


def _text(value: Any) -> str:
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if hasattr(value, "numpy"):  # A scalar tf.Tensor.
    return _text(value.numpy())
  return str(value)


def string_label_to_class_id(string_label: Any, label_classes: Sequence[str],
                             example: Optional[Mapping[str, Any]] = None,
                             is_target: bool = False, default: int = -1) -> int:
  """Index of the label text in `label_classes`; `default` for predictions outside it."""
  del example
  label = _text(string_label)
  if label in label_classes:
    return list(label_classes).index(label)
  if is_target:  # a DataFormatError: the CLI's one line, exit 2 (through seqio's ValueError)
    raise readers.DataFormatError(
        f"target {label!r} is not in the label set {list(label_classes)}; the evaluation split "
        f"has no (or wrong) labels: evaluate on a labeled split such as 'validation'.")
  return default


def multirc(string_label: Any, example: Optional[Mapping[str, Any]] = None,
            is_target: bool = False) -> Mapping[str, Any]:
  """{"value": class id, "group": question idx (targets only)} for MultiRC's grouped metrics."""
  result = {"value": string_label_to_class_id(string_label, ("False", "True"),
                                              is_target=is_target)}
  if is_target:
    result["group"] = int(example["idx/question"])
  return result


def record(answer: Any, example: Optional[Mapping[str, Any]] = None,
           is_target: bool = False) -> Mapping[str, Any]:
  """ReCoRD: prediction text, or all answers plus the (passage, query) group for targets."""
  if is_target:
    return {
        "value": [_text(a) for a in example["answers"]],
        "group": (int(example["idx/passage"]), int(example["idx/query"])),
    }
  return {"value": _text(answer)}


def qa(answer: Any, example: Optional[Mapping[str, Any]] = None,
       is_target: bool = False) -> Any:
  """SQuAD/MRQA: the prediction text, or the list of all answers for targets."""
  if is_target:
    return [_text(a) for a in example["answers"]]
  return _text(answer)


def wsc_simple(prediction: Any, example: Optional[Mapping[str, Any]] = None,
               is_target: bool = False) -> int:
  """1 if the generated referent matches the candidate (T5's fuzzy match), else 0.

  A prediction that is empty once cleaned (e.g. "" or "the") is -1, as in T5: 0 would
  spuriously match a negative label. For targets, the example's label (1: the candidate is
  the pronoun's referent).
  """
  if is_target:
    return int(example["label"])

  def clean(s: str) -> str:
    s = s.strip().lower()
    return " ".join(w for w in s.split(" ") if w not in _WSC_DETERMINERS)

  prediction = clean(_text(prediction))
  if not prediction:
    return -1
  referent = clean(_text(example["targets_pretokenized"]))
  if ("'" in prediction) != ("'" in referent):
    # "Bob" must not match the referent "Bob's hat".
    return 0
  prediction_words, referent_words = set(prediction.split(" ")), set(referent.split(" "))
  return int(prediction_words.issubset(referent_words) or
             referent_words.issubset(prediction_words))


def remove_sentinel(text: Any, *unused_args, **unused_kwargs) -> str:
  """Strips a leading <extra_id_0> (and the space after it) from a decoded prediction."""
  text = _text(text)
  if text.startswith(SENTINEL_0):
    text = text[len(SENTINEL_0):].lstrip()
  return text


def with_sentinel_removed(postprocess_fn: Optional[Callable]) -> Callable:
  """Wraps `postprocess_fn` so that predictions lose their leading sentinel first."""

  def fn(output, example=None, is_target=False):
    if not is_target:
      output = remove_sentinel(output)
    if postprocess_fn is None:
      return output
    return postprocess_fn(output, example=example, is_target=is_target)

  return fn


def translate_labels(mapping: Mapping[str, str]) -> Callable:
  """A postprocessor rewriting predicted label words, e.g. QQP's "duplicate" -> "equivalent".

  Whole-label mapping: "not_duplicate" -> "not_equivalent" must be listed explicitly.
  """

  def fn(output, example=None, is_target=False):
    del example
    output = _text(output)
    if is_target:
      return output
    return mapping.get(output, output)

  return fn


def sequential(*fns: Callable) -> Callable:
  """Applies postprocessors in order, passing `example` and `is_target` to each."""

  def fn(output, example=None, is_target=False):
    for f in fns:
      output = f(output, example=example, is_target=is_target)
    return output

  return fn
