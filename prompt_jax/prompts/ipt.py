"""IPT, instance-wise prompt tuning (Jiang et al. 2022): prompts read off each example's own input.

  * random IPT:     a trainable table [V, H] (random init); prompt = table[input_ids[:P]];
  * pretrained IPT: the same, the table initialised from a [V, H] .npy produced by
                    `prompt-jax ipt-pretrain` (embedding + text classifier);
  * encoder IPT:    the pretrained table frozen and the pretrained classifier network (TextCNN,
                    LSTM or MLP, saved beside the table by ipt_pretrain) trained: it maps the rows
                    of the first ceil(rate·n) real input tokens (n per example; `rate` = sequence
                    utilisation rate) to k = P prompt tokens through a new output layer.
The networks, as the paper describes them: TextCNN = convolutions of widths w (F filters each,
max-pooled) + one linear layer; MLP = three linear layers on the mean row; LSTM = three LSTM
layers + three linear layers. The last linear layer is the classifier's head while pretraining
and the prompt head (-> k·H) in IPT; everything before it is the pretrained network.
Prompt positions of padding tokens (inputs shorter than P) are masked (`prompt_mask`).
Usable on top of an input-level prompt (`seam.Concat`) and as the source of per-layer prefixes
(`prefix.DeepPrefix(source=...)`, "prefix tuning + IPT").

Trainable parameters, with F filters of widths w, hidden m, k = P:
  random / pretrained:  V·H                                  (`encoder/prompt/prompt/table`)
  encoder (`.../text_encoder/...`; the frozen table is `.../frozen_table`):
    textcnn: sum_w (w·H·F + F) + |w|·F·k·H + k·H
    lstm:    4m(H + m + 1) + 2·4m(2m + 1) + 2(m² + m) + m·k·H + k·H
    mlp:     H·m + m + m² + m + m·k·H + k·H
"""
import json
import math
import os
from typing import Callable, Dict, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax import npy
from prompt_jax.errors import ConfigError
from prompt_jax.prompts import initializers
from prompt_jax.prompts.seam import Method

Array = jax.Array
ENCODERS = ("textcnn", "lstm", "mlp")
LSTM_LAYERS = 3
NETWORK_SUFFIX = ".network.npz"
# path inside the text encoder ("cnn/conv3_kernel") -> the pretrained value's initializer, or None
Pretrained = Optional[Callable[[str], Optional[initializers.PromptInit]]]


def network_params(encoder: str, emb_dim: int, widths: Sequence[int] = (3, 4, 5),
                   filters: int = 100, hidden: int = 256) -> int:
  """Parameters of the network before the output layer."""
  h, m = emb_dim, hidden
  if encoder == "textcnn":
    return sum(w * h * filters + filters for w in widths)
  if encoder == "lstm":
    return 4 * m * (h + m + 1) + (LSTM_LAYERS - 1) * 4 * m * (2 * m + 1) + 2 * (m * m + m)
  return h * m + m + m * m + m


def features(encoder: str, widths: Sequence[int] = (3, 4, 5), filters: int = 100,
             hidden: int = 256) -> int:
  """Width of the network's output (the input of the output layer)."""
  return len(widths) * filters if encoder == "textcnn" else hidden


def num_trainable_params(length: int, emb_dim: int, vocab_size: int, mode: str = "lookup",
                         encoder: str = "textcnn", widths: Sequence[int] = (3, 4, 5),
                         filters: int = 100, hidden: int = 256) -> int:
  if mode == "lookup":
    return vocab_size * emb_dim
  head = features(encoder, widths, filters, hidden) * length * emb_dim + length * emb_dim
  return network_params(encoder, emb_dim, widths, filters, hidden) + head


def load_table(path: str, vocab_size: int, emb_dim: int) -> np.ndarray:
  """A pretrained IPT table [V, H] from .npy, checked against the model's vocab and width."""
  table = npy.load(path, f"IPT_TABLE_FILE {path!r}",
                   "write the table with prompt-jax ipt-pretrain --out=...")
  if table.ndim != 2:
    raise ConfigError(f"IPT table {path!r} has shape {table.shape}, not a table [V, H] = "
                      f"[{vocab_size}, {emb_dim}]")
  if table.shape[0] != vocab_size:
    raise ConfigError(f"IPT table {path!r} has shape {table.shape}: its vocabulary "
                      f"({table.shape[0]} rows) differs from the model's vocab_size={vocab_size}")
  if table.shape[1] != emb_dim:
    raise ConfigError(f"IPT table {path!r} has width {table.shape[1]}, the model's emb_dim is "
                      f"{emb_dim}")
  return table.astype(np.float32)


