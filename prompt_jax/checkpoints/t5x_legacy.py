"""t5x's legacy (pre-orbax) checkpoint layout: a msgpack `checkpoint` file plus zarr arrays.

A checkpoint directory `checkpoint_<step>/` holds

  checkpoint                     msgpack (flax serialization) of
                                   {'version': 3, 'optimizer': {'state': {...}, 'target': params}}
  target.encoder.layers_0.attention.query.kernel/   a gzip zarr array (tensorstore), one per
  ...                                               partitioned parameter, named with dots

Arrays t5x does not partition (layer-norm scales, relative position tables, optimizer scalars)
are stored inline in the msgpack as flax ndarray ext types (code 1: msgpack of (shape, dtype
name, C-order bytes)); each partitioned one is replaced by its tensorstore spec, whose kvstore
path is relative to the checkpoint directory ('file'/'gfile' locally, 'gcs' with a dummy bucket
on GCS -- both are rebased onto wherever the checkpoint is read from).

Reading walks the msgpack with seeks: only the bytes of `optimizer/target` are read and decoded;
`optimizer/state` (Adafactor slots, inline or in `state.param_states.*` zarr dirs) is skipped
without being read.
"""
import logging
import os
import shutil
import time
from typing import Any, Dict, Mapping, Tuple

import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import tensorstore as ts

from prompt_jax.checkpoints import arrays as arrays_lib
from prompt_jax.checkpoints import storage
from prompt_jax.checkpoints import tree as tree_lib
from prompt_jax.checkpoints.tree import CheckpointError

VERSION = 3  # t5x's current legacy version (native bfloat16 in tensorstore, since 2021-06).
MSGPACK_FILE = "checkpoint"
_DESIRED_CHUNK_BYTES = 64 * 1024 * 1024  # t5x's zarr chunk target.
_PLACEHOLDER = "PLACEHOLDER://"  # orbax's aggregate-file reference to a separately stored array.
_EXT_NDARRAY, _EXT_COMPLEX, _EXT_NPSCALAR = 1, 2, 3

# --- msgpack: seek-skipping navigation -------------------------------------------------------

# type byte -> (bytes of the length field, extra bytes after it) for str/bin/ext.
_SIZED = {0xc4: (1, 0), 0xc5: (2, 0), 0xc6: (4, 0), 0xc7: (1, 1), 0xc8: (2, 1), 0xc9: (4, 1),
          0xd9: (1, 0), 0xda: (2, 0), 0xdb: (4, 0)}
# type byte -> fixed payload size (numbers and fixext).
_FIXED = {0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4,
          0xd3: 8, 0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17}


class _Msgpack:
  """Walks a msgpack stream in a seekable file, skipping values without reading them."""

  def __init__(self, f, name: str):
    self._f = f
    self._name = name

  def _read(self, n: int) -> bytes:
    data = self._f.read(n)
    if len(data) != n:
      raise CheckpointError(f"{self._name} is truncated (wanted {n} bytes at offset "
                            f"{self._f.tell() - len(data)}); the checkpoint is incomplete")
    return data

  def _int(self, n: int) -> int:
    return int.from_bytes(self._read(n), "big")

  def map_header(self) -> int:
    """Number of entries of the map that starts here."""
    b = self._read(1)[0]
    if 0x80 <= b <= 0x8f:
      return b & 0x0f
    if b in (0xde, 0xdf):
      return self._int(2 if b == 0xde else 4)
    raise CheckpointError(f"{self._name} is not a t5x msgpack checkpoint (expected a map, found "
                          f"type byte 0x{b:02x})")

  def skip(self):
    """Seeks past one value (containers included) without reading payloads."""
    pending = 1
    while pending:
      pending -= 1
      b = self._read(1)[0]
      if b <= 0x7f or b >= 0xe0 or b in (0xc0, 0xc2, 0xc3):
        continue
      if 0x80 <= b <= 0x8f:
        pending += 2 * (b & 0x0f)
      elif 0x90 <= b <= 0x9f:
        pending += b & 0x0f
      elif 0xa0 <= b <= 0xbf:
        self._f.seek(b & 0x1f, 1)
      elif b in _SIZED:
        size_bytes, extra = _SIZED[b]
        self._f.seek(self._int(size_bytes) + extra, 1)
      elif b in _FIXED:
        self._f.seek(_FIXED[b], 1)
      elif b in (0xdc, 0xdd):
        pending += self._int(2 if b == 0xdc else 4)
      elif b in (0xde, 0xdf):
        pending += 2 * self._int(2 if b == 0xde else 4)
      else:
        raise CheckpointError(f"{self._name}: invalid msgpack type byte 0x{b:02x}")

  def value(self) -> Any:
    """Reads and decodes one value (ndarray ext types become numpy arrays)."""
    start = self._f.tell()
    self.skip()
    end = self._f.tell()
    self._f.seek(start)
    data = self._read(end - start)
    return _unchunk(msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False))


