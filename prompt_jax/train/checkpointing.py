"""Orbax checkpoints of the trainable state (+ data position) and `.npy` exports of prompts.

Layout under MODEL_DIR:
  checkpoints/<step>/state/            trainable params, optimizer state, step   (orbax, atomic)
  checkpoints/<step>/data/             {"position", "batch_size", "num_data_shards",
                                        "fingerprint": {leaf path: uint32}}       (json)
  checkpoints/<step>/data_iterators/   tf.data iterator state of each data shard (tf.train.Checkpoint)
  numpy_checkpoints/checkpoint_<step>/<param path with '.'>.npy         (process 0 only)
  corrupt_checkpoints/<step>/          checkpoints that failed to restore, moved aside (never deleted)
Frozen parameters are never saved: a restart reloads them from INITIAL_CHECKPOINT_PATH.

Intact: a checkpoint is intact when orbax restores it AND the restored values have the fingerprint
saved with them. The fingerprint is needed: orbax (OCDBT) restores a data file with a flipped byte
without complaint (tests/train/test_reliability.py shows it). `latest_intact` is the one function
that finds the newest intact checkpoint; `latest_step` is its read-only step-only form (eval/infer).
"""
import contextlib
import dataclasses
import errno
import fcntl
import glob
import json
import logging
import os
import re
import shutil
from typing import Any, Callable, Container, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from jax.sharding import Mesh
import optax
import orbax.checkpoint as ocp

from prompt_jax import paths
from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.errors import ConfigError, RunError, causes
from prompt_jax.train import state as state_lib

CHECKPOINTS_DIR = "checkpoints"
NUMPY_DIR = "numpy_checkpoints"
CORRUPT_DIR = "corrupt_checkpoints"
ITEMS = ("state", "data", "data_iterators")
# Free space below which MODEL_DIR counts as full before training starts.
MIN_FREE_BYTES = 64 << 20
LOCK_FILE = ".train.lock"  # held (flock) by the `prompt-jax train` that writes MODEL_DIR


def checkpoints_dir(model_dir: str) -> str:
  return os.path.join(model_dir, CHECKPOINTS_DIR)


def step_dir(model_dir: str, step: int) -> str:
  return os.path.join(checkpoints_dir(model_dir), str(step))


def steps(model_dir: str) -> List[int]:
  """Finished checkpoint steps under MODEL_DIR (local or gs://), newest first, read without
  creating anything. Unfinished saves (orbax tmp dirs) do not count; nothing is verified."""
  directory = epath.Path(checkpoints_dir(model_dir))
  if not directory.is_dir():
    return []
  return sorted((int(d.name) for d in directory.iterdir()
                 if re.fullmatch(r"\d+", d.name) and (d / "state").is_dir()), reverse=True)


# ===== Writable MODEL_DIR =====

@contextlib.contextmanager
def run_lock(model_dir: str):
  """Holds MODEL_DIR for one trainer: a second `prompt-jax train` on the same MODEL_DIR (a
  command run twice, a requeued job while the first still runs) is refused in one line. It
  used to train beside the first, both saving the same steps over each other (orbax's force)
  and interleaving their TensorBoard events.

  An exclusive, non-blocking flock of MODEL_DIR/.train.lock, by process 0 (the one that writes
  checkpoints); the kernel releases it when the process ends, however it ends (kill -9
  included). The file stays, empty, after a run; a command that fails removes the file it
  created, so it changes nothing in a MODEL_DIR that had none, and a MODEL_DIR this call created
  and nothing else wrote is removed again. Remote paths (gs://) are not locked."""
  if "://" in model_dir or jax.process_index() != 0:
    yield
    return
  check_writable(model_dir)  # (creates nothing) a read-only or full place: its one line first
  created = not os.path.exists(model_dir)
  os.makedirs(model_dir, exist_ok=True)
  path = os.path.join(model_dir, LOCK_FILE)
  new_file = not os.path.exists(path)
  fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
  locked = failed = False
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      locked = True
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise
      raise ConfigError(f"MODEL_DIR {model_dir} is in use by another `prompt-jax train` (it "
                        f"holds {path}); wait for it to finish or stop it, or choose another "
                        f"MODEL_DIR") from None
    yield
  except BaseException:
    failed = True
    raise
  finally:
    # A run that failed leaves MODEL_DIR as it found it: the lock file goes if it was ours
    # (a run trained before the lock, or by loop.train alone, had none).
    if locked and failed and new_file:
      os.remove(path)
    os.close(fd)
    if created and os.listdir(model_dir) in ([], [LOCK_FILE]):  # refused before writing
      shutil.rmtree(model_dir, ignore_errors=True)


