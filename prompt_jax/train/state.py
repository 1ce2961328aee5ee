"""Trainable/frozen split of the parameters, the train state and the jitted train/eval steps.

Only parameters whose '/'-joined path fully matches TRAINABLE_REGEX are trainable. They, with
their optimizer state and the step, form `TrainState`; frozen parameters are a separate tree
passed to the step as an argument: they get no gradients, never enter the optimizer state and
may be held in bfloat16.
"""
import re
from typing import Any, Callable, Dict, Mapping, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from prompt_jax import partitioning
from prompt_jax.train import losses

Array = jax.Array
PyTree = Any
DEFAULT_TRAINABLE_REGEX = r"encoder/(prompt|layer_prompts)/.*"


@flax.struct.dataclass
class TrainState:
  step: Array  # [] int32
  params: PyTree  # trainable parameters only (nested dict)
  opt_state: PyTree

  def as_dict(self) -> Dict[str, Any]:
    return {"step": self.step, "params": self.params, "opt_state": self.opt_state}


def flatten(tree: Mapping[str, Any]) -> Dict[str, Any]:
  return traverse_util.flatten_dict(flax.core.unfreeze(tree), sep="/")


def unflatten(flat: Mapping[str, Any]) -> Dict[str, Any]:
  return traverse_util.unflatten_dict(dict(flat), sep="/")


def is_trainable(path: str, trainable_regex: str) -> bool:
  return re.fullmatch(trainable_regex, path) is not None


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


def model_inputs(batch_size: int, feature_lengths: Mapping[str, int]) -> Tuple[Array, ...]:
  """Dummy (encoder_input_tokens, decoder_input_tokens, decoder_target_tokens) for init."""
  enc = jnp.ones((batch_size, feature_lengths["inputs"]), jnp.int32)
  dec = jnp.ones((batch_size, feature_lengths["targets"]), jnp.int32)
  return enc, dec, dec


def abstract_variables(model: nn.Module, feature_lengths: Mapping[str, int]) -> PyTree:
  """Boxed abstract `params` of `model` (shapes and logical axes, nothing allocated)."""
  inputs = model_inputs(1, feature_lengths)
  return jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), *inputs, enable_dropout=False))["params"]


def param_shardings(boxed_params: PyTree, mesh: Mesh) -> PyTree:
  """NamedShardings of every parameter from its logical axes (t5x rules + prompt rules)."""
  specs = partitioning.logical_specs(boxed_params)
  return partitioning.logical_to_sharding(specs, mesh)


def opt_state_shardings(opt_state_shapes: PyTree, params: PyTree, shardings: PyTree,
                        mesh: Mesh) -> PyTree:
  """Optimizer slots shaped like the params share their shardings; the rest is replicated."""
  params_def = jax.tree_util.tree_structure(params)
  replicated = NamedSharding(mesh, PartitionSpec())

  def is_param_tree(x):
    return jax.tree_util.tree_structure(x) == params_def if isinstance(x, dict) else False

  def assign(x):
    if is_param_tree(x):
      return jax.tree_util.tree_map(
          lambda s, p, sh: sh if tuple(s.shape) == tuple(p.shape) else replicated,
          x, params, shardings)
    return jax.tree_util.tree_map(lambda _: replicated, x)

  return jax.tree_util.tree_map(assign, opt_state_shapes, is_leaf=is_param_tree)


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, *,
                    z_loss: float = 1e-4,
                    loss_normalizing_factor=losses.NUM_REAL_TARGET_TOKENS) -> Callable:
  """step(state, frozen, batch, dropout_rng) -> (state, metrics); not yet jitted."""

  def step(state: TrainState, frozen: PyTree, batch: Mapping[str, Array], rng: Array):
    dropout_rng = jax.random.fold_in(rng, state.step)

    def loss_fn(trainable):
      logits = model.apply(
          {"params": merge(trainable, frozen)}, batch["encoder_input_tokens"],
          batch["decoder_input_tokens"], batch["decoder_target_tokens"], enable_dropout=True,
          rngs={"dropout": dropout_rng})  # [B, S, V]
      return losses.compute_loss(logits, batch, z_loss, loss_normalizing_factor)

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.global_norm(grads)
    return TrainState(state.step + 1, params, opt_state), metrics

  return step


def make_eval_step(model: nn.Module, *, z_loss: float = 1e-4,
                   loss_normalizing_factor=losses.NUM_REAL_TARGET_TOKENS) -> Callable:
  """eval_step(trainable, frozen, batch) -> metrics (teacher forced, no dropout)."""

  def eval_step(trainable: PyTree, frozen: PyTree, batch: Mapping[str, Array]):
    logits = model.apply(
        {"params": merge(trainable, frozen)}, batch["encoder_input_tokens"],
        batch["decoder_input_tokens"], batch["decoder_target_tokens"], enable_dropout=False)
    return losses.compute_loss(logits, batch, z_loss, loss_normalizing_factor)[1]

  return eval_step


def unbox(tree: PyTree) -> PyTree:
  return nn.meta.unbox(tree)
