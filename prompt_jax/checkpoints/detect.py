"""Which checkpoint format a path holds, and the directory to read it from."""
import re
from typing import Tuple

from prompt_jax.checkpoints import hf
from prompt_jax.checkpoints import orbax_format
from prompt_jax.checkpoints import storage
from prompt_jax.checkpoints import t5x_legacy
from prompt_jax.checkpoints.tree import CheckpointError

T5X_LEGACY = "t5x_legacy"
T5X_ORBAX = "t5x_orbax"
HF = "hf"
FORMATS = (T5X_LEGACY, T5X_ORBAX, HF)

_STEP_DIR_RE = re.compile(r"checkpoint_(\d+)")
_LOOKED_FOR = (
    "looked for a t5x legacy checkpoint (a 'checkpoint' msgpack file), a t5x orbax checkpoint "
    "('_METADATA' or 'state/_METADATA'), checkpoint_<step>/ subdirectories holding either, and a "
    "Hugging Face T5 dir (config.json + model.safetensors or pytorch_model.bin)")


def _format_of_dir(path: str):
  if not storage.is_gcs(path) and hf.is_hf_dir(path):
    return HF
  if orbax_format.pytree_dir(path):
    return T5X_ORBAX
  if t5x_legacy.is_checkpoint_dir(path):
    return T5X_LEGACY
  return None


def resolve(path) -> Tuple[str, str]:
  """(format, checkpoint dir) for `path`: a checkpoint dir, its `checkpoint` file, or a model
  dir of `checkpoint_<step>` subdirs (the latest complete step is taken)."""
  path = storage.normalize(path)
  try:
    return _resolve(path)
  except CheckpointError:
    raise
  except (OSError, ValueError) as e:  # tensorstore reports GCS failures as ValueError
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise CheckpointError(f"cannot read checkpoint path {path}: {message}") from e


def _resolve(path: str) -> Tuple[str, str]:
  if storage.isfile(path):
    parent, name = path.rsplit("/", 1)
    names = {t5x_legacy.MSGPACK_FILE, hf.CONFIG_FILE, *hf.WEIGHT_FILES}
    fmt = _format_of_dir(parent) if name in names else None
    if fmt is None:
      raise CheckpointError(f"no T5 checkpoint at {path}: {_LOOKED_FOR}")
    return fmt, parent
  if not storage.isdir(path):
    raise CheckpointError(f"checkpoint path {path} does not exist")
  fmt = _format_of_dir(path)
  if fmt is not None:
    return fmt, path
  steps = sorted((int(m.group(1)), name) for name in storage.listdir(path)
                 for m in [_STEP_DIR_RE.fullmatch(name)] if m)
  for _, name in reversed(steps):
    step_dir = storage.join(path, name)
    fmt = _format_of_dir(step_dir)
    if fmt in (T5X_LEGACY, T5X_ORBAX):
      return fmt, step_dir
  raise CheckpointError(f"no T5 checkpoint at {path}: {_LOOKED_FOR}")


def detect_format(path) -> str:
  """One of 't5x_legacy', 't5x_orbax', 'hf'; CheckpointError if `path` holds none of them."""
  return resolve(path)[0]