def check_writable(model_dir: str, min_free_bytes: int = MIN_FREE_BYTES) -> None:
  """ConfigError unless MODEL_DIR is (or can be created as) a writable directory with room for
  checkpoints. Creates nothing: probes with a temporary file in the nearest existing directory.
  Remote paths (gs://...) are not checked here."""
  if "://" in model_dir:
    return
  message = paths.not_a_directory_message(model_dir)
  if message:
    raise ConfigError(message)
  path = os.path.abspath(model_dir)
  probe_dir = paths.nearest_existing(path)
  try:
    paths.probe_writable(probe_dir)
  except OSError as e:
    raise ConfigError(f"MODEL_DIR {model_dir!r} is not writable ({probe_dir}: {e.strerror}); "
                      f"choose a writable MODEL_DIR or fix its permissions") from None
  # A resumed run writes into what MODEL_DIR already holds: checkpoints (and their step dirs,
  # which the manager deletes and quarantine moves), .npy exports, summaries.
  if probe_dir == path:
    for sub in _written_subdirs(path):
      if not os.path.isdir(sub):
        raise ConfigError(f"MODEL_DIR {model_dir!r} cannot be used: {sub} is not a directory; "
                          f"move it away or choose another MODEL_DIR")
      try:
        paths.probe_writable(sub)
      except OSError as e:
        raise ConfigError(f"MODEL_DIR {model_dir!r} is not writable ({sub}: {e.strerror}); "
                          f"fix its permissions (chmod -R u+w) or choose another MODEL_DIR"
                          ) from None
  free = shutil.disk_usage(probe_dir).free
  if free < min_free_bytes:
    raise ConfigError(f"MODEL_DIR {model_dir!r} is on a full filesystem ({free >> 20} MiB free, "
                      f"checkpoints need at least {min_free_bytes >> 20} MiB); free space or "
                      f"choose another MODEL_DIR")


# What the run writes into below MODEL_DIR (summaries.TRAIN_DIR etc. for the summaries).
_WRITTEN_DIRS = (CHECKPOINTS_DIR, NUMPY_DIR, CORRUPT_DIR, "train", "training_eval",
                 "inference_eval")


def _written_subdirs(path: str) -> List[str]:
  """The existing paths under MODEL_DIR that a run writes into, or moves or deletes."""
  found = [os.path.join(path, name) for name in _WRITTEN_DIRS
           if os.path.lexists(os.path.join(path, name))]
  ckpt = os.path.join(path, CHECKPOINTS_DIR)
  if os.path.isdir(ckpt):
    found += [os.path.join(ckpt, n) for n in sorted(os.listdir(ckpt))
              if re.fullmatch(r"\d+", n) and os.path.isdir(os.path.join(ckpt, n))]
  return found


# ===== Fingerprints: detect damaged values =====

