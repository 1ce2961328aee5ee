"""A user's `.npy` array file (a prompt, an embedding table) read as one numeric array.

Anything else is one ConfigError line naming the file and what it is: missing, an `.npz`
archive, not a `.npy` at all, truncated or damaged, a pickled object array (never unpickled),
or values that are not numbers. Every reader of such files (PROMPT_FILE, ensemble and bank
prompts, `inspect --prompt`, `recycle`) goes through `load`, so each says the same;
`load_archive` does the same for the `.npz`/`.safetensors` files of several arrays (IPT's
pretrained network, an MPT source). `save_all` writes a set of `.npy` files all or none.
"""
import os
import zipfile
import zlib
from typing import Dict, Mapping

import numpy as np

from prompt_jax import errors
from prompt_jax.errors import ConfigError

EXPORT_HINT = "export the prompt with `prompt-jax export --format=npy`"
_MAGIC = b"\x93NUMPY"


def load(path: str, what: str, hint: str = "") -> np.ndarray:
  """The numeric array saved at `path` by `numpy.save`. `what` starts each error ("PROMPT_FILE
  'p.npy'", "--prompt p.npy"); `hint`, what to do instead, ends it."""
  tail = f"; {hint}" if hint else ""
  if not path or not os.path.isfile(path):
    raise ConfigError(f"{what} does not exist{tail}")
  try:
    with open(path, "rb") as f:
      magic = f.read(len(_MAGIC))
  except OSError as e:
    raise ConfigError(f"{what} cannot be read ({e.strerror or e}){tail}") from e
  if magic.startswith(b"PK\x03\x04"):  # numpy.savez: a zip of arrays
    raise ConfigError(f"{what} is an .npz archive, not one .npy array{tail}")
  if magic != _MAGIC:
    raise ConfigError(f"{what} is not a .npy array file{tail}")
  try:
    array = np.load(path)  # allow_pickle=False: an object array is refused, never unpickled
  except (OSError, ValueError, EOFError) as e:
    raise ConfigError(f"{what} is not a readable .npy array ({_reason(e)}){tail}") from e
  if array.dtype.kind not in "fiub":
    raise ConfigError(f"{what} holds {array.dtype} values, not numbers{tail}")
  return check_finite(array, what, tail)


def check_finite(array: np.ndarray, what: str, tail: str = "", name: str = "") -> np.ndarray:
  """`array`, or one ConfigError if it holds NaN or Inf (a diverged run's prompt, say): trained
  on or evaluated, it would give a NaN loss or constant predictions with no word of why."""
  if array.dtype.kind in "fc":
    bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
    if bad:
      where = f" ({name})" if name else ""
      raise ConfigError(f"{what}{where} holds {bad} NaN or Inf value(s) of {np.size(array)}, "
                        f"not usable numbers{tail}")
  return array


def load_archive(path: str, what: str, hint: str = "") -> Dict[str, np.ndarray]:
  """Every array of the `.npz` (numpy.savez) or `.safetensors` file at `path`, read in full, so
  a damaged member is this one ConfigError line, not a traceback when it is first used."""
  tail = f"; {hint}" if hint else ""
  if not path or not os.path.isfile(path):
    raise ConfigError(f"{what} does not exist{tail}")
  if path.endswith(".safetensors"):
    return _safetensors(path, what, tail)
  try:
    with open(path, "rb") as f:
      magic = f.read(4)
    if magic != b"PK\x03\x04":
      kind = "a .npy array" if magic == _MAGIC[:4] else "not a zip"
      raise ConfigError(f"{what} is not an .npz archive of arrays ({kind}){tail}")
    with np.load(path) as data:  # allow_pickle=False: an object array is refused
      arrays = {k: np.asarray(data[k]) for k in data.files}
  except ConfigError:
    raise
  except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
    raise ConfigError(f"{what} is not a readable .npz archive ({_reason(e)}){tail}") from e
  return {k: check_finite(a, what, tail, k) for k, a in arrays.items()}


def _safetensors(path: str, what: str, tail: str) -> Dict[str, np.ndarray]:
  try:
    from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError(f"{what} is a .safetensors file: pip install safetensors") from e
  try:
    arrays = load_file(path)
  except (SafetensorError, OSError, ValueError) as e:
    raise ConfigError(f"{what} is not a readable .safetensors file ({_reason(e)}){tail}") from e
  return {k: check_finite(np.asarray(a), what, tail, k) for k, a in arrays.items()}


def _reason(e: BaseException) -> str:
  if "pickle" in str(e):
    return "it holds pickled Python objects"
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


def save_all(files: Mapping[str, np.ndarray]) -> None:
  """Saves {path: array} as .npy files, all or none: each goes to `path.tmp` first and is renamed
  only once every one is written, so a failed write (a full disk, a kill) leaves the previous
  set as it was (an export's prefix arrays, recycle's prompts), never a mix of two."""
  try:
    for path, array in files.items():
      errors.make_dirs(os.path.dirname(path), f"--output {path}")
      try:
        with open(path + ".tmp", "wb") as f:
          np.save(f, array)
      except OSError as e:
        raise errors.RunError(f"writing {path} failed ({e.strerror or e}); nothing was replaced: "
                              f"free space or choose another place, and rerun") from e
    for path in files:
      os.replace(path + ".tmp", path)
  finally:
    for path in files:
      if os.path.exists(path + ".tmp"):
        os.remove(path + ".tmp")
