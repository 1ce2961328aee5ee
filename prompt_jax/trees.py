"""Parameter trees as t5x names them: nested dicts <-> '/'-joined paths, trainable/frozen split.

Only parameters whose '/'-joined path fully matches TRAINABLE_REGEX are trainable.
"""
import re
from typing import Any, Dict, Mapping, Tuple

import flax
import flax.linen as nn
from flax import traverse_util

from prompt_jax.errors import ConfigError

PyTree = Any


def flatten(tree: Mapping[str, Any]) -> Dict[str, Any]:
  return traverse_util.flatten_dict(flax.core.unfreeze(tree), sep="/")


def unflatten(flat: Mapping[str, Any]) -> Dict[str, Any]:
  return traverse_util.unflatten_dict(dict(flat), sep="/")


def _compiled(trainable_regex: str) -> re.Pattern:
  """TRAINABLE_REGEX compiled (re caches it); a bad one is a one-line ConfigError."""
  if not isinstance(trainable_regex, (str, re.Pattern)):
    raise ConfigError(f"TRAINABLE_REGEX {trainable_regex!r} is not a string; set it to a "
                      f"quoted regular expression, e.g. TRAINABLE_REGEX = 'encoder/prompt/.*'")
  try:
    return re.compile(trainable_regex)
  except re.error as e:
    raise ConfigError(f"TRAINABLE_REGEX {trainable_regex!r} is not a valid regular expression "
                      f"({e}); fix the pattern (a literal ( [ + * ? needs a backslash)") from e


def is_trainable(path: str, trainable_regex: str) -> bool:
  return _compiled(trainable_regex).fullmatch(path) is not None


def split(tree: Mapping[str, Any], trainable_regex: str) -> Tuple[Dict, Dict]:
  """(trainable, frozen) nested dicts of a parameter tree."""
  flat = flatten(tree)
  trainable = {k: v for k, v in flat.items() if is_trainable(k, trainable_regex)}
  frozen = {k: v for k, v in flat.items() if k not in trainable}
  return unflatten(trainable), unflatten(frozen)


def merge(trainable: Mapping[str, Any], frozen: Mapping[str, Any]) -> Dict[str, Any]:
  flat = flatten(frozen)
  flat.update(flatten(trainable))
  return unflatten(flat)


def unbox(tree: PyTree) -> PyTree:
  """Strips flax's logical-partitioning boxes."""
  return nn.meta.unbox(tree)
