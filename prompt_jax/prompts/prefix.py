"""Prefix tuning (Li & Liang 2021) / P-tuning v2: learned key/value prefixes in every layer.

Used through the per-layer hooks of the seam, one `DeepPrefix` (one set) per attention:
  * `T5(config, layer_prompts=factory)`: the encoder's self-attention (`encoder/layer_prompts/...`);
  * `T5(config, decoder_layer_prompts=factory)`: the decoder's self-attention
    (`decoder/layer_prompts/...`);
  * `T5(config, decoder_cross_prompts=factory)`: the decoder's cross-attention
    (`decoder/cross_layer_prompts/...`), whose keys/values are otherwise the encoder's output.
Li & Liang prefix both sides of an encoder-decoder (z = [PREFIX; x; PREFIX'; y], their Section
4.1), and their code (XiangLi1999/PrefixTuning, seq2seq/prefixTuning.py, `use_encoder_prefix =
use_cross_prefix = True`) gives all three attentions their own set: wte_enc/control_trans_enc
(encoder), wte/control_trans (decoder self-attention), wte2/control_trans2 (passed as the
'encoder_decoder' past keys/values: the cross-attention), as PEFT's T5 prefix tuning does.
Layer l attends P extra keys/values (no relative position bias, never masked) before its own.
  * direct: key, value [L, P, D] trainable (D = heads·head_dim);
  * reparameterised (hidden=m, their Section 4.3 / P-tuning v2's `prefix_projection`):
      [key; value] = Linear(m -> 2·L·D)(tanh(Linear(H -> m)(E))),  E [P, H] trainable;
    used while training, folded (`fold`) into the direct form for export and inference;
  * instance-wise (`source`, IPT on prefix tuning): E is replaced by a per-example prompt
    [B, P, H] from a method reading the input (e.g. `ipt.IPT`), so every example gets its own
    prefixes in every layer (encoder set only).
Initialisation: random (`init`), or from the activations of real words (Li & Liang Section 7.2,
their recommended one): the frozen model runs on the words' tokens and each layer's keys/values
become the prefixes (`word_activations`: the encoder's and the decoder's self-attention, and the
decoder's cross-attention, whose keys/values project the frozen encoder's output on the words);
with the reparameterisation, the output layer is solved by least squares so that the MLP
reproduces them at step 0 (the reference code regresses it to them by MSE).

Trainable parameters, per set (`embedding`, `wi_kernel`, `wi_bias`, `wo_kernel`, `wo_bias`, or
`key`, `value` in the direct form):
  direct: 2·L·P·D;   reparameterised: P·H + H·m + m + 2·L·D·m + 2·L·D (no P·H with `source`);
three sets in the paper's encoder-decoder setting (L = the layers of each stack).
A prefix of length 0 is the plain model.
"""
from typing import Callable, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax import partitioning
from prompt_jax.models import t5 as t5_lib
from prompt_jax.prompts import initializers

Array = jax.Array
# () -> (key, value), each [L, P, D]: target prefixes (e.g. real-word activations).
KVInit = Callable[[], Tuple[Array, Array]]


def num_trainable_params(length: int, num_layers: int, num_heads: int, head_dim: int,
                         emb_dim: Optional[int] = None, hidden: Optional[int] = None,
                         with_embedding: bool = True) -> int:
  d = num_heads * head_dim
  if hidden is None:
    return 2 * num_layers * length * d
  return ((length * emb_dim if with_embedding else 0) + emb_dim * hidden + hidden
          + 2 * num_layers * d * hidden + 2 * num_layers * d)


def _flat_kv(key: Array, value: Array) -> Array:
  """(key, value) [L, P, D] -> [P, 2·L·D], the layout of the reparameterisation's output."""
  kv = jnp.stack([key, value])  # [2, L, P, D]
  return kv.transpose(2, 0, 1, 3).reshape(kv.shape[2], -1)


