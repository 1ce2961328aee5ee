"""T5 encoder-decoder in Flax linen, with t5x's parameter tree and call signature.

The encoder has one seam for prompts and knows no prompt method by name:
  * `prompt`: a factory of a module `m(input_tokens [B, T], embedded [B, T, H], deterministic,
    context=PromptContext) -> (embedded' [B, T', H], mask [B, T'])` that places prompt embeddings
    into the embedded input, plus `m.input_mask(input_tokens) -> [B, T']` (the same mask from the
    tokens alone: the decoder's cross-attention and the KV-cache decoder use it) and
    `m.slots(input_tokens) -> [B, T']` (k + 1 at the k-th prompt position, 0 elsewhere) and
    `m.attention_mask(input_tokens, valid, dtype) -> [B, 1, T', T']` or None (the encoder
    self-attention mask of the run's prompt/input visibility; None: full visibility);
  * `layer_prompts`: a factory of a per-layer hook `h(LayerContext, deterministic)
    -> (x' [B, T', H], kv_prefix)` called before every encoder layer; `kv_prefix` is None or a pair
    of [B, P, heads, kv] keys/values prepended in that layer's self-attention.
Both are called as `factory(name=...)` inside the encoder, so their parameters live under
`encoder/prompt/...` and `encoder/layer_prompts/...`. Two optional decoder hooks of the same
form, called before every decoder layer (their context has no encoder inputs):
  * `decoder_layer_prompts`: key/value prefixes of the decoder's self-attention
    (`decoder/layer_prompts/...`);
  * `decoder_cross_prompts`: key/value prefixes of the decoder's cross-attention
    (`encoder_decoder_attention`; `decoder/cross_layer_prompts/...`), prepended to the keys/values
    of the encoder's output: always attended, no bias (prefix tuning's third set, Li & Liang's
    `use_cross_prefix`). Its returned x is ignored (the hidden states are the self-attention
    hook's to change); the cross-attention is not cached, so decoding with the KV cache takes
    them at every step.

Everything a method may read comes in an explicit context (no attribute probing, no walking up
the module tree): `PromptContext` (the raw input: tokens, embeddings, validity, and
`representation()`, the frozen encoder's pooled output on the raw input) and `LayerContext` (the
layer index, its input hidden states and mask, where the input-level prompt sits, and the
input-level method module for hooks that share its parameters).
`representation()` returns the batch feature `prompt_representation` [B, H] when the caller
passes one (the trainer caches it per example), else runs the frozen encoder once per call.
`task_ids` [B] (int32, optional): the task of each example of a multi-task batch (the data's
`task_ids` feature), passed to `encode`/`__call__` and read by methods through
`PromptContext.task_ids`; methods that keep no per-task parameters ignore it.
"""
import dataclasses
from typing import Callable, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from prompt_jax.models import layers
from prompt_jax.models.config import T5Config

Array = jax.Array
ModuleFactory = Callable[..., nn.Module]
POOLINGS = ("mean", "first")


@dataclasses.dataclass(frozen=True)
class PromptContext:
  """The raw encoder input, as every prompt method and encoder hook sees it."""
  input_tokens: Array  # [B, T]
  embedded: Array  # [B, T, H] frozen token embeddings of the raw input
  input_valid: Array  # [B, T] real (non-padding) tokens
  # () -> [B, H] (float32 or wider): the frozen encoder's output on the raw input (no prompt, no
  # dropout, no gradient), pooled by `T5.representation_pooling`.
  representation: Callable[[], Array]
  # [B] int32: the task of each example (a multi-task batch's `task_ids` feature), or None when
  # the caller passes none; multi-task methods (one prompt per task) read it.
  task_ids: Optional[Array] = None


