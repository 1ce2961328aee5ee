"""P-tuning (Liu et al. 2021; PEFT `PromptEncoderConfig`). gin: `prompt_jax.p_tuning`."""
import dataclasses
from typing import Optional

import gin

from prompt_jax.errors import ConfigError
from prompt_jax.prompts import p_tuning as p_tuning_lib
from prompt_jax.prompts.specs import base


@dataclasses.dataclass(frozen=True)
class PTuningSpec(base.MethodSpec):
  encoder: str = "mlp"  # 'mlp' or 'lstm' (PEFT's encoder_reparameterization_type)
  hidden: Optional[int] = None  # PEFT's encoder_hidden_size; None: the model width H
  num_layers: int = 2  # LSTM layers (PEFT's encoder_num_layers; the MLP always has 3 layers)
  dropout_rate: float = 0.0  # between LSTM layers (PEFT's encoder_dropout)

  def check(self, config):
    super().check(config)
    base.check_dropout(self.dropout_rate, self.name)
    if self.encoder not in p_tuning_lib.ENCODERS:
      raise ConfigError(f"unknown P-tuning encoder {self.encoder!r}; set P_TUNING_ENCODER to "
                        f"one of {', '.join(p_tuning_lib.ENCODERS)}")
    if self.hidden is not None and self.hidden <= 0:
      raise ConfigError(f"P_TUNING_HIDDEN must be > 0 (or None for the model width), got "
                        f"{self.hidden}")
    if self.num_layers < 1:
      raise ConfigError(f"P_TUNING_LAYERS must be >= 1, got {self.num_layers}")

  def _hidden(self, config) -> int:
    return self.hidden if self.hidden is not None else config.emb_dim

  def method(self, backbone):
    return base.partial(p_tuning_lib.PTuningPrompt, length=self.length,
                        hidden=self._hidden(backbone.config), encoder=self.encoder,
                        num_layers=self.num_layers, dropout_rate=self.dropout_rate)

  def num_trainable_params(self, config):
    return p_tuning_lib.num_trainable_params(self.length, config.emb_dim, self._hidden(config),
                                             self.encoder, self.num_layers)

  def fold(self, params, config):
    return {"prompt": p_tuning_lib.fold(base.input_prompt(params), self.length, config.emb_dim,
                                        self._hidden(config), self.encoder,
                                        self.num_layers)}  # [P, H]


@gin.configurable(module="prompt_jax")
def p_tuning(length: int = 20, encoder: str = "mlp", hidden: Optional[int] = None,
             num_layers: int = 2, dropout_rate: float = 0.0,
             placement="prefix") -> PTuningSpec:
  """P-tuning: a [length, H] virtual-token table through an MLP or a BiLSTM + MLP head."""
  return PTuningSpec(length=length, placement=placement, encoder=encoder, hidden=hidden,
                     num_layers=num_layers, dropout_rate=dropout_rate)