def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def leaf_paths(tree: Any) -> Dict[str, Any]:
  """{'params/encoder/prompt/prompt/prompt': leaf, 'opt_state/0/v/...': leaf, ...}: the same
  names for a namedtuple optimizer state and for orbax's metadata tree of it."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {"/".join(_key_name(k) for k in path): leaf for path, leaf in flat}


def _leaf_fingerprint(x: jax.Array) -> jax.Array:
  """sum_i bits(x_i) * (2 i + 1) mod 2**32: modular integer arithmetic, so the same for any
  sharding or reduction order; any single changed element changes it (odd weights)."""
  size = x.dtype.itemsize
  if x.dtype == jnp.bool_:
    u = x.astype(jnp.uint32)
  elif size == 8:
    u64 = jax.lax.bitcast_convert_type(x, jnp.uint64)
    u = (u64 ^ (u64 >> 32)).astype(jnp.uint32)
  else:
    u = jax.lax.bitcast_convert_type(x, {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}[size])
    u = u.astype(jnp.uint32)
  index, stride = jnp.zeros(x.shape, jnp.uint32), 1
  for axis in reversed(range(x.ndim)):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(stride)
    stride = (stride * x.shape[axis]) % (1 << 32)
  return jnp.sum(u * (index * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)


_fingerprints = jax.jit(lambda leaves: {k: _leaf_fingerprint(v) for k, v in leaves.items()})


def fingerprint(tree: Any) -> Dict[str, int]:
  """{leaf path: uint32 fingerprint} of every array in `tree` (computed on device; compiled
  once per tree structure)."""
  leaves = {k: v for k, v in leaf_paths(tree).items() if hasattr(v, "dtype")}
  return {k: int(np.asarray(_host(v))) for k, v in _fingerprints(leaves).items()}


def _host(x):
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return x.addressable_data(0)
  return jax.device_get(x)


class CorruptCheckpoint(Exception):
  """A checkpoint that cannot be restored as saved."""


def verify(tree: Any, saved: Optional[Mapping[str, int]], prefix: str = "") -> None:
  """CorruptCheckpoint if a leaf of `tree` differs from its saved fingerprint. Checkpoints
  written before fingerprints existed (`saved` None) are taken as they are."""
  if saved is None:
    return
  got = fingerprint(tree)
  for path, value in got.items():
    want = saved.get(prefix + path)
    if want is not None and int(want) != value:
      raise CorruptCheckpoint(f"the values of {prefix + path} differ from those saved "
                              f"(a data file is damaged)")


# ===== tf.data iterator state as an orbax item =====

class DataIteratorHandler(ocp.CheckpointHandler):
  """Saves/restores tf.data iterators, one `tf.train.Checkpoint` per data shard
  (`shard-00003-of-00008.index` / `.data-*`), as t5x's `_TfDataCheckpointer` does per process.
  Each process writes the shards it owns into orbax's temporary directory, so the state is
  committed atomically with the rest of the checkpoint. A pipeline tf.data cannot checkpoint
  (e.g. `from_generator`) leaves a `.unsupported` note; restoring it raises DataStateUnavailable
  and the trainer replays the stream instead."""

  def save(self, directory: epath.Path, args: "DataIteratorSave"):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    for shard, iterator in args.iterators.items():
      prefix = directory / _shard_name(shard, args.num_shards)
      try:
        tf.train.Checkpoint(ds=iterator).write(str(prefix))
      except (tf.errors.FailedPreconditionError, tf.errors.UnimplementedError) as e:
        # A stateful op (py_function, from_generator) cannot be serialised; a write error
        # (disk full) is another OpError and fails the save.
        _warn_once(f"the training data pipeline cannot save its position ({_first_line(e)}); "
                   f"a restart will replay the consumed batches instead")
        (directory / (_shard_name(shard, args.num_shards) + ".unsupported")).write_text(str(e))

  def restore(self, directory: epath.Path, args: "DataIteratorRestore"):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    for shard, iterator in args.iterators.items():
      name = _shard_name(shard, args.num_shards)
      if (directory / (name + ".unsupported")).exists():
        raise DataStateUnavailable(f"{directory / name} was not saved")
      if not (directory / (name + ".index")).exists():
        raise CorruptCheckpoint(f"{directory / name}.index is missing")
      try:
        tf.train.Checkpoint(ds=iterator).read(str(directory / name)).assert_consumed()
      except (tf.errors.OpError, AssertionError, ValueError) as e:
        if "dataset definition" in str(e) or "DeserializeIterator" in str(e):
          # Intact, but saved by another pipeline (another shuffle, task, lengths): the config
          # changed, nothing is damaged.
          raise DataPipelineChanged(_first_line(e)) from e
        raise CorruptCheckpoint(f"data iterator {name}: {_first_line(e)}") from e
    return None


class DataStateUnavailable(Exception):
  """The checkpoint holds no iterator state for the pipeline (it is not checkpointable)."""


class DataPipelineChanged(Exception):
  """The saved iterator state is of another data pipeline than the one configured now."""


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
  iterators: Mapping[int, Any]  # shard -> tf.data.Iterator (the shards this process owns)
  num_shards: int


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
  iterators: Mapping[int, Any]  # shard -> tf.data.Iterator (every shard this process reads)
  num_shards: int


def _shard_name(shard: int, num_shards: int) -> str:
  return f"shard-{shard:05d}-of-{num_shards:05d}"


_WARNED = set()


def _warn_once(message: str) -> None:
  if message not in _WARNED:
    _WARNED.add(message)
    logging.warning(message)


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def reason(e: BaseException) -> str:
  """The short cause of a failed read or write ('File too large', 'No space left on device')."""
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  text = re.sub(r"\{\{[^}]*\}\}\s*", "", getattr(e, "message", None) or _first_line(e))
  for known in ("No space left on device", "Disk quota exceeded", "File too large",
                "Permission denied", "Read-only file system"):
    if known in text:
      return known
  text = re.sub(r"\s*\[Op:[^\]]*\]\s*$", "", text)
  return text.rsplit("; ", 1)[-1].strip() or type(e).__name__


def is_write_failure(e: BaseException) -> bool:
  """Whether `e`, raised by a checkpoint save, is a failed write (disk full, permissions): an
  OSError, a TensorFlow OpError, or tensorstore's ValueError ('RESOURCE_EXHAUSTED: ... No space
  left on device [os_error_code=28]')."""
  if isinstance(e, OSError) or type(e).__module__.startswith("tensorflow"):
    return True
  text = str(e)
  return isinstance(e, ValueError) and any(
      m in text for m in ("RESOURCE_EXHAUSTED", "No space left", "os_error_code",
                          "PERMISSION_DENIED", "Disk quota exceeded"))


