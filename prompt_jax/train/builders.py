"""gin-configurable constructors of the model: T5Config preset + prompt spec -> T5 module.

  prompt_jax.t5_config.preset = 't5_1_1_large'           (gin/models/*.gin)
  prompt_jax.prompt_tuning.length = %PROMPT_LENGTH       (gin/runs/prompt_*.gin)
  prompt_jax.prompt_tuning.init = @prompt_jax.from_class_labels()   (gin/prompts/*.gin)
"""
import dataclasses
from typing import Any, Callable, Optional

import gin
import jax.numpy as jnp

from prompt_jax.models import T5, T5Config, get_config
from prompt_jax.prompts import PromptTuning, prompt_factory
from prompt_jax.prompts import initializers
from prompt_jax.train import state as state_lib
from prompt_jax.train.errors import ConfigError

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_of(name) -> Any:
  if not isinstance(name, str):
    return name
  if name not in _DTYPES:
    raise ConfigError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}")
  return _DTYPES[name]


@gin.configurable(module="prompt_jax")
def t5_config(preset: str = gin.REQUIRED, dropout_rate: Optional[float] = None,
              dtype: str = "bfloat16", vocab_size: Optional[int] = None,
              **overrides) -> T5Config:
  """A T5 preset (models/config.py PRESETS) with run-level overrides."""
  if dropout_rate is not None:
    overrides["dropout_rate"] = dropout_rate
  if vocab_size is not None:
    overrides["vocab_size"] = vocab_size
  try:
    return get_config(preset, dtype=dtype_of(dtype), **overrides)
  except (ValueError, TypeError) as e:
    raise ConfigError(str(e)) from e


@dataclasses.dataclass(frozen=True)
class PromptSpec:
  """A prompt method before the frozen embedding is known: length, init spec, placement."""
  length: int
  init: Callable = None  # spec(embedding, vocabulary) -> (rng, shape) -> array
  placement: str = "prefix"

  def factory(self, embedding=None, vocabulary=None):
    """What `T5(config, prompt=...)` takes; `embedding=None` for shapes only."""
    if self.length < 1:
      raise ConfigError(f"PROMPT_LENGTH must be >= 1, got {self.length}")
    spec = self.init or initializers.uniform()
    init = spec(embedding, vocabulary) if embedding is not None else initializers.uniform()()
    method = lambda name: PromptTuning(length=self.length, init=init, name=name)
    return prompt_factory(method, self.length, self.placement)


@gin.configurable(module="prompt_jax")
def prompt_tuning(length: int = 100, init: Optional[Callable] = None,
                  placement: str = "prefix") -> PromptSpec:
  """Lester et al.'s prompt tuning: one learned [length, emb_dim] prompt (prefix by default)."""
  return PromptSpec(length, init, placement)


def build_model(config: T5Config, prompt, embedding=None, vocabulary=None) -> T5:
  """T5 with the prompt of `prompt` (a PromptSpec or any prompts.specs method spec): the
  input-level prompt and, for deep methods, the per-layer hooks."""
  from prompt_jax.prompts import specs  # pylint: disable=g-import-not-at-top  (gin cycle)
  return T5(config, **specs.model_kwargs(prompt, config, embedding, vocabulary))


DEFAULT_PROMPT = "prompt_tuning"  # model_spec's default: Lester et al.'s prompt tuning


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The model of a run (t5x's MODEL): backbone config, prompt, what trains, frozen dtype."""
  config: T5Config
  prompt: Optional[PromptSpec]
  trainable_regex: str
  frozen_dtype: str = "float32"


@gin.configurable(module="prompt_jax")
def model_spec(config: Optional[T5Config] = None, prompt: Any = DEFAULT_PROMPT,
               trainable_regex: Optional[str] = None,
               frozen_dtype: str = "float32") -> ModelSpec:
  """`config` defaults to the gin-configured `t5_config()` (set by gin/models/*.gin).

  `prompt` defaults to the gin-configured `prompt_tuning()`; a method's gin file
  (gin/prompts/<method>.gin) binds another spec, `runs/model_finetune.gin` binds None. No run
  file binds it, so a method file works whatever its position among the --gin_file flags.
  `trainable_regex` (TRAINABLE_REGEX) None: the prompt method's own regex.
  """
  if prompt is DEFAULT_PROMPT:
    prompt = prompt_tuning()
  if trainable_regex is None:
    trainable_regex = getattr(prompt, "trainable_regex", state_lib.DEFAULT_TRAINABLE_REGEX)
  return ModelSpec(config if config is not None else t5_config(), prompt, trainable_regex,
                   frozen_dtype)
