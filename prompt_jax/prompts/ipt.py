"""IPT, instance-wise prompt tuning: prompts read off each example's own input tokens.

  * random IPT:     a trainable table [V, H] (random init); prompt = table[input_ids[:P]];
  * pretrained IPT: the same, the table initialised from a [V, H] .npy produced by
                    `python -m prompt_jax.prompts.ipt_pretrain` (embedding + TextCNN classifier);
  * encoder IPT:    the (pretrained) table frozen; a trainable encoder (TextCNN, LSTM or MLP)
                    maps the rows of the first ceil(rate·n) real input tokens (n per example;
                    `rate` = sequence utilisation rate) to k = P prompt tokens.
Prompt positions of padding tokens (inputs shorter than P) are masked (`prompt_mask`).
Usable on top of an input-level prompt (`seam.Concat`) and of deep prompts (the layer hook).

Trainable parameters:
  random / pretrained:  V·H                                  (`encoder/prompt/prompt/table`)
  encoder (`encoder/prompt/prompt/text_encoder/...`; the frozen table is
  `encoder/prompt/prompt/frozen_table`), with F filters of widths w, hidden m, k = P:
    textcnn: sum_w (w·H·F + F) + |w|·F·k·H + k·H
    lstm:    4·m·(H + m + 1) + m·k·H + k·H
    mlp:     H·m + m + m·k·H + k·H
"""
import math
import os
from typing import Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax.errors import ConfigError
from prompt_jax.prompts import initializers

Array = jax.Array
ENCODERS = ("textcnn", "lstm", "mlp")


def num_trainable_params(length: int, emb_dim: int, vocab_size: int, mode: str = "lookup",
                         encoder: str = "textcnn", widths: Sequence[int] = (3, 4, 5),
                         filters: int = 100, hidden: int = 256) -> int:
  h, k = emb_dim, length
  if mode == "lookup":
    return vocab_size * emb_dim
  if encoder == "textcnn":
    return sum(w * h * filters + filters for w in widths) + len(widths) * filters * k * h + k * h
  if encoder == "lstm":
    return 4 * hidden * (h + hidden + 1) + hidden * k * h + k * h
  return h * hidden + hidden + hidden * k * h + k * h


def load_table(path: str, vocab_size: int, emb_dim: int) -> np.ndarray:
  """A pretrained IPT table [V, H] from .npy, checked against the model's vocab and width."""
  if not path or not os.path.exists(path):
    raise ConfigError(f"IPT table file {path!r} does not exist")
  table = np.load(path)
  if table.ndim != 2 or table.shape[0] != vocab_size:
    raise ConfigError(f"IPT table {path!r} has shape {table.shape}: its vocabulary "
                      f"({table.shape[0]} rows) differs from the model's vocab_size={vocab_size}")
  if table.shape[1] != emb_dim:
    raise ConfigError(f"IPT table {path!r} has width {table.shape[1]}, the model's emb_dim is "
                      f"{emb_dim}")
  return table.astype(np.float32)


def table_init(path: str, vocab_size: int, emb_dim: int) -> initializers.PromptInit:
  return initializers.array_init(load_table(path, vocab_size, emb_dim), f"IPT table {path!r}")


class TextCNN(nn.Module):
  """Kim's CNN: [B, T, H] rows, [B, T] validity -> [B, |widths|·F] max-pooled features."""
  widths: Tuple[int, ...] = (3, 4, 5)
  filters: int = 100

  @nn.compact
  def __call__(self, rows: Array, valid: Array) -> Array:
    rows = jnp.where(valid[..., None], rows, 0.0)  # unused rows must not leak into windows
    feats = []
    for w in self.widths:
      kernel = self.param(f"conv{w}_kernel", nn.with_logical_partitioning(
          nn.initializers.lecun_normal(), ("prompt_kernel", "prompt_embed", "prompt_mlp")),
                          (w, rows.shape[-1], self.filters))
      bias = self.param(f"conv{w}_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("prompt_mlp",)), (self.filters,))
      x = jax.lax.conv_general_dilated(rows, kernel, (1,), "SAME",
                                       dimension_numbers=("NWC", "WIO", "NWC"))  # [B, T, F]
      x = nn.relu(x + bias)
      x = jnp.where(valid[..., None], x, -jnp.inf).max(axis=1)  # [B, F]
      feats.append(jnp.where(jnp.isfinite(x), x, 0.0))
    return jnp.concatenate(feats, axis=-1)  # [B, |widths|·F]


class LSTM(nn.Module):
  """A one-layer LSTM; returns the hidden state after each example's last valid row [B, m]."""
  hidden: int

  @nn.compact
  def __call__(self, rows: Array, valid: Array) -> Array:
    h_dim, m = rows.shape[-1], self.hidden
    init = nn.initializers.lecun_normal()
    wi = self.param("wi", nn.with_logical_partitioning(init, ("prompt_embed", "prompt_mlp")),
                    (h_dim, 4 * m))
    wh = self.param("wh", nn.with_logical_partitioning(init, ("prompt_mlp", "prompt_mlp")),
                    (m, 4 * m))
    b = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("prompt_mlp",)),
                   (4 * m,))
    xs = rows @ wi + b  # [B, T, 4m]

    def step(carry, inp):
      h, c = carry
      x, ok = inp  # [B, 4m], [B]
      i, f, g, o = jnp.split(x + h @ wh, 4, axis=-1)
      c2 = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
      h2 = nn.sigmoid(o) * jnp.tanh(c2)
      keep = ok[:, None]
      return (jnp.where(keep, h2, h), jnp.where(keep, c2, c)), None
    zeros = jnp.zeros(rows.shape[:1] + (m,), rows.dtype)
    (h, _), _ = jax.lax.scan(step, (zeros, zeros),
                             (jnp.swapaxes(xs, 0, 1), jnp.swapaxes(valid, 0, 1)))
    return h  # [B, m]