@dataclasses.dataclass(frozen=True)
class LayerContext:
  """What a per-layer hook receives before layer `layer` (encoder or decoder)."""
  layer: int
  x: Array  # [B, T', H] the layer's input hidden states
  valid: Optional[Array] = None  # [B, T'] validity of x's positions (encoder only)
  # [B, T'] int32: k + 1 at the k-th position of the input-level prompt, 0 elsewhere (encoder
  # with an input-level prompt only).
  prompt_slots: Optional[Array] = None
  inputs: Optional[PromptContext] = None  # the raw encoder input (encoder only)
  # The encoder's input-level method module (bound), for methods whose per-layer part shares
  # its parameters (M-IDPG); None without an input-level prompt.
  prompt_method: Optional[nn.Module] = None


def pool(x: Array, valid: Array, pooling: str = "mean") -> Array:
  """[B, T, H], [B, T] -> [B, H]: masked mean over valid positions, or the first valid one."""
  x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  if pooling == "first":
    first = jnp.argmax(valid, axis=1)  # [B]
    return jnp.take_along_axis(x, first[:, None, None], axis=1)[:, 0]
  if pooling != "mean":
    raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
  w = valid.astype(x.dtype)[..., None]
  return (x * w).sum(1) / jnp.maximum(w.sum(1), 1.0)


def _dropout(config: T5Config) -> nn.Dropout:
  # T5 shares dropout masks across positions ("broadcast along length").
  return nn.Dropout(rate=config.dropout_rate, broadcast_dims=(-2,))


def _attention(config: T5Config, name: str) -> layers.MultiHeadDotProductAttention:
  return layers.MultiHeadDotProductAttention(
      num_heads=config.num_heads, head_dim=config.head_dim, dtype=config.dtype,
      dropout_rate=config.dropout_rate, float32_logits=config.float32_attention_logits,
      implementation=config.attention_implementation,
      recompute_weights=config.remat_policy == "attention", name=name)


def _mlp(config: T5Config) -> layers.MlpBlock:
  return layers.MlpBlock(intermediate_dim=config.mlp_dim, activations=config.mlp_activations,
                         dropout_rate=config.dropout_rate, dtype=config.dtype, name="mlp")


def _relpos(config: T5Config) -> layers.RelativePositionBiases:
  return layers.RelativePositionBiases(
      num_buckets=config.relative_attention_num_buckets,
      max_distance=config.relative_attention_max_distance, num_heads=config.num_heads,
      dtype=config.dtype, name="relpos_bias")


class EncoderLayer(nn.Module):
  """`attention_bias` [batch|1, heads, T, T]: the stack's mask and relative-position bias, added
  to the attention logits (`layers.attention_bias`, computed once per stack), or the same as a
  `layers.PaddedBias` (`Encoder.self_attention_bias`)."""
  config: T5Config

  @nn.compact
  def __call__(self, inputs: Array, attention_bias: Optional[layers.AttentionBias] = None,
               kv_prefix: Optional[layers.KVPrefix] = None, deterministic: bool = True) -> Array:
    cfg = self.config
    x = layers.LayerNorm(dtype=cfg.dtype, name="pre_attention_layer_norm")(inputs)
    x = _attention(cfg, "attention")(x, x, None, attention_bias, kv_prefix=kv_prefix,
                                     deterministic=deterministic)  # [batch, length, embed]
    x = _dropout(cfg)(x, deterministic=deterministic) + inputs
    y = layers.LayerNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(x)
    y = _mlp(cfg)(y, deterministic=deterministic)  # [batch, length, embed]
    y = _dropout(cfg)(y, deterministic=deterministic) + x
    return layers.constrain(y, ("batch", "length", "embed"))


