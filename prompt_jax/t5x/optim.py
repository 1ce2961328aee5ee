"""What trains under t5x, and where the prompt parameters live on the mesh.

t5x's `optimizers.MultiOptimizer` takes (traversal, optimizer) pairs; the traversal here selects
the parameters that match the prompt method's trainable regex (`spec.trainable_regex`, or
TRAINABLE_REGEX), so every frozen parameter gets no optimizer state (MultiOptimizer stores None
for it) and its update is the identity. The frozen gradients t5x's train step asks for are dead
code once nothing reads them, so XLA drops them.

`MultiOptimizer` below is t5x's with one change to its checkpoint: the frozen parameters' None
states are left out of the state dict (t5x's orbax restore turns a saved None into an array read
and fails, so a run could not resume from its own MODEL_DIR), as t5x's `OptaxWrapper` leaves out
optax's empty states.
"""
import logging
from typing import Optional

import jax
from flax import traverse_util
from flax.serialization import to_state_dict

from prompt_jax.t5x import require_t5x

require_t5x()  # the install hint, not 'No module named t5x'
# pylint: disable=g-import-not-at-top,wrong-import-position
from t5x import optimizers as t5x_optimizers

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


class MultiOptimizer(t5x_optimizers.MultiOptimizer):
  """t5x's MultiOptimizer whose state dict (what a checkpoint saves and restores) holds
  optimizer state only for the parameters a traversal selects.

  t5x's stores None for every other parameter; its orbax checkpointer saves that None as a
  placeholder, but on restore (`checkpoints._construct_orbax_restoration_transforms`) turns the
  placeholder into an array to read, which is not there: `t5x.train` could not resume a run from
  its MODEL_DIR. Leaving the None states out of the state dict (the checkpoint then holds no
  entry for them) and putting them back in `restore_state` fixes that, and a checkpoint written
  before (with the placeholders) restores too: t5x reads only the state dict's keys.
  """

  def state_dict(self, target, state):
    state_dict = super().state_dict(target, state)
    flat = _flat(state_dict["state"]["param_states"])
    untrained = _untrained_param_paths(target, flat)
    state_dict["state"]["param_states"] = traverse_util.unflatten_dict(
        {k: v for k, v in flat.items() if k not in untrained})
    return state_dict

  def restore_state(self, opt_target, opt_state, state_dict):
    flat = _flat(state_dict["state"]["param_states"])
    for path in _untrained_param_paths(opt_target, _flat(to_state_dict(opt_state)["param_states"])):
      flat.setdefault(path, None)
    state_dict = dict(state_dict, state=dict(
        state_dict["state"], param_states=traverse_util.unflatten_dict(flat)))
    return super().restore_state(opt_target, opt_state, state_dict)


def _flat(param_states) -> dict:
  """{key tuple: leaf} of a param_states state dict (None and empty states kept)."""
  return dict(traverse_util.flatten_dict(param_states, keep_empty_nodes=True))


def _untrained_param_paths(target, flat_param_states: dict) -> set:
  """The paths (key tuples) of the parameters whose optimizer state is None."""
  return {path for path in traverse_util.flatten_dict(to_state_dict(target))
          if path in flat_param_states and flat_param_states[path] is None}


def masked_optax(regex: Optional[str] = None):
  """t5x's `OptaxWrapper` around the method's own optax optimizer, applied only to the
  parameters matching `regex` (None: the method's): `optax.multi_transform` gives every other
  parameter `set_to_zero` (no state, a zero update), so the update rule is prompt-jax train's.

  The rate applied is the method's own (DPT_LR, PREFIX_LR), not t5x's learning-rate schedule
  (OptaxWrapper ignores it); the method files bind LEARNING_RATE, t5x's constant schedule, to it
  so that t5x logs that rate. A warm-up (prompt_jax.adamw.warmup_steps) counts this run's steps,
  which t5x's schedule (counted from step 0, not the initial checkpoint's) cannot: warned."""
  import optax  # pylint: disable=g-import-not-at-top
  regex = regex if regex is not None else trainable_regex()
  method = method_optimizer()
  tx = method.tx
  first, last = float(method.schedule(0)), float(method.schedule(2**30))
  if first != last:
    logging.warning(
        "masked_optax: the method's learning rate changes over training (%g at its first step, "
        "%g later: a warm-up); t5x logs its own constant schedule (LEARNING_RATE), not it",
        first, last)

  def labels(params):  # same tree type as `params` (t5x passes FrozenDicts)
    return jax.tree_util.tree_map_with_path(
        lambda path, _: ("trainable" if trees.is_trainable(_path(path), regex) else "frozen"),
        params)
  return t5x_optimizers.OptaxWrapper(
      optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, labels))
