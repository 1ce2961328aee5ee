"""P-tuning (Liu et al. 2021, "GPT Understands, Too"; HF PEFT `PromptEncoder`): P virtual-token
embeddings reparameterised by a network, the network's output being the [P, H] prompt.

  encoder='mlp'  (PEFT's default, "recommended"): prompt = W3 relu(W2 relu(W1 E + b1) + b2) + b3
  encoder='lstm' (the paper's): prompt = MLP_head(BiLSTM(E)), the LSTM reading the P virtual
                 tokens as a sequence (`num_layers` layers, dropout between them), the head
                 Linear(2m, 2m) -> ReLU -> Linear(2m, H)
E [P, H] (`embedding`, N(0, 1) as torch.nn.Embedding), hidden size m (PEFT's
`encoder_hidden_size`, default H). Dense layers are initialised as torch.nn.Linear
(U(+-1/sqrt(fan_in)) for kernel and bias), LSTM weights as torch.nn.LSTM (U(+-1/sqrt(m))).
The LSTM keeps torch's layout (gates i, f, g, o; an input and a hidden bias), so PEFT's weights
copy in one to one and the trainable count equals PEFT's (flax's `OptimizedLSTMCell` has one bias
per gate, i.e. fewer parameters than the torch LSTM PEFT uses).

Trainable parameters (`num_trainable_params`): see the formula there. After training, `fold`
computes the [P, H] prompt once: inference and export use plain prompt tuning.
"""
import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from prompt_jax.prompts.seam import Method

Array = jax.Array
ENCODERS = ("mlp", "lstm")


def num_trainable_params(length: int, emb_dim: int, hidden: int, encoder: str = "mlp",
                         num_layers: int = 2) -> int:
  """P·H + the reparameterisation (PEFT's `PromptEncoder` count for the same configuration)."""
  h, m = emb_dim, hidden
  if encoder == "mlp":
    return length * h + (h * m + m) + (m * m + m) + (m * h + h)
  lstm = 0
  for layer in range(num_layers):
    width = h if layer == 0 else 2 * m
    lstm += 2 * (4 * m * width + 4 * m * m + 8 * m)  # two directions
  return length * h + lstm + (2 * m * 2 * m + 2 * m) + (2 * m * h + h)


def torch_uniform(fan_in: int) -> Callable:
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): torch.nn.Linear's (and LSTM's, fan_in = m) init."""
  bound = 1.0 / math.sqrt(fan_in)
  return lambda rng, shape, dtype=jnp.float32: jax.random.uniform(rng, shape, dtype, -bound,
                                                                   bound)


class Dense(nn.Module):
  """torch.nn.Linear as [in, out] kernel + bias."""
  features: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = torch_uniform(x.shape[-1])
    kernel = self.param("kernel",
                        nn.with_logical_partitioning(init, ("prompt_mlp_in", "prompt_mlp")),
                        (x.shape[-1], self.features))  # [in, out]
    bias = self.param("bias", nn.with_logical_partitioning(init, ("prompt_mlp",)),
                      (self.features,))
    return x @ kernel + bias


class LSTMDirection(nn.Module):
  """One direction of one torch LSTM layer on a [P, in] sequence -> [P, m].

  Parameters are torch's transposed: wi [in, 4m] (weight_ih.T), wh [m, 4m] (weight_hh.T),
  bi, bh [4m]; gates in torch's order i, f, g, o."""
  hidden: int
  reverse: bool = False

  @nn.compact
  def __call__(self, x: Array) -> Array:
    m = self.hidden
    init = torch_uniform(m)
    axes = ("prompt_mlp_in", "prompt_mlp")  # [in, 4m]
    wi = self.param("wi", nn.with_logical_partitioning(init, axes), (x.shape[-1], 4 * m))
    wh = self.param("wh", nn.with_logical_partitioning(init, axes), (m, 4 * m))
    bi = self.param("bi", nn.with_logical_partitioning(init, ("prompt_mlp",)), (4 * m,))
    bh = self.param("bh", nn.with_logical_partitioning(init, ("prompt_mlp",)), (4 * m,))
    xs = x @ wi + bi  # [P, 4m]: the input half of every step at once

    def step(carry, x_t):
      h, c = carry  # [m], [m]
      z = x_t + h @ wh + bh  # [4m]
      i, f, g, o = jnp.split(z, 4)
      c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      h = jax.nn.sigmoid(o) * jnp.tanh(c)
      return (h, c), h

    zeros = jnp.zeros((m,), xs.dtype)
    _, hs = jax.lax.scan(step, (zeros, zeros), xs, reverse=self.reverse)
    return hs  # [P, m] (in sequence order for both directions)


class PTuningPrompt(Method):
  """The [P, H] prompt of PEFT's `PromptEncoder` (see the module docstring)."""
  length: int
  hidden: int
  encoder: str = "mlp"
  num_layers: int = 2
  dropout_rate: float = 0.0  # between LSTM layers (PEFT's encoder_dropout)

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Array:
    del input_tokens, context
    if self.encoder not in ENCODERS:
      raise ValueError(f"unknown P-tuning encoder {self.encoder!r}; choose one of {ENCODERS}")
    width = embedded.shape[-1]
    x = self.param("embedding", nn.with_logical_partitioning(nn.initializers.normal(1.0),
                                                             ("prompt", "prompt_embed")),
                   (self.length, width))  # [P, H]
    if self.encoder == "mlp":
      x = nn.relu(Dense(self.hidden, name="mlp_0")(x))  # [P, m]
      x = nn.relu(Dense(self.hidden, name="mlp_1")(x))  # [P, m]
      return Dense(width, name="mlp_2")(x)  # [P, H]
    for layer in range(self.num_layers):
      if layer:
        x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
      x = jnp.concatenate(
          [LSTMDirection(self.hidden, name=f"lstm_{layer}_fwd")(x),
           LSTMDirection(self.hidden, reverse=True, name=f"lstm_{layer}_bwd")(x)],
          axis=-1)  # [P, 2m]
    x = nn.relu(Dense(2 * self.hidden, name="head_0")(x))  # [P, 2m]
    return Dense(width, name="head_1")(x)  # [P, H]


def fold(params, length: int, width: int, hidden: int, encoder: str = "mlp",
         num_layers: int = 2) -> Array:
  """The [P, H] prompt of trained `PTuningPrompt` params (no dropout), for plain prompt tuning."""
  module = PTuningPrompt(length=length, hidden=hidden, encoder=encoder, num_layers=num_layers)
  return module.apply({"params": params}, None, jnp.zeros((1, 1, width), jnp.float32))
