"""The train state and the jitted train/eval steps.

The trainable parameters (TRAINABLE_REGEX, see trees.py), with their optimizer state and the
step, form `TrainState`; frozen parameters are a separate tree passed to the step as an
argument: they get no gradients, never enter the optimizer state and may be held in bfloat16.
"""
import threading
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import flax
import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from prompt_jax import partitioning
from prompt_jax.train import guards
from prompt_jax.train import losses
from prompt_jax.trees import merge

Array = jax.Array
PyTree = Any
PROMPT_REPRESENTATION = "prompt_representation"  # optional batch feature [B, H]
TASK_IDS = "task_ids"  # optional batch feature [B]: the task of each row (multi-task mixtures)


@flax.struct.dataclass
class TrainState:
  step: Array  # [] int32
  params: PyTree  # trainable parameters only (nested dict)
  opt_state: PyTree

  def as_dict(self) -> Dict[str, Any]:
    return {"step": self.step, "params": self.params, "opt_state": self.opt_state}


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


def batch_shape(batch: Mapping[str, Any]) -> tuple:
  """The feature names and array shapes of `batch`, sorted: the key of the program jit compiles
  for it (a new length bucket is a new key)."""
  return tuple(sorted((k, tuple(v.shape)) for k, v in batch.items()))


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, *,
                    z_loss: float = 1e-4,
                    loss_normalizing_factor=losses.NUM_REAL_TARGET_TOKENS,
                    auxiliary_loss: Optional[Callable[[PyTree], Array]] = None) -> Callable:
  """step(state, frozen, batch, dropout_rng) -> (state, metrics); not yet jitted.

  `auxiliary_loss(params) -> []` (the method spec's, e.g. wayward prompts' gamma * distance; the
  merged trainable + frozen tree): added to the optimised objective and reported as the metric
  `auxiliary_loss`; `loss` stays the task loss.
  """

  def step(state: TrainState, frozen: PyTree, batch: Mapping[str, Array], rng: Array):
    dropout_rng = jax.random.fold_in(rng, state.step)

    def loss_fn(trainable):
      params = merge(trainable, frozen)
      logits = model.apply(
          {"params": params}, batch["encoder_input_tokens"],
          batch["decoder_input_tokens"], batch["decoder_target_tokens"], enable_dropout=True,
          rngs={"dropout": dropout_rng},
          # [B, H] the frozen encoder's cached representation (IDPG), when the loop adds it
          prompt_representation=batch.get(PROMPT_REPRESENTATION),
          task_ids=batch.get(TASK_IDS))  # [B, S, V]
      loss, metrics = losses.compute_loss(logits, batch, z_loss, loss_normalizing_factor)
      if auxiliary_loss is not None:
        aux = auxiliary_loss(params)  # []
        metrics["auxiliary_loss"] = aux
        loss = loss + aux
      return loss, metrics

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.global_norm(grads)
    return TrainState(state.step + 1, params, opt_state), metrics

  return step


def abstract_state(trainable: PyTree, trainable_shardings: PyTree,
                   tx: optax.GradientTransformation, mesh: Mesh) -> TrainState:
  """The state at step 0 as shapes placed by their shardings (jax.ShapeDtypeStruct; nothing is
  allocated): `trainable` (arrays or shapes) by `trainable_shardings`, `tx`'s state by
  `opt_state_shardings`, the step replicated. `plan` compiles from it; `initial_state` fills it."""
  def placed(x, sharding):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  opt_shapes = jax.eval_shape(tx.init, trainable)
  opt_shardings = opt_state_shardings(opt_shapes, trainable, trainable_shardings, mesh)
  return TrainState(placed(np.int32(0), partitioning.replicated(mesh)),
                    jax.tree_util.tree_map(placed, trainable, trainable_shardings),
                    jax.tree_util.tree_map(placed, opt_shapes, opt_shardings))


def shardings_of(tree: PyTree) -> PyTree:
  """The `.sharding` of every leaf (placed arrays or jax.ShapeDtypeStructs)."""
  return jax.tree_util.tree_map(lambda x: x.sharding, tree)


def initial_state(trainable: PyTree, trainable_shardings: PyTree,
                  tx: optax.GradientTransformation, mesh: Mesh):
  """(state, state shardings) at step 0: `trainable` with `tx`'s fresh state, placed as
  `abstract_state` says. `train` and `bench startup` start from it."""
  shardings = shardings_of(abstract_state(trainable, trainable_shardings, tx, mesh))
  with partitioning.axis_rules(mesh):
    opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(trainable)
  return (TrainState(jax.device_put(np.int32(0), shardings.step), trainable, opt_state),
          shardings)


