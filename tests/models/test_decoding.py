"""Beam search and target scoring from one encoder output, against teacher-forced references."""
import functools
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.models import decoding
from prompt_jax.models.t5 import Encoder
from prompt_jax.prompts import PromptTuning, prompt_factory
from tests import numerics
from tests.prompts import helpers

TINY = helpers.TINY  # vocab 64, embed 16, 2 + 2 layers
PROMPTED = functools.partial(T5, prompt=prompt_factory(
    functools.partial(PromptTuning, length=3), length=3))


def teacher_forced(model, params, enc, targets):
  """The old rank-classification score (evaluation/inference.py `_score` before this change):
  the full model, encoder included, summed log-likelihood [N] of `targets` [N, L]."""
  decoder_inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))  # shift right, BOS = 0
  logits = model.apply({"params": params}, enc, decoder_inputs, targets, enable_dropout=False)
  logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)))
  token = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [N, L]
  return jnp.sum(token * (targets > 0), axis=-1)


def _in(dtype, model, params):
  """`model` computing in `dtype` with `params` cast to it (float64: inside numerics.float64())."""
  return model.clone(config=model.config.replace(dtype=dtype)), numerics.cast(params, dtype)


def _lengths(tokens):
  """Tokens up to and including the first EOS (all of them if none)."""
  tokens = np.asarray(tokens)
  has_eos = (tokens == 1).any(-1)
  return np.where(has_eos, np.argmax(tokens == 1, axis=-1) + 1, tokens.shape[-1])


def decodable(params, eos=None):
  """`params` of a tiny T5 (any prompt method) changed so the decoder never emits padding (id 0:
  teacher forcing would mask it); EOS (id 1) gets the output column `scale * randn(embed)` of
  `eos = (seed, scale)` (chosen so that greedy rows end at different steps; the tests assert
  they do), or never comes (`eos=None`).

  To rule tokens out, embedding dimension 0 is made a constant feature: every token embeds 1
  there and no decoder sublayer writes to it, so after the final RMS norm it is > 0 at every
  position, and an output column that is -1000 there and 0 elsewhere gives a logit < -100."""
  params = jax.tree_util.tree_map(np.array, params)  # a float32 numpy copy
  params["token_embedder"]["embedding"][:, 0] = 1.0
  for i in range(TINY.num_decoder_layers):
    layer = params["decoder"][f"layers_{i}"]
    for block in (layer["self_attention"]["out"], layer["encoder_decoder_attention"]["out"],
                  layer["mlp"]["wo"]):
      block["kernel"][:, 0] = 0.0
  kernel = params["decoder"]["logits_dense"]["kernel"]
  never = np.zeros(TINY.emb_dim, np.float32)
  never[0] = -1000.0
  kernel[:, 0] = never
  kernel[:, 1] = eos[1] * np.random.RandomState(eos[0]).randn(TINY.emb_dim) if eos else never
  return params


def _random_model(make=T5, seed=0, eos=None):
  """A random tiny T5 (see `decodable`)."""
  model = make(TINY)
  return model, decodable(helpers.init(model, seed), eos)


def _chain_model(log_probs):
  """A tiny T5 whose decoder is a Markov chain over tokens 0..15: next-token logits depend only on
  the previous token, given by `log_probs` {token: {next: log p}} (others get -30).

  Deliberately built: the decoder's attention and MLP outputs are zeroed, so its output is the
  previous token's embedding; embeddings of 0..15 are one-hot, which the final RMS norm scales
  by sqrt(16) = 4, so logits_dense = table / 4 gives logits = table[previous token]."""
  model = T5(TINY)
  params = helpers.init(model, 0)
  table = np.full((16, TINY.vocab_size), -30.0, np.float32)
  for prev, nexts in log_probs.items():
    for nxt, lp in nexts.items():
      table[prev, nxt] = lp
  embedding = np.array(params["token_embedder"]["embedding"])
  embedding[:16] = np.eye(16, dtype=np.float32)
  params["token_embedder"]["embedding"] = embedding
  for i in range(TINY.num_decoder_layers):
    layer = params["decoder"][f"layers_{i}"]
    for block in ("self_attention", "encoder_decoder_attention"):
      layer[block]["out"]["kernel"] = np.zeros_like(layer[block]["out"]["kernel"])
    layer["mlp"]["wo"]["kernel"] = np.zeros_like(layer["mlp"]["wo"]["kernel"])
  params["decoder"]["logits_dense"]["kernel"] = table / 4.0
  return model, params