# ===== Save / restore =====

def manager(model_dir: str, *, period: int, keep: Optional[int],
            read_only: bool = False) -> ocp.CheckpointManager:
  """Keeps `keep` checkpoints, saving every `period` steps (and whenever forced)."""
  options = ocp.CheckpointManagerOptions(
      save_interval_steps=max(1, period), max_to_keep=keep, create=not read_only,
      read_only=read_only, enable_async_checkpointing=False,
      # a save cut short (killed, a second Ctrl-C) left `<step>.orbax-checkpoint-tmp` for good
      cleanup_tmp_directories=not read_only)
  return ocp.CheckpointManager(
      checkpoints_dir(model_dir), options=options,
      item_handlers={"state": ocp.StandardCheckpointHandler(),
                     "data": ocp.JsonCheckpointHandler(),
                     "data_iterators": DataIteratorHandler()})


def save(mngr: ocp.CheckpointManager, step: int, train_state: state_lib.TrainState,
         data_position: int, force: bool = False, stream=None) -> bool:
  """Saves the state, its fingerprint, the data position and (with `stream`, a
  data.TrainStream) the iterator state of the data shards this process owns."""
  state = train_state.as_dict()
  data = {"position": int(data_position), "fingerprint": fingerprint(state)}
  items = dict(state=ocp.args.StandardSave(state))
  if stream is not None:
    data.update(batch_size=stream.cfg.batch_size, num_data_shards=stream.num_shards,
                data_config=data_config(stream.cfg))
    items["data_iterators"] = DataIteratorSave(
        {k: stream.iterators[k] for k in stream.owned}, stream.num_shards)
  items["data"] = ocp.args.JsonSave(data)
  quiet = _QuietOrbaxThreadErrors()
  loggers = [logging.getLogger(name) for name in ("absl", "orbax")]
  for logger in loggers:
    logger.addFilter(quiet)
  try:
    return mngr.save(step, args=ocp.args.Composite(**items), force=force)
  finally:
    for logger in loggers:
      logger.removeFilter(quiet)


