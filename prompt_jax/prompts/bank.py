"""A prompt bank: N input-independent prompts served by one frozen model, a prompt per row.

Lester et al. (2021, Section 7) evaluate an ensemble of N prompts trained on one frozen model by
replicating each example across the N prompts in one batch; a bank also serves a mixed batch
where each example names its own prompt (one frozen model, many tasks). Both are rows of
(example, prompt index):

  table    [N, P_max, H]  the prompts, each left-aligned and zero-padded to the longest
  lengths  [N]            P_i, the real positions of each prompt
  row_prompt [E, K]       the prompt of each of K rows per example (K = N for an ensemble,
                          K = 1 for a mixed batch)

`bank_encode` embeds each example's tokens once ([E, T, H]) and broadcasts them to its K rows
([E * K, T, H]); each row's prompt is `table[row_prompt]` with the mask `k < P_i`, placed by its
prompt's placement (prefix / after_bos / suffix / between, per row). Padded prompt positions are
then moved behind the last real position ("compaction", a stable sort of each row by validity),
so every real position sits exactly where it sits when that prompt is evaluated alone: T5's
relative position biases see the same distances and the masked positions receive no attention.
A row's outputs thus equal its prompt's alone (up to float32 summation order: greedy tokens equal,
scores within rounding; tests/prompts/test_bank.py). When all prompts have one length, every
placed row is already laid out as alone and compaction is skipped (`PromptTable.layout`).

The encoder output comes with `mask_tokens` [R, T'] (1 at real positions, 0 elsewhere), which
stands in for the encoder input tokens of the plain (prompt-less) T5's decoder: its
cross-attention mask is `tokens > 0`, so `models.decoding`'s greedy_search / beam_search /
target_log_likelihoods decode bank rows unchanged. Nothing here imports TensorFlow.
"""
import dataclasses
import functools
from typing import Any, Callable, Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax.errors import ConfigError
from prompt_jax.models import layers
from prompt_jax.models import decoding

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class BankEntry:
  """One input-independent prompt: a [P, H] array and where it goes."""
  name: str
  prompt: np.ndarray  # [P, H] float32
  placement: Any = "prefix"  # a placement function or name (seam.PLACEMENTS)
  source: str = ""  # the file or MODEL_DIR it came from (messages, reports)


@dataclasses.dataclass(frozen=True)
class PromptTable:
  """The bank as arrays (see the module docstring)."""
  names: Tuple[str, ...]
  table: np.ndarray  # [N, P_max, H]
  lengths: np.ndarray  # [N] int32
  placement_ids: np.ndarray  # [N] int32 index into `placements`
  placements: Tuple[Any, ...]  # distinct placement functions

  @property
  def size(self) -> int:
    return len(self.names)

  @property
  def layout(self) -> Tuple[Tuple[Any, ...], bool]:
    """The static part of the jitted functions: (placements, ragged). With prompts of one length
    every placed row is already laid out as alone, and compaction is skipped."""
    return self.placements, bool(len(set(self.lengths.tolist())) > 1)

  def index(self, name: str) -> int:
    if name not in self.names:
      raise ConfigError(f"an example names prompt {name!r}, which is not in the prompt bank "
                        f"(it has {', '.join(self.names)}); add it to PROMPT_BANK")
    return self.names.index(name)


def build_table(entries: Sequence[BankEntry], width: int = None) -> PromptTable:
  """[N, P_max, H] of the entries (checked: N >= 1, one width H, distinct names)."""
  from prompt_jax.prompts import seam  # pylint: disable=g-import-not-at-top
  if not entries:
    raise ConfigError("the prompt bank is empty (N = 0): give at least one prompt "
                      "(ENSEMBLE_PROMPTS / PROMPT_BANK)")
  names = [e.name for e in entries]
  dupes = sorted({n for n in names if names.count(n) > 1})
  if dupes:
    raise ConfigError(f"prompt name(s) {', '.join(dupes)} appear twice in the bank: give each "
                      f"prompt its own name")
  for e in entries:
    if e.prompt.ndim != 2 or e.prompt.shape[0] < 1:
      raise ConfigError(f"prompt {e.name!r} ({e.source or 'array'}) has shape "
                        f"{list(e.prompt.shape)}; a bank prompt is [P, H] with P >= 1")
  widths = {e.prompt.shape[1] for e in entries}
  if width is not None:
    widths.add(width)
  if len(widths) > 1:
    detail = ", ".join(f"{e.name} H={e.prompt.shape[1]}" for e in entries)
    model = f", the frozen model's emb_dim is {width}" if width is not None else ""
    raise ConfigError(f"prompts of different widths in one bank ({detail}{model}): every prompt "
                      f"must have the frozen model's width H")
  p_max = max(e.prompt.shape[0] for e in entries)
  h = entries[0].prompt.shape[1]
  table = np.zeros((len(entries), p_max, h), np.float32)
  for i, e in enumerate(entries):
    table[i, :e.prompt.shape[0]] = e.prompt
  placements, ids = [], []
  for e in entries:
    fn = seam.get_placement(e.placement)
    if fn not in placements:
      placements.append(fn)
    ids.append(placements.index(fn))
  return PromptTable(names=tuple(names), table=table,
                     lengths=np.array([e.prompt.shape[0] for e in entries], np.int32),
                     placement_ids=np.array(ids, np.int32), placements=tuple(placements))