ln = np.log
# Greedy takes 2 (p .5), then 4 (.2, the best of ten), then EOS (.9): p = .09. Starting with the
# runner-up 3 (.4) and ending (.9) has p = .36. Tokens 5..15 loop through 14 or end (.5 each).
CHAIN = {0: {2: ln(.5), 3: ln(.4), 5: ln(.1)},
         2: {4: ln(.2), **{t: ln(.1) for t in range(6, 14)}},
         3: {1: ln(.9), 5: ln(.1)},
         4: {1: ln(.9), 5: ln(.1)},
         **{t: {1: ln(.5), 14: ln(.5)} for t in range(5, 16)}}
ENC = helpers.batch()[0]  # [4, 8] inputs (the chain ignores them)


def check_scores_are_penalised_log_likelihoods(model, params, alpha, beam_size=4, length=6,
                                                check_float64=True):
  """Beam scores == teacher-forced log-likelihood / ((5 + len) / 6) ** alpha, for every returned
  sequence; bound derived from the teacher-forced float32 reference's own error against float64
  (tests/numerics.py); with `check_float64`, beam search in float64 must agree to that bound at
  float64's unit roundoff with the penalised log-likelihoods of the sequences it returns (its own:
  float32 and float64 are different programs, whose top-k choices may differ on a near-tie).
  Returns (tokens, scores) of the float32 run."""
  tokens, scores = (np.asarray(x) for x in decoding.beam_decode(
      model, params, ENC, length, beam_size=beam_size, alpha=alpha))
  real = scores > decoding.NEG_INF / 2
  assert real[:, 0].all()

  def reference(dtype, tokens):
    """Penalised teacher-forced log-likelihoods [N, K] of `tokens` [N, K, L] in `dtype`."""
    finished = (tokens == 1).any(-1)  # a row with no finished sequence reports raw scores
    penalty = np.where(finished.any(-1, keepdims=True),
                       ((5.0 + _lengths(tokens)) / 6.0) ** alpha, 1.0)
    m, p = _in(dtype, model, params)
    ll = teacher_forced(m, p, jnp.repeat(ENC, beam_size, axis=0),
                        jnp.asarray(tokens.reshape(-1, length)))
    return np.asarray(ll).reshape(tokens.shape[:2]) / penalty

  ref32 = reference(jnp.float32, tokens)
  with numerics.float64():
    ref64 = reference(jnp.float64, tokens)
    if check_float64:
      tokens64, scores64 = (np.asarray(x) for x in decoding.beam_decode(
          *_in(jnp.float64, model, params), ENC, length, beam_size=beam_size, alpha=alpha))
      own64 = reference(jnp.float64, tokens64)
  numerics.assert_close(scores[real], ref32[real], ref64[real], what="beam scores")
  if check_float64:
    real64 = scores64 > decoding.NEG_INF / 2
    np.testing.assert_array_equal(real64, real)  # as many finished / live beams per row
    limit = numerics.bound(ref32[real], ref64[real], eps=numerics.EPS64)
    distance = float(np.abs(scores64[real64] - own64[real64]).max())
    assert distance <= limit, ("beam scores (float64)", distance, limit)
  assert (np.diff(scores, axis=1) <= 0).all(), "beams are sorted best first"
  return tokens, scores


# ===== Beam search =====

def test_beam_finds_a_likelier_sequence_than_greedy_on_a_crafted_chain():
  model, params = _chain_model(CHAIN)
  greedy = np.asarray(decoding.greedy_decode(model, params, ENC, 6))
  np.testing.assert_array_equal(greedy, np.tile([2, 4, 1, 0, 0, 0], (4, 1)))
  tokens, _ = decoding.beam_decode(model, params, ENC, 6, beam_size=4, alpha=0.0)
  best = np.asarray(tokens)[:, 0]
  np.testing.assert_array_equal(best, np.tile([3, 1, 0, 0, 0, 0], (4, 1)))
  # Judged by the teacher-forced model itself: log .36 vs log .09, a margin of log 4.
  ll_beam = np.asarray(teacher_forced(model, params, ENC, jnp.asarray(best)))
  ll_greedy = np.asarray(teacher_forced(model, params, ENC, jnp.asarray(greedy)))
  assert (ll_beam > ll_greedy + 1.0).all(), (ll_beam, ll_greedy)


