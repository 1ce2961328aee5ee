"""Residual prompt tuning (Razdaibiedina et al. 2023). gin: `prompt_jax.residual_prompt`."""
import dataclasses
from typing import Any

import gin

from prompt_jax.errors import ConfigError
from prompt_jax.prompts import initializers, residual
from prompt_jax.prompts.specs import base


@dataclasses.dataclass(frozen=True)
class ResidualSpec(base.MethodSpec):
  bottleneck: int = 400
  separate_mlps: bool = False
  dropout_rate: float = 0.0
  init: Any = None  # initialiser spec of P0; default sampled vocabulary

  def check(self, config):
    super().check(config)
    base.check_dropout(self.dropout_rate, self.name)
    if self.bottleneck <= 0:
      raise ConfigError(f"residual MLP bottleneck must be > 0, got {self.bottleneck}")

  def method(self, backbone):
    init = base.resolve_init(self.init, backbone, initializers.from_sampled_vocab())
    return base.partial(residual.ResidualPrompt, length=self.length,
                        bottleneck=self.bottleneck, separate_mlps=self.separate_mlps,
                        dropout_rate=self.dropout_rate, init=init)

  def num_trainable_params(self, config):
    return residual.num_trainable_params(self.length, config.emb_dim, self.bottleneck,
                                         self.separate_mlps)

  def fold(self, params, config):
    return {"prompt": residual.fold(base.input_prompt(params), self.bottleneck,
                                    self.separate_mlps)}  # [P, H]


@gin.configurable(module="prompt_jax")
def residual_prompt(length: int = 100, bottleneck: int = 400, separate_mlps: bool = False,
                    dropout_rate: float = 0.0, init=None, placement="prefix") -> ResidualSpec:
  """Residual prompt tuning: P0 + LN(W2 relu(W1 P0 + b1) + b2)."""
  return ResidualSpec(length=length, placement=placement, bottleneck=bottleneck,
                      separate_mlps=separate_mlps, dropout_rate=dropout_rate, init=init)
