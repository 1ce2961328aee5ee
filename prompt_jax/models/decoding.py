"""Decoding and scoring from one encoder output: greedy, beam search (KV cache), target scores.

The encoder runs once per example. Every function below has two forms:
  * a composable one taking `encoded` [B, T', H] (from `encode`) and the encoder input tokens
    [B, T] (the decoder recomputes from them the cross-attention mask, prompt positions included,
    via `T5.encoder_input_mask`): `greedy_search`, `beam_search`, `target_log_likelihoods`;
  * a jitted one taking the encoder input tokens: `greedy_decode`, `beam_decode`, `score_targets`.
Beam search repeats the encoder output (and the input tokens) to the beams; decoder key/value
prefixes (deep prefix tuning's decoder hook) are computed by the model for the B * K decoder rows
like for any batch. Target scoring runs the decoder once for C candidate targets of each example,
`jax.vmap`-ed over the candidates with the encoder output shared (not tiled), so the decoder's
cross-attention keys/values of the encoder output are computed once per example too.

Beam search follows t5x's `decoding.beam_search` (the T2T algorithm): each step keeps the 2K
best extensions of the K live beams, the K best of those not ending in EOS stay live, finished
sequences are scored log p / ((5 + length) / 6) ** alpha (length counts the EOS) and the K best
are kept; the search stops when no live beam can beat the worst finished one. One difference: a
sequence ending in EOS joins the finished set only when it ranks among the K best extensions of
its step (the classical rule, as in fairseq or HF), where t5x admits all 2K. So beam size 1 with
alpha = 0 is exactly greedy decoding, and a wider beam never returns a sequence that greedy-like
pruning of its own step would have dropped.
"""
import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from prompt_jax.errors import ConfigError, check_integer

Array = jax.Array
Cache = Mapping[str, Any]
StepFn = Callable[[Array, Cache], Tuple[Array, Cache]]

NEG_INF = -1.0e7  # t5x's: finite, so sums of it stay ordered and never become NaN
DECODING_METHODS = ("greedy", "beam")


@dataclasses.dataclass(frozen=True)
class DecodingConfig:
  """How eval/infer decode tasks without a label set (tasks with one use rank classification).

  method: 'greedy' or 'beam'; beam_size: K >= 1; alpha: the length penalty exponent
  (T5 used K = 4, alpha = 0.6 for its long-output tasks; alpha = 0 ranks by log-likelihood).
  """
  method: str = "greedy"
  beam_size: int = 4
  alpha: float = 0.6

  def __post_init__(self):
    if self.method not in DECODING_METHODS:
      raise ConfigError(f"decoding method must be one of {', '.join(DECODING_METHODS)}, got "
                        f"{self.method!r}")
    check_beam_size(self.beam_size)


def check_beam_size(beam_size: int) -> None:
  check_integer(beam_size, "prompt_jax.decoding_config.beam_size", 1, " (e.g. 4, as T5)")


def brevity_penalty(alpha: float, length, dtype=jnp.float32) -> Array:
  """T5's (GNMT's) length penalty ((5 + length) / 6) ** alpha; scores are log p / this."""
  return jnp.power((5.0 + jnp.asarray(length, dtype)) / 6.0, jnp.asarray(alpha, dtype))


# ===== Building blocks =====

def encode(model, params, encoder_input_tokens: Array,
           task_ids: Optional[Array] = None) -> Array:
  """[B, T] -> encoded [B, T', H] (T' includes prompt positions); `task_ids` [B]: each row's
  task, for multi-task prompts."""
  return model.apply({"params": params}, encoder_input_tokens, enable_dropout=False,
                     task_ids=task_ids, method=model.encode)


def init_cache(model, encoder_input_tokens: Array, max_decode_length: int) -> Cache:
  """A zero cache [batch, max_decode_length, heads, kv] per decoder self-attention layer."""
  batch = encoder_input_tokens.shape[0]
  dummy = jnp.zeros((batch, max_decode_length), jnp.int32)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), encoder_input_tokens, dummy, dummy,
                         enable_dropout=False, decode=True)["cache"])
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def decoder_step(model, params, encoded: Array, encoder_input_tokens: Array,
                 max_decode_length: int) -> StepFn:
  """step(token [N], cache) -> (next-token logits [N, V], cache): one KV-cache decoder step
  for the N rows of `encoded` [N, T', H]."""

  def step(token: Array, cache: Cache) -> Tuple[Array, Cache]:
    logits, mutated = model.apply(
        {"params": params, "cache": cache}, encoded, encoder_input_tokens, token[:, None],
        token[:, None], enable_dropout=False, decode=True, max_decode_length=max_decode_length,
        mutable=["cache"], method=model.decode)  # [N, 1, V]
    return logits[:, 0, :], mutated["cache"]

  return step


def _repeat(x: Array, k: int) -> Array:
  """[B, ...] -> [B * k, ...], each row k times in a row (row b * k + j is example b)."""
  return jnp.repeat(x, k, axis=0) if k > 1 else x


# ===== Greedy =====

