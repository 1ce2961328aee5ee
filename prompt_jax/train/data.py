"""seqio task -> EncDecFeatureConverter(pack=False) -> per-process numpy batches.

Configured as t5x's `utils.DatasetConfig` (same field names), so gin lines read the same:
  train/DatasetConfig.mixture_or_task_name = %MIXTURE_OR_TASK_NAME

Evaluation (teacher forced): each process reads the data shard of the rows its devices hold
(`process_rows`: shard start/R of B/R for R rows; processes that share rows, a `model` axis across
processes, read the same shard); the loop assembles the global batch sharded on `data`.

Training (`TrainStream`): the global batch does not depend on the topology. The split is read as
a fixed number K of data shards (`num_data_shards`, seqio.ShardInfo(k, K)); the global batch of
every step is shard 0's next B/K rows, then shard 1's, ... Each process reads the shards that
overlap the rows its devices hold (`process_rows`) and keeps those rows, so 1 process x 4 devices
and 2 processes x 2 devices train on the same rows in the same order. Each shard's position is its
tf.data iterator state, saved in every checkpoint (t5x's `save_dataset`, per data shard instead
of per process): a restart restores it in O(shuffle buffer), not O(steps) as `skip` would.

Multi-task data: `prompt_jax.tasks.multitask.register_multitask_mixture(name, tasks)` registers
a seqio mixture whose tasks set the feature `task_index` ([k] for the k-th task); the
feature converter passes it on as the model feature `task_ids` [B], which the model hands to prompt methods
(`PromptContext.task_ids`). Batches of other tasks have no `task_ids`.
"""
import contextlib
import dataclasses
import importlib
import inspect
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import gin
import jax
import numpy as np
import seqio
import tensorflow as tf

from prompt_jax.errors import ConfigError, causes, check_integer
from prompt_jax.prompts import multitask as multitask_prompts


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


def check_feature_lengths(cfg: DatasetConfig) -> None:
  lengths = cfg.task_feature_lengths
  if not isinstance(lengths, Mapping) or set(lengths) != {"inputs", "targets"} or not all(
      isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in lengths.values()):
    raise ConfigError(f"TASK_FEATURE_LENGTHS must map 'inputs' and 'targets' to positive "
                      f"lengths, e.g. {{'inputs': 512, 'targets': 8}}; got {lengths!r}")


def check_config(cfg: DatasetConfig) -> None:
  """One ConfigError for a value of the wrong type (before any data is read)."""
  check_feature_lengths(cfg)
  check_integer(cfg.seed, "RANDOM_SEED", none_ok=True)


def checked_task(cfg: DatasetConfig):
  """The task of `cfg` after checking its values and split (reads no data)."""
  check_config(cfg)
  task = get_task(cfg.mixture_or_task_name, cfg.module)
  check_split(task, cfg.split)
  return task


@contextlib.contextmanager
def user_data_errors():
  """A missing or malformed data file (or vocabulary) while building a pipeline is the user's to
  fix: re-raised as a ConfigError with the reader's one-line message (file:line, what to do).
  tf.data may wrap the error while tracing a preprocessor (autograph's StagingError)."""
  try:
    yield
  except ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    message = _user_data_error(e)
    if message is None:
      raise
    raise ConfigError(message) from e


def _user_data_error(e: BaseException) -> Optional[str]:
  try:
    from prompt_jax.tasks import DataFormatError  # pylint: disable=g-import-not-at-top
  except ImportError:
    DataFormatError = FileNotFoundError  # pylint: disable=invalid-name
  for c in causes(e):
    if isinstance(c, (FileNotFoundError, DataFormatError)):
      text = str(c).strip()
      return text.splitlines()[0] if text else type(c).__name__
    for name in ("FileNotFoundError", "DataFormatError"):  # wrapped as text by autograph
      for line in str(c).splitlines():
        if line.strip().startswith(name + ": "):
          return line.strip()[len(name) + 2:]
  return None


def mixture_tasks(task, split: str) -> List[seqio.Task]:
  """The tasks of a seqio mixture that have `split` (in seqio's order, as its Evaluator and
  `Mixture.get_dataset` take them), or [] for a task."""
  if not hasattr(task, "tasks") or hasattr(task, "preprocessors"):
    return []
  return [t for t in task.tasks if split in t.splits]