class DecoderLayer(nn.Module):
  """`self_bias` [batch|1, heads, L, L] and `cross_bias` [batch, 1, L, T']: the stack's masks
  (and relative-position bias) as additive attention biases, computed once per stack. When
  decoding with the cache, `self_bias` is the [1, heads, max_len, max_len] relative-position
  bias alone; the attention takes the current step's row and masks the unfilled cache.
  `kv_prefix` / `cross_kv_prefix`: key/value prefixes [batch, P, heads, kv] of the self- and the
  cross-attention (or None)."""
  config: T5Config

  @nn.compact
  def __call__(self, inputs: Array, encoded: Array, self_bias: Optional[Array] = None,
               cross_bias: Optional[Array] = None, deterministic: bool = True,
               decode: bool = False, max_decode_length: Optional[int] = None,
               kv_prefix: Optional[layers.KVPrefix] = None,
               cross_kv_prefix: Optional[layers.KVPrefix] = None) -> Array:
    cfg = self.config
    del max_decode_length  # the stack sized `self_bias` by it
    x = layers.LayerNorm(dtype=cfg.dtype, name="pre_self_attention_layer_norm")(inputs)
    x = _attention(cfg, "self_attention")(x, x, None, self_bias, kv_prefix=kv_prefix,
                                          decode=decode, deterministic=deterministic)
    x = _dropout(cfg)(x, deterministic=deterministic) + inputs
    y = layers.LayerNorm(dtype=cfg.dtype, name="pre_cross_attention_layer_norm")(x)
    y = _attention(cfg, "encoder_decoder_attention")(y, encoded, None, cross_bias,
                                                     kv_prefix=cross_kv_prefix,
                                                     deterministic=deterministic)
    y = _dropout(cfg)(y, deterministic=deterministic) + x
    z = layers.LayerNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(y)
    z = _mlp(cfg)(z, deterministic=deterministic)
    z = _dropout(cfg)(z, deterministic=deterministic) + y
    return layers.constrain(z, ("batch", "length", "embed"))


# What each rematerialised layer keeps from its forward pass for the backward pass (the rest is
# recomputed); names as t5x's examples/scalable_t5 ('minimal') and jax.checkpoint_policies.
# 'attention' rematerialises no layer, only each attention's core (layers.dot_product_attention's
# recompute_weights). On a 2-core CPU, T5 1.1 small, float32 (docs/benchmarks.md): at batch 8 x
# 612 positions it is 'minimal' in time and memory (both about 1.08x the step's time without
# remat and 0.85-0.9x its peak RSS); at 4 x 1124, where the weights grow with length squared,
# 2150 MB at 1.07x against 'minimal''s 2412 MB at 1.12x ('none': 2752 MB).
# bfloat16 products on CPU are custom_vjp calls (layers.float32_summed_einsum), saved by name.
_DENSE_PRODUCTS = jax.checkpoint_policies.save_only_these_names(layers.DENSE_PRODUCT)
_ALL_PRODUCTS = jax.checkpoint_policies.save_only_these_names(layers.DENSE_PRODUCT,
                                                              layers.ATTENTION_PRODUCT)
REMAT_POLICIES = {
    "minimal": jax.checkpoint_policies.save_from_both_policies(  # projections
        jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims, _DENSE_PRODUCTS),
    "dots": jax.checkpoint_policies.save_from_both_policies(  # + attention scores and context
        jax.checkpoint_policies.checkpoint_dots, _ALL_PRODUCTS),
    "full": None,  # nothing but the layer's inputs (jax.checkpoint's default)
}


def _maybe_remat(cls, config: T5Config):
  if config.remat_policy in ("none", "attention"):  # 'attention': inside the attention layer
    return cls
  # Argument numbers count `self` as 0: the flags that steer Python control flow are static
  # (DecoderLayer: deterministic, decode, max_decode_length; the prefixes after them are arrays).
  return nn.remat(cls, static_argnums=(5, 6, 7) if cls is DecoderLayer else (4,),
                  policy=REMAT_POLICIES[config.remat_policy])