@pytest.mark.parametrize("case", ["chain", "random", "random_prompted", "never_ends"])
def test_beam_size_1_with_alpha_0_is_greedy(case):
  model, params = {
      "chain": lambda: _chain_model(CHAIN),
      "random": lambda: _random_model(seed=1, eos=(1, 1.0)),
      "random_prompted": lambda: _random_model(PROMPTED, seed=1, eos=(1, 2.0)),
      "never_ends": lambda: _random_model(),
  }[case]()
  # In float64: greedy (argmax of the logits) and beam 1 (top-1 of running sum + log-softmax)
  # are different programs, whose float32 rounding may flip a near-tie.
  with numerics.float64():
    model, params = _in(jnp.float64, model, params)
    greedy = np.asarray(decoding.greedy_decode(model, params, ENC, 8))
    tokens, scores = decoding.beam_decode(model, params, ENC, 8, beam_size=1, alpha=0.0)
  if case.startswith("random"):
    lengths = _lengths(greedy)
    assert len(set(lengths)) > 1 and (greedy == 1).any(), "EOS at several steps: a real test"
  assert tokens.shape == (4, 1, 8) and scores.shape == (4, 1)
  np.testing.assert_array_equal(np.asarray(tokens)[:, 0], greedy)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_scores_equal_teacher_forced_log_likelihood(alpha):
  model, params = _random_model(PROMPTED, seed=1, eos=(0, 1.0))
  tokens, _ = check_scores_are_penalised_log_likelihoods(model, params, alpha)
  assert len(set(_lengths(tokens).ravel())) > 2, "finished at several lengths: alpha matters"


def test_unfinished_rows_return_live_beams_with_raw_log_likelihoods():
  model, params = _random_model()  # EOS out of reach
  tokens, _ = check_scores_are_penalised_log_likelihoods(model, params, alpha=0.6)
  assert not (tokens == 1).any() and (tokens > 0).all()


def test_length_penalty_changes_the_ranking_as_defined():
  model, params = _chain_model(CHAIN)
  best = {}
  for alpha in (0.0, 0.6, 8.0):
    # No float64 cross-check here: the chain's float32 arithmetic is almost exact (one-hot
    # embeddings, zeroed blocks; the reference's own error is ~1 ulp), so the ratio argument of
    # tests/numerics.py does not hold for it; the random-model tests run that check.
    tokens, scores = check_scores_are_penalised_log_likelihoods(model, params, alpha,
                                                                 beam_size=8,
                                                                 check_float64=False)
    best[alpha] = (tokens[0, 0], scores[0, 0])
  np.testing.assert_array_equal(best[0.0][0], [3, 1, 0, 0, 0, 0])  # the likeliest
  np.testing.assert_array_equal(best[0.6][0], [3, 1, 0, 0, 0, 0])
  # A strong penalty favours length: log .36 / (7/6)^8 = -0.30 loses to a 6-token sequence,
  # e.g. 5 14 14 14 14 1: log(.1 * .5^5) / (11/6)^8 = -0.045.
  assert _lengths(best[8.0][0]) == 6
  ll_short = np.log(.36)
  assert best[8.0][1] > ll_short / ((5 + 2) / 6) ** 8


def test_bad_beam_size_and_method_are_one_line_errors():
  model, params = _chain_model(CHAIN)
  for bad in (0, -2):
    with pytest.raises(ConfigError, match=r"beam_size must be >= 1 \(e.g. 4, as T5\), got") as e:
      decoding.beam_decode(model, params, ENC, 4, beam_size=bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="beam_size"):
      decoding.DecodingConfig(method="beam", beam_size=bad)
  with pytest.raises(ConfigError, match="decoding method must be one of greedy, beam, got 'top_k'"):
    decoding.DecodingConfig(method="top_k")


# ===== Target scoring (rank classification) =====

LABELS = jnp.array([[7, 1, 0], [9, 4, 1], [12, 1, 0]])  # [C, L] label tokens + EOS, 0-padded