def get_dataset(cfg: DatasetConfig, *, num_epochs: Optional[int] = None,
                shard_id: Optional[int] = None, num_shards: Optional[int] = None,
                start_position: int = 0, drop_remainder: bool = True) -> tf.data.Dataset:
  """Batched, converted dataset of this process's shard, positioned at `start_position` batches."""
  shard_id = jax.process_index() if shard_id is None else shard_id
  num_shards = jax.process_count() if num_shards is None else num_shards
  if cfg.batch_size % num_shards:
    raise ConfigError(f"BATCH_SIZE={cfg.batch_size} is not divisible by the "
                      f"{num_shards} processes")
  task = checked_task(cfg)
  with user_data_errors():
    read = lambda t: t.get_dataset(
        sequence_length=dict(cfg.task_feature_lengths), split=cfg.split,
        use_cached=cfg.use_cached, shuffle=cfg.shuffle, seed=cfg.seed, num_epochs=num_epochs,
        shard_info=seqio.ShardInfo(index=shard_id, num_shards=num_shards))
    subtasks = mixture_tasks(task, cfg.split)
    if num_epochs is not None and subtasks:
      # seqio's mixture sampling stops at the first task to run out (stop_on_empty_dataset),
      # dropping the other tasks' remaining rows: each task's rows instead, one of each in turn.
      parts = [read(t) for t in subtasks]
      ds = tf.data.Dataset.choose_from_datasets(
          parts, tf.data.Dataset.range(len(parts)).repeat(), stop_on_empty_dataset=False)
    else:
      ds = read(task)
    ds = convert(ds, cfg)
  ds = ds.batch(cfg.batch_size // num_shards, drop_remainder=drop_remainder)
  if start_position:
    ds = ds.skip(start_position)  # deterministic resume: same seed, same order
  return ds.prefetch(tf.data.AUTOTUNE)


MODEL_FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
                  "decoder_loss_weights")
TASK_INDEX = multitask_prompts.TASK_INDEX  # task feature: an example's task in its mixture
TASK_IDS = "task_ids"  # model feature [B] int32 (present only for multi-task mixtures)
OPTIONAL_MODEL_FEATURES = (TASK_IDS,)


def model_features(features) -> Tuple[str, ...]:
  """MODEL_FEATURES plus the optional ones present in `features` (names)."""
  return MODEL_FEATURES + tuple(k for k in OPTIONAL_MODEL_FEATURES if k in features)


