"""Running t5x's own binaries (`python -m t5x.train / eval / infer`) on prompt_jax's gin files.

t5x is not on PyPI: the tests use its sources at ../shared/t5x (see its README) and skip cleanly
when they are absent. Every t5x binary runs in a subprocess under a timeout.
"""
import os
import pathlib
import subprocess
import sys
from typing import Dict, Optional, Sequence

import numpy as np
import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
T5X_DIR = pathlib.Path(os.environ.get("PROMPT_JAX_T5X_DIR", REPO_ROOT.parent / "shared" / "t5x"))
GIN_DIR = REPO_ROOT / "gin"
# 2000: the step of the shipped tiny checkpoint (t5x counts TRAIN_STEPS from it).
EMBEDDED_STEP = 2000


def require_t5x() -> None:
  if not (T5X_DIR / "src" / "t5x" / "train.py").is_file():
    pytest.skip(f"t5x sources are absent at {T5X_DIR} (see ../shared/t5x/README.md)")
  import importlib.util  # pylint: disable=g-import-not-at-top
  missing = [m for m in ("fiddle", "jaxtyping", "chex", "cached_property")
             if importlib.util.find_spec(m) is None]
  if missing:
    pytest.skip(f"t5x needs {', '.join(missing)}: pip install -e '.[t5x]'")


def env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
  out = dict(os.environ)
  paths = [str(T5X_DIR / "src"), str(T5X_DIR / "stubs"), str(REPO_ROOT)]
  if out.get("PYTHONPATH"):
    paths.append(out["PYTHONPATH"])
  out.update({"PYTHONPATH": os.pathsep.join(paths), "JAX_PLATFORMS": "cpu",
              "TF_CPP_MIN_LOG_LEVEL": "3", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
  out.update(extra or {})
  return out


def run_t5x(binary: str, args: Sequence[str], timeout: float = 600,
            check: bool = True) -> subprocess.CompletedProcess:
  """`python -m t5x.<binary> --gin_search_paths=<gin>,<t5x> <args>`."""
  require_t5x()
  cmd = [sys.executable, "-m", f"t5x.{binary}",
         f"--gin_search_paths={GIN_DIR},{T5X_DIR / 'src'}", *args]
  proc = subprocess.run(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True, timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"t5x.{binary} failed ({proc.returncode}):\n{proc.stdout[-6000:]}")
  return proc


def run_python(code: str, *args: str, timeout: float = 600,
               with_t5x: bool = True) -> subprocess.CompletedProcess:
  """A python snippet (with t5x on the path unless `with_t5x` is False)."""
  if with_t5x:
    require_t5x()
  environ = env()
  if not with_t5x:
    environ["PYTHONPATH"] = str(REPO_ROOT)
  return subprocess.run([sys.executable, "-c", code, *args], env=environ, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, timeout=timeout)


# t5x's runs/finetune.gin shuffles the train split with a new seed each run
# (train/utils.DatasetConfig.seed = None): a test that compares a few steps' result needs the
# same batches on every machine (RANDOM_SEED fixes only the prompt's init and dropout).
FIXED_TRAIN_ORDER = ("--gin.train/utils.DatasetConfig.seed=0",)


def embedded_train_args(model_dir: str, steps: int, *extra: str) -> list:
  """The embedded default under t5x.train: `steps` prompt-tuning steps, no eval."""
  return ["--gin_file=t5x/runs/embedded_default.gin", f"--gin.MODEL_DIR='{model_dir}'",
          f"--gin.TRAIN_STEPS={EMBEDDED_STEP + steps}", "--gin.EVAL_PERIOD=0",
          "--gin.RANDOM_SEED=0", *FIXED_TRAIN_ORDER, *extra]


def read_t5x_checkpoint(path: str) -> Dict[str, np.ndarray]:
  """{'target/<param path>': array, 'state/...': array} of a t5x (orbax) checkpoint dir."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from prompt_jax import trees  # pylint: disable=g-import-not-at-top
  restored = ocp.PyTreeCheckpointer().restore(os.path.join(path, "state"))
  return {k: np.asarray(v) for k, v in trees.flatten(restored).items() if v is not None}


def trained_paths(flat_checkpoint: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """The model parameters that have optimizer state in a t5x checkpoint ({param path: value}):
  a state path names its parameter's path ('state/param_states/<p>/v' for t5x's Adafactor,
  '.../mu/<p>' for an optax AdamW)."""
  state_keys = [k + "/" for k in flat_checkpoint if k.startswith("state/param_states/")]
  params = {k[len("target/"):]: v for k, v in flat_checkpoint.items() if k.startswith("target/")}
  return {p: v for p, v in params.items() if any(f"/{p}/" in k for k in state_keys)}
