"""Where task data comes from: TFDS, or the official files under one local data dir.

The data dir is one setting honoured by every task. Precedence:
  1. `set_data_dir(path)` (the `--data_dir` flag of `prompt-jax`),
  2. gin: `prompt_jax.tasks.local_data_dir.path = %DATA_DIR`,
  3. the environment variable $PROMPT_JAX_DATA_DIR.
When none is set, tasks read TFDS. When one is set, tasks that have a local format read it from
files laid out like ../shared/data:

  <data_dir>/super_glue/<Task>/{train,val,test}.jsonl      (official SuperGLUE zips, unpacked)
  <data_dir>/super_glue/AX-b/AX-b.jsonl, AX-g/AX-g.jsonl
  <data_dir>/glue/<TASK>/{train,dev,test}.tsv              (official GLUE; MNLI: dev_matched...)
  <data_dir>/glue/MRPC/msr_paraphrase_{train,test}.txt, dev_ids.tsv   (TFDS's MRPC sources)
  <data_dir>/mrqa/{train,dev}/<Name>.jsonl.gz              (MRQA 2019 shared-task files)
  <data_dir>/{mr,cr,subj,mpqa}/{train,test}.csv            (LM-BFF `original` files)
  <data_dir>/ag_news/{train,test}.csv, imdb/{train,test}/{neg,pos}/*.txt

The source is chosen each time a dataset is built, so the setting may change after tasks are
registered (as the CLI does after parsing flags).
"""
import dataclasses
import gzip
import os
import pathlib
import re
import threading
import zlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import gin
import seqio
import tensorflow as tf

from prompt_jax.tasks import readers

DATA_DIR_ENV = "PROMPT_JAX_DATA_DIR"
_DATA_DIR_HELP = ("--data_dir, gin `prompt_jax.tasks.local_data_dir.path = %DATA_DIR` or "
                  f"${DATA_DIR_ENV}")

_explicit_data_dir: Optional[str] = None


def set_data_dir(path: Optional[Union[str, os.PathLike]]) -> None:
  """Sets the local data dir for all tasks (None clears it, falling back to gin, then the env)."""
  global _explicit_data_dir
  _explicit_data_dir = os.fspath(path) if path else None


@gin.configurable("local_data_dir", module="prompt_jax.tasks")
def local_data_dir(path: Optional[str] = None) -> Optional[str]:
  """Gin hook for the data dir: `prompt_jax.tasks.local_data_dir.path = %DATA_DIR`."""
  return path


def _data_dir_and_origin() -> Tuple[Optional[str], str]:
  if _explicit_data_dir:
    return _explicit_data_dir, "--data_dir / set_data_dir()"
  configured = local_data_dir()
  if configured:
    return configured, "--data_dir / gin DATA_DIR"
  env = os.environ.get(DATA_DIR_ENV)
  if env:
    return env, f"${DATA_DIR_ENV}"
  return None, "unset"


def get_data_dir() -> Optional[str]:
  """The local data dir in force, or None (tasks then read TFDS)."""
  return _data_dir_and_origin()[0]


@dataclasses.dataclass(frozen=True)
class Ragged:
  """A variable-length list feature (e.g. MRQA answers) of `dtype`."""
  dtype: tf.DType


FeatureSpec = Mapping[str, Any]  # name -> tf.DType | Ragged | nested FeatureSpec


@dataclasses.dataclass(frozen=True)
class LocalFiles:
  """Where one dataset's official files live under the data dir, and how to parse them.

  Attributes:
    folder: folder relative to the data dir, e.g. "super_glue/RTE".
    files: split -> file name inside `folder` (or candidate names, the first existing wins).
    read: parses one file into TFDS-shaped example dicts (see `readers`); or split -> such a
      parser, when splits share a file (MRPC's train and validation).
    features: dtypes of the example dicts, used to build the `tf.data.Dataset`.
    how_to_get: one clause telling the user how to fill `folder`.
  """
  folder: str
  files: Mapping[str, Union[str, Sequence[str]]]
  read: Union[Callable[[pathlib.Path], List[Dict[str, Any]]],
              Mapping[str, Callable[[pathlib.Path], List[Dict[str, Any]]]]]
  features: FeatureSpec
  how_to_get: str


_cache_lock = threading.Lock()
_parsed_cache: Dict[Tuple[str, float, int], List[Dict[str, Any]]] = {}