class Encoder(nn.Module):
  """Token embeddings -> prompt seam -> layers (optional per-layer hook) -> final norm."""
  config: T5Config
  shared_embedding: nn.Module
  prompt: Optional[ModuleFactory] = None
  layer_prompts: Optional[ModuleFactory] = None
  representation_pooling: str = "mean"

  def setup(self):
    cfg = self.config
    self.relpos_bias = _relpos(cfg)
    layer_cls = _maybe_remat(EncoderLayer, cfg)
    self.layers = [layer_cls(cfg, name=f"layers_{i}") for i in range(cfg.num_encoder_layers)]
    self.encoder_norm = layers.LayerNorm(dtype=cfg.dtype)
    self.dropout = _dropout(cfg)
    self.prompt_module = self.prompt(name="prompt") if self.prompt else None
    self.layer_prompt_module = (
        self.layer_prompts(name="layer_prompts") if self.layer_prompts else None)

  def input_mask(self, encoder_input_tokens: Array) -> Array:
    """[batch, T'] validity of each encoder position (prompt positions included)."""
    if self.prompt_module is None:
      return encoder_input_tokens > 0
    return self.prompt_module.input_mask(encoder_input_tokens)

  def frozen_representation(self, embedded: Array, valid: Array) -> Array:
    """[B, H]: the frozen layers + final norm on the raw input (no prompt, no hook, no dropout),
    pooled by `representation_pooling`; no gradient flows into it."""
    bias, trailing = self.self_attention_bias(valid)
    x = embedded.astype(self.config.dtype)
    for layer in self.layers:
      x = layer(x, bias, None, True)  # [B, T, H]
    x = _poison(self.encoder_norm(x), trailing)
    return jax.lax.stop_gradient(pool(x, valid, self.representation_pooling))

  def self_attention_bias(self, valid: Array, mask: Optional[Array] = None
                          ) -> Tuple[layers.AttentionBias, Optional[Array]]:
    """(bias, trailing): the self-attention bias of every layer, computed once, for positions
    `valid` [batch, T] and the mask [batch, 1, T, T] (None: padding alone, valid x valid).

    With a padding-alone mask and one of jax.nn's kernels (cuDNN on GPU in bfloat16: 'auto'),
    unless `padding_as_lengths` is False, the bias is a `layers.PaddedBias`: the relative-position bias [1, heads, T, T] and each row's
    length, which assumes the padding is at the end of each row, as seqio's feature converters
    pad and every placement keeps it (a prompt method that masks some of its own positions,
    IPT, gives a mask: dense form). `trailing` [batch] says where that holds; rows where it does
    not (filler rows without a real token aside) are NaN at the encoder's output (`_poison`), so a run fed other padding stops at its
    non-finite guard instead of attending to padding (`padding_as_lengths=False` serves it). Otherwise the dense bias
    [batch, heads, T, T] and trailing None."""
    cfg = self.config
    length = valid.shape[-1]
    relpos = self.relpos_bias(length, length, True)  # [1, heads, T, T]
    if mask is None and cfg.padding_as_lengths and layers.takes_sequence_lengths(
        cfg.attention_implementation, cfg.dtype, cfg.head_dim):
      lengths, trailing = layers.trailing_lengths(valid)
      return layers.PaddedBias(relpos, lengths, lengths), trailing
    if mask is None:
      mask = layers.make_attention_mask(valid, valid, dtype=cfg.dtype)
    return layers.attention_bias(mask, relpos, cfg.dtype), None

  def attention_bias(self, mask: Array, length: int) -> Array:
    """[batch, heads, T, T]: `mask` [batch, 1, T, T] and the relative-position bias, once for
    every layer."""
    relpos = self.relpos_bias(length, length, True)  # [1, heads, T, T]
    return layers.attention_bias(mask, relpos, self.config.dtype)

  def context(self, encoder_input_tokens: Array, embedded: Array,
              prompt_representation: Optional[Array] = None,
              task_ids: Optional[Array] = None) -> PromptContext:
    """The raw-input context; `representation()` is computed at most once per call."""
    valid = encoder_input_tokens > 0
    memo = {}

    def representation() -> Array:
      if prompt_representation is not None:
        return jax.lax.stop_gradient(jnp.asarray(prompt_representation))  # [B, H]
      if "r" not in memo:
        memo["r"] = self.frozen_representation(embedded, valid)
      return memo["r"]
    if task_ids is not None:
      task_ids = jnp.asarray(task_ids, jnp.int32).reshape(encoder_input_tokens.shape[:1])  # [B]
    return PromptContext(encoder_input_tokens, embedded, valid, representation, task_ids)

  def __call__(self, encoder_input_tokens: Array, encoder_mask: Optional[Array] = None,
               deterministic: bool = True,
               prompt_representation: Optional[Array] = None,
               task_ids: Optional[Array] = None) -> Array:
    cfg = self.config
    x = self.shared_embedding(encoder_input_tokens.astype("int32"))  # [batch, T, embed]
    inputs = self.context(encoder_input_tokens, x, prompt_representation, task_ids)
    valid = inputs.input_valid
    slots, method = None, None
    if self.prompt_module is not None:
      if encoder_mask is not None:
        raise ValueError("packed inputs (segment ids) cannot be combined with a prompt; "
                         "set pack=False in the feature converter.")
      x, valid = self.prompt_module(encoder_input_tokens, x, deterministic=deterministic,
                                    context=inputs)
      encoder_mask = self.prompt_module.attention_mask(encoder_input_tokens, valid,
                                                       dtype=cfg.dtype)  # None: full visibility
      if encoder_mask is None and self.prompt_module.prompt.prompt_mask(
          encoder_input_tokens) is not None:  # the prompt's own holes: not trailing padding
        encoder_mask = layers.make_attention_mask(valid, valid, dtype=cfg.dtype)
      if self.layer_prompt_module is not None:
        slots = self.prompt_module.slots(encoder_input_tokens)  # [batch, T']
        method = self.prompt_module.prompt
    x = self.dropout(x, deterministic=deterministic)
    x = layers.constrain(x.astype(cfg.dtype), ("batch", "length", "embed"))
    # [batch, heads, T', T'], or [1, heads, T', T'] and lengths
    bias, trailing = self.self_attention_bias(valid, encoder_mask)
    if trailing is not None:  # a filler row (no real token: eval's padding rows) is never read;
      # 'after_bos' puts its prompt after a padding position, and NaN there would reach a
      # batch's summed metrics through 0 x NaN.
      trailing = trailing | ~jnp.any(inputs.input_valid, axis=-1)
    for i, layer in enumerate(self.layers):
      kv_prefix = None
      if self.layer_prompt_module is not None:
        ctx = LayerContext(layer=i, x=x, valid=valid, prompt_slots=slots, inputs=inputs,
                           prompt_method=method)
        x, kv_prefix = self.layer_prompt_module(ctx, deterministic=deterministic)
      x = layer(x, bias, kv_prefix, deterministic)
    x = _poison(self.encoder_norm(x), trailing)
    return self.dropout(x, deterministic=deterministic)  # [batch, T', embed]