def table_init(path: str, vocab_size: int, emb_dim: int) -> initializers.PromptInit:
  return initializers.array_init(load_table(path, vocab_size, emb_dim), f"IPT table {path!r}")


# ===== The pretrained network beside the table =====

def network_path(table_path: str) -> str:
  """Where ipt_pretrain saves the classifier network of `table_path` (x.npy -> x.network.npz)."""
  root = table_path[:-4] if table_path.endswith(".npy") else table_path
  return root + NETWORK_SUFFIX


def save_network(table_path: str, params: Dict[str, np.ndarray], *, encoder: str,
                 widths: Sequence[int], filters: int, hidden: int) -> str:
  """Writes the network's parameters (flat 'a/b' paths, output layer excluded) and its kind."""
  meta = dict(encoder=encoder, widths=list(widths), filters=filters, hidden=hidden)
  path = network_path(table_path)
  arrays = {k: np.asarray(v, np.float32) for k, v in params.items()}
  with open(path, "wb") as f:
    np.savez(f, __meta__=np.asarray(json.dumps(meta)), **arrays)
  return path


def load_network(table_path: str, *, encoder: str, widths: Sequence[int], filters: int,
                 hidden: int) -> Dict[str, np.ndarray]:
  """The pretrained network saved beside `table_path`, checked against the chosen encoder."""
  path = network_path(table_path)
  if not os.path.exists(path):
    raise ConfigError(f"encoder IPT needs the pretrained network saved beside the table: "
                      f"{path!r} does not exist; run prompt-jax ipt-pretrain "
                      f"--encoder={encoder} (it writes both)")
  redo = f"run prompt-jax ipt-pretrain --encoder={encoder} again (it writes both)"
  arrays = npy.load_archive(path, f"IPT pretrained network {path!r}", redo)
  try:
    meta = json.loads(str(arrays.pop("__meta__")))
  except (KeyError, ValueError) as e:
    raise ConfigError(f"IPT pretrained network {path!r} has no readable __meta__ record of "
                      f"its encoder; {redo}") from e
  if (not isinstance(meta, dict) or meta.get("encoder") not in ("textcnn", "lstm", "mlp")
      or any(k not in meta for k in ("widths", "filters", "hidden"))):
    raise ConfigError(f"IPT pretrained network {path!r}'s __meta__ record does not name its "
                      f"encoder, widths, filters and hidden; {redo}")
  want = dict(encoder=encoder, widths=list(widths), filters=filters, hidden=hidden)
  if meta["encoder"] != encoder:
    raise ConfigError(f"IPT table {table_path!r}'s pretrained network is a {meta['encoder']} "
                      f"but IPT_ENCODER={encoder!r}; set IPT_ENCODER={meta['encoder']!r} or "
                      f"pretrain a {encoder} table")
  relevant = {"textcnn": ("widths", "filters"), "lstm": ("hidden",), "mlp": ("hidden",)}[encoder]
  for key in relevant:
    if meta[key] != want[key]:
      raise ConfigError(f"IPT table {table_path!r}'s pretrained {encoder} has {key}="
                        f"{meta[key]}, the IPT encoder is configured with {key}={want[key]}; "
                        f"use {key}={meta[key]}")
  return arrays


def pretrained_lookup(arrays: Dict[str, np.ndarray]) -> Callable[[str], initializers.PromptInit]:
  """Pretrained: each network parameter's initializer returns its pretrained value."""
  def lookup(path: str):
    if path not in arrays:
      return None
    return initializers.array_init(arrays[path], f"pretrained IPT network parameter {path!r}")
  return lookup


# ===== Networks =====

def _param(module, pretrained: Pretrained, path: str, name: str, init, shape, axes):
  """A parameter initialised from the pretrained network when it has one at `path/name`."""
  full = f"{path}/{name}" if path else name
  found = pretrained(full) if pretrained is not None else None
  return module.param(name, nn.with_logical_partitioning(found or init, axes), shape)