class _QuietOrbaxThreadErrors(logging.Filter):
  """Orbax's save threads log a failed write (with its traceback) before re-raising it to the
  caller, who reports it in one line (train/loop.py): drop those duplicates (any orbax error
  record during a save, on whichever logger it arrives)."""

  def filter(self, record):
    return not (record.levelno >= logging.ERROR and "orbax" in record.pathname)


@dataclasses.dataclass
class Restored:
  step: int
  state: state_lib.TrainState
  position: int
  data_restored: bool  # False: the stream must be replayed to `position`
  broken: List[Tuple[int, str]]  # newer checkpoints that failed, (step, reason)


def _check_structure(model_dir: str, step: int, abstract: Mapping[str, Any]) -> None:
  """ConfigError if checkpoint `step` was written for other parameters (another prompt length,
  method or optimizer): that is a configuration change, not damage."""
  try:
    meta = ocp.StandardCheckpointHandler().metadata(epath.Path(step_dir(model_dir, step)) / "state")
    saved = {k: tuple(v.shape) for k, v in leaf_paths(getattr(meta, "tree", meta)).items()
             if hasattr(v, "shape")}
  except Exception as e:  # pylint: disable=broad-except
    raise CorruptCheckpoint(f"its metadata cannot be read ({_first_line(e)})") from e
  want = {k: tuple(v.shape) for k, v in leaf_paths(abstract).items()}
  advice = (f"resume with the run's own config ({os.path.join(model_dir, 'config.gin')}) or use "
            f"a new MODEL_DIR")
  order = lambda p: (not p.startswith("params/"), p)  # parameters first, then optimizer state
  for part, what in (("params/", "another method or model"), ("", "another optimizer")):
    lacking = sorted(p for p in set(want) - set(saved) if p.startswith(part))
    extra = sorted(p for p in set(saved) - set(want) if p.startswith(part))
    if lacking or extra:  # name what differs (a shape message would say 'of shape None')
      said = []
      if lacking:
        said.append(f"this configuration has {_some(lacking)}, which the checkpoint lacks")
      if extra:
        said.append(f"the checkpoint holds {_some(extra)}, which this configuration lacks")
      raise ConfigError(f"checkpoint {step_dir(model_dir, step)} was written for {what}: "
                        f"{'; '.join(said)}; {advice}")
  for path in sorted(want, key=order):
    if saved[path] != want[path]:
      raise ConfigError(
          f"checkpoint {step_dir(model_dir, step)} holds {path} of shape {saved[path]} but "
          f"this configuration has {want[path]}: {advice}")


def check_resumable(model_dir: str, step: int, abstract_state: state_lib.TrainState,
                    stream) -> None:
  """ConfigError when checkpoint `step` was written for other parameter shapes, another
  BATCH_SIZE or another data pipeline than this configuration's: what restoring it checks, read
  from its metadata alone, so `train` refuses before its slow start. A checkpoint whose metadata
  cannot be read is left to the restore (which quarantines it and tries an older one)."""
  try:
    _check_structure(model_dir, step, abstract_state.as_dict())
  except CorruptCheckpoint:
    return
  try:
    data = json.loads((epath.Path(step_dir(model_dir, step)) / "data" / "metadata").read_text())
  except Exception:  # pylint: disable=broad-except  (unreadable: the restore decides)
    return
  if isinstance(data, dict):
    _check_data_layout(model_dir, step, data, stream)


def _some(paths: List[str], shown: int = 2) -> str:
  """'a, b and 3 more' (a checkpoint's leaf paths, for one error line)."""
  more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
  return ", ".join(paths[:shown]) + more