def _poison(x: Array, trailing: Optional[Array]) -> Array:
  """x [batch, T, H] with NaN in the rows where `trailing` [batch] is False (see
  `Encoder.self_attention_bias`); x itself when trailing is None."""
  if trailing is None:
    return x
  return jnp.where(trailing[:, None, None], x, jnp.full((), jnp.nan, x.dtype))


class Decoder(nn.Module):
  """Token embeddings -> layers (optional self- and cross-attention prefix hooks) -> logits."""
  config: T5Config
  shared_embedding: nn.Module
  layer_prompts: Optional[ModuleFactory] = None  # self-attention prefixes
  cross_prompts: Optional[ModuleFactory] = None  # cross-attention prefixes (x it returns: unused)

  @nn.compact
  def __call__(self, encoded: Array, decoder_input_tokens: Array,
               decoder_mask: Optional[Array] = None, encoder_decoder_mask: Optional[Array] = None,
               deterministic: bool = True, decode: bool = False,
               max_decode_length: Optional[int] = None) -> Array:
    cfg = self.config
    length = max_decode_length if decode and max_decode_length else decoder_input_tokens.shape[-1]
    relpos = _relpos(cfg)(length, length, False)  # [1, heads, L, L]
    self_bias = layers.attention_bias(decoder_mask, relpos, cfg.dtype)  # [batch|1, heads, L, L]
    cross_bias = layers.attention_bias(encoder_decoder_mask, None, cfg.dtype)  # [batch, 1, L, T']
    y = self.shared_embedding(decoder_input_tokens.astype("int32"))  # [batch, S, embed]
    y = _dropout(cfg)(y, deterministic=deterministic)
    y = layers.constrain(y.astype(cfg.dtype), ("batch", "length", "embed"))
    layer_cls = _maybe_remat(DecoderLayer, cfg)
    hook = self.layer_prompts(name="layer_prompts") if self.layer_prompts else None
    cross_hook = (self.cross_prompts(name="cross_layer_prompts") if self.cross_prompts
                  else None)
    for i in range(cfg.num_decoder_layers):
      kv_prefix, cross_kv_prefix = None, None
      if hook is not None:
        y, kv_prefix = hook(LayerContext(layer=i, x=y), deterministic=deterministic)
      if cross_hook is not None:  # its x is ignored: only the self-attention hook changes y
        _, cross_kv_prefix = cross_hook(LayerContext(layer=i, x=y), deterministic=deterministic)
      y = layer_cls(cfg, name=f"layers_{i}")(
          y, encoded, self_bias, cross_bias, deterministic, decode, max_decode_length, kv_prefix,
          cross_kv_prefix)
    y = layers.LayerNorm(dtype=cfg.dtype, name="decoder_norm")(y)
    y = _dropout(cfg)(y, deterministic=deterministic)
    if cfg.logits_via_embedding:
      # Tied output projection, rescaled by 1/sqrt(emb_dim) as in Mesh TensorFlow T5.
      logits = self.shared_embedding.attend(y) / jnp.sqrt(y.shape[-1])
    else:  # in float32 as t5x's: see float32_params
      logits = layers.DenseGeneral((cfg.vocab_size,), dtype=layers.at_least_float32(cfg.dtype),
                                   kernel_axes=("embed", "vocab"), name="logits_dense")(y)
    return layers.constrain(logits, ("batch", "length", "vocab"))  # [batch, S, vocab]


