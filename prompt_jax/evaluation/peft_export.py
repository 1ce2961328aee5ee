"""`prompt-jax export --format=peft`: a run's prompt as a Hugging Face PEFT prompt-tuning adapter.

  MODEL_DIR/export/peft_step<N>/adapter_config.json        PromptTuningConfig, PROMPT_TUNING,
                                                            SEQ_2_SEQ_LM, num_transformer_submodules 1
  MODEL_DIR/export/peft_step<N>/adapter_model.safetensors  {'prompt_embeddings': [P, H] float32}

  from peft import PeftModel
  model = PeftModel.from_pretrained(T5ForConditionalGeneration.from_pretrained(base), adapter_dir)

The layout is PEFT's own (peft/utils/save_and_load.py `get_peft_model_state_dict` ->
`BasePromptEncoder._get_adapter_state_dict` writes the one tensor `prompt_embeddings`, the
[num_virtual_tokens * num_transformer_submodules, token_dim] weight of `PromptEmbedding`;
peft/utils/constants.py names the two files). With `num_transformer_submodules = 1`,
`PeftModelForSeq2SeqLM.forward` prepends the P virtual tokens to the encoder's input embeddings
and ones to its attention mask, and leaves the decoder alone: prompt_jax's `prefix` placement
of an input-level prompt, exactly.

What PEFT's prompt tuning cannot represent is refused in one line before anything is written:
methods whose prompt is generated from each input (IDPG, IPT), key/value prefixes (prefix
tuning, P-tuning v2: PEFT's PREFIX_TUNING stores another parameterisation, not written here),
and placements other than `prefix` (PEFT always prepends). DPT, the rank probe and residual
prompts are folded to their [P, H] prompt first (`MethodSpec.fold`), so they export as plain
prompt tuning.

No torch and no peft are needed to write an adapter: the config is JSON and the tensor is written
by `safetensors.numpy` (the HF `safetensors` package).
"""
import json
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional

import jax
import numpy as np

from prompt_jax import errors
from prompt_jax import run_setup
from prompt_jax.checkpoints import hf
from prompt_jax.errors import ConfigError
from prompt_jax.evaluation import export as export_lib
from prompt_jax.evaluation import run as run_lib
from prompt_jax.prompts import visibility
from prompt_jax.prompts import specs
from prompt_jax.train import run_dir

CONFIG_NAME = "adapter_config.json"  # peft.utils.constants.CONFIG_NAME
WEIGHTS_NAME = "adapter_model.safetensors"  # peft.utils.constants.SAFETENSORS_WEIGHTS_NAME
TENSOR_NAME = "prompt_embeddings"  # the key PEFT saves and loads a prompt encoder under


def check_representable(spec, config) -> None:
  """One ConfigError when PEFT's prompt tuning cannot represent the method `spec`."""
  if spec is None:
    raise ConfigError("this run trains no prompt (full fine-tuning): there is no PEFT "
                      "prompt-tuning adapter to export")
  if spec.input_dependent:
    raise ConfigError(f"PEFT cannot represent {spec.name}: {spec.no_fixed_prompt}, a PEFT "
                      f"prompt-tuning adapter is one fixed [P, H] prompt (evaluate or infer "
                      f"with its MODEL_DIR instead)")
  shapes = specs.Backbone(config)
  if (spec.input_positions == 0 or spec.layer_hook(shapes) is not None
      or spec.decoder_layer_hook(shapes) is not None
      or spec.decoder_cross_hook(shapes) is not None):
    raise ConfigError(f"PEFT's prompt tuning cannot represent {spec.name}'s per-layer key/value "
                      f"prefixes (it holds input embeddings only): use --format=npy")
  if visibility.parse(spec.visibility) is not None:
    raise ConfigError(f"PEFT's virtual tokens and the input always see each other, this run "
                      f"trained with PROMPT_VISIBILITY={spec.visibility!r}: PEFT would give "
                      f"other outputs (use --format=npy and set the visibility again)")
  placement = spec.placement if isinstance(spec.placement, str) else getattr(
      spec.placement, "__name__", repr(spec.placement))
  if placement != "prefix":
    raise ConfigError(f"PEFT prepends its virtual tokens to the input, this run places its "
                      f"prompt as {placement!r}: only placement 'prefix' exports to PEFT "
                      f"(use --format=npy)")


def adapter_config(num_virtual_tokens: int, config, base_model: Optional[str] = None
                   ) -> Dict[str, Any]:
  """The fields of `peft.PromptTuningConfig(...).to_dict()` (peft 0.21) for our encoder prompt."""
  return {
      "peft_type": "PROMPT_TUNING",
      "task_type": "SEQ_2_SEQ_LM",
      "auto_mapping": None,
      "base_model_name_or_path": base_model,
      "revision": None,
      "inference_mode": True,
      "num_virtual_tokens": int(num_virtual_tokens),
      "token_dim": int(config.emb_dim),
      "num_transformer_submodules": 1,  # the encoder only (the decoder gets no prompt)
      "num_attention_heads": int(config.num_heads),
      "num_layers": int(config.num_encoder_layers),
      "modules_to_save": None,
      "prompt_tuning_init": "RANDOM",  # only read when training starts; the weights are ours
      "prompt_tuning_init_text": None,
      "tokenizer_name_or_path": None,
      "tokenizer_kwargs": None,
  }