def _restore_one(mngr: ocp.CheckpointManager, model_dir: str, step: int,
                 abstract_state: state_lib.TrainState, stream) -> Restored:
  abstract = abstract_state.as_dict()
  _check_structure(model_dir, step, abstract)
  items = {"state": ocp.args.StandardRestore(abstract), "data": ocp.args.JsonRestore()}
  has_iterators = (stream is not None and
                   (epath.Path(step_dir(model_dir, step)) / "data_iterators").is_dir())
  restored = mngr.restore(step, args=ocp.args.Composite(**items))
  data = restored["data"]
  if stream is not None:
    _check_data_layout(model_dir, step, data, stream)
  s = restored["state"]
  verify(s, data.get("fingerprint"))
  data_restored = False
  if has_iterators:
    try:
      mngr.restore(step, args=ocp.args.Composite(data_iterators=DataIteratorRestore(
          stream.iterators, stream.num_shards)))
      data_restored = True
    except DataStateUnavailable:
      pass  # the trainer replays the stream to `position`
    except Exception as e:  # pylint: disable=broad-except  (orbax may wrap it)
      changed = _cause(e, DataPipelineChanged)
      if changed is None:
        raise
      raise ConfigError(
          f"the data pipeline differs from the one checkpoint {step_dir(model_dir, step)} was "
          f"written with ({changed}); resume with the run's config.gin bindings "
          f"({os.path.join(model_dir, 'config.gin')}), or use a new MODEL_DIR") from None
  return Restored(step, state_lib.TrainState(s["step"], s["params"], s["opt_state"]),
                  int(data["position"]), data_restored, [])


def _check_data_layout(model_dir: str, step: int, data: Mapping[str, Any], stream) -> None:
  saved = (data.get("batch_size"), data.get("num_data_shards"))
  if saved[0] is None:
    return  # written before the layout was recorded
  if saved != (stream.cfg.batch_size, stream.num_shards):
    raise ConfigError(
        f"checkpoint {step_dir(model_dir, step)} was written with BATCH_SIZE={saved[0]} and "
        f"num_data_shards={saved[1]}; resume with the same values (the data order depends on "
        f"them) or use a new MODEL_DIR")
  saved_cfg, now = data.get("data_config"), data_config(stream.cfg)
  if saved_cfg is None:
    return  # written before the data pipeline was recorded (the iterator restore still checks)
  differ = [k for k in sorted(set(saved_cfg) | set(now)) if saved_cfg.get(k) != now.get(k)]
  if differ:
    what = ", ".join(f"{k} {saved_cfg.get(k)!r} then, {now.get(k)!r} now" for k in differ)
    raise ConfigError(
        f"the data pipeline differs from the one checkpoint {step_dir(model_dir, step)} was "
        f"written with ({what}); resume with the run's config.gin bindings "
        f"({os.path.join(model_dir, 'config.gin')}), or use a new MODEL_DIR")


def data_config(cfg) -> Dict[str, Any]:
  """What of the training DatasetConfig decides the batches a checkpoint's data position and
  iterator state refer to (JSON values, as the checkpoint's `data` item holds them)."""
  return {"task": cfg.mixture_or_task_name, "split": cfg.split,
          "task_feature_lengths": {k: int(v) for k, v in sorted(
              dict(cfg.task_feature_lengths).items())},
          "shuffle": bool(cfg.shuffle), "seed": cfg.seed, "pack": bool(cfg.pack)}


def _cause(e: Optional[BaseException], kind: type) -> Optional[BaseException]:
  """`e` or the first exception of its cause/context chain that is a `kind`."""
  return next((c for c in causes(e) if isinstance(c, kind)), None)


def latest_intact(model_dir: str, restore: Callable[[int], Any], use: str = "resuming from"
                  ) -> Optional[Tuple[int, Any, List]]:
  """THE newest intact checkpoint: (step, restore(step), [(newer broken step, reason)]).

  Tries the finished checkpoints newest first; a step whose `restore` raises (other than a
  ConfigError, which is the configuration's fault) is broken and the next older one is tried,
  with a warning naming both (once per process; `use`: what is done with the intact one, for
  the warning). All processes agree on the step. None: MODEL_DIR has no
  checkpoint. RunError (nothing changed on disk): there are checkpoints but none is intact."""
  broken: List[Tuple[int, str]] = []
  for step in steps(model_dir):
    try:
      result, error = restore(step), None
    except ConfigError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many kinds)
      result, error = None, _first_line(e)
    if not _all_processes_agree(error is None):
      broken.append((step, error or "it failed to restore on another process"))
      continue
    if broken:
      _warn_once(_fallback_message(model_dir, broken, step, use))
    return step, result, broken
  if broken:
    exported = sorted(glob.glob(os.path.join(model_dir, NUMPY_DIR, "checkpoint_*", "*.npy")),
                      key=lambda p: int(re.sub(r"\D", "", os.path.basename(os.path.dirname(p)))
                                        or 0))
    kept = (f"; the prompt of a step survives as {exported[-1]} (eval / infer it with "
            f"--gin.PROMPT_FILE, or start a new run from it: prompts/from_file.gin)"
            if exported else "")
    raise RunError(
        f"no intact checkpoint in {checkpoints_dir(model_dir)}: "
        + "; ".join(f"step {s}: {r}" for s, r in broken)
        + ". Nothing was changed or deleted; restore the files from a copy, or start over with "
          f"a new MODEL_DIR{kept}")
  return None