def float32_params(config: T5Config) -> frozenset:
  """Parameter paths the model uses in (at least) float32 whatever `config.dtype`: T5 1.1's
  untied output projection (t5x computes logits in float32). Every other parameter is cast to
  `config.dtype` before use, so holding it in that dtype changes no result."""
  return frozenset() if config.logits_via_embedding else frozenset({"decoder/logits_dense/kernel"})


class T5(nn.Module):
  """T5 with t5x's signature: `apply({'params': p}, enc_in, dec_in, dec_target) -> logits`."""
  config: T5Config
  prompt: Optional[ModuleFactory] = None
  layer_prompts: Optional[ModuleFactory] = None
  decoder_layer_prompts: Optional[ModuleFactory] = None
  decoder_cross_prompts: Optional[ModuleFactory] = None  # see the module docstring
  # How the frozen encoder's output is pooled into PromptContext.representation(): "mean" over
  # real tokens or the "first" token (IDPG's M(x)).
  representation_pooling: str = "mean"

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(num_embeddings=cfg.vocab_size, features=cfg.emb_dim,
                                       dtype=cfg.dtype,
                                       embedding_init=nn.initializers.normal(stddev=1.0))
    self.encoder = Encoder(cfg, self.token_embedder, prompt=self.prompt,
                           layer_prompts=self.layer_prompts,
                           representation_pooling=self.representation_pooling)
    self.decoder = Decoder(cfg, self.token_embedder, layer_prompts=self.decoder_layer_prompts,
                           cross_prompts=self.decoder_cross_prompts)

  def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Optional[Array] = None,
             enable_dropout: bool = True,
             prompt_representation: Optional[Array] = None,
             task_ids: Optional[Array] = None) -> Array:
    """[batch, T] -> encoded [batch, T', embed] (T' includes prompt positions).

    `prompt_representation` [batch, H]: a precomputed `encoder_representation` of these inputs
    (e.g. cached per example by the trainer); None computes it when a method asks for it.
    """
    cfg = self.config
    encoder_mask = None
    if encoder_segment_ids is not None:
      valid = encoder_input_tokens > 0
      encoder_mask = layers.combine_masks(
          layers.make_attention_mask(valid, valid, dtype=cfg.dtype),
          layers.make_attention_mask(encoder_segment_ids, encoder_segment_ids, jnp.equal,
                                     dtype=cfg.dtype), dtype=cfg.dtype)
    return self.encoder(encoder_input_tokens, encoder_mask, deterministic=not enable_dropout,
                        prompt_representation=prompt_representation, task_ids=task_ids)

  def encoder_representation(self, encoder_input_tokens: Array) -> Array:
    """[batch, H]: the frozen encoder's pooled output on the raw input (what IDPG reads as M(x)),
    the value `prompt_representation` stands in for."""
    embedded = self.token_embedder(encoder_input_tokens.astype("int32"))
    return self.encoder.frozen_representation(embedded, encoder_input_tokens > 0)

  def encoder_input_mask(self, encoder_input_tokens: Array) -> Array:
    """[batch, T'] validity of the encoded positions, for cross-attention."""
    return self.encoder.input_mask(encoder_input_tokens)

  def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array,
             decoder_target_tokens: Array, encoder_segment_ids: Optional[Array] = None,
             decoder_segment_ids: Optional[Array] = None,
             decoder_positions: Optional[Array] = None, enable_dropout: bool = True,
             decode: bool = False, max_decode_length: Optional[int] = None) -> Array:
    """Decoder logits [batch, S, vocab] given the encoder output."""
    del decoder_positions  # relative attention needs no positions
    cfg = self.config
    encoder_valid = self.encoder_input_mask(encoder_input_tokens)  # [batch, T']
    if decode:
      decoder_mask = None
      encoder_decoder_mask = layers.make_attention_mask(
          jnp.ones_like(decoder_target_tokens), encoder_valid, dtype=cfg.dtype)
    else:
      decoder_mask = layers.combine_masks(
          layers.make_causal_mask(decoder_target_tokens, dtype=cfg.dtype),
          layers.make_attention_mask(decoder_target_tokens > 0, decoder_target_tokens > 0,
                                     dtype=cfg.dtype), dtype=cfg.dtype)
      encoder_decoder_mask = layers.make_attention_mask(
          decoder_target_tokens > 0, encoder_valid, dtype=cfg.dtype)
      if decoder_segment_ids is not None:
        decoder_mask = layers.combine_masks(
            decoder_mask, layers.make_attention_mask(
                decoder_segment_ids, decoder_segment_ids, jnp.equal, dtype=cfg.dtype),
            dtype=cfg.dtype)
    if encoder_segment_ids is not None and decoder_segment_ids is not None:
      encoder_decoder_mask = layers.combine_masks(
          encoder_decoder_mask, layers.make_attention_mask(
              decoder_segment_ids, encoder_segment_ids, jnp.equal, dtype=cfg.dtype),
          dtype=cfg.dtype)
    return self.decoder(encoded, decoder_input_tokens, decoder_mask, encoder_decoder_mask,
                        deterministic=not enable_dropout, decode=decode,
                        max_decode_length=max_decode_length)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Array, encoder_segment_ids: Optional[Array] = None,
               decoder_segment_ids: Optional[Array] = None,
               encoder_positions: Optional[Array] = None,
               decoder_positions: Optional[Array] = None, *, enable_dropout: bool = True,
               decode: bool = False, max_decode_length: Optional[int] = None,
               prompt_representation: Optional[Array] = None,
               task_ids: Optional[Array] = None) -> Array:
    """Teacher-forced logits [batch, target_len, vocab]."""
    del encoder_positions
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout,
                          prompt_representation, task_ids)
    return self.decode(encoded, encoder_input_tokens, decoder_input_tokens,
                       decoder_target_tokens, encoder_segment_ids, decoder_segment_ids,
                       decoder_positions, enable_dropout=enable_dropout, decode=decode,
                       max_decode_length=max_decode_length)
