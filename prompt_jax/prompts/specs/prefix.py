"""Prefix tuning (Li & Liang 2021) / P-tuning v2, and prefix tuning + IPT.

gin: `prompt_jax.deep_prefix` (gin/prompts/prefix.gin, prefix_ipt.gin). Up to three prefix sets
(prompts/prefix.py): the encoder's self-attention (always), the decoder's self-attention
(`decoder`) and the decoder's cross-attention (`cross`, which needs `decoder`: the paper's
encoder-decoder setting has both, and cross-attention prefixes without the decoder's own are no
setting of the paper or of P-tuning v2, so asking for them alone is a ConfigError).
"""
import dataclasses
from typing import Optional

import gin
import numpy as np

from prompt_jax import partitioning, trees
from prompt_jax.errors import ConfigError
from prompt_jax.prompts import prefix
from prompt_jax.prompts.specs import base


@dataclasses.dataclass(frozen=True)
class DeepPrefixSpec(base.MethodSpec):
  MIN_LENGTH = 0  # prefixes in the layers alone: no input-level prompt positions
  hidden: Optional[int] = None
  dropout_rate: float = 0.0
  input_prompt: Optional[base.MethodSpec] = None  # an input-level method used as well
  decoder: bool = True  # also prefixes in the decoder's self-attention
  init_words: Optional[str] = None  # initialise from these words' activations (else random)
  source: Optional[base.MethodSpec] = None  # an IPT spec: per-example prefixes (encoder)
  # also prefixes in the decoder's cross-attention (needs `decoder`); False by default, so the
  # recorded config.gin of a run trained before it existed builds the same model
  cross: bool = False

  @property
  def trainable_regex(self) -> str:
    layers = (r"encoder/layer_prompts/(?!source/frozen_table$).*" if self.source is not None
              else r"encoder/layer_prompts/.*")
    parts = [layers]
    if self.input_prompt is not None:
      parts.append(self.input_prompt.trainable_regex)
    if self.decoder:
      parts.append(r"decoder/layer_prompts/.*")
    if self.cross:
      parts.append(r"decoder/cross_layer_prompts/.*")
    return "|".join(f"(?:{p})" for p in parts)

  @property
  def input_positions(self) -> int:
    return self.input_prompt.input_positions if self.input_prompt is not None else 0

  @property
  def reads_input_tokens(self) -> bool:
    return any(s is not None and s.reads_input_tokens for s in (self.input_prompt, self.source))

  @property
  def required_inputs_length(self) -> int:
    return max([s.required_inputs_length for s in (self.input_prompt, self.source)
                if s is not None] + [0])

  @property
  def input_dependent(self) -> bool:
    return self.source is not None or (self.input_prompt is not None
                                       and self.input_prompt.input_dependent)

  @property
  def representation_pooling(self):
    return self.input_prompt.representation_pooling if self.input_prompt is not None else None

  def check(self, config):
    base.check_length(self.length, self.MIN_LENGTH)
    base.check_dropout(self.dropout_rate, self.name)
    if self.cross and not self.decoder:
      raise ConfigError("cross-attention prefixes (PREFIX_CROSS=True) come with the decoder's "
                        "self-attention prefixes: set PREFIX_DECODER=True or PREFIX_CROSS=False")
    if self.hidden is not None and self.hidden <= 0:
      raise ConfigError(f"prefix reparameterisation hidden size must be > 0, got {self.hidden}")
    if self.source is not None:
      if self.hidden is None:
        raise ConfigError("prefix tuning + IPT generates the prefixes through the "
                          "reparameterisation MLP: set PREFIX_HIDDEN")
      if self.source.length != self.length:
        raise ConfigError(f"the IPT source gives {self.source.length} rows, the prefix has "
                          f"PROMPT_LENGTH={self.length}: bind both to %PROMPT_LENGTH")
      self.source.check(config)
    if self.input_prompt is not None:
      self.input_prompt.check(config)
    if config is None:
      raise ConfigError("deep prefixes need the T5 config (layers, heads, head_dim)")

  def method(self, backbone):
    return self.input_prompt.method(backbone) if self.input_prompt is not None else None

  def prompt_factory(self, backbone):
    if self.input_prompt is None:
      return None
    return self.input_prompt.prompt_factory(backbone)

  def _words(self, backbone, which: str):
    """() -> (key, value) [L, P, D]: the words' activations in the attention `which`
    ('encoder' / 'decoder' / 'cross', `prefix.word_activations`), or None (random init)."""
    if not self.init_words or backbone.shapes_only or self.length == 0:
      return None
    if backbone.vocabulary is None or backbone.params is None:
      raise ConfigError("PREFIX_INIT_WORDS needs the frozen model and the task's vocabulary")
    tokens = base.config_error(lambda: prefix.word_tokens(
        backbone.vocabulary.encode(self.init_words), self.length))
    params = backbone.params
    params = trees.unflatten(params) if "token_embedder/embedding" in params else params
    kv = tuple(partitioning.to_host(a)  # whole, where a model axis spans processes
               for a in prefix.word_activations(backbone.config, params, tokens, which=which))
    return lambda: kv

  def _hook(self, backbone, num_layers: int, which: str):
    config = backbone.config
    source = None
    if self.source is not None and which == "encoder":  # the decoder's hooks see no input
      source = self.source.method(backbone)
    return base.partial(prefix.DeepPrefix, length=self.length, num_layers=num_layers,
                        num_heads=config.num_heads, head_dim=config.head_dim,
                        emb_dim=config.emb_dim, hidden=self.hidden,
                        dropout_rate=self.dropout_rate,
                        kv_init=None if source is not None else self._words(backbone, which),
                        source=source)

  def layer_hook(self, backbone):
    return self._hook(backbone, backbone.config.num_encoder_layers, "encoder")

  def decoder_layer_hook(self, backbone):
    if not self.decoder:
      return None
    return self._hook(backbone, backbone.config.num_decoder_layers, "decoder")

  def decoder_cross_hook(self, backbone):
    if not self.cross:
      return None
    return self._hook(backbone, backbone.config.num_decoder_layers, "cross")

  def fold(self, params, config):
    """'prefix' (and 'decoder_prefix', 'cross_prefix': the decoder's self- and
    cross-attention) [2, L, P, D]: key and value prefixes stacked, the reparameterisation
    folded; plus the input-level prompt's arrays, if any."""
    if self.input_dependent:
      return super().fold(params, config)
    backbone = base.Backbone(config)
    out = {}
    for name, stack, module, hook in (
        ("prefix", "encoder", "layer_prompts", self.layer_hook(backbone)),
        ("decoder_prefix", "decoder", "layer_prompts", self.decoder_layer_hook(backbone)),
        ("cross_prefix", "decoder", "cross_layer_prompts", self.decoder_cross_hook(backbone))):
      if hook is not None:
        folded = prefix.fold(params[stack][module], hook(name=None))
        out[name] = np.stack([np.asarray(folded["key"]), np.asarray(folded["value"])])
    if self.input_prompt is not None:
      out.update(self.input_prompt.fold(params, config))
    return out

  def num_trainable_params(self, config):
    count = lambda layers, with_embedding=True: prefix.num_trainable_params(
        self.length, layers, config.num_heads, config.head_dim, config.emb_dim, self.hidden,
        with_embedding)
    n = count(config.num_encoder_layers, self.source is None)
    if self.source is not None:
      n += self.source.num_trainable_params(config)
    if self.decoder:
      n += count(config.num_decoder_layers)
    if self.cross:
      n += count(config.num_decoder_layers)
    if self.input_prompt is not None:
      n += self.input_prompt.num_trainable_params(config)
    return n


@gin.configurable(module="prompt_jax")
def deep_prefix(length: int = 10, hidden: Optional[int] = None, dropout_rate: float = 0.0,
                input_prompt=None, decoder: bool = True, init_words: Optional[str] = None,
                source=None, cross: bool = False) -> DeepPrefixSpec:
  """Prefix tuning / P-tuning v2: key/value prefixes in every encoder (and decoder) layer's
  self-attention, and with `cross` (needs `decoder`) in every decoder layer's cross-attention;
  with `source` (an IPT spec) the encoder's prefixes are generated per example (prefix tuning
  + IPT). `cross` defaults to False: runs recorded before it existed load unchanged."""
  return DeepPrefixSpec(length=length, hidden=hidden, dropout_rate=dropout_rate,
                        input_prompt=input_prompt, decoder=decoder, init_words=init_words,
                        source=source, cross=cross)