class EncDecFeatureConverter(seqio.EncDecFeatureConverter):
  """seqio's converter; for a dataset whose examples carry a task's `task_index` ([1] or scalar,
  a multi-task mixture's) it also passes it on as the model feature `task_ids` (rank 0)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.task_ids = False

  def __call__(self, ds: tf.data.Dataset, task_feature_lengths):
    self.task_ids = TASK_INDEX in ds.element_spec
    self.MODEL_FEATURES = dict(type(self).MODEL_FEATURES)  # pylint: disable=invalid-name
    if self.task_ids:
      self.MODEL_FEATURES[TASK_IDS] = seqio.FeatureConverter.FeatureSpec(dtype=tf.int32, rank=0)
    # seqio's Evaluator passes the lengths it measured, task_index's included: not a text feature.
    lengths = {k: v for k, v in task_feature_lengths.items() if k != TASK_INDEX}
    return super().__call__(ds, lengths)

  def _convert_example(self, features):
    out = dict(super()._convert_example(features))
    if self.task_ids:
      out[TASK_IDS] = tf.reshape(tf.cast(features[TASK_INDEX], tf.int32), [-1])[0]
    return out

  def get_model_feature_lengths(self, task_feature_lengths):
    lengths = dict(super().get_model_feature_lengths(task_feature_lengths))
    if self.task_ids:
      lengths[TASK_IDS] = 1  # rank 0: seqio skips its length check
    return lengths


def convert(ds: tf.data.Dataset, cfg: "DatasetConfig") -> tf.data.Dataset:
  """`ds` (task features) -> model features; `task_ids` when the tasks set `task_index`."""
  return EncDecFeatureConverter(pack=cfg.pack)(ds, dict(cfg.task_feature_lengths))


def numpy_batches(ds: tf.data.Dataset) -> Iterator[Mapping[str, np.ndarray]]:
  for batch in ds.as_numpy_iterator():
    yield {k: v for k, v in batch.items() if k in model_features(batch)}


# ===== Training: a topology-independent global stream =====

def process_spans(sharding, batch_size: int) -> List[Tuple[int, int, int]]:
  """(start, stop, process index) of the global batch rows each device holds under `sharding`
  (the `data` sharding of a [batch, ...] array): every device's, which every process knows from
  the sharding alone."""
  return sorted({(index[0].start or 0, batch_size if index[0].stop is None else index[0].stop,
                  device.process_index)
                 for device, index in sharding.devices_indices_map((batch_size, 1)).items()})


def process_rows(sharding, batch_size: int) -> Tuple[int, int]:
  """[start, stop) of the global batch rows that this process's devices hold under `sharding`
  (the `data` sharding of a [batch, ...] array)."""
  spans = sorted({(start, stop) for start, stop, process in process_spans(sharding, batch_size)
                  if process == jax.process_index()})
  for (_, stop), (start, _) in zip(spans, spans[1:]):
    if start != stop:
      raise ConfigError(f"this process's devices hold rows {spans} of the batch, not one "
                        f"contiguous block; the data layout needs the devices of each process "
                        f"next to each other on the mesh's data axis")
  return spans[0][0], spans[-1][1]


def shard_dataset(cfg: DatasetConfig, shard: int, num_shards: int, skip: int = 0,
                  group_batches: int = 0) -> tf.data.Dataset:
  """Data shard `shard` of `num_shards`: repeated, shuffled by `cfg.seed`, converted, sorted by
  length within windows of `group_batches` batches (`group_by_length`; 0: not), and batched by
  `batch_size // num_shards`, after `skip` batches."""
  task = checked_task(cfg)
  kwargs = {}
  if "try_in_mem_cache" in inspect.signature(task.get_dataset).parameters:
    # seqio caches small splits in memory; a checkpointed iterator would then carry the whole
    # cache. Without it the iterator state is the shuffle buffer (the order is the same).
    kwargs["try_in_mem_cache"] = False
  with user_data_errors():
    ds = task.get_dataset(
        sequence_length=dict(cfg.task_feature_lengths), split=cfg.split,
        use_cached=cfg.use_cached, shuffle=cfg.shuffle, seed=cfg.seed, num_epochs=None,
        shard_info=seqio.ShardInfo(index=shard, num_shards=num_shards), **kwargs)
    ds = convert(ds, cfg)
  ds = ds.map(lambda ex: {k: ex[k] for k in model_features(ex)})
  rows = cfg.batch_size // num_shards
  window = group_batches * rows
  if window:  # each window of `window` examples in descending length, then cut into batches
    ds = ds.batch(window, drop_remainder=True).map(sort_by_length).unbatch()
  ds = ds.batch(rows, drop_remainder=True)
  if skip:
    ds = ds.skip(skip)  # only for checkpoints without iterator state: O(skip)
  return ds.prefetch(tf.data.AUTOTUNE)


# ===== Length bucketing (opt-in) =====

# The features whose trailing padding bucketing trims, and the length each is measured by.
_BUCKETED = {"encoder_input_tokens": "inputs", "decoder_input_tokens": "targets",
             "decoder_target_tokens": "targets", "decoder_loss_weights": "targets"}


@gin.configurable(module="prompt_jax")
def length_buckets(num_buckets: int = 0, multiple: int = 8) -> Tuple[int, int]:
  """Training batches padded to the smallest of `num_buckets` fixed lengths per feature that
  holds the batch's longest example, instead of to TASK_FEATURE_LENGTHS (0: off, the default);
  eval / infer batches of inputs likewise (`evaluation.inference`).

    prompt_jax.length_buckets.num_buckets = 4

  The lengths are TASK_FEATURE_LENGTHS * k / num_buckets (k = 1..num_buckets) rounded up to a
  multiple of `multiple`, so jit compiles at most num_buckets^2 step programs. Only trailing
  padding is cut (the feature converter pads at the end); the prompt's positions are added by
  the model after the cut, wherever its placement puts them, so losses and metrics are those of
  the padded batch (tests/train/test_bucketing.py). With dropout > 0 the dropout draws depend
  on the shape: equal in distribution, not in value."""
  # 2.5 or '4' was a TypeError from inside the pipeline, exit 1
  check_integer(num_buckets, "prompt_jax.length_buckets.num_buckets", 0, " (0: off)")
  check_integer(multiple, "prompt_jax.length_buckets.multiple", 1)
  return num_buckets, multiple


@gin.configurable(module="prompt_jax")
def group_by_length(batches: int = 0) -> int:
  """Training examples sorted by length within windows of `batches` batches before they are
  batched (0: off, the default), so that each batch holds rows of similar length and its
  length bucket wastes fewer padded positions:

    prompt_jax.length_buckets.num_buckets = 8
    prompt_jax.group_by_length.batches = 8

  As transformers' `group_by_length` (its megabatches of 50 batches): each window of
  `batches` x BATCH_SIZE shuffled examples is ordered by input length, longest first (then
  target length), and cut into consecutive batches. Each window holds the same examples as
  without grouping, each trained on once; what changes is which examples share a batch and
  their order within the window, so an example moves at most `batches` - 1 steps (a longer
  window pads less and mixes less). Per data shard and deterministic, so the global batch
  still does not depend on the process layout and the iterator state in each checkpoint
  resumes it bitwise. Needs `length_buckets`: without it every batch is padded to
  TASK_FEATURE_LENGTHS and grouping would only change the order."""
  check_integer(batches, "prompt_jax.group_by_length.batches", 0, " (0: off)")
  return batches


def sort_by_length(features: Mapping[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """A window of examples ([window, ...] each feature) in descending order of input length,
  then of target length (stable: ties keep the shuffled order)."""
  inputs = tf.math.count_nonzero(features["encoder_input_tokens"], axis=1, dtype=tf.int64)
  targets = tf.math.count_nonzero(features["decoder_target_tokens"], axis=1, dtype=tf.int64)
  key = inputs * (tf.cast(tf.shape(features["decoder_target_tokens"])[1], tf.int64) + 1) + targets
  order = tf.argsort(key, direction="DESCENDING", stable=True)
  return {k: tf.gather(v, order) for k, v in features.items()}


def bucket_lengths(feature_length: int, num_buckets: int, multiple: int = 8) -> Tuple[int, ...]:
  """The fixed lengths a feature of TASK_FEATURE_LENGTHS `feature_length` is padded to."""
  lengths = {min(feature_length, -(-(feature_length * k // num_buckets) // multiple) * multiple)
             for k in range(1, num_buckets + 1)}
  return tuple(sorted(lengths | {feature_length}))


def bucket_for(length: int, buckets: Tuple[int, ...]) -> int:
  """The smallest of `buckets` (ascending, the last the full length) holding `length`."""
  return next(b for b in buckets if b >= length)


def used_length(tokens: np.ndarray) -> int:
  """1 + the last non-padding column of a [rows, length] batch (0 if all padding)."""
  nonzero = np.flatnonzero(np.any(tokens != 0, axis=0))
  return int(nonzero[-1]) + 1 if nonzero.size else 0


def trim_to_buckets(batch: Mapping[str, np.ndarray], buckets: Mapping[str, Tuple[int, ...]],
                    needed: Optional[Mapping[str, int]] = None) -> Dict[str, np.ndarray]:
  """`batch` cut to the smallest bucket of each feature holding its longest row. `needed`
  (feature length name -> length) overrides the longest-row lengths (all processes of a
  multi-process run agree on the global maximum)."""
  if needed is None:
    needed = batch_needs(batch)
  out = dict(batch)
  for name, length_name in _BUCKETED.items():
    if name not in batch:
      continue
    target = bucket_for(needed[length_name], buckets[length_name])
    out[name] = batch[name][:, :target]
  return out


def batch_needs(batch: Mapping[str, np.ndarray]) -> Dict[str, int]:
  """The length each of inputs/targets needs: its features' longest row (padding excluded)."""
  needs = {"inputs": 0, "targets": 0}
  for name, length_name in _BUCKETED.items():
    if name in batch:
      needs[length_name] = max(needs[length_name], used_length(batch[name]))
  return needs


