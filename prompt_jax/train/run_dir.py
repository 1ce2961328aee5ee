"""A run directory that describes itself: the one function that resolves a run.

  MODEL_DIR/config.gin                        the resolved gin config train wrote
  MODEL_DIR/checkpoints/<step>/state          orbax: trainable params, optimizer state, step
  MODEL_DIR/numpy_checkpoints/checkpoint_<step>/<param path with '.'>.npy

`resolve(model_dir)` finds the config and the latest intact checkpoint; eval, infer, export,
describe (and the CLI's last lines) all go through it. The latest step comes from
`checkpointing.latest_step`, called here only, so a change of what "intact" means (a corrupt
checkpoint skipped) reaches every command at once.

This sits in train/ (floor 3), beside the checkpoint layout it reads: nothing below needs a run
directory, and reaching `checkpointing` from floor 2.5 would be an upward import.
"""
import dataclasses
import os
import re
from typing import Dict, Mapping, Optional, Tuple

from etils import epath

from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.errors import ConfigError
from prompt_jax.train import checkpointing

CONFIG_FILE = "config.gin"
# Parameter shapes do not depend on sequence lengths: any lengths give the same shapes.
_SHAPE_LENGTHS = {"inputs": 8, "targets": 4}


@dataclasses.dataclass(frozen=True)
class RunDir:
  """What a MODEL_DIR holds. Paths are None where the run has not written them."""
  model_dir: str
  config: Optional[str]  # MODEL_DIR/config.gin
  step: Optional[int]  # the checkpoint's step
  checkpoint: Optional[str]  # MODEL_DIR/checkpoints/<step> (or CHECKPOINT_PATH)
  numpy_dir: Optional[str]  # MODEL_DIR/numpy_checkpoints/checkpoint_<step>
  own: bool = True  # the checkpoint is this run's (MODEL_DIR/checkpoints/<step>)

  @property
  def label(self) -> str:
    """What output file names say of the checkpoint: 'step<N>' for this run's; for another
    run's CHECKPOINT_PATH, that run's name too ('<run>_step<N>'), or the checkpoint's name when
    it has no step, so that outputs of different checkpoints never share a file."""
    safe = lambda name: re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    if not self.checkpoint or (self.own and self.step is not None):
      return f"step{self.step}"
    path = self.checkpoint.rstrip("/")
    if self.step is None:
      return safe(os.path.basename(path))
    run = os.path.dirname(path)  # <run>/checkpoints/<step> (ours), <run>/checkpoint_<step> (t5x)
    if os.path.basename(run) == checkpointing.CHECKPOINTS_DIR:
      run = os.path.dirname(run)
    return f"{safe(os.path.basename(run))}_step{self.step}"

  def numpy_files(self) -> Tuple[str, ...]:
    """The `.npy` exports of the checkpoint's trainable parameters (sorted)."""
    if not self.numpy_dir:
      return ()
    return tuple(sorted(str(p) for p in epath.Path(self.numpy_dir).glob("*.npy")))


def config_path(model_dir: str) -> str:
  return os.path.join(model_dir, CONFIG_FILE)


def latest_checkpoint(model_dir: str) -> Tuple[Optional[int], Optional[str]]:
  """(step, MODEL_DIR/checkpoints/<step>) of the latest intact checkpoint, or (None, None)."""
  step = checkpointing.latest_step(model_dir)
  if step is None:
    return None, None
  return step, os.path.join(checkpointing.checkpoints_dir(model_dir), str(step))