def write_adapter(prompt: np.ndarray, out_dir: str, config,
                  base_model: Optional[str] = None) -> List[str]:
  """Writes `prompt` [P, H] as a PEFT prompt-tuning adapter in `out_dir` (files replaced
  atomically); returns the two paths."""
  try:
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError("--format=peft needs the `safetensors` package: pip install "
                      "safetensors") from e
  prompt = np.ascontiguousarray(prompt, np.float32)
  if prompt.ndim != 2 or prompt.shape[1] != config.emb_dim:
    raise ConfigError(f"a PEFT prompt-tuning adapter holds a [P, {config.emb_dim}] prompt, got "
                      f"shape {prompt.shape}")
  # A new adapter directory is written whole under a temporary name, then renamed: an interrupted
  # or failed export leaves no directory that a rerun would refuse as existing (it left the
  # weights and a .tmp config). An existing one (the default path, exported again) has its two
  # files replaced, each atomically.
  new = not os.path.isdir(out_dir)
  parent = os.path.dirname(os.path.abspath(out_dir))
  errors.make_dirs(parent if new else out_dir, f"--output {out_dir}")
  where = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.tmp",
                           dir=parent) if new else out_dir
  names = (WEIGHTS_NAME, CONFIG_NAME)
  try:
    weights_tmp, config_tmp = (os.path.join(where, n + ".tmp") for n in names)
    save_file({TENSOR_NAME: prompt}, weights_tmp, metadata={"format": "pt"})
    # safetensors writes 0600: the adapter is for sharing (the hub, a group's models dir), so it
    # gets a new file's usual mode, as adapter_config.json does.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(weights_tmp, 0o666 & ~umask)
    with open(config_tmp, "w") as f:
      json.dump(adapter_config(prompt.shape[0], config, base_model), f, indent=2,
                sort_keys=True)
      f.write("\n")
    for n in names:
      os.replace(os.path.join(where, n + ".tmp"), os.path.join(where, n))
    if new:
      os.chmod(where, 0o777 & ~umask)  # (mkdtemp's is 0700)
      os.rename(where, out_dir)
  finally:
    if new and os.path.isdir(where):
      shutil.rmtree(where, ignore_errors=True)
    for n in names:
      if os.path.exists(os.path.join(out_dir, n + ".tmp")):
        os.remove(os.path.join(out_dir, n + ".tmp"))
  return [os.path.join(out_dir, CONFIG_NAME), os.path.join(out_dir, WEIGHTS_NAME)]


# An --output named like one of these is a file name, not the adapter's directory.
FILE_SUFFIXES = (".npy", ".npz", ".safetensors", ".bin", ".json", ".pt", ".pth")


def export_peft(model: run_setup.ModelSpec, run: run_dir.RunDir, output: Optional[str] = None,
                base_model: Optional[str] = None) -> List[str]:
  """`export --format=peft`: the run's (folded) prompt as a PEFT adapter directory (default
  MODEL_DIR/export/peft_step<N>); returns one 'what ... to <dir>' line."""
  check_representable(model.prompt, model.config)
  suffix = os.path.splitext(output.rstrip("/" + os.sep))[1].lower() if output else ""
  if suffix in FILE_SUFFIXES:  # (it would be the adapter's directory, named like a file)
    raise ConfigError(f"--output {output} names a {suffix} file, but --format=peft writes an "
                      f"adapter directory (adapter_config.json, adapter_model.safetensors): "
                      f"name a directory" + ("; --format=npy writes a .npy file"
                                             if suffix == ".npy" else ""))
  export_lib.check_new_output(output, "a PEFT adapter directory")
  params = export_lib._nested(run_lib.checkpoint_params(run.checkpoint))  # pylint: disable=protected-access
  extra = export_lib.outside_the_prompt(model, params)
  if extra:
    raise ConfigError(f"the run also trained {', '.join(extra)} (TRAINABLE_REGEX), which a "
                      f"PEFT prompt-tuning adapter cannot hold: PEFT would give other outputs "
                      f"(evaluate the run with its MODEL_DIR)")
  arrays = export_lib.fold(model.prompt, model.config, params)
  if set(arrays) != {"prompt"}:  # a method whose fold gives more than an input-level prompt
    raise ConfigError(f"PEFT's prompt tuning cannot represent {model.prompt.name} "
                      f"({', '.join(sorted(arrays))}): use --format=npy")
  prompt = arrays["prompt"]
  out_dir = output or os.path.join(run.model_dir, export_lib.EXPORT_DIR, f"peft_{run.label}")
  if jax.process_index() == 0:
    if os.path.isfile(out_dir):
      raise ConfigError(f"--output {out_dir} is a file: --format=peft writes a directory")
    # PEFT's AutoPeftModel loads base_model_name_or_path with transformers: an HF directory
    # only (a t5x or orbax backbone is named nowhere; pass the HF model to PeftModel yourself).
    named = base_model if base_model and hf.is_hf_dir(base_model) else None
    write_adapter(prompt, out_dir, model.config, named)
  return [f"PEFT prompt-tuning adapter ({prompt.shape[0]} virtual tokens x {prompt.shape[1]}, "
          f"{model.prompt.name} of checkpoint step {run.step}) to {out_dir}"]