class TextCNN(nn.Module):
  """Kim's CNN: [B, T, H] rows, [B, T] validity -> [B, |widths|·F] max-pooled features."""
  widths: Tuple[int, ...] = (3, 4, 5)
  filters: int = 100
  pretrained: Pretrained = None

  @nn.compact
  def __call__(self, rows: Array, valid: Array) -> Array:
    rows = jnp.where(valid[..., None], rows, 0.0)  # unused rows must not leak into windows
    feats = []
    for w in self.widths:
      p = lambda *a: _param(self, self.pretrained, "cnn", *a)
      kernel = p(f"conv{w}_kernel", nn.initializers.lecun_normal(),
                 (w, rows.shape[-1], self.filters), ("prompt_kernel", "prompt_embed", "prompt_mlp"))
      bias = p(f"conv{w}_bias", nn.initializers.zeros, (self.filters,), ("prompt_mlp",))
      x = jax.lax.conv_general_dilated(rows, kernel, (1,), "SAME",
                                       dimension_numbers=("NWC", "WIO", "NWC"))  # [B, T, F]
      x = nn.relu(x + bias)
      x = jnp.where(valid[..., None], x, -jnp.inf).max(axis=1)  # [B, F]
      feats.append(jnp.where(jnp.isfinite(x), x, 0.0))
    return jnp.concatenate(feats, axis=-1)  # [B, |widths|·F]


class LSTM(nn.Module):
  """Stacked LSTM layers; returns the top layer's hidden state after each example's last valid
  row [B, m]."""
  hidden: int
  num_layers: int = LSTM_LAYERS
  pretrained: Pretrained = None

  @nn.compact
  def __call__(self, rows: Array, valid: Array) -> Array:
    m = self.hidden
    init = nn.initializers.lecun_normal()
    xs = rows  # [B, T, in]
    h = None
    for layer in range(self.num_layers):
      p = lambda *a, layer=layer: _param(self, self.pretrained, "lstm", f"layer{layer}_{a[0]}",
                                         *a[1:])
      wi = p("wi", init, (xs.shape[-1], 4 * m), ("prompt_embed", "prompt_mlp"))
      wh = p("wh", init, (m, 4 * m), ("prompt_mlp_in", "prompt_mlp"))
      b = p("bias", nn.initializers.zeros, (4 * m,), ("prompt_mlp",))
      gates_in = xs @ wi + b  # [B, T, 4m]

      def step(carry, inp, wh=wh):
        h, c = carry
        x, ok = inp  # [B, 4m], [B]
        i, f, g, o = jnp.split(x + h @ wh, 4, axis=-1)
        c2 = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
        h2 = nn.sigmoid(o) * jnp.tanh(c2)
        keep = ok[:, None]
        h, c = jnp.where(keep, h2, h), jnp.where(keep, c2, c)
        return (h, c), h
      zeros = jnp.zeros(rows.shape[:1] + (m,), rows.dtype)
      (h, _), hs = jax.lax.scan(step, (zeros, zeros),
                                (jnp.swapaxes(gates_in, 0, 1), jnp.swapaxes(valid, 0, 1)))
      xs = jnp.swapaxes(hs, 0, 1)  # [B, T, m] the next layer's input
    return h  # [B, m]


def _dense(module, pretrained: Pretrained, name, x, features, in_axis="prompt_mlp_in"):
  """A hidden linear layer [in, m] (in_axis: 'prompt_embed' from the rows, else m -> m)."""
  kernel = _param(module, pretrained, "", f"{name}_kernel", nn.initializers.lecun_normal(),
                  (x.shape[-1], features), (in_axis, "prompt_mlp"))
  bias = _param(module, pretrained, "", f"{name}_bias", nn.initializers.zeros, (features,),
                ("prompt_mlp",))
  return x @ kernel + bias  # [B, features]


