"""IDPG and M-IDPG (Wu et al. 2022): one spec, one generator (`prompts/idpg.py`).

gin: `prompt_jax.idpg_prompt` (gin/prompts/idpg.gin), `prompt_jax.idpg_multilayer`
(gin/prompts/idpg_multilayer.gin).
"""
import dataclasses
from typing import Any

import gin

from prompt_jax.prompts import idpg
from prompt_jax.prompts.specs import base


@dataclasses.dataclass(frozen=True)
class IDPGSpec(base.MethodSpec):
  """Python defaults are plain (dense layers, mean embedding); the gin files bind the paper's."""
  bottleneck: int = 256
  layer_type: str = "dnn"
  phm_n: int = 4
  phm_shared_rules: bool = True
  activation: str = "gelu"
  dropout_rate: float = 0.1
  representation: str = "embedding_mean"
  prompt_init: Any = None  # initialiser spec of b2, the task prompt [P, H]
  multilayer: bool = False  # M-IDPG: prompts in every encoder layer
  version: str = "S"  # M-IDPG's S / M / L (S-IDPG is one layer: 'S')
  generator_input: str = "representation"  # M-IDPG layers >= 1: or 'previous_layer'

  @property
  def input_dependent(self) -> bool:
    return True

  @property
  def name(self) -> str:
    return "M-IDPG" if self.multilayer else "IDPG"

  @property
  def representation_pooling(self):
    return idpg.pooling_of(self.representation)

  def num_layers(self, config) -> int:
    return config.num_encoder_layers if self.multilayer else 1

  def check(self, config):
    super().check(config)
    base.check_dropout(self.dropout_rate, self.name)
    emb_dim = config.emb_dim if config is not None else self.phm_n  # H unknown: skip its check
    base.config_error(lambda: idpg.check(
        length=self.length, emb_dim=emb_dim, bottleneck=self.bottleneck,
        layer_type=self.layer_type, phm_n=self.phm_n, representation=self.representation,
        version=self.version, generator_input=self.generator_input))

  def method(self, backbone):
    return base.partial(
        idpg.IDPG, length=self.length, bottleneck=self.bottleneck, layer_type=self.layer_type,
        phm_n=self.phm_n, phm_shared_rules=self.phm_shared_rules, activation=self.activation,
        dropout_rate=self.dropout_rate, representation=self.representation,
        num_layers=self.num_layers(backbone.config), version=self.version,
        prompt_init=base.resolve_init(self.prompt_init, backbone))

  def layer_hook(self, backbone):
    if not self.multilayer:
      return None
    return base.partial(idpg.MultiLayerIDPG, generator_input=self.generator_input,
                        pooling=self.representation_pooling or "mean")

  def num_trainable_params(self, config):
    return idpg.num_trainable_params(
        self.length, config.emb_dim, self.bottleneck, self.layer_type, self.phm_n,
        self.num_layers(config), self.version, self.phm_shared_rules)


@gin.configurable(module="prompt_jax")
def idpg_prompt(length: int = 5, bottleneck: int = 256, layer_type: str = "dnn",
                phm_n: int = 4, phm_shared_rules: bool = True, activation: str = "gelu",
                dropout_rate: float = 0.1, representation: str = "embedding_mean",
                prompt_init=None, placement="prefix") -> IDPGSpec:
  """S-IDPG: a prompt generated per example from M(x) by a bottleneck (dense or PHM) generator."""
  return IDPGSpec(length=length, placement=placement, bottleneck=bottleneck,
                  layer_type=layer_type, phm_n=phm_n, phm_shared_rules=phm_shared_rules,
                  activation=activation, dropout_rate=dropout_rate,
                  representation=representation, prompt_init=prompt_init)


@gin.configurable(module="prompt_jax")
def idpg_multilayer(length: int = 5, bottleneck: int = 256, version: str = "M",
                    layer_type: str = "dnn", phm_n: int = 4, phm_shared_rules: bool = True,
                    activation: str = "gelu", dropout_rate: float = 0.1,
                    generator_input: str = "representation",
                    representation: str = "embedding_mean", prompt_init=None,
                    placement="prefix") -> IDPGSpec:
  """M-IDPG: generated prompts in every encoder layer (versions S, M, L)."""
  return IDPGSpec(length=length, placement=placement, bottleneck=bottleneck,
                  layer_type=layer_type, phm_n=phm_n, phm_shared_rules=phm_shared_rules,
                  activation=activation, dropout_rate=dropout_rate,
                  representation=representation, prompt_init=prompt_init, multilayer=True,
                  version=version, generator_input=generator_input)
