"""`prompt-jax export --format=npy|peft`: the trained prompt of a run as plain arrays.

  prompt tuning, DPT, residual   -> prompt_step<N>.npy          [P, H]  (DPT / residual folded)
  deep prefix (P-tuning v2)      -> prefix_step<N>.npy          [2, L, P, D]  key, value stacked
                                    decoder_prefix_step<N>.npy  (PREFIX_DECODER = True)
                                    cross_prefix_step<N>.npy    (PREFIX_CROSS = True)
  IDPG, M-IDPG, IPT              -> refused: their prompt depends on the input
`--format=peft` writes the [P, H] prompt as a Hugging Face PEFT prompt-tuning adapter directory
(evaluation/peft_export.py; prefix placement, input-level prompts only),
written to MODEL_DIR/export/ (or --output) from the latest intact checkpoint (or CHECKPOINT_PATH).
A [P, H] file is what `prompts/from_file.gin` (PROMPT_FILE) and plain prompt tuning read.

`FORMATS` is the one dispatch on --format; each method's spec folds its own parameters
(`prompts.specs.MethodSpec.fold`).
"""
import os
from typing import Any, Callable, Dict, List, Mapping, Optional

import jax
import numpy as np

from prompt_jax import npy
from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.paths import nearest_existing
from prompt_jax.errors import ConfigError
from prompt_jax.evaluation import run as run_lib
from prompt_jax.prompts import visibility
from prompt_jax.train import run_dir

EXPORT_DIR = "export"
Params = Mapping[str, Any]  # the trained parameter tree (nested dicts of arrays)
Fold = Callable[[Any, Any, Params], Dict[str, np.ndarray]]  # (spec, T5Config, params) -> arrays

def fold(spec, config, params: Params) -> Dict[str, np.ndarray]:
  """{file stem: float32 array} of an input-independent method's trained parameters, folded by
  its spec (`MethodSpec.fold`; input-dependent methods are refused there in one line)."""
  return {k: np.asarray(jax.device_get(v), np.float32)
          for k, v in spec.fold(params, config).items()}


def _nested(flat: Mapping[str, np.ndarray]) -> Dict[str, Any]:
  out: Dict[str, Any] = {}
  for path, value in flat.items():
    node = out
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return out


def outside_the_prompt(model: run_setup.ModelSpec, params: Params) -> List[str]:
  """The checkpoint's trained parameters that are not the method's own (a TRAINABLE_REGEX
  wider than the method's, e.g. the encoder's final norm too): a prompt file cannot hold them."""
  flat = trees.flatten(params)
  return sorted(k for k in flat if trees.is_trainable(k, model.trainable_regex)
                and not trees.is_trainable(k, model.prompt.trainable_regex))


def visibility_note(model: run_setup.ModelSpec) -> Optional[str]:
  """The run's PROMPT_VISIBILITY when it is not full (None when full): a prompt file does not
  carry it."""
  names = visibility.parse(model.prompt.visibility)
  return ", ".join(sorted(names)) if names is not None else None


def check_new_output(output: Optional[str], what: str) -> None:
  """An explicit --output never replaces a file or a non-empty directory (it may hold a prompt
  or adapter trained elsewhere): one line. The default paths under MODEL_DIR/export name the
  checkpoint (run_dir.RunDir.label), so writing them again rewrites the same export."""
  if output and os.path.exists(output) and not (os.path.isdir(output) and not os.listdir(output)):
    raise ConfigError(f"--output {output} already exists: export never replaces it; choose "
                      f"another path or remove it first ({what})")


def export_npy(model: run_setup.ModelSpec, run: run_dir.RunDir,
               output: Optional[str] = None, base_model: Optional[str] = None) -> List[str]:
  """Writes each folded array as .npy; returns 'name [shape] float32 (step N): path' lines."""
  del base_model  # a .npy names no backbone
  if model.prompt is None:
    raise ConfigError("this run trains no prompt (full fine-tuning): nothing to export")
  into = bool(output) and (os.path.isdir(output) or output.endswith(("/", os.sep)))
  if (output and not into and not output.endswith(".npy")  # out.txt held an .npy
      and os.path.isdir(nearest_existing(os.path.dirname(os.path.abspath(output))))):
    raise ConfigError(f"--output {output} names neither a .npy file nor a directory: give "
                      f"--output={output}.npy, or --output={output}/ for a directory")
  if output and not into:
    check_new_output(output, "a .npy file")
  params = _nested(run_lib.checkpoint_params(run.checkpoint))
  arrays = fold(model.prompt, model.config, params)
  if output and not into and len(arrays) > 1:
    raise ConfigError(f"--output names one file but this method exports {len(arrays)} arrays "
                      f"({', '.join(sorted(arrays))}): name a directory (--output={output}/) "
                      f"or leave --output out")
  # A directory (--output=DIR/, or one that exists) takes each array under the name MODEL_DIR/
  # export would give it; none already there is replaced.
  folder = output if into else os.path.join(run.model_dir, EXPORT_DIR)
  paths = {stem: output if output and not into else
           os.path.join(folder, f"{stem}_{run.label}.npy") for stem in sorted(arrays)}
  if into:
    there = [p for p in paths.values() if os.path.exists(p)]
    if there:
      raise ConfigError(f"--output {output}: {there[0]} already exists: export never replaces "
                        f"it; choose another directory or remove it first")
  if jax.process_index() == 0:
    npy.save_all({paths[stem]: arrays[stem] for stem in paths})
  which = f"step {run.step}" if run.step is not None else run.checkpoint
  written = [f"{stem} {list(arrays[stem].shape)} {arrays[stem].dtype} of checkpoint {which} to "
             f"{path}" for stem, path in paths.items()]
  extra, visible = outside_the_prompt(model, params), visibility_note(model)
  if extra:
    written.append(f"note: the run also trained {', '.join(extra)} (TRAINABLE_REGEX), which "
                   f"the .npy files do not hold: evaluate the run with its MODEL_DIR")
  if visible:
    written.append(f"note: the run trained with PROMPT_VISIBILITY {visible}; a PROMPT_FILE run "
                   f"gives full visibility unless you set it again")
  return written


def export_peft(model: run_setup.ModelSpec, run: run_dir.RunDir, output: Optional[str] = None,
                base_model: Optional[str] = None) -> List[str]:
  """A PEFT prompt-tuning adapter directory (`evaluation/peft_export.py`)."""
  from prompt_jax.evaluation import peft_export  # pylint: disable=g-import-not-at-top
  return peft_export.export_peft(model, run, output, base_model)


# --format -> writer(model, run, output, base_model=INITIAL_CHECKPOINT_PATH) -> result lines
FORMATS: Dict[str, Callable[..., List[str]]] = {"npy": export_npy, "peft": export_peft}


def export(fmt: str, model_dir: str, checkpoint_path: Optional[str] = None,
           output: Optional[str] = None, model: Optional[run_setup.ModelSpec] = None,
           base_model: Optional[str] = None) -> List[str]:
  """`prompt-jax export --format=<fmt>`: the run's latest (or CHECKPOINT_PATH's) checkpoint."""
  if fmt not in FORMATS:
    raise ConfigError(f"--format={fmt!r}: choose one of {sorted(FORMATS)}")
  run = run_dir.resolve(model_dir, checkpoint_path)
  if run.checkpoint is None:
    raise ConfigError(f"MODEL_DIR {model_dir} has no checkpoint to export: train first, or set "
                      f"CHECKPOINT_PATH")
  model = model or run_setup.model_spec()
  return FORMATS[fmt](model, run, output, base_model=base_model)
