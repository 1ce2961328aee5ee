"""The Flax module t5x's `models.EncoderDecoderModel` calls: the frozen T5 plus a prompt method.

prompt_jax's `models.T5` already has t5x's call signature (`__call__(encoder_input_tokens,
decoder_input_tokens, decoder_target_tokens, encoder_segment_ids, decoder_segment_ids,
encoder_positions, decoder_positions, *, enable_dropout, decode, max_decode_length)`, `encode`,
and `decode(encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens, ...)`
with a `cache` collection for t5x's beam search and temperature sampling) and t5x's parameter
names (`token_embedder/embedding`, `encoder/layers_0/attention/query/kernel`, ...), so a
pretrained t5x checkpoint restores into it and t5x checkpoints of it are read back by
`prompt-jax eval`. The prompt method's parameters live under `encoder/prompt/...`,
`encoder/layer_prompts/...`, `decoder/layer_prompts/...` and `decoder/cross_layer_prompts/...`,
absent from the pretrained checkpoint (gin/t5x/models/*.gin restores them fresh).
Instance-dependent methods (IDPG, IPT) read `encoder_input_tokens`, which t5x passes to
`__call__`, `encode` and `decode` alike.

gin (gin/t5x/models/prompt.gin):
  models.EncoderDecoderModel.module = @prompt_jax.t5x.prompt_network()
  prompt_jax.t5x.prompt_network.initial_checkpoint_path = %INITIAL_CHECKPOINT_PATH
  prompt_jax.t5x.prompt_network.inputs_length = @task_inputs_length()  (of TASK_FEATURE_LENGTHS)
The method is prompt_jax's own gin (`prompt_jax.model_spec.prompt = @prompt_jax.dpt()`, from
gin/prompts/<method>.gin), the backbone `prompt_jax.t5_config` (gin/models/<size>.gin).
"""
import functools
import logging
import os
import re
from typing import Any, Mapping, Optional, Sequence, Set

import numpy as np

from prompt_jax import checkpoints
from prompt_jax import layering
from prompt_jax import paths
from prompt_jax import run_setup
from prompt_jax.checkpoints import t5x_legacy  # pylint: disable=unused-import
from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.t5x import register

register()  # gin/t5x/models/prompt.gin imports this module: the configurables it names


def task_inputs_length(task_feature_lengths: Optional[Mapping[str, int]] = None
                       ) -> Optional[int]:
  """The `inputs` entry of t5x's TASK_FEATURE_LENGTHS (gin cannot index a macro), or None where
  the run gives none (t5x's runs/eval.gin: TASK_FEATURE_LENGTHS = None, lengths computed from
  the data): then `prompt_network` checks nothing."""
  if not task_feature_lengths or task_feature_lengths.get("inputs") is None:
    return None
  return int(task_feature_lengths["inputs"])


@functools.lru_cache(maxsize=4)
def _checked_embedding(path: str, config) -> np.ndarray:
  """[V, H] float32 embedding table of the checkpoint at `path`, after checking that every
  backbone parameter `config` implies is there with its shape (one ConfigError otherwise)."""
  try:
    return checkpoints.load_array(path, "token_embedder/embedding", np.float32, config=config)
  except checkpoints.CheckpointError as e:
    raise ConfigError(f"{_path_macro()}: {e}") from e
  except (OSError, ValueError) as e:
    raise ConfigError(f"{_path_macro()} {path!r} cannot be read: {e}") from e


def _path_macro() -> str:
  """The macro the user set: CHECKPOINT_PATH under t5x/runs/prompt_{eval,infer}.gin (which bind
  INITIAL_CHECKPOINT_PATH = %CHECKPOINT_PATH), else INITIAL_CHECKPOINT_PATH."""
  try:
    import gin  # pylint: disable=g-import-not-at-top
    value = gin.query_parameter("%INITIAL_CHECKPOINT_PATH")
  except Exception:  # pylint: disable=broad-except
    return "INITIAL_CHECKPOINT_PATH"
  if (isinstance(value, gin.config.ConfigurableReference)
      and value.configurable.selector == "gin.macro"):
    return value.scoped_selector.split("/")[0]
  return "INITIAL_CHECKPOINT_PATH"


