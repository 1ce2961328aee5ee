"""The explicit context every prompt method and per-layer hook receives (models.PromptContext,
models.LayerContext), the frozen encoder's representation and its precomputed batch feature."""
import functools

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import LayerContext, PromptContext, T5
from prompt_jax.models import t5 as t5_lib
from prompt_jax.prompts import idpg, seam
from prompt_jax.prompts.tuning import PromptTuning
from tests import numerics
from tests.prompts import helpers

CFG = helpers.TINY
P = 3
SEEN = []


class _Recorder(nn.Module):
  """A hook that changes nothing and records its context (eager runs only)."""

  def __call__(self, ctx, deterministic=True):
    SEEN.append(ctx)
    return ctx.x, None


def test_hooks_get_an_explicit_context():
  SEEN.clear()
  method = functools.partial(PromptTuning, length=P)
  model = T5(CFG, prompt=seam.prompt_factory(method, P, "suffix"), layer_prompts=_Recorder,
             decoder_layer_prompts=_Recorder)
  params = helpers.init_prompted(model)
  SEEN.clear()
  enc, dec_in, tgt = helpers.batch()
  helpers.logits(model, params)
  encoder, decoder = SEEN[:CFG.num_encoder_layers], SEEN[CFG.num_encoder_layers:]
  assert [c.layer for c in encoder] == list(range(CFG.num_encoder_layers))
  assert [c.layer for c in decoder] == list(range(CFG.num_decoder_layers))
  for ctx in encoder:
    assert isinstance(ctx, LayerContext) and isinstance(ctx.inputs, PromptContext)
    assert ctx.x.shape == (4, 8 + P, 16)
    np.testing.assert_array_equal(ctx.inputs.input_tokens, enc)
    np.testing.assert_array_equal(ctx.inputs.input_valid, enc > 0)
    np.testing.assert_array_equal(ctx.valid.sum(1), (enc > 0).sum(1) + P)
    # Suffix: the prompt sits before each example's EOS; slots number its positions 1..P.
    slots = np.asarray(ctx.prompt_slots)
    eos = np.argmax(np.asarray(enc) == 1, axis=1)
    for b in range(4):
      np.testing.assert_array_equal(slots[b, eos[b]:eos[b] + P], [1, 2, 3])
      assert (slots[b] > 0).sum() == P
    assert isinstance(ctx.prompt_method, PromptTuning)
  for ctx in decoder:  # the decoder's hook sees its own hidden states only
    assert ctx.inputs is None and ctx.prompt_slots is None and ctx.x.shape[:2] == (4, 2)


@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_representation_is_the_frozen_encoder_output_pooled(pooling):
  model = T5(CFG, representation_pooling=pooling)
  params = helpers.frozen()
  enc, _, _ = helpers.batch()

  def ours(dtype):
    return model.clone(config=CFG.replace(dtype=dtype)).apply(
        {"params": numerics.cast(params, dtype)}, enc, method=T5.encoder_representation)

  def reference(dtype):  # the plain frozen encoder (no prompt), then pooled by hand in numpy
    encoded = np.asarray(T5(CFG.replace(dtype=dtype)).apply(
        {"params": numerics.cast(params, dtype)}, enc, enable_dropout=False, method=T5.encode))
    valid = np.asarray(enc) > 0
    if pooling == "first":
      return encoded[:, 0]
    return (encoded * valid[..., None]).sum(1) / valid.sum(1, keepdims=True)
  numerics.check_equivalent(ours, reference)  # bound: the reference's own float32 error


def _idpg_model(representation="encoder_mean"):
  method = functools.partial(idpg.IDPG, length=P, bottleneck=8, representation=representation)
  model = T5(CFG, prompt=seam.prompt_factory(method, P),
             representation_pooling=idpg.pooling_of(representation))
  return model, helpers.init_prompted(model)


def test_a_precomputed_representation_replaces_the_encoder_pass():
  model, params = _idpg_model()
  enc, dec_in, tgt = helpers.batch()
  rep = model.apply({"params": params}, enc, method=T5.encoder_representation)  # [B, H]
  computed = helpers.logits(model, params)
  given = model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False,
                      prompt_representation=rep)
  # The same values enter the same generator: bitwise equal.
  np.testing.assert_array_equal(np.asarray(given), np.asarray(computed))
  other = model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False,
                      prompt_representation=jnp.zeros_like(rep))
  assert np.abs(np.asarray(other) - np.asarray(computed)).max() > 1e-4  # and it is what is read


def test_embedding_mean_reads_no_encoder():
  model, params = _idpg_model("embedding_mean")
  enc, dec_in, tgt = helpers.batch()
  # Any feature is ignored: M(x) is the mean frozen embedding.
  a = model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False,
                  prompt_representation=jnp.zeros((4, 16)))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(helpers.logits(model, params)))
  assert idpg.pooling_of("embedding_mean") is None
  assert idpg.pooling_of("encoder") == "mean" and idpg.pooling_of("encoder_first") == "first"


def test_pool_first_and_mean():
  x = jnp.arange(24, dtype=jnp.float32).reshape(2, 3, 4)
  valid = jnp.array([[True, True, False], [False, True, True]])
  np.testing.assert_array_equal(t5_lib.pool(x, valid, "first"), np.asarray(x)[[0, 1], [0, 1]])
  np.testing.assert_array_equal(t5_lib.pool(x, valid, "mean"),
                                [(np.asarray(x)[0, 0] + np.asarray(x)[0, 1]) / 2,
                                 (np.asarray(x)[1, 1] + np.asarray(x)[1, 2]) / 2])
