"""A user's `.npy` array file (a prompt, an embedding table) read as one numeric array.

Anything else is one ConfigError line naming the file and what it is: missing, an `.npz`
archive, not a `.npy` at all, truncated or damaged, a pickled object array (never unpickled),
or values that are not numbers. Every reader of such files (PROMPT_FILE, ensemble and bank
prompts, `inspect --prompt`, `recycle`) goes through `load`, so each says the same.
"""
import os

import numpy as np

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
    reason = ("it holds pickled Python objects" if "pickle" in str(e)
              else (str(e).strip().splitlines() or [type(e).__name__])[0])
    raise ConfigError(f"{what} is not a readable .npy array ({reason}){tail}") from e
  if array.dtype.kind not in "fiub":
    raise ConfigError(f"{what} holds {array.dtype} values, not numbers{tail}")
  return array