def jit_guarded_train_step(model: nn.Module, tx: optax.GradientTransformation,
                           state_shardings: TrainState, frozen_shardings: PyTree, mesh: Mesh,
                           **step_kwargs) -> Callable:
  """The train loop's step, jitted: `make_train_step(model, tx, **step_kwargs)` under
  `guards.finite_guarded`, i.e. step(state, frozen, batch, rng, first_bad) -> (state, metrics,
  first_bad), the batch split over `data`, the state donated. `train` and `bench startup`
  compile this same program."""
  replicated = partitioning.replicated(mesh)
  return jax.jit(
      guards.finite_guarded(make_train_step(model, tx, **step_kwargs)),
      in_shardings=(state_shardings, frozen_shardings, partitioning.data_sharding(mesh),
                    replicated, replicated),
      out_shardings=(state_shardings, replicated, replicated), donate_argnums=(0,))


def abstract_step_args(state: TrainState, frozen: PyTree,
                       batch_shapes: Mapping[str, Any], mesh: Mesh) -> tuple:
  """`jit_guarded_train_step`'s arguments (state, frozen, batch, rng, first_bad) as placed
  shapes, from the placed `state` and `frozen` and {feature: (global shape, dtype)}: what
  `CompileAhead` compiles for."""
  replicated = partitioning.replicated(mesh)
  rng = jax.eval_shape(lambda: jax.random.fold_in(jax.random.PRNGKey(0), 1))
  batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=partitioning.data_sharding(mesh))
           for k, (shape, dtype) in batch_shapes.items()}
  return (state, frozen, batch, jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=replicated),
          jax.ShapeDtypeStruct((), guards.initial_flag(replicated).dtype, sharding=replicated))


class CompileAhead:
  """Compiles the jitted `fn` for abstract `args` (jax.ShapeDtypeStructs with shardings) on a
  background thread, so the compile overlaps what the caller does meanwhile: `train` reads the
  checkpoint. jit's in-memory caches then serve `fn`'s first call with arguments of those
  shapes, dtypes and shardings: the call neither traces nor compiles again. `wait()` before that
  call (else it would compile a second time). Harmless when the arguments turn out otherwise:
  the call compiles as it would have. A failure here is kept, not raised: the call compiles the
  program itself and raises it where it would have."""

  def __init__(self, fn: Callable, args: Sequence[Any], mesh: Mesh):
    self.error: Optional[BaseException] = None

    def work():
      try:
        with partitioning.axis_rules(mesh):  # thread-local: the call's rules, here too
          fn.lower(*args).compile()
      except Exception as e:  # pylint: disable=broad-except
        self.error = e

    self._thread = threading.Thread(target=work, name="prompt_jax-compile-ahead", daemon=True)
    self._thread.start()

  def wait(self) -> Optional[BaseException]:
    """Blocks until the compile is done; returns its failure, if any."""
    self._thread.join()
    return self.error


def step_compiled_ahead(model: nn.Module, tx: optax.GradientTransformation, trainable: PyTree,
                        frozen: PyTree, mesh: Mesh,
                        batch_shapes: Optional[Mapping[str, Any]], **step_kwargs):
  """(step, CompileAhead or None): `jit_guarded_train_step` of `model` for parameters still to
  be read, given as placed shapes (`run_setup.layout`'s `trainable`/`frozen`), and with
  {feature: (global shape, dtype)} its compile started on a background thread. `train` and
  `bench startup` call this before reading the checkpoint, then `.wait()` before the first
  step; without `batch_shapes` the step compiles at its first call."""
  state = abstract_state(trainable, shardings_of(trainable), tx, mesh)
  step = jit_guarded_train_step(model, tx, shardings_of(state), shardings_of(frozen), mesh,
                                **step_kwargs)
  if batch_shapes is None:
    return step, None
  return step, CompileAhead(step, abstract_step_args(state, frozen, batch_shapes, mesh), mesh)


def make_eval_step(model: nn.Module, *, z_loss: float = 1e-4,
                   loss_normalizing_factor=losses.NUM_REAL_TARGET_TOKENS) -> Callable:
  """eval_step(trainable, frozen, batch) -> metrics (teacher forced, no dropout)."""

  def eval_step(trainable: PyTree, frozen: PyTree, batch: Mapping[str, Array]):
    logits = model.apply(
        {"params": merge(trainable, frozen)}, batch["encoder_input_tokens"],
        batch["decoder_input_tokens"], batch["decoder_target_tokens"], enable_dropout=False,
        task_ids=batch.get(TASK_IDS))
    return losses.compute_loss(logits, batch, z_loss, loss_normalizing_factor)[1]

  return eval_step