def _read_cached(path: pathlib.Path, read: Callable) -> List[Dict[str, Any]]:
  """Parses `path` once per (path, mtime, reader)."""
  key = (str(path), path.stat().st_mtime, id(read))
  with _cache_lock:
    if key not in _parsed_cache:
      try:
        _parsed_cache[key] = read(path)
      except (UnicodeDecodeError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise readers.unreadable(path, e) from None
    return _parsed_cache[key]


def _columns(examples: Sequence[Mapping[str, Any]], spec: FeatureSpec) -> Dict[str, Any]:
  """Column tensors (dense, ragged or nested) for `tf.data.Dataset.from_tensor_slices`."""
  out = {}
  for key, kind in spec.items():
    values = [ex[key] for ex in examples]
    if isinstance(kind, Mapping):
      out[key] = _columns(values, kind)
    elif isinstance(kind, Ragged):
      flat = [v for vs in values for v in vs]
      out[key] = tf.RaggedTensor.from_row_lengths(
          tf.constant(flat, dtype=kind.dtype, shape=[len(flat)]),
          tf.constant([len(vs) for vs in values], dtype=tf.int64))
    else:
      out[key] = tf.constant(values, dtype=kind, shape=[len(values)])
  return out


def examples_to_dataset(examples: Sequence[Mapping[str, Any]],
                        features: FeatureSpec) -> tf.data.Dataset:
  """A `tf.data.Dataset` of dense tensors (variable-length lists as 1-D tensors)."""
  ds = tf.data.Dataset.from_tensor_slices(_columns(examples, features))
  # Slices of ragged columns have ragged_rank 0; an identity map turns their specs into dense ones.
  return ds.map(lambda ex: tf.nest.map_structure(tf.identity, ex))


class LocalOrTfdsSource(seqio.DataSource):
  """A `seqio.DataSource` reading local official files when a data dir is set, else TFDS.

  Either side may be absent: a TFDS-only dataset (C4) ignores the data dir; a files-only dataset
  (MR, CR, SUBJ, MPQA) requires it.
  """

  def __init__(self,
               description: str,
               splits: Sequence[str],
               tfds_name: Optional[str] = None,
               tfds_splits: Optional[Mapping[str, str]] = None,
               local: Optional[LocalFiles] = None):
    """Constructor.

    Args:
      description: human-readable dataset name for error messages, e.g. "SuperGLUE RTE".
      splits: the task's split names.
      tfds_name: TFDS name with config and version, e.g. "super_glue/rte:1.0.2".
      tfds_splits: task split -> TFDS split, when they differ (default: identity).
      local: the local file layout, if the dataset has one.
    """
    if tfds_name is None and local is None:
      raise ValueError(f"{description}: give a tfds_name, local files, or both.")
    super().__init__(splits=splits)
    self.description = description
    self.tfds_name = tfds_name
    self.local = local
    self._tfds = None
    if tfds_name:
      split_map = {s: (tfds_splits or {}).get(s, s) for s in splits}
      self._tfds = seqio.TfdsDataSource(tfds_name=tfds_name, splits=split_map)

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return False

  def __repr__(self) -> str:
    return (f"LocalOrTfdsSource({self.description!r}, tfds={self.tfds_name!r}, "
            f"local={self.local.folder if self.local else None!r})")

  def uses_local_files(self) -> bool:
    """Whether the dataset is read from local files under the current data dir setting."""
    if self.local is None:
      return False
    if get_data_dir() is None:
      if self._tfds is None:
        files = ", ".join(f"{self.local.folder}/{_names(f)[0]}" for f in self.local.files.values())
        raise FileNotFoundError(
            f"{self.description} is read from local files only and no data dir is set; set one "
            f"({_DATA_DIR_HELP}) to a folder containing {files}.")
      return False
    return True

  def _check_split(self, split: str) -> None:
    if split not in self.splits:
      raise ValueError(
          f"{self.description} has no split {split!r}; use one of {', '.join(self.splits)}.")

  def local_path(self, split: str) -> pathlib.Path:
    """The local file of `split`, raising a one-line, actionable error if it is missing."""
    self._check_split(split)
    data_dir, origin = _data_dir_and_origin()
    root = pathlib.Path(data_dir)
    if not root.is_dir():
      raise FileNotFoundError(
          f"data dir {root} (from {origin}) "
          f"{'is a file, not a folder' if root.exists() else 'does not exist'}; point it at a "
          f"folder laid out like "
          f"../shared/data (super_glue/, glue/, mrqa/, ...) or unset it to read TFDS.")
    folder = root / self.local.folder
    tfds_hint = f", or unset the data dir to read TFDS {self.tfds_name}" if self._tfds else ""
    if not folder.is_dir():
      raise FileNotFoundError(
          f"{self.description}: folder {folder} does not exist; {self.local.how_to_get}"
          f"{tfds_hint}.")
    candidates = _names(self.local.files[split])
    for name in candidates:
      if (folder / name).exists():
        return folder / name
    raise FileNotFoundError(
        f"{self.description}: split {split!r} needs {folder / candidates[0]}, which does not "
        f"exist; {self.local.how_to_get}{tfds_hint}.")

  def local_examples(self, split: str) -> List[Dict[str, Any]]:
    """The parsed examples of `split` from the local files."""
    read = self.local.read
    return _read_cached(self.local_path(split), read[split] if isinstance(read, Mapping) else read)

  def get_dataset(self,
                  split: str = "train",
                  shuffle: bool = True,
                  seed: Optional[int] = None,
                  shard_info: Optional[seqio.ShardInfo] = None,
                  *,
                  sequence_length: Optional[Mapping[str, int]] = None,
                  use_cached: bool = False,
                  num_epochs: Optional[int] = 1) -> tf.data.Dataset:
    del sequence_length, use_cached, num_epochs  # Unused, as in seqio's sources.
    self._check_split(split)
    if self.uses_local_files():
      ds = examples_to_dataset(self.local_examples(split), self.local.features)
      if shard_info:
        ds = ds.shard(shard_info.num_shards, shard_info.index)
      return ds
    self._check_tfds_reachable()
    try:
      return self._tfds.get_dataset(split=split, shuffle=shuffle, seed=seed,
                                    shard_info=shard_info)
    except OSError as e:  # TFDS downloads a dataset it has not prepared: offline, after minutes
      reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      raise FileNotFoundError(self._tfds_unavailable(
          f"could not be read or downloaded ({type(e).__name__}: {reason})")) from e

  def _tfds_unavailable(self, why: str) -> str:
    local = (f"pass --data_dir=DIR with the official files ({self.local.folder}/: "
             f"{self.local.how_to_get}), or " if self.local else "")
    return (f"{self.description}: TFDS {self.tfds_name} {why}; without network, {local}pass "
            f"--tfds_data_dir=DIR where it is prepared")

  def _check_tfds_reachable(self) -> None:
    """Offline, TFDS spends about 210 s (and progress bars, and partial folders) trying to
    download a dataset it has not prepared: when it is not prepared and GCS's name does not
    resolve (a quick look-up, prompt_jax.paths), one line at once instead."""
    try:
      builder = self._tfds.tfds_dataset.builder  # seqio's, under --tfds_data_dir
      if builder.is_prepared():
        return
      where = builder.data_dir
    except AssertionError as e:  # 'Dataset c4 cannot be loaded at version 3.0.1, only: 3.1.0, ..'
      found = re.search(r"cannot be loaded at version \S+, only: ((?:\d+\.\d+\.\d+(?:, )?)+)",
                        str(e))
      if found is None:
        raise
      raise ValueError(f"{self.description}: the installed tensorflow-datasets cannot load "
                       f"TFDS {self.tfds_name} (it reads {found.group(1).strip(', ')}): use a task "
                       f"of one of those versions") from e
    except Exception:  # pylint: disable=broad-except  (TFDS's own error follows)
      return
    from prompt_jax import paths  # pylint: disable=g-import-not-at-top
    unreachable = paths.unreachable_gcs()
    if unreachable:
      raise FileNotFoundError(self._tfds_unavailable(
          f"is not prepared (no {where}) and cannot be downloaded ({unreachable})"))

  def list_shards(self, split: str) -> Sequence[str]:
    if self.uses_local_files():
      return [str(self.local_path(split))]
    self._check_tfds_reachable()
    return self._tfds.list_shards(split)

  def num_input_examples(self, split: str) -> Optional[int]:
    if self.uses_local_files():
      return len(self.local_examples(split))
    self._check_tfds_reachable()
    return self._tfds.num_input_examples(split)


def _names(entry: Union[str, Sequence[str]]) -> Sequence[str]:
  return (entry,) if isinstance(entry, str) else tuple(entry)