def greedy_search(model, params, encoded: Array, encoder_input_tokens: Array,
                  max_decode_length: int, eos_id: int = 1,
                  decoder_start_token_id: int = 0) -> Array:
  """Greedy tokens [B, max_decode_length]; positions after EOS are 0. Stops early once every
  row has produced EOS."""
  batch = encoder_input_tokens.shape[0]
  step = decoder_step(model, params, encoded, encoder_input_tokens, max_decode_length)

  def cond(state):
    i, _, _, done, _ = state
    return (i < max_decode_length) & ~jnp.all(done)

  def body(state):
    i, token, cache, done, out = state
    logits, cache = step(token, cache)
    next_token = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B]
    next_token = jnp.where(done, 0, next_token)
    out = lax.dynamic_update_slice(out, next_token[:, None], (0, i))
    return i + 1, next_token, cache, done | (next_token == eos_id), out

  start = jnp.full((batch,), decoder_start_token_id, jnp.int32)
  out = jnp.zeros((batch, max_decode_length), jnp.int32)
  cache = init_cache(model, encoder_input_tokens, max_decode_length)
  state = (jnp.array(0), start, cache, jnp.zeros((batch,), bool), out)
  return lax.while_loop(cond, body, state)[-1]


@functools.partial(jax.jit, static_argnames=("model", "max_decode_length", "eos_id",
                                             "decoder_start_token_id"))
def greedy_decode(model, params, encoder_input_tokens: Array, max_decode_length: int,
                  eos_id: int = 1, decoder_start_token_id: int = 0,
                  task_ids: Optional[Array] = None) -> Array:
  """Greedy tokens [B, max_decode_length] (0 after EOS); the encoder runs once."""
  encoded = encode(model, params, encoder_input_tokens, task_ids)  # [B, T', H]
  return greedy_search(model, params, encoded, encoder_input_tokens, max_decode_length,
                       eos_id, decoder_start_token_id)


# ===== Beam search =====

def _gather_beams(x: Array, indices: Array) -> Array:
  """x [B, M, ...], indices [B, K] -> [B, K, ...]."""
  return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def _gather_cache(cache: Cache, parents: Array) -> Cache:
  """Reorders the flat [B * K, ...] cache rows to follow `parents` [B, K] (beam indices);
  scalars (the shared cache index) are left alone."""
  batch, k = parents.shape
  rows = (jnp.arange(batch)[:, None] * k + parents).reshape(-1)  # [B * K]
  return jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=0) if x.ndim else x, cache)


def beam_search(model, params, encoded: Array, encoder_input_tokens: Array,
                max_decode_length: int, beam_size: int = 4, alpha: float = 0.6,
                eos_id: int = 1, decoder_start_token_id: int = 0) -> Tuple[Array, Array]:
  """Beam search on the encoder output `encoded` [B, T', H] of `encoder_input_tokens` [B, T].

  Returns (tokens [B, K, max_decode_length], scores [B, K]), best first. tokens end with EOS
  and are 0 after it; a finished sequence's score is its log-likelihood / brevity_penalty(alpha,
  its length including EOS). A row where no sequence finished within max_decode_length returns
  its live beams with their raw log-likelihoods (as t5x). Slots with a score <= NEG_INF / 2 hold
  no sequence (fewer than K finished).
  """
  check_beam_size(beam_size)
  k, length = beam_size, max_decode_length
  batch = encoder_input_tokens.shape[0]
  step = decoder_step(model, params, _repeat(encoded, k), _repeat(encoder_input_tokens, k),
                      length)
  cache = init_cache(model, _repeat(encoder_input_tokens, k), length)
  score_dtype = jnp.promote_types(model.config.dtype, jnp.float32)  # float64 in x64 references
  neg_inf = jnp.asarray(NEG_INF, score_dtype)
  real = lambda s: s > NEG_INF / 2  # a candidate made of actual tokens

  # Sequences carry the start token at position 0: [B, K, 1 + L].
  live_seqs = jnp.zeros((batch, k, length + 1), jnp.int32).at[:, :, 0].set(decoder_start_token_id)
  live_logp = jnp.tile(jnp.asarray([0.0] + [NEG_INF] * (k - 1), score_dtype), (batch, 1))
  state = (jnp.array(0), live_seqs, live_logp, jnp.zeros_like(live_seqs),
           jnp.full((batch, k), neg_inf), jnp.zeros((batch, k), bool), cache)

  def best_possible(live_logp, i):
    # Log-probabilities only fall as a beam grows; for alpha >= 0 the penalty grows with the
    # length, so a live beam's best normalised score is reached at the longest length (the
    # max over the lengths still possible keeps the bound right for alpha < 0 as well).
    penalty = jnp.maximum(brevity_penalty(alpha, i + 1, score_dtype),
                          brevity_penalty(alpha, length, score_dtype))
    return live_logp[:, 0] / penalty  # [B] (beams are sorted)

  def cond(state):
    i, _, live_logp, _, fin_scores, fin_flags, _ = state
    worst_finished = jnp.where(fin_flags[:, -1], fin_scores[:, -1], neg_inf)  # sorted: last
    done = jnp.all(fin_flags, axis=1) & (worst_finished > best_possible(live_logp, i))
    return (i < length) & ~jnp.all(done)

  def body(state):
    i, live_seqs, live_logp, fin_seqs, fin_scores, fin_flags, cache = state
    tokens = live_seqs[:, :, i].reshape(-1)  # [B * K]
    logits, cache = step(tokens, cache)  # [B * K, V]
    logp = jax.nn.log_softmax(logits.astype(score_dtype)).reshape(batch, k, -1)
    vocab = logp.shape[-1]
    logp = logp + live_logp[:, :, None]  # [B, K, V]
    # The 2K best extensions: even if K of them end in EOS, K live ones remain.
    top_logp, top_index = lax.top_k(logp.reshape(batch, k * vocab), 2 * k)  # [B, 2K]
    parents, top_tokens = top_index // vocab, (top_index % vocab).astype(jnp.int32)
    top_seqs = _gather_beams(live_seqs, parents).at[:, :, i + 1].set(top_tokens)  # [B, 2K, 1+L]
    ended = (top_tokens == eos_id) & real(top_logp)

    # Live: the K best that did not end.
    live_candidates = jnp.where(ended, neg_inf, top_logp)
    live_logp, keep = lax.top_k(live_candidates, k)  # [B, K]
    live_seqs = _gather_beams(top_seqs, keep)
    cache = _gather_cache(cache, jnp.take_along_axis(parents, keep, axis=1))

    # Finished: those that ended among the K best of this step, by penalised score.
    ended &= jnp.arange(2 * k)[None, :] < k
    scores = top_logp / brevity_penalty(alpha, i + 1, score_dtype)
    scores = jnp.where(ended, scores, neg_inf)
    all_scores = jnp.concatenate([fin_scores, scores], axis=1)  # [B, 3K]
    fin_scores, best = lax.top_k(all_scores, k)
    fin_seqs = _gather_beams(jnp.concatenate([fin_seqs, top_seqs], axis=1), best)
    fin_flags = _gather_beams(jnp.concatenate([fin_flags, ended], axis=1), best)
    return i + 1, live_seqs, live_logp, fin_seqs, fin_scores, fin_flags, cache

  _, live_seqs, live_logp, fin_seqs, fin_scores, fin_flags, _ = lax.while_loop(cond, body, state)
  any_finished = jnp.any(fin_flags, axis=1)  # [B]
  seqs = jnp.where(any_finished[:, None, None], fin_seqs, live_seqs)[:, :, 1:]
  scores = jnp.where(any_finished[:, None], fin_scores, live_logp)
  return seqs, scores


