"""IDPG, instance-dependent prompt generation (Wu et al. 2022).

  r = M(x) [B, H]                    sentence representation of the raw input
  prompt = reshape(W2·act(W1·r + b1) + b2, [B, P, H])

M(x): "embedding_mean" — the mean of the frozen token embeddings over real tokens (IDPG's cheap
GloVe-like variant) — or "encoder" — the mean-pooled output of the frozen T5 encoder on the raw
input (an extra encoder pass with the model's own frozen encoder weights, no gradient).
The generator is a bottleneck H -> m -> P·H, as dense layers ("dnn") or PHM layers ("phm", one
n x n x n rule shared by both layers, n dividing m and H). As the reference code (CSerxy/IDPG):
gelu, dropout (0.1) on r and on the hidden layer, weights ~ N(0, 0.02). b2 is stored as the task
prompt [P, H] (`.../prompt`), so with W1 = W2 = 0 IDPG is exactly prompt tuning with b2 as the
prompt. M-IDPG (prompts in every layer, versions S/M/L) is `MultiLayerIDPG` below.

Trainable parameters (`encoder/prompt/prompt/...`):
  dnn: H·m + m + m·P·H + P·H
  phm: n³ + H·m/n + m + m·P·H/n + P·H
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from prompt_jax.prompts import initializers, phm

Array = jax.Array
REPRESENTATIONS = ("embedding_mean", "encoder")


def num_trainable_params(length: int, emb_dim: int, bottleneck: int, layer_type: str = "dnn",
                         phm_n: int = 1) -> int:
  if layer_type == "dnn":
    return emb_dim * bottleneck + bottleneck + bottleneck * length * emb_dim + length * emb_dim
  return (phm_n ** 3 + phm.num_params(phm_n, emb_dim, bottleneck)
          + phm.num_params(phm_n, bottleneck, length * emb_dim, bias=False) + length * emb_dim)


def masked_mean(x: Array, valid: Array) -> Array:
  """[B, T, H], [B, T] -> [B, H] mean over valid positions."""
  valid = valid.astype(x.dtype)[..., None]
  return (x * valid).sum(1) / jnp.maximum(valid.sum(1), 1.0)


def _frozen_encoder(module: nn.Module):
  """The T5 Encoder this method sits in (the nearest ancestor with `layers` and `encoder_norm`)."""
  node = module.parent
  while node is not None:
    if hasattr(type(node), "input_mask") and hasattr(node, "config") and hasattr(
        node, "shared_embedding"):
      return node
    node = getattr(node, "parent", None)
  raise ValueError("IDPG representation='encoder' must be used inside a T5 encoder")


def encoder_representation(module: nn.Module, input_tokens: Array, embedded: Array) -> Array:
  """Mean-pooled frozen-encoder output on the raw input (no prompt, no dropout, no gradient)."""
  from prompt_jax.models import layers as t5_layers  # pylint: disable=g-import-not-at-top
  enc = _frozen_encoder(module)
  valid = input_tokens > 0  # [B, T]
  mask = t5_layers.make_attention_mask(valid, valid, dtype=enc.config.dtype)
  x = embedded.astype(enc.config.dtype)
  for layer in enc.layers:
    x = layer(x, mask, None, True)  # [B, T, H]
  x = enc.encoder_norm(x)
  return jax.lax.stop_gradient(masked_mean(x.astype(jnp.promote_types(x.dtype, jnp.float32)), valid))  # [B, H]


class IDPG(nn.Module):
  """Generates a [B, P, H] prompt per example from its sentence representation."""
  length: int
  bottleneck: int = 256
  layer_type: str = "dnn"  # or "phm"
  phm_n: int = 4
  activation: str = "gelu"
  dropout_rate: float = 0.1
  representation: str = "embedding_mean"
  prompt_init: initializers.PromptInit = initializers.uniform_init()
  kernel_init: initializers.PromptInit = nn.initializers.normal(0.02)

  def check(self, emb_dim: int) -> None:
    if self.bottleneck <= 0:
      raise ValueError(f"IDPG bottleneck m must be > 0, got {self.bottleneck}")
    if self.layer_type not in ("dnn", "phm"):
      raise ValueError(f"IDPG layer_type must be 'dnn' or 'phm', got {self.layer_type!r}")
    if self.representation not in REPRESENTATIONS:
      raise ValueError(f"IDPG representation must be one of {REPRESENTATIONS}, "
                       f"got {self.representation!r}")
    if self.layer_type == "phm":
      phm.check_divides(self.phm_n, m=self.bottleneck, H=emb_dim)

  def represent(self, input_tokens: Array, embedded: Array) -> Array:
    if self.representation == "encoder":
      return encoder_representation(self, input_tokens, embedded)
    return jax.lax.stop_gradient(
        masked_mean(embedded.astype(jnp.promote_types(embedded.dtype, jnp.float32)), input_tokens > 0))  # [B, H]

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True) -> Array:
    h_dim, m, length = embedded.shape[-1], self.bottleneck, self.length
    self.check(h_dim)
    param = lambda name, init, shape, axes: self.param(
        name, nn.with_logical_partitioning(init, axes), shape)
    if self.layer_type == "dnn":
      w1 = param("wi_kernel", self.kernel_init, (h_dim, m), ("prompt_embed", "prompt_mlp"))
      w2 = param("wo_kernel", self.kernel_init, (m, length * h_dim), ("prompt_mlp", "prompt_embed"))
    else:
      n = self.phm_n
      rule = param("phm_rule", nn.initializers.xavier_uniform(), (n, n, n),
                   ("prompt_phm", "prompt_phm", "prompt_phm"))
      s1 = param("wi_blocks", self.kernel_init, (n, h_dim // n, m // n),
                 ("prompt_phm", "prompt_embed", "prompt_mlp"))
      s2 = param("wo_blocks", self.kernel_init, (n, m // n, length * h_dim // n),
                 ("prompt_phm", "prompt_mlp", "prompt_embed"))
      w1, w2 = phm.kernel(rule, s1), phm.kernel(rule, s2)  # [H, m], [m, P·H]
    b1 = param("wi_bias", nn.initializers.zeros, (m,), ("prompt_mlp",))
    b2 = param("prompt", self.prompt_init, (length, h_dim), ("prompt", "prompt_embed"))
    drop = nn.Dropout(self.dropout_rate)
    r = drop(self.represent(input_tokens, embedded), deterministic=deterministic)  # [B, H]
    hidden = getattr(nn, self.activation)(r @ w1 + b1)  # [B, m]
    out = drop(hidden, deterministic=deterministic) @ w2  # [B, P·H]
    return out.reshape(-1, length, h_dim) + b2  # [B, P, H]


# ===== M-IDPG: prompts generated for every encoder layer =====

VERSIONS = ("S", "M", "L")


def num_trainable_params_multilayer(length: int, emb_dim: int, bottleneck: int, num_layers: int,
                                    version: str = "M", layer_type: str = "dnn",
                                    phm_n: int = 1) -> int:
  """M-IDPG: (n³ if phm) + a·(H·m + m·P·H)/n + b·(m + P·H), with a = L for version L else 1
  and b = 1 for version S else L (n = 1 for dense layers)."""
  n = phm_n if layer_type == "phm" else 1
  weights = (emb_dim * bottleneck + bottleneck * length * emb_dim) // n
  biases = bottleneck + length * emb_dim
  a = num_layers if version == "L" else 1
  b = 1 if version == "S" else num_layers
  return (phm_n ** 3 if layer_type == "phm" else 0) + a * weights + b * biases


class Placeholder(nn.Module):
  """P zero positions for the seam (M-IDPG's hook overwrites them in every layer)."""
  length: int

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True) -> Array:
    del input_tokens, deterministic
    return jnp.zeros((self.length, embedded.shape[-1]), embedded.dtype)  # [P, H]