class TrainStream:
  """This process's rows of each step's global batch (see the module docstring).

  `iterators`: shard -> tf.data iterator, every shard this process reads; `owned`: the shards
  whose state this process saves (those whose first row is on this process and on no process of
  a lower index: with a `model` axis across processes several hold the same rows, and each shard
  is still saved by exactly one process; a restore gives every holder the state). With
  `length_buckets` on, each batch is cut to its bucket (`buckets`) after it is read: the
  iterator state is that of the padded stream (with `group_by_length`, of the grouped one).
  `tokens_real` / `tokens_processed` count this process's real and processed token positions
  (inputs + targets, prompt positions excluded) for the real-token share."""

  def __init__(self, cfg: DatasetConfig, num_shards: int, rows: Tuple[int, int],
               spans: Optional[Sequence[Tuple[int, int, int]]] = None):
    if num_shards < 1 or cfg.batch_size % num_shards:
      raise ConfigError(f"BATCH_SIZE={cfg.batch_size} is not divisible by num_data_shards="
                        f"{num_shards}; choose a number of data shards that divides it")
    self.cfg = cfg
    self.num_shards = num_shards
    self.rows_per_shard = cfg.batch_size // num_shards
    start, stop = rows
    self.shards: List[int] = list(range(start // self.rows_per_shard,
                                        -(-stop // self.rows_per_shard)))
    self._offset = start - self.shards[0] * self.rows_per_shard
    self._rows = stop - start
    # `spans` (`process_spans`: every device's rows and process): the lowest process holding a
    # shard's first row saves it; without them, this process holds its rows alone.
    lead = lambda row: min(p for a, b, p in spans if a <= row < b) if spans else None
    self.owned: List[int] = [k for k in self.shards if start <= k * self.rows_per_shard < stop
                             and lead(k * self.rows_per_shard) in (None, jax.process_index())]
    self.iterators: Dict[int, tf.data.Iterator] = {}
    num_buckets, multiple = length_buckets()
    self.buckets: Optional[Dict[str, Tuple[int, ...]]] = None
    if num_buckets:
      check_feature_lengths(cfg)
      self.buckets = {k: bucket_lengths(v, num_buckets, multiple)
                      for k, v in cfg.task_feature_lengths.items()}
    self.group_batches = group_by_length()
    if self.group_batches and self.buckets is None:
      raise ConfigError(f"prompt_jax.group_by_length.batches={self.group_batches} needs length "
                        f"buckets: set prompt_jax.length_buckets.num_buckets (e.g. 8); without "
                        f"them every batch is padded to TASK_FEATURE_LENGTHS and grouping "
                        f"would only reorder the examples")
    self.tokens_real = 0
    self.tokens_processed = 0
    self._check_rows()
    self.restart(skip=0)

  def _check_rows(self) -> None:
    """A data shard with no examples (an empty or all-filtered split, or more data shards than
    examples) would end the stream at the first step, after MODEL_DIR was written: one line now.
    Each shard is read unshuffled up to its first batch (cheap: no shuffle buffer to fill)."""
    cfg = dataclasses.replace(self.cfg, shuffle=False)
    for k in self.shards:
      if not list(shard_dataset(cfg, k, self.num_shards).take(1)):
        raise ConfigError(self._no_rows(k))

  def _no_rows(self, shard: int) -> str:
    where = f" in data shard {shard} of {self.num_shards}" if self.num_shards > 1 else ""
    return (f"the {self.cfg.split!r} split of {self.cfg.mixture_or_task_name} has no examples"
            f"{where}: check its data files (empty, or every row filtered out)"
            + (" or use fewer data shards (num_data_shards)" if self.num_shards > 1 else ""))

  @property
  def real_token_share(self) -> float:
    """Real / processed input+target positions of the batches this process has read since it
    started (TensorBoard's data/real_token_share: what bucketing and grouping save)."""
    return self.tokens_real / max(self.tokens_processed, 1)

  def batch_shapes(self) -> Optional[Dict[str, Tuple[Tuple[int, ...], np.dtype]]]:
    """{feature: (global shape, dtype)} that every batch has, from tf.data's element spec
    without reading one (`train` compiles its step for them while the checkpoint is read);
    None when batches differ (length buckets) or tf.data leaves a length unknown."""
    if self.buckets is not None:
      return None
    spec = self.iterators[self.shards[0]].element_spec
    shapes = {}
    for name in model_features(spec):
      if spec[name].shape.rank is None:
        return None
      dims = spec[name].shape.as_list()
      if None in dims[1:]:
        return None
      shapes[name] = ((self.cfg.batch_size, *dims[1:]), spec[name].dtype.as_numpy_dtype)
    return shapes

  def restart(self, skip: int) -> None:
    """New pipelines positioned after `skip` batches (replaying them through tf.data)."""
    self.iterators = {k: iter(shard_dataset(self.cfg, k, self.num_shards, skip,
                                            self.group_batches))
                      for k in self.shards}

  def __iter__(self):
    return self

  def __next__(self) -> Dict[str, np.ndarray]:
    try:
      parts = [next(self.iterators[k]) for k in self.shards]
    except StopIteration:  # the stream repeats: only a shard without examples ends
      raise ConfigError(self._no_rows(self.shards[0])) from None
    batch = {name: np.concatenate([p[name].numpy() for p in parts])[
        self._offset:self._offset + self._rows] for name in model_features(parts[0])}
    if self.buckets is not None:
      needs = batch_needs(batch)
      if jax.process_count() > 1:  # one global shape: the longest row over all processes
        from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
        both = multihost_utils.process_allgather(
            np.array([needs["inputs"], needs["targets"]], np.int32))
        needs = {"inputs": int(np.max(both[..., 0])), "targets": int(np.max(both[..., 1]))}
      batch = trim_to_buckets(batch, self.buckets, needs)
    self.tokens_real += int(np.count_nonzero(batch["encoder_input_tokens"])
                            + np.count_nonzero(batch["decoder_target_tokens"]))
    self.tokens_processed += int(batch["encoder_input_tokens"].size
                                 + batch["decoder_target_tokens"].size)
    return batch
