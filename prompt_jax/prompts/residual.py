"""Residual prompt tuning (Razdaibiedina et al. 2023): a prompt reparameterised by a residual MLP.

  prompt = P0 + LayerNorm(Dropout(W2·ReLU(W1·P0 + b1) + b2))     (per prompt token)

P0 [P, H] is initialised from the sampled vocabulary (pass `init`); W1 [H, m], W2 [m, H]
(bottleneck m, default 400); LayerNorm with scale and bias (eps 1e-5, as torch's). One MLP is
shared by all tokens, or (separate_mlps=True) one per token.

Trainable parameters: P·H + k·(2·H·m + m + 3·H), k = 1 (shared MLP) or P (one per token)
(`encoder/prompt/prompt/...`). `fold(params, ...)` exports the effective [P, H] prompt.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from prompt_jax.prompts import initializers
from prompt_jax.prompts.seam import Method

Array = jax.Array


def num_trainable_params(length: int, emb_dim: int, bottleneck: int = 400,
                         separate_mlps: bool = False) -> int:
  k = length if separate_mlps else 1
  return length * emb_dim + k * (2 * emb_dim * bottleneck + bottleneck + 3 * emb_dim)


def _param(module, name, init, shape, axes, separate: bool, length: int):
  if separate:
    shape, axes = (length,) + tuple(shape), ("prompt",) + tuple(axes)
  return module.param(name, nn.with_logical_partitioning(init, axes), shape)


class ResidualMLP(nn.Module):
  """x [P, H] -> x + LN(Dropout(W2 relu(W1 x + b1) + b2)); weights [P, ...] when separate."""
  bottleneck: int
  separate: bool = False
  dropout_rate: float = 0.0
  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    length, width = x.shape
    if self.bottleneck <= 0:
      raise ValueError(f"residual MLP bottleneck must be > 0, got {self.bottleneck}")
    dense_init = nn.initializers.lecun_normal(batch_axis=(0,) if self.separate else ())
    p = lambda *args: _param(self, *args, separate=self.separate, length=length)
    w1 = p("wi_kernel", dense_init, (width, self.bottleneck), ("prompt_embed", "prompt_mlp"))
    b1 = p("wi_bias", nn.initializers.zeros, (self.bottleneck,), ("prompt_mlp",))
    w2 = p("wo_kernel", dense_init, (self.bottleneck, width), ("prompt_mlp", "prompt_embed"))
    b2 = p("wo_bias", nn.initializers.zeros, (width,), ("prompt_embed",))
    scale = p("ln_scale", nn.initializers.ones, (width,), ("prompt_embed",))
    bias = p("ln_bias", nn.initializers.zeros, (width,), ("prompt_embed",))
    if self.separate:
      h = jnp.einsum("ph,phm->pm", x, w1) + b1  # [P, m]
      y = jnp.einsum("pm,pmh->ph", nn.relu(h), w2) + b2  # [P, H]
    else:
      y = nn.relu(x @ w1 + b1) @ w2 + b2  # [P, H]
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    mean = y.mean(-1, keepdims=True)
    var = ((y - mean) ** 2).mean(-1, keepdims=True)
    y = (y - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias  # [P, H]
    return x + y


class ResidualPrompt(Method):
  """A [P, H] prompt P0 passed through a residual MLP."""
  length: int
  bottleneck: int = 400
  separate_mlps: bool = False
  dropout_rate: float = 0.0
  init: initializers.PromptInit = initializers.uniform_init()

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Array:
    del input_tokens, context
    prompt = self.param("prompt",
                        nn.with_logical_partitioning(self.init, ("prompt", "prompt_embed")),
                        (self.length, embedded.shape[-1]))  # [P, H]
    return ResidualMLP(self.bottleneck, self.separate_mlps, self.dropout_rate, name="mlp")(
        prompt, deterministic=deterministic)  # [P, H]


def fold(params, bottleneck: int, separate_mlps: bool = False) -> Array:
  """The effective (deterministic) [P, H] prompt of ResidualPrompt params, for PromptTuning."""
  prompt = params["prompt"]
  return ResidualMLP(bottleneck, separate_mlps).apply({"params": params["mlp"]}, prompt)