def _dense(module, name, x, features, in_axis="prompt_mlp"):
  kernel = module.param(f"{name}_kernel", nn.with_logical_partitioning(
      nn.initializers.lecun_normal(), (in_axis, "prompt_embed")), (x.shape[-1], features))
  bias = module.param(f"{name}_bias", nn.with_logical_partitioning(
      nn.initializers.zeros, ("prompt_embed",)), (features,))
  return x @ kernel + bias


class TextEncoder(nn.Module):
  """Table rows of the used input tokens [B, T, H] -> k prompt tokens [B, k, H]."""
  length: int
  kind: str = "textcnn"
  widths: Tuple[int, ...] = (3, 4, 5)
  filters: int = 100
  hidden: int = 256

  @nn.compact
  def __call__(self, rows: Array, valid: Array) -> Array:
    h_dim = rows.shape[-1]
    if self.kind == "textcnn":
      feats = TextCNN(tuple(self.widths), self.filters, name="cnn")(rows, valid)
    elif self.kind == "lstm":
      feats = LSTM(self.hidden, name="lstm")(rows, valid)
    elif self.kind == "mlp":
      v = valid.astype(rows.dtype)[..., None]
      pooled = (rows * v).sum(1) / jnp.maximum(v.sum(1), 1.0)  # [B, H]
      feats = nn.relu(_dense(self, "hidden", pooled, self.hidden, "prompt_embed"))
    else:
      raise ValueError(f"IPT encoder must be one of {ENCODERS}, got {self.kind!r}")
    out = _dense(self, "out", feats, self.length * h_dim)  # [B, k·H]
    return out.reshape(-1, self.length, h_dim)  # [B, k, H]


class IPT(nn.Module):
  """Instance-wise prompt: [B, P, H] from the example's own tokens (see module docstring)."""
  length: int
  vocab_size: int
  mode: str = "lookup"  # "lookup" (random / pretrained IPT) or "encoder"
  table_init: initializers.PromptInit = initializers.normal_init(0.5)
  encoder: str = "textcnn"
  rate: float = 1.0
  widths: Tuple[int, ...] = (3, 4, 5)
  filters: int = 100
  hidden: int = 256

  def _table(self, name: str, emb_dim: int) -> Array:
    return self.param(name, nn.with_logical_partitioning(self.table_init,
                                                          ("prompt_vocab", "prompt_embed")),
                      (self.vocab_size, emb_dim))  # [V, H]

  def _first_tokens(self, input_tokens: Array) -> Array:
    """[B, P] the first P input tokens, padded with 0 when the input is shorter than P."""
    first = input_tokens[:, :self.length]
    return jnp.pad(first, ((0, 0), (0, self.length - first.shape[1])))

  def prompt_mask(self, input_tokens: Array) -> Array:
    """[B, P]: lookup prompts are masked where the input is padding."""
    if self.mode == "lookup":
      return self._first_tokens(input_tokens) > 0
    return jnp.ones((input_tokens.shape[0], self.length), bool)

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True) -> Array:
    del deterministic
    emb_dim = embedded.shape[-1]
    if self.mode == "lookup":
      # P > inputs length only pads (masked); `seam.check_prompt_length(...,
      # reads_input_tokens=True)` rejects such a run configuration up front.
      table = self._table("table", emb_dim)
      return jnp.take(table, self._first_tokens(input_tokens), axis=0)  # [B, P, H]
    if self.mode != "encoder":
      raise ValueError(f"IPT mode must be 'lookup' or 'encoder', got {self.mode!r}")
    if not 0 < self.rate <= 1:
      raise ValueError(f"IPT sequence utilisation rate must be in (0, 1], got {self.rate}")
    table = jax.lax.stop_gradient(self._table("frozen_table", emb_dim))
    rows = jnp.take(table, input_tokens, axis=0)  # [B, T, H]
    n = (input_tokens > 0).sum(1, keepdims=True)  # [B, 1]
    used = jnp.ceil(self.rate * n).astype(jnp.int32)  # [B, 1]
    valid = (jnp.arange(input_tokens.shape[1])[None] < used) & (input_tokens > 0)  # [B, T]
    return TextEncoder(self.length, self.encoder, tuple(self.widths), self.filters, self.hidden,
                       name="text_encoder")(rows, valid)  # [B, k, H]


def used_rows(num_tokens: int, rate: float) -> int:
  """How many input rows encoder IPT reads for an example of `num_tokens` real tokens."""
  return int(math.ceil(rate * num_tokens))