def resolve(model_dir: str, checkpoint_path: Optional[str] = None) -> RunDir:
  """The run in MODEL_DIR: its config.gin and its latest intact checkpoint (or
  `checkpoint_path`, a `.../checkpoints/<step>` dir, when given). Reads, never writes."""
  if not model_dir:
    raise ConfigError("MODEL_DIR is empty: set --gin.MODEL_DIR=\"'/path/to/run'\"")
  config = config_path(model_dir)
  config = config if epath.Path(config).is_file() else None
  if checkpoint_path:
    name = os.path.basename(checkpoint_path.rstrip("/"))
    if name == "state":
      checkpoint_path = os.path.dirname(checkpoint_path.rstrip("/"))
      name = os.path.basename(checkpoint_path)
    # Ours are checkpoints/<step>; t5x's are checkpoint_<step>.
    found = re.fullmatch(r"(?:checkpoint_)?(\d+)", name)
    step = int(found.group(1)) if found else None
  else:
    step, checkpoint_path = latest_checkpoint(model_dir)
  numpy_dir = None
  # The .npy export of that step, when the checkpoint is this run's (not another run's).
  ours = os.path.normpath(os.path.dirname(os.path.abspath(checkpoint_path or "."))) == (
      os.path.normpath(os.path.abspath(checkpointing.checkpoints_dir(model_dir))))
  if step is not None and ours:
    candidate = epath.Path(model_dir) / checkpointing.NUMPY_DIR / f"checkpoint_{step}"
    numpy_dir = str(candidate) if candidate.is_dir() else None
  return RunDir(model_dir=model_dir, config=config, step=step, checkpoint=checkpoint_path,
                numpy_dir=numpy_dir, own=ours)


def state_dir(checkpoint_path: str) -> str:
  """The orbax `state` item of a `checkpoints/<step>` dir (or the `state` dir itself)."""
  path = checkpoint_path.rstrip("/")
  state = path if os.path.basename(path) == "state" else os.path.join(path, "state")
  if not epath.Path(state).is_dir():
    parent = epath.Path(os.path.dirname(os.path.dirname(state)))
    steps = sorted(int(p.name) for p in parent.iterdir() if p.name.isdigit()
                   and (p / "state").is_dir()) if parent.is_dir() else []
    there = f" (the steps in {parent}: {', '.join(map(str, steps))})" if steps else ""
    what = ("does not exist" if not epath.Path(path).exists()
            else f"is not a prompt_jax checkpoint (no {state})")
    raise ConfigError(f"CHECKPOINT_PATH {checkpoint_path!r} {what}: name a "
                      f"MODEL_DIR/checkpoints/<step> directory{there}, a t5x checkpoint_<step> "
                      f"directory, or leave CHECKPOINT_PATH out for the run's latest")
  return state


def checkpoint_shapes(checkpoint_path: str) -> Dict[str, Tuple[int, ...]]:
  """{parameter path: shape} of the trained parameters in a checkpoint, from orbax's
  metadata (no array is read)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  meta = ocp.StandardCheckpointer().metadata(os.path.abspath(state_dir(checkpoint_path)))
  tree = getattr(meta, "item_metadata", meta)
  tree = getattr(tree, "tree", tree)
  return {k: tuple(v.shape) for k, v in trees.flatten(tree["params"]).items()}


def trainable_shapes(model: run_setup.ModelSpec) -> Dict[str, Tuple[int, ...]]:
  """{parameter path: shape} of what `model` trains, from abstract shapes (nothing allocated)."""
  boxed = run_setup.abstract_variables(run_setup.build_model(model.config, model.prompt),
                                       _SHAPE_LENGTHS)
  flat = trees.flatten(trees.unbox(boxed))
  return {k: tuple(v.shape) for k, v in flat.items()
          if trees.is_trainable(k, model.trainable_regex)}


def shape_mismatch(expected: Mapping[str, Tuple[int, ...]],
                   saved: Mapping[str, Tuple[int, ...]]) -> Optional[str]:
  """None if the checkpoint has every parameter the model trains, with its shape; else what
  differs, e.g. 'encoder/prompt/prompt/prompt: (16, 64) here, (8, 64) in the checkpoint'."""
  for name in sorted(expected):
    if name not in saved:
      have = ", ".join(sorted(saved)[:3]) + (" ..." if len(saved) > 3 else "")
      return f"{name} is not in the checkpoint (it has {have or 'no parameters'})"
    if tuple(saved[name]) != tuple(expected[name]):
      return (f"{name}: {tuple(expected[name])} here, {tuple(saved[name])} in the checkpoint")
  return None