def compact(values: Array, mask: Array) -> Tuple[Array, Array]:
  """Moves each row's valid positions to the front in order (masked ones behind them):
  values [R, T', H], mask [R, T'] -> the same, reordered."""
  order = jnp.argsort(~mask, axis=1, stable=True)  # [R, T'] valid first, stable
  values = jnp.take_along_axis(values, order[..., None], axis=1)
  return values, jnp.take_along_axis(mask, order, axis=1)


def _bank_encoder(module, tokens: Array, table: Array, lengths: Array, placement_ids: Array,
                  row_prompt: Array, layout) -> Tuple[Array, Array]:
  """Run inside `model.apply(..., method=...)` of a prompt-less T5: (encoded [R, T', H],
  valid [R, T'])."""
  cfg = module.config
  encoder = module.encoder
  placements, ragged = layout
  examples, k = row_prompt.shape
  embedded = module.token_embedder(tokens.astype("int32"))  # [E, T, H]: once per example
  rows = examples * k
  embedded = jnp.broadcast_to(embedded[:, None], (examples, k) + embedded.shape[1:])
  embedded = embedded.reshape((rows,) + embedded.shape[2:])  # [R, T, H]
  row_tokens = jnp.broadcast_to(tokens[:, None], (examples, k, tokens.shape[1]))
  row_tokens = row_tokens.reshape(rows, tokens.shape[1])  # [R, T]
  index = row_prompt.reshape(rows)  # [R]
  prompt = jnp.take(table, index, axis=0)  # [R, P_max, H]
  prompt_mask = jnp.arange(table.shape[1])[None, :] < jnp.take(lengths, index)[:, None]
  x, valid = None, None
  row_placement = jnp.take(placement_ids, index)  # [R]
  for p, place in enumerate(placements):
    xp, vp = place(prompt, embedded, row_tokens, prompt_mask)  # [R, T', H], [R, T']
    if x is None:
      x, valid = xp, vp
    else:
      use = (row_placement == p)[:, None]
      x, valid = jnp.where(use[..., None], xp, x), jnp.where(use, vp, valid)
  if ragged:
    x, valid = compact(x, valid)
  x = layers.constrain(x.astype(cfg.dtype), ("batch", "length", "embed"))
  bias = encoder.attention_bias(layers.make_attention_mask(valid, valid, dtype=cfg.dtype),
                                x.shape[-2])  # [R, heads, T', T'], once for all layers
  for layer in encoder.layers:
    x = layer(x, bias, None, True)
  return encoder.encoder_norm(x), valid  # [R, T', H], [R, T']


def encode(model, params, tokens: Array, bank: Dict[str, Array], row_prompt: Array,
           layout) -> Tuple[Array, Array]:
  """(encoded [E * K, T', H], mask_tokens [E * K, T'] int32) of `tokens` [E, T] under the
  prompts `row_prompt` [E, K]; `bank` = {'table', 'lengths', 'placement_ids'} as arrays,
  `layout` = `PromptTable.layout`. `model` is the frozen T5 without a prompt, `params` its
  parameters."""
  encoded, valid = model.apply({"params": params}, tokens, bank["table"], bank["lengths"],
                               bank["placement_ids"], row_prompt, layout,
                               method=_bank_encoder)
  return encoded, valid.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("model", "layout", "max_decode_length"))
def greedy(model, params, tokens, bank, row_prompt, layout, max_decode_length):
  """Greedy tokens [E * K, max_decode_length] of every (example, prompt) row."""
  encoded, mask_tokens = encode(model, params, tokens, bank, row_prompt, layout)
  return decoding.greedy_search(model, params, encoded, mask_tokens, max_decode_length)


@functools.partial(jax.jit, static_argnames=("model", "layout", "max_decode_length",
                                             "beam_size"))
def beam(model, params, tokens, bank, row_prompt, layout, max_decode_length, beam_size,
         alpha):
  """(best tokens [E * K, L], its score [E * K]) of every row (beam search)."""
  encoded, mask_tokens = encode(model, params, tokens, bank, row_prompt, layout)
  seqs, scores = decoding.beam_search(model, params, encoded, mask_tokens, max_decode_length,
                                      beam_size, alpha)
  return seqs[:, 0], scores[:, 0]


@functools.partial(jax.jit, static_argnames=("model", "layout"))
def score(model, params, tokens, bank, row_prompt, layout, targets):
  """Summed log-likelihood [E * K, C] of the candidate targets [C, L] for every row; the
  encoder runs once per row, the embedding once per example."""
  encoded, mask_tokens = encode(model, params, tokens, bank, row_prompt, layout)
  return decoding.target_log_likelihoods(model, params, encoded, mask_tokens, targets)


def device_bank(table: PromptTable, dtype=jnp.float32) -> Dict[str, Array]:
  """The jit arguments of a table."""
  return {"table": jnp.asarray(table.table, dtype), "lengths": jnp.asarray(table.lengths),
          "placement_ids": jnp.asarray(table.placement_ids)}
