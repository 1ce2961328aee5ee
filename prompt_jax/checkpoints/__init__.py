"""Load frozen T5 weights from t5x (legacy or orbax) and Hugging Face checkpoints; save t5x's.

  config, params = checkpoints.load("gs://t5-data/pretrained_models/t5x/t5_1_1_base")
  config, params = checkpoints.load("/models/t5-small-hf", get_config("t5_1_0_small"))
  config, params = checkpoints.load(path, config, shardings=param_shardings)  # sharded jax.Arrays

`params` is the content of the flax 'params' collection of `prompt_jax.models.T5(config)`,
named as t5x's examples/t5 (see `tree.expected_shapes`). Only model weights are read: optimizer
slots are never loaded.
"""
from typing import Any, Dict, List, Mapping, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from prompt_jax.checkpoints import hf
from prompt_jax.checkpoints import orbax_format
from prompt_jax.checkpoints import t5x_legacy
from prompt_jax.checkpoints import tree as tree_lib
from prompt_jax.checkpoints.detect import FORMATS, HF, T5X_LEGACY, T5X_ORBAX
from prompt_jax.checkpoints.detect import detect_format, resolve
from prompt_jax.checkpoints.tree import CheckpointError, expected_shapes
from prompt_jax.models.config import T5Config

__all__ = ["load", "load_array", "check", "save", "detect_format", "expected_shapes", "CheckpointError", "FORMATS",
           "HF", "T5X_LEGACY", "T5X_ORBAX"]

_READERS = {T5X_LEGACY: t5x_legacy.LegacyCheckpoint, T5X_ORBAX: orbax_format.OrbaxCheckpoint,
            HF: hf.HFCheckpoint}


def load(path, config: Optional[T5Config] = None, *, dtype=None,
         dtypes: Optional[Mapping[str, Any]] = None,
         shardings: tree_lib.ShardingsArg = None) -> Tuple[T5Config, Mapping[str, Any]]:
  """Reads the T5 weights at `path` (format detected); returns (config, nested params).

  Args:
    path: a t5x legacy checkpoint dir (or its `checkpoint` file), a t5x orbax checkpoint dir, a
      model dir of `checkpoint_<step>` subdirs (latest step), local or gs://; or an HF T5 dir.
    config: the model's T5Config. Every parameter it implies must be in the checkpoint with
      that shape (CheckpointError names the parameter otherwise). None: taken from the HF
      config.json, or inferred from t5x parameter shapes.
    dtype: dtype of the returned arrays (default float32).
    dtypes: the dtype of some (or all) of them by path ('decoder/logits_dense/kernel'),
      over `dtype`.
    shardings: None for host numpy arrays; else a pytree of jax.sharding.Sharding matching the
      params, a callable path -> Sharding ('encoder/layers_0/attention/query/kernel'), or one
      Sharding for all. Each array is then read shard by shard into a jax.Array.
  """
  checkpoint, config, expected = _open(path, config)
  flat_shardings = tree_lib.resolve_shardings(shardings, expected)
  groups: Dict[np.dtype, List[str]] = {}
  for name in expected:
    dt = (dtypes or {}).get(name, dtype)
    groups.setdefault(np.dtype(jnp.dtype(np.float32 if dt is None else dt)), []).append(name)
  flat = {}
  for dt, names in groups.items():
    flat.update(checkpoint.restore(names, dt, flat_shardings))
  return config, tree_lib.unflatten(flat)


def check(path, config: T5Config) -> None:
  """Raises the CheckpointError `load(path, config)` would for a path that is not a checkpoint
  or one of other shapes, reading only the checkpoint's metadata (`train` checks before it
  starts compiling the step, which then overlaps the read)."""
  _open(path, config)


def _open(path, config: Optional[T5Config]):
  """(reader, config, {path: expected shape}) of the checkpoint at `path`, checked against
  `config` (None: the checkpoint's own or one inferred from its shapes)."""
  fmt, ckpt_dir = resolve(path)
  checkpoint = _READERS[fmt](ckpt_dir)
  checkpoint_config = getattr(checkpoint, "config", None)
  if config is None:
    config = checkpoint_config or tree_lib.infer_config(checkpoint.shapes, ckpt_dir)
  elif checkpoint_config is not None:
    hf.check_compatible(config, checkpoint_config, ckpt_dir)
  return checkpoint, config, tree_lib.validate(checkpoint.shapes, config, ckpt_dir)


def load_array(path, name: str, dtype=None, config: Optional[T5Config] = None) -> np.ndarray:
  """One parameter of the checkpoint at `path` (e.g. 'token_embedder/embedding'), as a host
  array, without reading the others (any format `load` reads). `config`: first check that every
  backbone parameter it implies is there with its shape (CheckpointError naming the first
  mismatch, as `load`)."""
  fmt, ckpt_dir = resolve(path)
  checkpoint = _READERS[fmt](ckpt_dir)
  if config is not None:
    tree_lib.validate(checkpoint.shapes, config, ckpt_dir)
  if name not in checkpoint.shapes:
    raise CheckpointError(f"{ckpt_dir} has no parameter {name}")
  dtype = np.dtype(jnp.dtype(np.float32 if dtype is None else dtype))
  return np.asarray(checkpoint.restore([name], dtype)[name])


def save(path, params: Mapping[str, Any], *, step: int = 0,
         format: str = T5X_LEGACY) -> str:  # pylint: disable=redefined-builtin
  """Writes `params` as t5x's `path/checkpoint_<step>/` and returns that directory.

  format='t5x_legacy' (default; alias 'legacy'): a msgpack `checkpoint` (version 3,
  `optimizer/target` and a minimal `optimizer/state/step`) with kernels and embeddings in gzip
  zarr dirs, as t5x's Checkpointer writes. 't5x_orbax' (alias 'orbax'): t5x's orbax layout,
  `checkpoint_<step>/state/`. Arrays are saved as float32 (t5x's default save dtype); writes
  are atomic; an existing step is an error.
  """
  from flax.core import meta  # pylint: disable=g-import-not-at-top

  writers = {T5X_LEGACY: t5x_legacy.write_checkpoint, T5X_ORBAX: orbax_format.write_checkpoint}
  format = {"legacy": T5X_LEGACY, "orbax": T5X_ORBAX}.get(format, format)
  if format not in writers:
    raise CheckpointError(f"cannot save format {format!r}; choose one of {sorted(writers)}")
  return writers[format](path, meta.unbox(params), step)