def prompt_network(spec: Optional[run_setup.ModelSpec] = None,
                   initial_checkpoint_path: Optional[str] = None,
                   vocabulary: Any = None, inputs_length: Optional[int] = None) -> T5:
  """T5 with the method of `spec` (None: the gin-configured `prompt_jax.model_spec()`).

  `initial_checkpoint_path`: the pretrained t5x checkpoint (INITIAL_CHECKPOINT_PATH): its
  shapes are checked against the backbone config (another model size fails here, in one line)
  and its embedding table feeds the initialisers that read it (sampled vocabulary, class
  labels). `vocabulary` (VOCABULARY): for class-label initialisers and 'between:' placements.
  `inputs_length`: the task's `inputs` length (TASK_FEATURE_LENGTHS['inputs'], through
  `task_inputs_length`), checked against the method's needs (IPT and prefix + IPT read their
  prompt off the first P input tokens: P <= inputs length): one ConfigError, as prompt-jax
  train gives.
  """
  check_gin_file_order()
  spec = spec if spec is not None else run_setup.model_spec()
  embedding = None
  if initial_checkpoint_path:
    embedding = _checked_embedding(str(initial_checkpoint_path), spec.config)
  else:
    logging.warning("prompt_network: no initial_checkpoint_path; initialisers that read the "
                    "embedding table fall back to their shape-only form")
  if spec.prompt is not None and inputs_length is not None:
    spec.prompt.check_fits(int(inputs_length))
  return run_setup.build_model(spec.config, spec.prompt, embedding, vocabulary)


_METHOD_DEFAULTS = "t5x/models/method_defaults.gin"  # every t5x/models/*_prompt.gin includes it


def check_gin_file_order() -> None:
  """A t5x/prompts/<method>.gin given (--gin_file) before a file that includes a model file
  (t5x/models/*_prompt.gin, t5x/runs/embedded_default.gin) is one ConfigError: the model file
  binds the default method again (prompt tuning, P=100), and in gin the later file wins, so the
  run would silently train plain prompt tuning."""
  try:
    from absl import flags  # pylint: disable=g-import-not-at-top
    given = list(flags.FLAGS["gin_file"].value or []) if flags.FLAGS.is_parsed() else []
  except (ImportError, KeyError):  # not under a t5x binary
    return
  error = gin_file_order_error(given)
  if error:
    raise ConfigError(error)


def gin_file_order_error(gin_files: Sequence[str],
                         search_paths: Optional[Sequence[str]] = None) -> Optional[str]:
  """The error `check_gin_file_order` raises for these --gin_file values, or None (files are
  looked up as gin does; in `search_paths` if given)."""
  closures = [_packaged_includes(f, search_paths) for f in gin_files]
  gin_dir = paths.gin_dir()
  # prompt-jax's own method and initialiser files, which the t5x/prompts/ files include.
  # (those another of them includes, as prefix_ipt.gin includes prefix.gin, are not given)
  own = [sorted(f for f in closure if f.startswith("prompts/")) for closure in closures]
  own = [[f for f in files if not any(f in layering.prompt_includes(gin_dir, g) for g in files)]
         for files in own]
  given = {f: gin_files[i] for i, files in enumerate(own) for f in files}
  try:  # (naming the files t5x was given)
    layering.check_method_files(gin_dir, [f for files in own for f in files], given.__getitem__)
  except ConfigError as e:
    return str(e)
  for i, j in ((i, j) for i in range(len(own)) for j in range(i + 1, len(own))):
    if any(layering.is_initialiser(gin_dir, f) for f in own[i]) and \
        layering.method_of(gin_dir, own[j]):
      return (f"--gin_file={gin_files[i]} comes before --gin_file={gin_files[j]}, a method "
              f"file that sets its own initialisation: in gin the later file wins, so the "
              f"initialiser would be ignored; give it after {gin_files[j]}")
  for i, earlier in enumerate(closures):
    methods = sorted(f for f in earlier if f.startswith("t5x/prompts/"))
    if not methods:
      continue
    for j in range(i + 1, len(gin_files)):
      if _METHOD_DEFAULTS in closures[j]:
        return (f"--gin_file={gin_files[i]} comes before --gin_file={gin_files[j]}, which "
                f"includes a model file and with it the default method (prompt tuning, "
                f"PROMPT_LENGTH=100): in gin the later file wins, so {methods[0]} would be "
                f"ignored; give it after {gin_files[j]}")
  return None


def _packaged_includes(name: str, search_paths: Optional[Sequence[str]]) -> Set[str]:
  """The packaged gin files (relative to gin_dir) that the file `name` is or includes, at any
  depth; files gin cannot find are left to gin's own error."""
  root = os.path.realpath(paths.gin_dir())
  found: Set[str] = set()
  seen: Set[str] = set()

  def visit(name: str) -> None:
    path = layering.gin_path(name, search_paths)
    if path is None or os.path.realpath(path) in seen:
      return
    seen.add(os.path.realpath(path))
    relative = os.path.relpath(os.path.realpath(path), root)
    if not relative.startswith(".."):
      found.add(relative)
    try:
      with open(path) as f:
        text = f.read()
    except OSError:
      return
    for included in re.findall(r"^\s*include\s+['\"]([^'\"]+)['\"]", text, re.M):
      visit(included)

  visit(name)
  return found
