"""Paths on local disk or Google Cloud Storage, with no dependency beyond tensorstore.

Local paths use the os module. `gs://bucket/dir` paths go through tensorstore's own `gcs`
kvstore driver (the one t5x's tensorstore specs name), so reading a checkpoint from GCS needs
neither TensorFlow nor gcsfs. `KvFile` is a seekable, read-only file over any tensorstore kvstore
(byte-range reads with read-ahead); the tests drive it with the `file` driver.
"""
import os
import re
from typing import List, Optional, Tuple

import tensorstore as ts

_GCS_RE = re.compile(r"^gs://([^/]+)/?(.*)$", re.DOTALL)
_READ_AHEAD_BYTES = 1 << 20


def is_gcs(path: str) -> bool:
  return str(path).startswith("gs://")


def split_gcs(path: str) -> Tuple[str, str]:
  """'gs://bucket/a/b' -> ('bucket', 'a/b')."""
  match = _GCS_RE.fullmatch(str(path))
  if match is None:
    raise ValueError(f"not a gs:// path: {path!r}")
  return match.group(1), match.group(2).strip("/")


def join(path: str, *parts: str) -> str:
  """os.path.join for local paths, '/'-join for gs:// paths."""
  path = str(path)
  if is_gcs(path):
    return "/".join([path.rstrip("/")] + [p.strip("/") for p in parts if p])
  return os.path.join(path, *parts)


def normalize(path) -> str:
  """A str path; local paths made absolute, trailing slashes dropped."""
  path = os.fspath(path)
  if is_gcs(path):
    return path.rstrip("/")
  return os.path.abspath(os.path.expanduser(path))


def kvstore_spec(path: str) -> dict:
  """The tensorstore kvstore spec of a file or directory path (gcs driver for gs://)."""
  if is_gcs(path):
    bucket, key = split_gcs(path)
    return {"driver": "gcs", "bucket": bucket, "path": key}
  return {"driver": "file", "path": normalize(path)}


def _dir_kvstore(path: str) -> ts.KvStore:
  spec = kvstore_spec(path)
  spec["path"] = spec["path"].rstrip("/") + "/" if spec["path"] else ""
  return ts.KvStore.open(spec).result()


def _gcs_keys(path: str) -> List[str]:
  """All keys (recursively) under a gs:// directory, relative to it."""
  return [k.decode() for k in _dir_kvstore(path).list().result()]


def isfile(path: str) -> bool:
  if not is_gcs(path):
    return os.path.isfile(path)
  parent, name = path.rstrip("/").rsplit("/", 1)
  result = _dir_kvstore(parent).read(name, byte_range=slice(0, 0)).result()
  return result.state == "value"


def isdir(path: str) -> bool:
  if not is_gcs(path):
    return os.path.isdir(path)
  return bool(_gcs_keys(path))


def exists(path: str) -> bool:
  return isfile(path) or isdir(path)


def listdir(path: str) -> List[str]:
  """Names of the immediate children (files and directories) of a directory."""
  if not is_gcs(path):
    return sorted(os.listdir(path))
  return sorted({key.split("/", 1)[0] for key in _gcs_keys(path)})


def read_bytes(path: str) -> bytes:
  with open_binary(path) as f:
    return f.read()


def write_bytes(path: str, data: bytes):
  """Writes a whole file (one object on GCS)."""
  if not is_gcs(path):
    with open(path, "wb") as f:
      f.write(data)
    return
  parent, name = path.rstrip("/").rsplit("/", 1)
  _dir_kvstore(parent).write(name, data).result()


def open_binary(path: str):
  """A seekable read-only binary file: `open()` locally, a `KvFile` on GCS."""
  if not is_gcs(path):
    return open(path, "rb")
  parent, name = path.rstrip("/").rsplit("/", 1)
  return KvFile(kvstore_spec(parent), name)


class KvFile:
  """A seekable read-only file over one key of a tensorstore kvstore (ranged reads)."""

  def __init__(self, directory_spec: dict, key: str, read_ahead: int = _READ_AHEAD_BYTES):
    spec = dict(directory_spec)
    spec["path"] = spec.get("path", "").rstrip("/") + "/" if spec.get("path") else ""
    self._store = ts.KvStore.open(spec).result()
    self._key = key
    self._read_ahead = read_ahead
    self._pos = 0
    self._buf_start = 0
    self._buf = b""
    self._eof: Optional[int] = None  # file size, once known
    self.bytes_fetched = 0  # for tests: how much was really read from storage

  def _fetch(self, start: int, size: int) -> bytes:
    if self._eof is not None and start >= self._eof:
      return b""
    try:
      result = self._store.read(self._key, byte_range=slice(start, start + size)).result()
    except ValueError as e:  # OUT_OF_RANGE: fewer than `size` bytes remain; read the rest.
      if "OUT_OF_RANGE" not in str(e):
        raise
      result = self._store.read(self._key, byte_range=slice(start, None)).result()
      self._eof = start + len(result.value)
    if result.state != "value":
      raise FileNotFoundError(f"{self._key} not found in {self._store.spec().to_json()}")
    self.bytes_fetched += len(result.value)
    return result.value

  def read(self, n: int = -1) -> bytes:
    if n is None or n < 0:
      data = self._fetch_rest()
      self._pos += len(data)
      return data
    end = self._pos + n
    buf_end = self._buf_start + len(self._buf)
    if not (self._buf_start <= self._pos and end <= buf_end):
      self._buf_start = self._pos
      self._buf = self._fetch(self._pos, max(n, self._read_ahead))
    offset = self._pos - self._buf_start
    data = self._buf[offset:offset + n]
    self._pos += len(data)
    return data

  def _fetch_rest(self) -> bytes:
    result = self._store.read(self._key, byte_range=slice(self._pos, None)).result()
    if result.state != "value":
      raise FileNotFoundError(f"{self._key} not found in {self._store.spec().to_json()}")
    self.bytes_fetched += len(result.value)
    return result.value

  def seek(self, offset: int, whence: int = 0) -> int:
    if whence == 0:
      self._pos = offset
    elif whence == 1:
      self._pos += offset
    else:
      raise ValueError("KvFile supports seek from the start or the current position only")
    return self._pos

  def tell(self) -> int:
    return self._pos

  def close(self):
    self._buf = b""

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