def _fallback_message(model_dir: str, broken: Sequence[Tuple[int, str]], step: int,
                      use: str) -> str:
  newest, reason = broken[0]
  more = (f" (and {', '.join(str(s) for s, _ in broken[1:])})" if len(broken) > 1 else "")
  return (f"checkpoint {step_dir(model_dir, newest)}{more} cannot be restored ({reason}); "
          f"{use} {step_dir(model_dir, step)}, the newest intact checkpoint")


def _all_processes_agree(ok: bool) -> bool:
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.min(multihost_utils.process_allgather(np.int32(ok))))


def restore_latest(mngr: ocp.CheckpointManager, model_dir: str,
                   abstract_state: state_lib.TrainState, stream=None) -> Optional[Restored]:
  """The newest intact checkpoint restored into `abstract_state`'s shardings (and `stream`'s
  iterators), or None. Broken newer checkpoints are listed in `.broken` (see `quarantine`)."""
  found = latest_intact(
      model_dir, lambda step: _restore_one(mngr, model_dir, step, abstract_state, stream))
  if found is None:
    return None
  _, restored, broken = found
  restored.broken = broken
  return restored


def resume_or_initialise(mngr: ocp.CheckpointManager, model_dir: str, run: run_setup.Run,
                         tx: optax.GradientTransformation, mesh: Mesh, stream=None
                         ) -> Tuple[run_setup.Run, state_lib.TrainState, Optional[Restored]]:
  """(run, state, restored): the train state of MODEL_DIR's newest intact checkpoint, restored
  into the placed shapes of `run`'s trainable parameters (`run.trainable` becomes its params),
  or, with nothing to restore (restored None), the state of a fresh start: the deferred prompt
  init (`run_setup.initialise_deferred`) and a fresh optimizer state. `train` and
  `bench startup` start this way."""
  restored = restore_latest(
      mngr, model_dir,
      state_lib.abstract_state(run.trainable, run.trainable_shardings, tx, mesh), stream)
  if restored is None:
    run = run_setup.initialise_deferred(run)
    state, _ = state_lib.initial_state(run.trainable, run.trainable_shardings, tx, mesh)
  else:
    state = restored.state
    run.trainable = state.params
  return run, state, restored


def quarantine(mngr: ocp.CheckpointManager, model_dir: str,
               broken: Sequence[Tuple[int, str]]) -> None:
  """Moves broken checkpoints to MODEL_DIR/corrupt_checkpoints/<step> (process 0), with their
  .npy exports (`<step>/numpy_checkpoints`), so the manager neither counts them against `keep`
  (which would delete the intact one in their favour) nor collides with them when it saves those
  steps again. Nothing is deleted."""
  if not broken:
    return
  if jax.process_index() == 0:
    target = epath.Path(model_dir) / CORRUPT_DIR
    target.mkdir(parents=True, exist_ok=True)
    for step, reason in broken:
      dest = target / str(step)
      n = 1
      while dest.exists():
        dest, n = target / f"{step}.{n}", n + 1
      epath.Path(step_dir(model_dir, step)).rename(dest)
      # Its .npy export (written from memory when it was saved) goes with it: training that step
      # again would replace it, and it may be the one intact copy of what was trained.
      exported_npy = epath.Path(model_dir) / NUMPY_DIR / f"checkpoint_{step}"
      if exported_npy.is_dir():
        exported_npy.rename(dest / NUMPY_DIR)
      (dest / "WHY.txt").write_text(f"failed to restore: {reason}\n")
      logging.warning("moved the broken checkpoint %s to %s", step_dir(model_dir, step), dest)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices("prompt_jax:quarantine")
  mngr.reload()