def _dtype_from_name(name) -> np.dtype:
  name = name.decode() if isinstance(name, bytes) else name
  return np.dtype(jnp.bfloat16) if name == "bfloat16" else np.dtype(name)


def _decode_ext(code: int, data: bytes):
  """flax.serialization's ext types: ndarray/npscalar (shape, dtype, bytes) and complex."""
  if code in (_EXT_NDARRAY, _EXT_NPSCALAR):
    shape, dtype_name, buffer = msgpack.unpackb(data, raw=True)
    array = np.frombuffer(buffer, dtype=_dtype_from_name(dtype_name)).reshape(shape)
    return array if code == _EXT_NDARRAY else array[()]
  if code == _EXT_COMPLEX:
    return complex(*msgpack.unpackb(data))
  return msgpack.ExtType(code, data)


def _ext_hook(code: int, data: bytes):
  return _decode_ext(code, data)  # indirection lets tests count decodes.


def _unchunk(value):
  """Reassembles flax's chunked encoding of > 2 GiB inline arrays."""
  if not isinstance(value, dict):
    return value
  if "__msgpack_chunked_array__" in value:
    shape = tuple(value["shape"][k] for k in sorted(value["shape"], key=int))
    chunks = [value["chunks"][k] for k in sorted(value["chunks"], key=int)]
    return np.concatenate(chunks).reshape(shape)
  return {k: _unchunk(v) for k, v in value.items()}


def read_target(f, name: str) -> Tuple[int, Dict[str, Any]]:
  """(version, decoded `optimizer/target` subtree) of a t5x msgpack checkpoint file.

  Everything else -- notably `optimizer/state` -- is skipped by seeking, never read.
  Version 0 is a plain flax optimizer checkpoint ({'target', 'state'} at the top).
  """
  nav = _Msgpack(f, name)
  version, target = 0, None
  for _ in range(nav.map_header()):
    key = nav.value()
    if key == "version":
      version = nav.value()
    elif key == "optimizer":
      for _ in range(nav.map_header()):
        if nav.value() == "target":
          target = nav.value()
        else:
          nav.skip()
    elif key == "target":
      target = nav.value()
    else:
      nav.skip()
  if target is None:
    raise CheckpointError(f"{name} has no 'optimizer/target' tree; it is not a t5x checkpoint")
  if version not in (0, 2, 3):
    raise CheckpointError(f"{name} has t5x checkpoint version {version}; versions 0, 2 and 3 "
                          "are supported")
  return version, target


# --- tensorstore specs --------------------------------------------------------------------


def _is_ts_spec(value) -> bool:
  return isinstance(value, dict) and {"driver", "kvstore"} <= set(value)


def _is_leaf(value) -> bool:
  return _is_ts_spec(value)


def absolute_spec(spec: Mapping[str, Any], ckpt_dir: str, for_write: bool = False
                  ) -> Dict[str, Any]:
  """Rebases a stored (relative) zarr spec onto `ckpt_dir`, local ('file') or gs:// ('gcs').

  For reading, chunking and compression are dropped from the metadata (as t5x does), so arrays
  written with other chunkings open too; shape and dtype stay and are checked by tensorstore.
  """
  spec = {k: (dict(v) if isinstance(v, dict) else v) for k, v in spec.items()}
  kvstore = dict(spec.get("kvstore", {}))
  if "path" in spec and "path" not in kvstore:  # tensorstore < 0.1.14 specs.
    kvstore["path"] = spec.pop("path")
  relative = kvstore.get("path", "").strip("/")
  if kvstore.get("driver") not in ("file", "gfile", "gcs"):
    raise CheckpointError(f"unsupported tensorstore kvstore driver {kvstore.get('driver')!r} "
                          f"in {ckpt_dir}/{MSGPACK_FILE}")
  spec["kvstore"] = storage.kvstore_spec(storage.join(ckpt_dir, relative))
  metadata = dict(spec.get("metadata", {}))
  if not for_write:
    metadata.pop("chunks", None)
    metadata.pop("compressor", None)
  spec["metadata"] = metadata
  return spec