class TextEncoder(nn.Module):
  """Table rows of the used input tokens [B, T, H] -> [B, out_features]: the network, then the
  output layer `out` (the classifier's head, or IPT's prompt head)."""
  out_features: int
  kind: str = "textcnn"
  widths: Tuple[int, ...] = (3, 4, 5)
  filters: int = 100
  hidden: int = 256
  dropout_rate: float = 0.0  # before the output layer (Kim's CNN classifier uses 0.5)
  pretrained: Pretrained = None  # the network's pretrained values (not the output layer's)

  @nn.compact
  def __call__(self, rows: Array, valid: Array, deterministic: bool = True) -> Array:
    dense = lambda name, x, n, in_axis="prompt_mlp_in": _dense(self, self.pretrained, name, x,
                                                               n, in_axis)
    if self.kind == "textcnn":
      feats = TextCNN(tuple(self.widths), self.filters, self.pretrained, name="cnn")(rows, valid)
    elif self.kind == "lstm":
      h = LSTM(self.hidden, LSTM_LAYERS, self.pretrained, name="lstm")(rows, valid)  # [B, m]
      feats = nn.relu(dense("hidden_2", nn.relu(dense("hidden_1", h, self.hidden)), self.hidden))
    elif self.kind == "mlp":
      v = valid.astype(rows.dtype)[..., None]
      pooled = (rows * v).sum(1) / jnp.maximum(v.sum(1), 1.0)  # [B, H]
      feats = nn.relu(dense("hidden_1", pooled, self.hidden, "prompt_embed"))
      feats = nn.relu(dense("hidden_2", feats, self.hidden))
    else:
      raise ValueError(f"IPT encoder must be one of {ENCODERS}, got {self.kind!r}")
    feats = nn.Dropout(self.dropout_rate)(feats, deterministic=deterministic)
    # The output layer is never pretrained for IPT (its width is the prompt's, not the classes').
    kernel = self.param("out_kernel", nn.with_logical_partitioning(
        nn.initializers.lecun_normal(), ("prompt_mlp", "prompt_embed")),
                        (feats.shape[-1], self.out_features))
    bias = self.param("out_bias", nn.with_logical_partitioning(
        nn.initializers.zeros, ("prompt_embed",)), (self.out_features,))
    return feats @ kernel + bias  # [B, out_features]


def used_valid(input_tokens: Array, rate: float) -> Array:
  """[B, T]: the first ceil(rate·n) real tokens of each example (n real tokens)."""
  n = (input_tokens > 0).sum(1, keepdims=True)  # [B, 1]
  used = jnp.ceil(rate * n).astype(jnp.int32)  # [B, 1]
  return (jnp.arange(input_tokens.shape[1])[None] < used) & (input_tokens > 0)


class IPT(Method):
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
  pretrained: Pretrained = None  # encoder mode: the pretrained network (ipt_pretrain)

  def _table(self, name: str, emb_dim: int) -> Array:
    return self.param(name, nn.with_logical_partitioning(self.table_init,
                                                          ("prompt_vocab", "prompt_embed")),
                      (self.vocab_size, emb_dim))  # [V, H]

  def _first_tokens(self, input_tokens: Array) -> Array:
    """[B, P] the first P input tokens, padded with 0 when the input is shorter than P."""
    first = input_tokens[:, :self.length]
    return jnp.pad(first, ((0, 0), (0, self.length - first.shape[1])))

  def prompt_mask(self, input_tokens: Array) -> Optional[Array]:
    """[B, P]: lookup prompts are masked where the input is padding."""
    if self.mode == "lookup":
      return self._first_tokens(input_tokens) > 0
    return None

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Array:
    del deterministic, context
    emb_dim = embedded.shape[-1]
    if self.mode == "lookup":
      # P > inputs length only pads (masked); the spec's check_fits rejects such a run
      # configuration up front.
      table = self._table("table", emb_dim)
      return jnp.take(table, self._first_tokens(input_tokens), axis=0)  # [B, P, H]
    if self.mode != "encoder":
      raise ValueError(f"IPT mode must be 'lookup' or 'encoder', got {self.mode!r}")
    if not 0 < self.rate <= 1:
      raise ValueError(f"IPT sequence utilisation rate must be in (0, 1], got {self.rate}")
    table = jax.lax.stop_gradient(self._table("frozen_table", emb_dim))
    rows = jnp.take(table, input_tokens, axis=0)  # [B, T, H]
    valid = used_valid(input_tokens, self.rate)  # [B, T]
    out = TextEncoder(self.length * emb_dim, self.encoder, tuple(self.widths), self.filters,
                      self.hidden, pretrained=self.pretrained, name="text_encoder")(rows, valid)
    return out.reshape(-1, self.length, emb_dim)  # [B, k, H]


def used_rows(num_tokens: int, rate: float) -> int:
  """How many input rows encoder IPT reads for an example of `num_tokens` real tokens."""
  return int(math.ceil(rate * num_tokens))
