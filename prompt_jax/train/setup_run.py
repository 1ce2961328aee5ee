"""What train, eval, infer and describe share: mesh, model, frozen backbone, trainable init.

`prepare(...)` validates the configuration and restores the frozen backbone *before* anything
is written to MODEL_DIR, so a bad configuration leaves no trace.
"""
import dataclasses
import logging
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from prompt_jax import checkpoints
from prompt_jax import partitioning
from prompt_jax import vocab as vocab_lib
from prompt_jax.models import T5Config
from prompt_jax.train import builders
from prompt_jax.train import state as state_lib
from prompt_jax.train.errors import ConfigError

PyTree = Any


@dataclasses.dataclass
class Run:
  """Everything built for one run. Trees are nested dicts of (sharded) jax.Arrays."""
  mesh: Mesh
  config: T5Config
  model: nn.Module
  trainable: PyTree
  frozen: PyTree
  trainable_shardings: PyTree
  frozen_shardings: PyTree


def backbone_paths(config: T5Config) -> set:
  return set(state_lib.flatten(checkpoints.expected_shapes(config)))


def check_batch(batch_size: int, mesh: Mesh) -> None:
  data_parallel = mesh.shape["data"]
  if batch_size < 1 or batch_size % data_parallel:
    raise ConfigError(
        f"BATCH_SIZE={batch_size} is not divisible by the data-parallel size {data_parallel} "
        f"({jax.device_count()} devices / {mesh.shape['model']} model partitions)")
  if batch_size % jax.process_count():
    raise ConfigError(f"BATCH_SIZE={batch_size} is not divisible by the "
                      f"{jax.process_count()} processes")


def prepare(*, config: T5Config, prompt: Optional[builders.PromptSpec],
            feature_lengths: Mapping[str, int], initial_checkpoint_path: Optional[str],
            trainable_regex: str, mesh: Mesh, vocabulary=None, random_seed: int = 0,
            frozen_dtype: str = "float32") -> Run:
  """Restores the frozen backbone (sharded) and initialises what it lacks (the prompt)."""
  if vocabulary is not None:
    try:
      vocab_lib.check_fits(vocabulary, config.vocab_size)
    except ValueError as e:
      raise ConfigError(str(e)) from e
  if prompt is not None:
    from prompt_jax.prompts import specs  # pylint: disable=g-import-not-at-top  (gin cycle)
    specs.check_fits(prompt, feature_lengths["inputs"])
  abstract_model = builders.build_model(config, prompt)
  boxed = state_lib.abstract_variables(abstract_model, feature_lengths)
  shardings = state_lib.flatten(state_lib.param_shardings(boxed, mesh))
  backbone = backbone_paths(config)
  init_rng = jax.random.fold_in(jax.random.PRNGKey(random_seed), 0)

  if initial_checkpoint_path:
    try:
      _, loaded = checkpoints.load(initial_checkpoint_path, config,
                                   dtype=builders.dtype_of(frozen_dtype),
                                   shardings=lambda path: shardings[path])
    except checkpoints.CheckpointError as e:
      raise ConfigError(f"INITIAL_CHECKPOINT_PATH: {e}") from e
    except (OSError, ValueError) as e:
      raise ConfigError(f"INITIAL_CHECKPOINT_PATH {initial_checkpoint_path!r} cannot be read: "
                        f"{e}") from e
    loaded = state_lib.flatten(loaded)
  else:
    logging.warning("INITIAL_CHECKPOINT_PATH is empty: the backbone is randomly initialised")
    loaded = _init(abstract_model, feature_lengths, init_rng, shardings,
                   keep=lambda p: p in backbone)

  embedding = loaded.get("token_embedder/embedding")
  embedding = (np.asarray(_host(embedding), np.float32) if embedding is not None else None)
  model = builders.build_model(config, prompt, embedding, vocabulary)
  fresh = _init(model, feature_lengths, init_rng, shardings, keep=lambda p: p not in backbone)
  params = dict(loaded)
  params.update(fresh)

  trainable = {k: v for k, v in params.items() if state_lib.is_trainable(k, trainable_regex)}
  if not trainable:
    raise ConfigError(f"TRAINABLE_REGEX {trainable_regex!r} matches no parameter; "
                      f"parameters include {sorted(params)[:3]}... and {sorted(fresh)}")
  frozen_dt = builders.dtype_of(frozen_dtype)
  frozen = {k: (v.astype(frozen_dt) if v.dtype != frozen_dt else v)
            for k, v in params.items() if k not in trainable}
  trainable = {k: v.astype(jnp.float32) for k, v in trainable.items()}
  return Run(mesh=mesh, config=config, model=model,
             trainable=state_lib.unflatten(trainable), frozen=state_lib.unflatten(frozen),
             trainable_shardings=state_lib.unflatten({k: shardings[k] for k in trainable}),
             frozen_shardings=state_lib.unflatten({k: shardings[k] for k in frozen}))


def _init(model, feature_lengths, rng, shardings, keep) -> dict:
  """Initialises only the kept parameters (XLA drops the rest), placed by their shardings."""
  inputs = state_lib.model_inputs(1, feature_lengths)
  abstract = state_lib.flatten(state_lib.unbox(jax.eval_shape(
      lambda: model.init(rng, *inputs, enable_dropout=False))["params"]))
  names = [k for k in abstract if keep(k)]

  def init(rng):
    params = state_lib.flatten(state_lib.unbox(
        model.init(rng, *inputs, enable_dropout=False)["params"]))
    return {k: params[k] for k in names}

  with partitioning.axis_rules(shardings[next(iter(shardings))].mesh):
    return jax.jit(init, out_shardings={k: shardings[k] for k in names})(rng)


def _host(x):
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return multihost_utils.process_allgather(x, tiled=True)
  return jax.device_get(x)


def count(tree: PyTree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))