def _spec_dtype(spec: Mapping[str, Any]) -> np.dtype:
  name = spec.get("dtype") or spec.get("metadata", {}).get("dtype")
  return _dtype_from_name(name) if name else np.dtype(np.float32)


def _zarr_lazy(spec: Dict[str, Any], name: str, path: str) -> arrays_lib.LazyArray:
  shape = tuple(spec.get("metadata", {}).get("shape", ()))
  dtype = _spec_dtype(spec)
  if dtype == np.dtype(np.uint16):
    raise CheckpointError(f"parameter '{name}' in {path} is stored as uint16 (t5x version 2 "
                          "bfloat16); re-save it with t5x version 3 or later")
  opened = []

  def read(index):
    if not opened:
      try:
        opened.append(ts.open(spec, open=True, read=True).result())
      except Exception as e:  # pylint: disable=broad-except
        raise CheckpointError(f"cannot open the zarr array of '{name}' at "
                              f"{spec['kvstore']}: {str(e).splitlines()[0]}") from e
    return opened[0][index].read().result()

  return arrays_lib.LazyArray(shape=shape, dtype=dtype, read=read)


# --- reading ------------------------------------------------------------------------------


def is_checkpoint_dir(path: str) -> bool:
  return storage.isfile(storage.join(path, MSGPACK_FILE))


_TF_STATE = b"model_checkpoint_path"


class LegacyCheckpoint:
  """The model weights of one t5x legacy checkpoint directory, read lazily."""

  format = "t5x_legacy"

  def __init__(self, ckpt_dir: str):
    self.path = ckpt_dir
    msgpack_path = storage.join(ckpt_dir, MSGPACK_FILE)
    with storage.open_binary(msgpack_path) as f:
      if f.read(len(_TF_STATE)) == _TF_STATE:  # TensorFlow's text 'checkpoint' state file
        raise CheckpointError(
            f"{ckpt_dir} is a TensorFlow checkpoint (the original Mesh TensorFlow T5 release), "
            f"not t5x: use its t5x conversion (gs://t5-data/pretrained_models/t5x/<model>/"
            f"checkpoint_<step>) or a Hugging Face T5 directory")
      f.seek(0)
      self.version, target = read_target(f, msgpack_path)
    self.arrays: Dict[str, arrays_lib.LazyArray] = {}
    for name, leaf in tree_lib.flatten(target, is_leaf=_is_leaf).items():
      if _is_ts_spec(leaf):
        self.arrays[name] = _zarr_lazy(absolute_spec(leaf, ckpt_dir), name, ckpt_dir)
      elif isinstance(leaf, str) and leaf.startswith(_PLACEHOLDER):
        relative = leaf[len(_PLACEHOLDER):]
        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": relative}}
        spec = absolute_spec(spec, ckpt_dir)
        meta = ts.open(spec, open=True).result()
        spec["metadata"] = {"shape": list(meta.shape)}
        spec["dtype"] = meta.dtype.name
        self.arrays[name] = _zarr_lazy(spec, name, ckpt_dir)
      elif isinstance(leaf, np.ndarray):
        self.arrays[name] = arrays_lib.from_numpy(leaf)
      # Other leaves (None for untouched MultiOptimizer states, scalars) are not weights.
    self.shapes = {name: lazy.shape for name, lazy in self.arrays.items()}

  def restore(self, names, dtype, shardings=None) -> Dict[str, Any]:
    return arrays_lib.materialize({n: self.arrays[n] for n in names}, dtype, shardings)


# --- writing ------------------------------------------------------------------------------


def choose_chunk_shape(shape, target_elements: int):
  """t5x's chunking: the largest shape dividing `shape` within `target_elements`, by greedily
  shrinking the largest dimension to its next smaller divisor."""
  divisors = [[d for d in range(1, size + 1) if size % d == 0] for size in shape]
  while int(np.prod([d[-1] for d in divisors])) > target_elements:
    largest = max(range(len(shape)), key=lambda i: divisors[i][-1])
    divisors[largest].pop()
  return [d[-1] for d in divisors]


