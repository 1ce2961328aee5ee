"""Per-layer prompts (prompt-tuning `extended/train/per_layer.py`; Qin & Eisner 2021 with `add`).

gin: `prompt_jax.per_layer_prompt` (gin/prompts/per_layer.gin).
"""
import dataclasses
from typing import Any

import gin

from prompt_jax.errors import ConfigError
from prompt_jax.prompts import per_layer, tuning
from prompt_jax.prompts.specs import base


@dataclasses.dataclass(frozen=True)
class PerLayerSpec(base.MethodSpec):
  mode: str = "replace"
  init: Any = None  # the input-level (layer 0) prompt's initialiser spec; default uniform

  @property
  def input_dependent(self) -> bool:
    return True  # no single [P, H] prompt: every layer has its own

  @property
  def no_fixed_prompt(self) -> str:
    return f"{self.name} has one prompt per encoder layer, not one [P, H] prompt"

  def check(self, config):
    super().check(config)
    if self.mode not in per_layer.MODES:
      raise ConfigError(f"PER_LAYER_MODE={self.mode!r} is not one of {list(per_layer.MODES)}")
    if config is None:
      raise ConfigError("per-layer prompts need the T5 config (number of encoder layers)")

  def method(self, backbone):
    return base.partial(tuning.PromptTuning, length=self.length,
                        init=base.resolve_init(self.init, backbone))

  def layer_hook(self, backbone):
    return base.partial(per_layer.PerLayerPrompt, length=self.length,
                        num_layers=backbone.config.num_encoder_layers, mode=self.mode)

  def num_trainable_params(self, config):
    return per_layer.num_trainable_params(self.length, config.num_encoder_layers, config.emb_dim)

  def fold(self, params, config):
    raise ConfigError("per-layer prompts have one prompt per encoder layer, not one [P, H] "
                      "prompt to export; evaluate or infer with the run's MODEL_DIR")


@gin.configurable(module="prompt_jax")
def per_layer_prompt(length: int = 100, mode: str = "replace", init=None,
                     placement="prefix") -> PerLayerSpec:
  """One prompt per encoder layer, replacing (or added to) the hidden states at the prompt
  positions before the layer."""
  return PerLayerSpec(length=length, placement=placement, mode=mode, init=init)
