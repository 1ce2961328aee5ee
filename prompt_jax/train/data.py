"""seqio task -> EncDecFeatureConverter(pack=False) -> per-process numpy batches.

Configured as t5x's `utils.DatasetConfig` (same field names), so gin lines read the same:
  train/DatasetConfig.mixture_or_task_name = %MIXTURE_OR_TASK_NAME
Each process reads its shard of the data (seqio.ShardInfo) and yields `batch_size //
process_count` rows; the loop assembles the global batch sharded on `data`.
"""
import dataclasses
import importlib
from typing import Iterator, Mapping, Optional

import gin
import jax
import numpy as np
import seqio
import tensorflow as tf

from prompt_jax.errors import ConfigError


@gin.configurable(module="prompt_jax")
@dataclasses.dataclass
class DatasetConfig:
  """What t5x calls `utils.DatasetConfig`."""
  mixture_or_task_name: str = gin.REQUIRED
  task_feature_lengths: Mapping[str, int] = gin.REQUIRED
  split: str = "train"
  batch_size: int = gin.REQUIRED  # global
  shuffle: bool = True
  seed: Optional[int] = 0
  use_cached: bool = False
  pack: bool = False
  module: Optional[str] = None


def import_task_module(module: Optional[str]) -> None:
  """Imports MIXTURE_OR_TASK_MODULE (and prompt_jax's own tasks) so tasks are registered."""
  for name in ("prompt_jax.embedded.task", "prompt_jax.tasks", module):
    if not name:
      continue
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if name == module:
        raise ConfigError(f"MIXTURE_OR_TASK_MODULE {module!r} cannot be imported: {e}") from e


def get_task(name: str, module: Optional[str] = None):
  import_task_module(module)
  try:
    try:
      from prompt_jax import tasks  # pylint: disable=g-import-not-at-top
      return tasks.get_task(name)  # also registers few-shot names on demand
    except ImportError:
      return seqio.get_mixture_or_task(name)
  except ValueError as e:
    if "unknown task" in str(e):
      raise ConfigError(f"MIXTURE_OR_TASK_NAME: {e}") from e
    known = sorted(seqio.MixtureRegistry.names()) + sorted(seqio.TaskRegistry.names())
    import difflib  # pylint: disable=g-import-not-at-top
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {close}?" if close else " (set MIXTURE_OR_TASK_MODULE to register it)"
    raise ConfigError(f"unknown MIXTURE_OR_TASK_NAME {name!r}{hint}") from e


def check_split(task, split: str) -> None:
  splits = getattr(task, "splits", None)
  if splits and split not in splits:
    raise ConfigError(f"task {task.name!r} has no split {split!r}; it has {sorted(splits)}")


def get_dataset(cfg: DatasetConfig, *, num_epochs: Optional[int] = None,
                shard_id: Optional[int] = None, num_shards: Optional[int] = None,
                start_position: int = 0, drop_remainder: bool = True) -> tf.data.Dataset:
  """Batched, converted dataset of this process's shard, positioned at `start_position` batches."""
  shard_id = jax.process_index() if shard_id is None else shard_id
  num_shards = jax.process_count() if num_shards is None else num_shards
  if cfg.batch_size % num_shards:
    raise ConfigError(f"BATCH_SIZE={cfg.batch_size} is not divisible by the "
                      f"{num_shards} processes")
  task = get_task(cfg.mixture_or_task_name, cfg.module)
  check_split(task, cfg.split)
  ds = task.get_dataset(
      sequence_length=dict(cfg.task_feature_lengths), split=cfg.split, use_cached=cfg.use_cached,
      shuffle=cfg.shuffle, seed=cfg.seed, num_epochs=num_epochs,
      shard_info=seqio.ShardInfo(index=shard_id, num_shards=num_shards))
  converter = seqio.EncDecFeatureConverter(pack=cfg.pack)
  ds = converter(ds, dict(cfg.task_feature_lengths))
  ds = ds.batch(cfg.batch_size // num_shards, drop_remainder=drop_remainder)
  if start_position:
    ds = ds.skip(start_position)  # deterministic resume: same seed, same order
  return ds.prefetch(tf.data.AUTOTUNE)


def numpy_batches(ds: tf.data.Dataset) -> Iterator[Mapping[str, np.ndarray]]:
  for batch in ds.as_numpy_iterator():
    yield {k: v for k, v in batch.items()
           if k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
                    "decoder_loss_weights")}