class MultiLayerIDPG(nn.Module):
  """Per-layer hook: before layer l, positions [0, P) (a prefix `Placeholder` prompt) are set to
  G_l(r) = W2_l·act(W1_l·r + b1_l) + b2_l, r = M(x) (mean frozen token embedding) or, with
  generator_input='previous_layer', the masked mean of layer l's input (layer 0 uses M(x)).
  Versions: S — W and b shared by all layers; M — W shared, b per layer; L — both per layer.
  Trainable parameters: see `num_trainable_params_multilayer` (`encoder/layer_prompts/...`).
  """
  length: int
  num_layers: int
  bottleneck: int = 256
  version: str = "M"
  layer_type: str = "dnn"
  phm_n: int = 4
  activation: str = "gelu"
  dropout_rate: float = 0.1
  generator_input: str = "representation"  # or "previous_layer"
  prompt_init: initializers.PromptInit = initializers.uniform_init()
  kernel_init: initializers.PromptInit = nn.initializers.normal(0.02)
  wants_inputs = True  # the encoder passes input_tokens and input_mask

  def check(self, emb_dim: int) -> None:
    if self.version not in VERSIONS:
      raise ValueError(f"M-IDPG version must be one of {VERSIONS}, got {self.version!r}")
    if self.generator_input not in ("representation", "previous_layer"):
      raise ValueError("M-IDPG generator_input must be 'representation' or 'previous_layer', "
                       f"got {self.generator_input!r}")
    IDPG(self.length, self.bottleneck, self.layer_type, self.phm_n, parent=None).check(emb_dim)

  def _param(self, name, init, shape, axes, per_layer: bool):
    if per_layer:
      shape, axes = (self.num_layers,) + tuple(shape), ("prompt_layers",) + tuple(axes)
    return self.param(name, nn.with_logical_partitioning(init, axes), shape)

  @nn.compact
  def __call__(self, layer: int, x: Array, deterministic: bool = True,
               input_tokens: Array = None, input_mask: Array = None):
    h_dim, m, length = x.shape[-1], self.bottleneck, self.length
    self.check(h_dim)
    per_w, per_b = self.version == "L", self.version != "S"
    pick = lambda a, per: a[layer] if per else a
    if self.layer_type == "dnn":
      w1 = self._param("wi_kernel", self.kernel_init, (h_dim, m), ("prompt_embed", "prompt_mlp"),
                       per_w)
      w2 = self._param("wo_kernel", self.kernel_init, (m, length * h_dim),
                       ("prompt_mlp", "prompt_embed"), per_w)
      w1, w2 = pick(w1, per_w), pick(w2, per_w)
    else:
      n = self.phm_n
      rule = self.param("phm_rule", nn.with_logical_partitioning(
          nn.initializers.xavier_uniform(), ("prompt_phm",) * 3), (n, n, n))
      s1 = self._param("wi_blocks", self.kernel_init, (n, h_dim // n, m // n),
                       ("prompt_phm", "prompt_embed", "prompt_mlp"), per_w)
      s2 = self._param("wo_blocks", self.kernel_init, (n, m // n, length * h_dim // n),
                       ("prompt_phm", "prompt_mlp", "prompt_embed"), per_w)
      w1, w2 = phm.kernel(rule, pick(s1, per_w)), phm.kernel(rule, pick(s2, per_w))
    b1 = pick(self._param("wi_bias", nn.initializers.zeros, (m,), ("prompt_mlp",), per_b), per_b)
    b2 = pick(self._param("prompt", self.prompt_init, (length, h_dim),
                          ("prompt", "prompt_embed"), per_b), per_b)  # [P, H]
    if self.generator_input == "previous_layer" and layer > 0:
      r = masked_mean(x.astype(jnp.promote_types(x.dtype, jnp.float32)), input_mask)  # [B, H]
    else:
      embedded = _frozen_encoder(self).shared_embedding(input_tokens)  # [B, T, H]
      r = jax.lax.stop_gradient(masked_mean(embedded.astype(jnp.promote_types(embedded.dtype, jnp.float32)), input_tokens > 0))
    drop = nn.Dropout(self.dropout_rate)
    r = drop(r, deterministic=deterministic)
    hidden = getattr(nn, self.activation)(r @ w1 + b1)  # [B, m]
    hidden = drop(hidden, deterministic=deterministic)
    prompt = (hidden @ w2).reshape(-1, length, h_dim) + b2  # [B, P, H]
    return x.at[:, :length].set(prompt.astype(x.dtype)), None