def stored_inline(name: str, array) -> bool:
  """Whether t5x keeps this parameter inline in the msgpack rather than in a zarr array.

  t5x writes a parameter to tensorstore when its partitioner gives it mesh axes; for examples/t5
  that is every kernel and the embedding, while layer-norm scales and relative position tables
  stay inline -- as in the checkpoints t5x itself writes (see tests: the real tiny T5 1.1).
  """
  return np.ndim(array) < 2 or name.endswith("relpos_bias/rel_embedding")


def _relative_spec(name: str, array: np.ndarray, gcs: bool) -> Dict[str, Any]:
  """The spec t5x records for a tensorstore-written parameter (path relative to the dir).

  `name` is the parameter's path in the saved state dict, e.g. 'target/encoder/...', whose
  zarr directory is 'target.encoder....'.
  """
  chunks = choose_chunk_shape(array.shape, max(1, _DESIRED_CHUNK_BYTES // array.dtype.itemsize))
  kvstore = ({"driver": "gcs", "bucket": "t5x-dummy-bucket", "path": name.replace("/", ".")}
             if gcs else {"driver": "file", "path": name.replace("/", ".")})
  spec = {
      "driver": "zarr",
      "dtype": jnp.dtype(array.dtype).name,
      "kvstore": kvstore,
      "metadata": {"compressor": {"id": "gzip"}, "shape": list(array.shape), "chunks": chunks},
  }
  return ts.Spec(spec).to_json()


def _sorted_tree(tree):
  if isinstance(tree, Mapping):
    return {k: _sorted_tree(tree[k]) for k in sorted(tree)}
  return tree


def write_checkpoint(model_dir: str, params: Mapping[str, Any], step: int,
                     dtype=np.float32) -> str:
  """Writes `params` as t5x's `model_dir/checkpoint_<step>/`; returns that directory.

  Local: everything goes to `checkpoint_<step>.tmp-<time>` which is renamed into place, so a
  crash never leaves a half-written `checkpoint_<step>`. GCS has no rename: arrays are written
  first and the msgpack `checkpoint` file last, and a directory without that file is not a
  checkpoint to t5x or to `load` (t5x itself finalizes with `gsutil mv`).
  """
  from flax import serialization  # pylint: disable=g-import-not-at-top

  if jax.process_count() > 1:
    raise NotImplementedError("checkpoints.save writes from a single process")
  model_dir = storage.normalize(model_dir)
  final_dir = storage.join(model_dir, f"checkpoint_{step}")
  gcs = storage.is_gcs(model_dir)
  # On GCS a directory without the msgpack file is an unfinished save and may be overwritten.
  if storage.exists(storage.join(final_dir, MSGPACK_FILE) if gcs else final_dir):
    raise CheckpointError(f"{final_dir} already exists; remove it or save another step")
  work_dir = final_dir if gcs else f"{final_dir}.tmp-{int(time.time())}"
  if not gcs:
    os.makedirs(work_dir)
  try:
    target = {}
    for name, value in tree_lib.flatten(params).items():
      array = np.asarray(jax.device_get(value)).astype(dtype)
      if stored_inline(name, array):
        target[name] = array
        continue
      spec = _relative_spec(f"target/{name}", array, gcs)
      store = ts.open(absolute_spec(spec, work_dir, for_write=True), create=True, open=True)
      store.result().write(array).result()
      target[name] = spec
    optimizer = _sorted_tree({"state": {"step": np.asarray(step, np.int32)},
                              "target": tree_lib.unflatten(target)})
    # As t5x: version first, then the (key-sorted) optimizer state dict; flax's ext types.
    data = serialization.msgpack_serialize({"version": VERSION, "optimizer": optimizer},
                                           in_place=True)
    storage.write_bytes(storage.join(work_dir, MSGPACK_FILE), data)
    if not gcs:
      os.rename(work_dir, final_dir)
  except BaseException:
    if not gcs:
      shutil.rmtree(work_dir, ignore_errors=True)
    raise
  logging.info("Saved t5x checkpoint for step %d to %s", step, final_dir)
  return final_dir
