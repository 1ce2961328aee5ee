"""What trains under t5x, and where the prompt parameters live on the mesh.

t5x's `optimizers.MultiOptimizer` takes (traversal, optimizer) pairs; the traversal here selects
the parameters that match the prompt method's trainable regex (`spec.trainable_regex`, or
TRAINABLE_REGEX), so every frozen parameter gets no optimizer state (MultiOptimizer stores None
for it) and its update is the identity. The frozen gradients t5x's train step asks for are dead
code once nothing reads them, so XLA drops them.
"""
from typing import Optional

import jax
from flax import traverse_util

from prompt_jax import partitioning
from prompt_jax import run_setup
from prompt_jax import trees


def trainable_regex(spec: Optional[run_setup.ModelSpec] = None) -> str:
  """The run's trainable regex ('/'-joined parameter paths, full match)."""
  spec = spec if spec is not None else run_setup.model_spec()
  return spec.trainable_regex


def trainable_traversal(regex: Optional[str] = None) -> traverse_util.ModelParamTraversal:
  """A flax traversal of the parameters matching `regex` (None: the method's own regex)."""
  regex = regex if regex is not None else trainable_regex()
  return traverse_util.ModelParamTraversal(
      lambda path, _: trees.is_trainable(path.lstrip("/"), regex))


def logical_axis_rules():
  """The prompt parameters' logical axes (replicated), for t5x's
  `partitioning.standard_logical_axis_rules(additional_rules=...)`."""
  return tuple(partitioning.PROMPT_RULES)


def _path(key_path) -> str:
  return "/".join(str(getattr(k, "key", k)) for k in key_path)


def method_optimizer():
  """The method's own optimizer (prompt_jax's gin `prompt_jax.train.optimizer`: Adafactor as
  Lester et al. for prompt tuning, AdamW for DPT and prefixes, from the method file), as
  prompt_jax's `train.optimizers.Optimizer`."""
  import gin  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import optimizers as pj_optimizers  # pylint: disable=g-import-not-at-top
  try:
    ref = gin.query_parameter("prompt_jax.train.optimizer")
  except ValueError:
    return pj_optimizers.adafactor()
  return ref.scoped_configurable_fn() if hasattr(ref, "scoped_configurable_fn") else ref


def masked_optax(regex: Optional[str] = None):
  """t5x's `OptaxWrapper` around the method's own optax optimizer, applied only to the
  parameters matching `regex` (None: the method's): `optax.multi_transform` gives every other
  parameter `set_to_zero` (no state, a zero update), so the update rule is prompt-jax train's."""
  import optax  # pylint: disable=g-import-not-at-top
  from t5x import optimizers  # pylint: disable=g-import-not-at-top
  regex = regex if regex is not None else trainable_regex()
  tx = method_optimizer().tx

  def labels(params):  # same tree type as `params` (t5x passes FrozenDicts)
    return jax.tree_util.tree_map_with_path(
        lambda path, _: ("trainable" if trees.is_trainable(_path(path), regex) else "frozen"),
        params)
  return optimizers.OptaxWrapper(
      optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, labels))
