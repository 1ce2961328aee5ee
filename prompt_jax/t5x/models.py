"""t5x's EncoderDecoderModel for a prompted T5 (network.py's module).

The only difference from `t5x.models.EncoderDecoderModel`: prompt_jax's parameters carry their
logical axis names as flax `LogicallyPartitioned` boxes (models/layers.py), while t5x's train
state and partitioner read them from a `params_axes` collection (t5x examples' `param_with_axes`).
`get_initial_variables` unboxes the parameters and writes the same names into `params_axes`, so
t5x shards every parameter (prompt ones included) by the logical axis rules.
Training, evaluation (beam search, temperature sampling), scoring (`score_batch`, rank
classification) and inference are t5x's own.
"""
import re
from typing import Any, Mapping, Optional

import flax
import jax
import jax.numpy as jnp
from flax import traverse_util
from flax.linen import partitioning as flax_partitioning

from prompt_jax.errors import ConfigError
from prompt_jax.t5x import require_t5x

require_t5x()  # the install hint, not 'No module named t5x'
# pylint: disable=g-import-not-at-top,wrong-import-position
from t5x import models


def params_axes_of(boxed_params: Any) -> dict:
  """{'<name>_axes': AxisMetadata(names)} mirroring `boxed_params` (t5x's `params_axes`)."""
  flat = traverse_util.flatten_dict(
      flax.core.unfreeze(boxed_params),
      is_leaf=lambda _, x: isinstance(x, flax.linen.LogicallyPartitioned))
  axes = {}
  for path, leaf in flat.items():
    if not isinstance(leaf, flax.linen.LogicallyPartitioned):
      raise ValueError(f"parameter {'/'.join(path)} has no logical axis names")
    axes[path[:-1] + (path[-1] + "_axes",)] = flax_partitioning.AxisMetadata(
        names=tuple(leaf.names))
  return traverse_util.unflatten_dict(axes)


class PromptEncoderDecoderModel(models.EncoderDecoderModel):
  """t5x's EncoderDecoderModel whose initial variables carry `params_axes`."""

  def get_initial_variables(self, rng: jax.Array, input_shapes: Mapping[str, Any],
                            input_types: Optional[Mapping[str, jnp.dtype]] = None):
    variables = flax.core.unfreeze(super().get_initial_variables(rng, input_shapes, input_types))
    boxed = variables["params"]
    variables["params"] = flax.linen.meta.unbox(boxed)
    variables["params_axes"] = params_axes_of(boxed)
    return flax.core.freeze(variables)

  # A checkpoint restored into a model of other shapes (t5x.eval / infer of a prompt trained
  # with PROMPT_LENGTH=8 under the model file's 100) fails in flax's apply, deep in a traceback:
  # its last line is a ConfigError naming the parameter and what to set.
  def _compute_logits(self, *args, **kwargs):
    with _shapes_of_the_checkpoint():
      return super()._compute_logits(*args, **kwargs)

  def predict_batch_with_aux(self, *args, **kwargs):
    with _shapes_of_the_checkpoint():
      return super().predict_batch_with_aux(*args, **kwargs)


class _shapes_of_the_checkpoint:  # pylint: disable=invalid-name
  """Turns flax's ScopeParamShapeError into a ConfigError naming the parameter's path."""

  def __enter__(self):
    return self

  def __exit__(self, kind, error, _):
    if kind is None or not issubclass(kind, flax.errors.ScopeParamShapeError):
      return False
    match = re.search(r'parameter "([^"]+)" in "([^"]*)".*generate shape (\(.*?\)), but the '
                      r'existing parameter it received has shape (\(.*?\))', str(error))
    if match is None:
      return False
    name, scope, wanted, held = match.groups()
    path = "/".join([p for p in scope.split("/") if p] + [name])
    raise ConfigError(f"the checkpoint's {path} has shape {held}; the gin config builds it "
                      f"with shape {wanted}: set the gin values it was trained with (e.g. "
                      f"PROMPT_LENGTH, the method's gin file)") from error
