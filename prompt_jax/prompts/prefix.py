"""Prefix tuning / P-tuning v2: learned key/value prefixes in every encoder self-attention layer.

Used through the per-layer hook of the seam: `T5(config, layer_prompts=factory)`; each layer l
attends P extra keys/values (no relative position bias) before its own.
  * direct: key, value [L, P, D] trainable (D = heads·head_dim);
  * reparameterised (hidden=m, prefix tuning's / P-tuning v2's `prefix_projection`):
      [key; value] = Linear(m -> 2·L·D)(tanh(Linear(H -> m)(E))),  E [P, H] trainable;
    used while training, folded (`fold`) into the direct form for export and inference.

Trainable parameters (`encoder/layer_prompts/...`):
  direct: 2·L·P·D;   reparameterised: P·H + H·m + m + 2·L·D·m + 2·L·D.
A prefix of length 0 is the plain model. The same module serves as the decoder's hook
(`T5(config, decoder_layer_prompts=...)`, `decoder/layer_prompts/...`, L = decoder layers; the
decoder's prefixes are attended by every target position, also when decoding with a KV cache).
"""
from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from prompt_jax.prompts import initializers

Array = jax.Array


def num_trainable_params(length: int, num_layers: int, num_heads: int, head_dim: int,
                         emb_dim: Optional[int] = None, hidden: Optional[int] = None) -> int:
  d = num_heads * head_dim
  if hidden is None:
    return 2 * num_layers * length * d
  return (length * emb_dim + emb_dim * hidden + hidden + 2 * num_layers * d * hidden
          + 2 * num_layers * d)


class DeepPrefix(nn.Module):
  """Per-layer hook `h(layer, x [B, T, H], deterministic) -> (x, (key, value))`, key and value
  [B, P, heads, kv]."""
  length: int
  num_layers: int
  num_heads: int
  head_dim: int
  emb_dim: Optional[int] = None  # needed with `hidden` (the width of E)
  hidden: Optional[int] = None  # m of the reparameterisation MLP; None = direct prefixes
  dropout_rate: float = 0.0
  init: initializers.PromptInit = initializers.normal_init(0.5)

  @nn.compact
  def prefixes(self) -> Tuple[Array, Array]:
    """(key, value), each [L, P, D]."""
    d = self.num_heads * self.head_dim
    shape = (self.num_layers, self.length, d)
    axes = ("prompt_layers", "prompt", "prompt_embed")
    if self.hidden is None:
      key = self.param("key", nn.with_logical_partitioning(self.init, axes), shape)
      value = self.param("value", nn.with_logical_partitioning(self.init, axes), shape)
      return key, value
    if self.hidden <= 0:
      raise ValueError(f"prefix reparameterisation hidden size must be > 0, got {self.hidden}")
    if self.emb_dim is None:
      raise ValueError("DeepPrefix with a reparameterisation MLP needs emb_dim")
    dense_init = nn.initializers.lecun_normal()
    p = lambda name, init, shp, ax: self.param(name, nn.with_logical_partitioning(init, ax), shp)
    emb = p("embedding", self.init, (self.length, self.emb_dim), ("prompt", "prompt_embed"))
    w1 = p("wi_kernel", dense_init, (self.emb_dim, self.hidden), ("prompt_embed", "prompt_mlp"))
    b1 = p("wi_bias", nn.initializers.zeros, (self.hidden,), ("prompt_mlp",))
    w2 = p("wo_kernel", dense_init, (self.hidden, 2 * self.num_layers * d),
           ("prompt_mlp", "prompt_embed"))
    b2 = p("wo_bias", nn.initializers.zeros, (2 * self.num_layers * d,), ("prompt_embed",))
    kv = jnp.tanh(emb @ w1 + b1) @ w2 + b2  # [P, 2·L·D]
    kv = kv.reshape(self.length, 2, self.num_layers, d).transpose(1, 2, 0, 3)  # [2, L, P, D]
    return kv[0], kv[1]

  def __call__(self, layer: int, x: Array, deterministic: bool = True):
    if self.length == 0:
      return x, None
    key, value = self.prefixes()  # [L, P, D]
    batch = x.shape[0]
    rng = None
    if not deterministic and self.dropout_rate > 0:
      rng = self.make_rng("dropout")

    def per_layer(a, salt):
      a = a[layer]  # [P, D]
      if rng is not None:
        keep = jax.random.bernoulli(jax.random.fold_in(rng, salt), 1 - self.dropout_rate, a.shape)
        a = jnp.where(keep, a / (1 - self.dropout_rate), 0)
      a = a.reshape(self.length, self.num_heads, self.head_dim)
      return jnp.broadcast_to(a, (batch,) + a.shape).astype(x.dtype)  # [B, P, heads, kv]
    return x, (per_layer(key, 0), per_layer(value, 1))


def fold(params, module: DeepPrefix):
  """Direct-form params {'key', 'value'} ([L, P, D]) of a reparameterised DeepPrefix."""
  key, value = module.apply({"params": params}, method=DeepPrefix.prefixes)
  return {"key": key, "value": value}