def read_state(state_dir: str) -> Any:
  """The orbax `state` item at `state_dir` as host numpy arrays (nested dicts), whatever devices
  wrote it: a restore without a target rebuilds the saved shardings, and fails on another
  device count (a run trained on 8 devices, exported on 1)."""
  path = epath.Path(state_dir)
  handler = ocp.PyTreeCheckpointHandler()
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                      handler.metadata(path).tree)
  return ocp.Checkpointer(handler).restore(path, args=ocp.args.PyTreeRestore(restore_args=args))


def read_verified(checkpoint_dir: str) -> Any:
  """The state of the `checkpoints/<step>` dir `checkpoint_dir` (host arrays), after verifying
  it whole against its fingerprint ("intact" means the same thing as for the trainer);
  CorruptCheckpoint on a damaged one. A checkpoint with no fingerprint (t5x's) is taken as is."""
  directory = epath.Path(checkpoint_dir)
  restored = read_state(str(directory / "state"))
  data_file = directory / "data" / "metadata"
  saved = None
  if data_file.exists():
    import json  # pylint: disable=g-import-not-at-top
    saved = json.loads(data_file.read_text()).get("fingerprint")
  verify(restored, saved)
  return restored


def read_params(model_dir: str, step: int) -> Dict[str, np.ndarray]:
  """The trainable parameters of checkpoint `step` (host arrays, flat paths), after verifying
  the whole checkpoint against its fingerprint; raises on a damaged checkpoint."""
  restored = read_verified(step_dir(model_dir, step))
  return {k: np.asarray(v) for k, v in trees.flatten(restored["params"]).items()}


def latest_step(model_dir: str) -> Optional[int]:
  """The newest intact checkpoint step under MODEL_DIR (read-only: warns about newer broken
  ones, moves nothing). None when MODEL_DIR has no checkpoint; RunError when none is intact."""
  found = latest_intact(model_dir, lambda step: read_params(model_dir, step), use="using")
  return None if found is None else found[0]


# ===== .npy exports =====

def export_numpy(model_dir: str, step: int, trainable: Mapping[str, Any],
                 exclude: Container[str] = ()) -> Optional[str]:
  """Writes each trainable parameter not in `exclude` (backbone weights, when fine-tuning the
  whole model) as `.npy`, as prompt-tuning does; process 0 only."""
  flat = {k: np.asarray(jax.device_get(_fully_addressable(v)))
          for k, v in trees.flatten(trainable).items() if k not in exclude}
  if jax.process_index() != 0 or not flat:
    return None
  out = epath.Path(model_dir) / NUMPY_DIR / f"checkpoint_{step}"
  tmp = out.parent / (out.name + ".tmp")
  tmp.mkdir(parents=True, exist_ok=True)
  for path, value in flat.items():
    with (tmp / (path.replace("/", ".") + ".npy")).open("wb") as f:
      np.save(f, value)
  if out.exists():
    out.rmtree()
  tmp.rename(out)  # atomic locally; on GCS a copy, written only after every array
  return str(out)


def exported(model_dir: str, step: int) -> bool:
  return (epath.Path(model_dir) / NUMPY_DIR / f"checkpoint_{step}").is_dir()


def all_finite(tree: Any) -> bool:
  """Whether every floating value of `tree` is finite (one device reduction, one host read)."""
  leaves = [x for x in jax.tree_util.tree_leaves(tree)
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
  if not leaves:
    return True
  return bool(np.asarray(_host(_all_finite(leaves))))


_all_finite = jax.jit(lambda xs: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs])))


def _fully_addressable(x):
  """A host copy of a (possibly multi-process) jax.Array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return multihost_utils.process_allgather(x, tiled=True)
  return x
