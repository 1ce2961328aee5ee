"""t5x's orbax checkpoint layout, read and written through orbax-checkpoint.

t5x's `OrbaxCheckpointManagerInterface` saves the train state dict with an orbax
`CheckpointManager(step_prefix='checkpoint')` under the item name 'state':

  checkpoint_<step>/_CHECKPOINT_METADATA
  checkpoint_<step>/state/_METADATA, manifest.ocdbt, d/, ...   (a PyTree checkpoint)

whose tree is {'target': params, 'state': {'step', 'param_states', ...}} (older t5x wrapped it
as {'version', 'optimizer': {...}}). Reading restores only the parameter subtree
(`partial_restore`), so optimizer slots are never read; with shardings, orbax reads each
array straight into a sharded jax.Array.
"""
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from prompt_jax.checkpoints import storage
from prompt_jax.checkpoints import tree as tree_lib
from prompt_jax.checkpoints.tree import CheckpointError

METADATA_FILE = "_METADATA"
STATE_ITEM = "state"
# Where the model parameters live inside the saved tree, most specific first.
_PARAM_PREFIXES = (("optimizer", "target"), ("target",), ("params",), ())


def pytree_dir(path: str) -> Optional[str]:
  """The orbax PyTree directory at `path` (itself or its `state/` item), if any."""
  for candidate in (path, storage.join(path, STATE_ITEM)):
    if storage.isfile(storage.join(candidate, METADATA_FILE)):
      return candidate
  return None


def _epath(path: str):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(path)


def _subtree(tree: Mapping[str, Any], prefix: Tuple[str, ...]):
  for key in prefix:
    if not isinstance(tree, Mapping) or key not in tree:
      return None
    tree = tree[key]
  return tree


def _nest(prefix: Tuple[str, ...], tree):
  for key in reversed(prefix):
    tree = {key: tree}
  return tree


class OrbaxCheckpoint:
  """The model weights of a t5x orbax checkpoint, restored through orbax."""

  format = "t5x_orbax"

  def __init__(self, path: str):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    self.path = path
    self._dir = pytree_dir(path)
    if self._dir is None:
      raise CheckpointError(f"{path} is not an orbax checkpoint (no {METADATA_FILE})")
    try:
      metadata = ocp.PyTreeCheckpointHandler().metadata(_epath(self._dir)).tree
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"cannot read orbax metadata of {self._dir}: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    for prefix in _PARAM_PREFIXES:
      params = _subtree(metadata, prefix)
      if isinstance(params, Mapping) and "token_embedder" in params:
        self._prefix = prefix
        break
    else:
      raise CheckpointError(f"orbax checkpoint {self._dir} has no T5 parameters (looked for "
                            "'token_embedder' under 'target', 'optimizer/target', 'params', /)")
    flat = tree_lib.flatten(params)
    self.shapes = {name: tuple(m.shape) for name, m in flat.items() if hasattr(m, "shape")}

  def restore(self, names, dtype, shardings=None) -> Dict[str, Any]:
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    dtype = np.dtype(dtype)
    names = list(names)
    if shardings is None:
      args = {n: ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype) for n in names}
    else:
      args = {n: ocp.ArrayRestoreArgs(sharding=shardings[n], dtype=dtype) for n in names}
    item = _nest(self._prefix, tree_lib.unflatten({n: 0 for n in names}))
    restore_args = _nest(self._prefix, tree_lib.unflatten(args))
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    restored = checkpointer.restore(
        _epath(self._dir),
        args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True))
    flat = tree_lib.flatten(_subtree(restored, self._prefix))
    return {n: flat[n] for n in names}


def write_checkpoint(model_dir: str, params: Mapping[str, Any], step: int,
                     dtype=np.float32, use_ocdbt: bool = False) -> str:
  """Writes `params` as t5x's orbax `model_dir/checkpoint_<step>/state/`; returns the step dir.

  The tree is t5x's train state dict with a minimal optimizer state: {'target': params,
  'state': {'step': step}}. t5x's manager uses `PyTreeCheckpointHandler(use_ocdbt=False)`
  (one zarr dir per array, e.g. `state/target.token_embedder.embedding`); orbax's own default,
  OCDBT, is `use_ocdbt=True`. Orbax writes atomically (temporary directory, then rename).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  model_dir = storage.normalize(model_dir)
  final_dir = storage.join(model_dir, f"checkpoint_{step}")
  if storage.exists(final_dir):
    raise CheckpointError(f"{final_dir} already exists; remove it or save another step")
  target = jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)).astype(dtype), params)
  state = {"target": target, "state": {"step": np.asarray(step, np.int32)}}
  options = ocp.CheckpointManagerOptions(step_prefix="checkpoint", create=True)
  handlers = {STATE_ITEM: ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt)}
  with ocp.CheckpointManager(_epath(model_dir), options=options, item_names=(STATE_ITEM,),
                             item_handlers=handlers) as manager:
    latest = manager.latest_step()
    if latest is not None and step <= latest:  # the manager would skip the save, returning False
      raise CheckpointError(f"{model_dir} already holds checkpoint_{latest}; orbax saves only "
                            f"later steps: save step {latest + 1} or more, or into another "
                            f"directory")
    saved = manager.save(step, args=ocp.args.Composite(
        **{STATE_ITEM: ocp.args.PyTreeSave(state)}))
    manager.wait_until_finished()
  if not saved or not storage.exists(final_dir):
    raise CheckpointError(f"orbax did not write {final_dir}; nothing was saved")
  return final_dir