def _per_label(model, params, enc, labels):
  """The old path: the full model once per label."""
  return jnp.stack([teacher_forced(model, params, enc, jnp.tile(lab[None], (enc.shape[0], 1)))
                    for lab in labels], axis=-1)  # [B, C]


def test_label_scores_equal_the_per_label_full_model():
  model, params = _random_model(PROMPTED)
  enc = ENC
  numerics.check_equivalent(
      lambda dt: decoding.score_targets(*_in(dt, model, params), enc, LABELS),
      lambda dt: _per_label(*_in(dt, model, params), enc, LABELS))
  # Per-example candidates [B, C, L] give the same as shared ones (the same program).
  per_example = jnp.broadcast_to(LABELS[None], (4,) + LABELS.shape)
  np.testing.assert_array_equal(decoding.score_targets(model, params, enc, per_example),
                                decoding.score_targets(model, params, enc, LABELS))


def _encoder_calls(fn, *args):
  """Batch sizes of the Encoder calls made while tracing fn(*args)."""
  calls = []

  def count(next_fun, args, kwargs, context):
    if isinstance(context.module, Encoder) and context.method_name == "__call__":
      calls.append(args[0].shape[0])
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(count):
    jax.make_jaxpr(fn)(*args)
  return calls


def _flops(fn, *args) -> float:
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])


def test_label_scores_run_the_encoder_once_per_example():
  model, params = _random_model(PROMPTED)
  enc, c = ENC, LABELS.shape[0]
  new = functools.partial(decoding.score_targets.__wrapped__, model)
  old = functools.partial(_per_label, model)
  assert _encoder_calls(new, params, enc, LABELS) == [4]  # once, on the 4 examples
  assert _encoder_calls(old, params, enc, LABELS) == [4] * c  # before: once per label
  # The compiled programs agree: the old path (one jitted full-model call per label, as
  # inference.py ran it) costs at least C - 1 more encoder passes than the new one.
  one_label = lambda p, e, t: teacher_forced(model, p, e, t)
  targets = jnp.tile(LABELS[0][None], (4, 1))
  flops_old = c * _flops(one_label, params, enc, targets)
  flops_new = _flops(new, params, enc, LABELS)
  encoder = _flops(functools.partial(decoding.encode, model), params, enc)
  assert flops_old - flops_new >= (c - 1) * encoder, (flops_old, flops_new, encoder)


def test_beam_search_and_label_scores_on_a_4x2_mesh_equal_one_device(tmp_path):
  script = pathlib.Path(__file__).parents[1] / "sharded_decoding_check.py"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = tmp_path / "decoded.npz"
  proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                        env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = np.load(out)
  # The searches' choices (the sequences the beams hold) are compared in float64: the mesh and
  # one device are programs of different shapes, whose float32 rounding may flip a near-tie
  # between candidates; in float64 a flip needs a tie within ~1e-16 relative.
  np.testing.assert_array_equal(r["sharded64_tokens"], r["single64_tokens"])
  assert len(set(_lengths(r["single64_tokens"]).ravel())) > 1
  # Model-parallel contractions sum in another order: the float32 mesh run is bounded by the
  # single-device float32 error against float64 (tests/numerics.py); its beam scores as the
  # penalised log-likelihoods of the sequences it returned (teacher-forced on one device).
  numerics.assert_close(r["sharded_label_scores"], r["single_label_scores"],
                        r["single64_label_scores"], what="4 x 2 mesh label scores")
  real = r["sharded_scores"] > decoding.NEG_INF / 2
  numerics.assert_close(r["sharded_scores"][real], r["forced_scores"][real],
                        r["forced64_scores"][real], what="4 x 2 mesh beam scores")
  # In float64 the mesh agrees with one device to the same bound at float64's unit roundoff.
  numerics.assert_close(r["sharded64_label_scores"], r["single_label_scores"],
                        r["single64_label_scores"], eps=numerics.EPS64,
                        what="4 x 2 mesh label scores (float64)")
  real64 = r["single64_scores"] > decoding.NEG_INF / 2
  assert numerics.bound(r["forced_scores"][real], r["forced64_scores"][real],
                        eps=numerics.EPS64) >= float(np.abs(
                            r["sharded64_scores"] - r["single64_scores"])[real64].max()), (
      "4 x 2 mesh beam scores (float64)")
