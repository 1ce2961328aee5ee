"""Orbax checkpoints of the trainable state (+ data position) and `.npy` exports of prompts.

Layout under MODEL_DIR:
  checkpoints/<step>/state/   trainable params, optimizer state, step   (orbax, atomic)
  checkpoints/<step>/data/    {"position": batches consumed}             (json)
  numpy_checkpoints/checkpoint_<step>/<param path with '.'>.npy         (process 0 only)
Frozen parameters are never saved: a restart reloads them from INITIAL_CHECKPOINT_PATH.
"""
import os
import re
from typing import Any, Container, Mapping, Optional, Tuple

import jax
import numpy as np
from etils import epath
import orbax.checkpoint as ocp

from prompt_jax import trees
from prompt_jax.train import state as state_lib

CHECKPOINTS_DIR = "checkpoints"
NUMPY_DIR = "numpy_checkpoints"


def checkpoints_dir(model_dir: str) -> str:
  return os.path.join(model_dir, CHECKPOINTS_DIR)


def latest_step(model_dir: str) -> Optional[int]:
  """The latest complete checkpoint step under MODEL_DIR (local or gs://), read without
  creating anything. Unfinished saves (orbax tmp dirs) do not count."""
  directory = epath.Path(checkpoints_dir(model_dir))
  if not directory.is_dir():
    return None
  steps = [int(d.name) for d in directory.iterdir()
           if re.fullmatch(r"\d+", d.name) and (d / "state").is_dir()]
  return max(steps) if steps else None


def manager(model_dir: str, *, period: int, keep: Optional[int],
            read_only: bool = False) -> ocp.CheckpointManager:
  """Keeps `keep` checkpoints, saving every `period` steps (and whenever forced)."""
  options = ocp.CheckpointManagerOptions(
      save_interval_steps=max(1, period), max_to_keep=keep, create=not read_only,
      read_only=read_only, enable_async_checkpointing=False)
  return ocp.CheckpointManager(checkpoints_dir(model_dir), options=options,
                               item_names=("state", "data"))


def save(mngr: ocp.CheckpointManager, step: int, train_state: state_lib.TrainState,
         data_position: int, force: bool = False) -> bool:
  return mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(train_state.as_dict()),
      data=ocp.args.JsonSave({"position": int(data_position)})), force=force)


def restore(mngr: ocp.CheckpointManager, step: int,
            abstract_state: state_lib.TrainState) -> Tuple[state_lib.TrainState, int]:
  """(state placed as `abstract_state`'s shardings, data position) of checkpoint `step`."""
  restored = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state.as_dict()),
      data=ocp.args.JsonRestore()))
  s = restored["state"]
  return (state_lib.TrainState(s["step"], s["params"], s["opt_state"]),
          int(restored["data"]["position"]))


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


def _fully_addressable(x):
  """A host copy of a (possibly multi-process) jax.Array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return multihost_utils.process_allgather(x, tiled=True)
  return x