@functools.partial(jax.jit, static_argnames=("model", "max_decode_length", "beam_size", "eos_id",
                                             "decoder_start_token_id"))
def beam_decode(model, params, encoder_input_tokens: Array, max_decode_length: int,
                beam_size: int = 4, alpha: float = 0.6, eos_id: int = 1,
                decoder_start_token_id: int = 0,
                task_ids: Optional[Array] = None) -> Tuple[Array, Array]:
  """`beam_search` from the encoder input tokens: (tokens [B, K, L], scores [B, K]), best
  first; the encoder runs once per example (alpha is traced: changing it does not recompile)."""
  encoded = encode(model, params, encoder_input_tokens, task_ids)  # [B, T', H]
  return beam_search(model, params, encoded, encoder_input_tokens, max_decode_length,
                     beam_size, alpha, eos_id, decoder_start_token_id)


# ===== Scoring candidate targets (rank classification) =====

def target_log_likelihoods(model, params, encoded: Array, encoder_input_tokens: Array,
                           targets: Array) -> Array:
  """Summed log-likelihood [B, C] of each of C candidate targets per example, teacher forced.

  targets: [B, C, L] or [C, L] (the same candidates for every example), 0-padded, ending with
  EOS. The decoder runs on [B, L] rows for each candidate against the one `encoded` [B, T', H].
  """
  batch = encoded.shape[0]
  if targets.ndim == 2:
    targets = jnp.broadcast_to(targets[None], (batch,) + targets.shape)  # [B, C, L]

  def one(target):  # [B, L] -> [B]
    decoder_inputs = jnp.pad(target[:, :-1], ((0, 0), (1, 0)))  # shift right, BOS = 0
    logits = model.apply({"params": params}, encoded, encoder_input_tokens, decoder_inputs,
                         target, enable_dropout=False, method=model.decode)  # [B, L, V]
    logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)))
    token = jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]  # [B, L]
    return jnp.sum(token * (target > 0), axis=-1)

  return jax.vmap(one, in_axes=1, out_axes=1)(targets)  # [B, C]


@functools.partial(jax.jit, static_argnames=("model",))
def score_targets(model, params, encoder_input_tokens: Array, targets: Array,
                  task_ids: Optional[Array] = None) -> Array:
  """`target_log_likelihoods` from the encoder input tokens [B, T]: [B, C]; the encoder runs
  once per example, whatever C."""
  encoded = encode(model, params, encoder_input_tokens, task_ids)  # [B, T', H]
  return target_log_likelihoods(model, params, encoded, encoder_input_tokens, targets)
