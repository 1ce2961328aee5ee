"""DPT (low-rank), residual prompt tuning and deep prefixes: training, masks, exact reductions."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import T5
from prompt_jax.models.decoding import greedy_decode
from prompt_jax.prompts import low_rank, prefix, residual, seam
from prompt_jax.prompts.tuning import PromptTuning
from tests import numerics
from tests.prompts import helpers

CFG = helpers.TINY
P = 4


def _prompted(method, length=P):
  model = T5(CFG, prompt=seam.prompt_factory(method, length))
  return model, helpers.init_prompted(model)


def _plain_prompt(prompt):
  """(model, params) of plain prompt tuning with `prompt` [P, H]."""
  model, params = _prompted(functools.partial(PromptTuning, length=prompt.shape[0]))
  params["encoder"]["prompt"]["prompt"]["prompt"] = prompt
  return model, params


def _folded_logits_fn(fold, method_params):
  """dtype -> logits of plain prompt tuning with `fold(method params cast to dtype)`."""
  def run(dtype):
    model, params = _plain_prompt(fold(numerics.cast(method_params, dtype)))
    return helpers.logits_fn(model, params)(dtype)
  return run


def test_dpt_trains_only_a_and_b_and_masks_are_right():
  model, params = _prompted(functools.partial(low_rank.LowRankPrompt, length=P, rank=2))
  a = params["encoder"]["prompt"]["prompt"]
  assert a["a"].shape == (P, 2) and a["b"].shape == (2, 16)
  assert np.abs(a["a"]).max() <= 0.5  # uniform +-0.5 as the reference code
  after, _ = helpers.assert_trains_only(
      model, params, ["encoder/prompt/prompt/a", "encoder/prompt/prompt/b"])
  helpers.assert_masks_right(model, after, num_prompt=P)
  assert low_rank.num_trainable_params(P, 16, 2) == 2 * (P + 16)


def test_dpt_from_svd_of_a_prompt_equals_that_prompt_and_folds():
  prompt = np.random.RandomState(3).randn(P, 16).astype(np.float32)
  a, b = low_rank.svd_factors(prompt, min(P, 16))
  model, params = _prompted(functools.partial(low_rank.LowRankPrompt, length=P, rank=P))
  params["encoder"]["prompt"]["prompt"] = {"a": jnp.asarray(a), "b": jnp.asarray(b)}
  # A and B are float32 parameters: they reproduce the prompt to float32 rounding only, so the
  # float32 bound applies (no float64 check). Derived as in tests/numerics.py.
  helpers.check_same_logits(model, params, *_plain_prompt(prompt), check_float64=False)
  ab = params["encoder"]["prompt"]["prompt"]
  numerics.assert_close(prompt, low_rank.fold(ab),
                        low_rank.fold(numerics.cast(ab, np.float64)), what="A·B")


def test_residual_trains_folds_and_masks():
  method = functools.partial(residual.ResidualPrompt, length=P, bottleneck=8, separate_mlps=True)
  model, params = _prompted(method)
  after, _ = helpers.assert_trains_only(model, params, ["encoder/prompt/prompt/"])
  helpers.assert_masks_right(model, after, num_prompt=P)
  n = sum(v.size for v in jax.tree_util.tree_leaves(after["encoder"]["prompt"]))
  assert n == residual.num_trainable_params(P, 16, 8, separate_mlps=True)
  # Folded [P, H] prompt == the in-model MLP: bound derived from float32's own error.
  numerics.check_equivalent(
      _folded_logits_fn(lambda p: residual.fold(p, 8, True), after["encoder"]["prompt"]["prompt"]),
      helpers.logits_fn(model, after))


def test_residual_shared_mlp_folds():
  method = functools.partial(residual.ResidualPrompt, length=P, bottleneck=8)
  model, params = _prompted(method)
  params = helpers.perturbed(params)  # LN scale/bias and biases away from their init
  numerics.check_equivalent(
      _folded_logits_fn(lambda p: residual.fold(p, 8), params["encoder"]["prompt"]["prompt"]),
      helpers.logits_fn(model, params))


def test_residual_bad_bottleneck_is_a_clear_error():
  model = T5(CFG, prompt=seam.prompt_factory(
      functools.partial(residual.ResidualPrompt, length=P, bottleneck=0), P))
  with pytest.raises(ValueError, match="bottleneck must be > 0, got 0"):
    helpers.init(model)


def _deep(length, hidden=None):
  factory = functools.partial(prefix.DeepPrefix, length=length, num_layers=CFG.num_encoder_layers,
                              num_heads=CFG.num_heads, head_dim=CFG.head_dim, emb_dim=CFG.emb_dim,
                              hidden=hidden)
  model = T5(CFG, layer_prompts=factory)
  return model, helpers.init_prompted(model), factory


def test_deep_prefix_trains_only_its_prefixes_and_folds():
  hidden = 8
  model, params, factory = _deep(3, hidden)
  after, _ = helpers.assert_trains_only(model, params, ["encoder/layer_prompts/"],
                                        learning_rate=0.1)
  helpers.assert_masks_right(model, after, num_prompt=0)  # no input positions added
  n = sum(v.size for v in jax.tree_util.tree_leaves(after["encoder"]["layer_prompts"]))
  assert n == prefix.num_trainable_params(3, 2, 2, 8, emb_dim=16, hidden=hidden)
  # The folded reparameterisation (direct key/value prefixes) == the unfolded one.
  direct, d_params, _ = _deep(3, None)
  def folded(dtype):
    d_params["encoder"]["layer_prompts"] = prefix.fold(
        numerics.cast(after["encoder"]["layer_prompts"], dtype), factory(name=None))
    return helpers.logits_fn(direct, d_params)(dtype)
  numerics.check_equivalent(folded, helpers.logits_fn(model, after))  # bound: tests/numerics.py


def test_deep_prefix_of_length_zero_is_the_plain_model():
  model, params, _ = _deep(0)
  # Concatenating empty prefixes changes no arithmetic: bitwise equal.
  np.testing.assert_array_equal(helpers.logits(model, params),
                                helpers.logits(T5(CFG), helpers.frozen()))


def _decoder_deep(length, hidden=None):
  factory = functools.partial(prefix.DeepPrefix, length=length, num_layers=CFG.num_decoder_layers,
                              num_heads=CFG.num_heads, head_dim=CFG.head_dim, emb_dim=CFG.emb_dim,
                              hidden=hidden)
  model = T5(CFG, decoder_layer_prompts=factory)
  enc, dec_in, tgt = helpers.batch()
  own = jax.jit(lambda rng: {k: v for k, v in nn.meta.unbox(model.init(
      rng, enc, dec_in, tgt))["params"]["decoder"].items() if k == "layer_prompts"})(
          jax.random.PRNGKey(0))  # {} for a prefix of length 0
  base = helpers.frozen()
  return model, dict(base, decoder=dict(base["decoder"], **own))


def test_decoder_prefixes_train_and_decode_with_the_kv_cache():
  model, params = _decoder_deep(2)
  after, _ = helpers.assert_trains_only(model, params, ["decoder/layer_prompts/"],
                                        regex=r"decoder/layer_prompts/.*", learning_rate=0.1)
  helpers.assert_masks_right(model, after)
  # KV-cache greedy decoding == re-running the teacher-forced model for every step.
  enc, _, _ = helpers.batch()
  with numerics.float64():  # two programs' argmax choices: compared in float64 (numerics)
    model, after = numerics.in_float64(model, after)
    cached = np.asarray(greedy_decode(model, after, enc[:2], 4))
    tokens = jnp.zeros((2, 5), jnp.int32)
    for i in range(4):
      out = helpers.logits(model, after, enc=enc[:2], dec_in=tokens, tgt=jnp.ones_like(tokens))
      tokens = tokens.at[:, i + 1].set(jnp.argmax(out[:, i], axis=-1).astype(tokens.dtype))
    ref = np.asarray(tokens[:, 1:])
  after_eos = np.cumsum(np.cumsum(ref == 1, axis=1), axis=1) > 1
  np.testing.assert_array_equal(cached, np.where(after_eos, 0, ref))


def test_decoder_prefix_of_length_zero_is_the_plain_model():
  model, params = _decoder_deep(0)
  np.testing.assert_array_equal(helpers.logits(model, params),  # empty prefixes: bitwise
                                helpers.logits(T5(CFG), helpers.frozen()))