class DeepPrefix(nn.Module):
  """Per-layer hook `h(ctx: LayerContext, deterministic) -> (x, (key, value))`, key and value
  [B, P, heads, kv]."""
  length: int
  num_layers: int
  num_heads: int
  head_dim: int
  emb_dim: Optional[int] = None  # needed with `hidden` (the width of E)
  hidden: Optional[int] = None  # m of the reparameterisation MLP; None = direct prefixes
  dropout_rate: float = 0.0
  init: initializers.PromptInit = initializers.normal_init(0.5)
  kv_init: Optional[KVInit] = None  # real-word activations (see module docstring)
  source: Optional[Callable[..., nn.Module]] = None  # per-example E [B, P, H] (needs `hidden`)

  @nn.compact
  def prefixes(self, inputs: Optional[t5_lib.PromptContext] = None,
               deterministic: bool = True) -> Tuple[Array, Array]:
    """(key, value), each [L, P, D] ([B, L, P, D] with a `source`)."""
    d = self.num_heads * self.head_dim
    shape = (self.num_layers, self.length, d)
    axes = ("prompt_layers", "prompt", "prompt_embed")
    p = lambda name, init, shp, ax: self.param(name, nn.with_logical_partitioning(init, ax), shp)
    targets = self.kv_init
    if self.hidden is None:
      if self.source is not None:
        raise ValueError("instance-wise prefixes (a `source`) need the reparameterisation "
                         "(hidden > 0)")
      pick = lambda i: (self.init if targets is None
                        else lambda rng, shp: jnp.asarray(targets()[i], jnp.float32))
      return p("key", pick(0), shape, axes), p("value", pick(1), shape, axes)
    if self.hidden <= 0:
      raise ValueError(f"prefix reparameterisation hidden size must be > 0, got {self.hidden}")
    if self.emb_dim is None:
      raise ValueError("DeepPrefix with a reparameterisation MLP needs emb_dim")
    dense_init = nn.initializers.lecun_normal()
    if self.source is None:
      emb = p("embedding", self.init, (self.length, self.emb_dim), ("prompt", "prompt_embed"))
    else:  # [B, P, H] per example, from the raw input
      emb = self.source(name="source")(inputs.input_tokens, inputs.embedded,
                                       deterministic=deterministic, context=inputs)
    w1 = p("wi_kernel", dense_init, (self.emb_dim, self.hidden), ("prompt_embed", "prompt_mlp"))
    b1 = p("wi_bias", nn.initializers.zeros, (self.hidden,), ("prompt_mlp",))
    def words_w2(rng, shp):  # least squares: tanh(E·W1 + b1)·W2 = the words' activations
      del rng, shp
      hidden = jnp.tanh(emb @ w1 + b1)  # [P, m]
      return jnp.linalg.lstsq(hidden, _flat_kv(*map(jnp.asarray, targets())))[0]
    w2_init = words_w2 if targets is not None and self.source is None else dense_init
    w2 = p("wo_kernel", w2_init, (self.hidden, 2 * self.num_layers * d),
           ("prompt_mlp", "prompt_embed"))
    b2 = p("wo_bias", nn.initializers.zeros, (2 * self.num_layers * d,), ("prompt_embed",))
    kv = jnp.tanh(emb @ w1 + b1) @ w2 + b2  # [B?, P, 2·L·D]
    kv = kv.reshape(kv.shape[:-2] + (self.length, 2, self.num_layers, d))
    kv = jnp.moveaxis(kv, -4, -2)  # [B?, 2, L, P, D]
    return kv[..., 0, :, :, :], kv[..., 1, :, :, :]

  def __call__(self, ctx: t5_lib.LayerContext, deterministic: bool = True):
    x = ctx.x
    if self.length == 0:
      return x, None
    key, value = self.prefixes(ctx.inputs, deterministic)  # [B?, L, P, D]
    batch = x.shape[0]
    rng = None
    if not deterministic and self.dropout_rate > 0:
      rng = self.make_rng("dropout")

    def per_layer(a, salt):
      a = a[..., ctx.layer, :, :]  # [B?, P, D]
      if rng is not None:
        keep = jax.random.bernoulli(jax.random.fold_in(rng, salt), 1 - self.dropout_rate, a.shape)
        a = jnp.where(keep, a / (1 - self.dropout_rate), 0)
      a = a.reshape(a.shape[:-1] + (self.num_heads, self.head_dim))
      a = partitioning.broadcast_batch(a, (batch,) + a.shape[-3:])  # [B, P, heads, kv]
      return a.astype(x.dtype)
    return x, (per_layer(key, 0), per_layer(value, 1))


def fold(params, module: DeepPrefix):
  """Direct-form params {'key', 'value'} ([L, P, D]) of a reparameterised DeepPrefix."""
  key, value = module.apply({"params": params}, method=DeepPrefix.prefixes)
  return {"key": key, "value": value}


def word_tokens(ids, length: int) -> np.ndarray:
  """[P] the token ids repeated (or cut) to the prefix length."""
  ids = [int(i) for i in ids]
  if not ids:
    raise ValueError("prefix initialisation words encode to no tokens")
  return np.asarray([ids[i % len(ids)] for i in range(length)], np.int32)


ATTENTIONS = {  # which: (stack, attention module, number-of-layers field of the config)
    "encoder": ("encoder", "attention", "num_encoder_layers"),
    "decoder": ("decoder", "self_attention", "num_decoder_layers"),
    "cross": ("decoder", "encoder_decoder_attention", "num_decoder_layers"),
}


def word_activations(config, params, tokens, which: str = "encoder") -> Tuple[Array, Array]:
  """(key, value), each [L, P, D] float32: the frozen model's keys and values in every layer of
  the attention `which` when it reads `tokens` [P]: 'encoder' (the encoder's self-attention),
  'decoder' (the decoder's self-attention: the decoder reads the tokens as its targets, teacher
  forced, with the same tokens as its input) or 'cross' (the decoder's cross-attention: the key
  and value projections of the frozen encoder's output on the tokens)."""
  if which not in ATTENTIONS:
    raise ValueError(f"which must be one of {sorted(ATTENTIONS)}, got {which!r}")
  side, attention, layers_field = ATTENTIONS[which]
  tokens = jnp.asarray(tokens, jnp.int32)[None, :]  # [1, P]
  model = t5_lib.T5(config)
  num_layers = getattr(config, layers_field)

  def wanted(module, method_name):  # .../layers_i/<attention>/{key,value}
    path = module.path
    return (method_name == "__call__" and len(path) >= 2 and path[-1] in ("key", "value")
            and path[-2] == attention)

  def run(params, tokens):
    dec_in = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))  # shifted right, BOS = 0
    _, state = model.apply({"params": params}, tokens, dec_in, tokens, enable_dropout=False,
                           capture_intermediates=wanted, mutable=["intermediates"])
    layers = state["intermediates"][side]
    get = lambda i, kind: layers[f"layers_{i}"][attention][kind]["__call__"][0][0]  # [P, h, d]
    stack = lambda kind: jnp.stack([get(i, kind).reshape(tokens.shape[1], -1)
                                    for i in range(num_layers)]).astype(jnp.float32)
    return stack("key"), stack("value")  # [L, P, D]
  return jax.jit(run)(params, tokens)
