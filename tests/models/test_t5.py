"""The Flax T5: parameter tree and logical axes as t5x, masks, the prompt seam, KV-cache decoding."""
import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import PRESETS, T5, T5Config, get_config
from prompt_jax.models.decoding import greedy_decode
from prompt_jax.prompts import PromptTuning, prompt_factory
from tests import numerics

TINY = T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                num_encoder_layers=2, num_decoder_layers=2, dtype=jnp.float32,
                mlp_activations=("gelu", "linear"), logits_via_embedding=False, dropout_rate=0.0)


def _batch():
  enc = jnp.array([[5, 6, 7, 8, 1, 0, 0], [9, 10, 1, 0, 0, 0, 0]])
  tgt = jnp.array([[3, 4, 1, 0], [5, 1, 0, 0]])
  dec_in = jnp.array([[0, 3, 4, 0], [0, 5, 0, 0]])
  return enc, dec_in, tgt


def _init(model, seed=0):
  enc, dec_in, tgt = _batch()
  return nn.meta.unbox(
      model.init(jax.random.PRNGKey(seed), enc, dec_in, tgt, enable_dropout=False))


def test_parameter_tree_and_logical_axes_are_t5x():
  enc, dec_in, tgt = _batch()
  boxed = jax.eval_shape(lambda: T5(TINY).init(jax.random.PRNGKey(0), enc, dec_in, tgt))
  specs = flax.traverse_util.flatten_dict(nn.get_partition_spec(boxed)["params"], sep="/")
  shapes = flax.traverse_util.flatten_dict(nn.meta.unbox(boxed)["params"], sep="/")
  expect = {
      "token_embedder/embedding": ((64, 16), ("vocab", "embed")),
      "encoder/relpos_bias/rel_embedding": ((2, 32), ("heads", "relpos_buckets")),
      "encoder/layers_1/pre_attention_layer_norm/scale": ((16,), ("embed",)),
      "encoder/layers_1/attention/query/kernel": ((16, 16), ("embed", "joined_kv")),
      "encoder/layers_1/attention/out/kernel": ((16, 16), ("joined_kv", "embed")),
      "encoder/layers_1/mlp/wi_0/kernel": ((16, 32), ("embed", "mlp")),
      "encoder/layers_1/mlp/wi_1/kernel": ((16, 32), ("embed", "mlp")),
      "encoder/layers_1/mlp/wo/kernel": ((32, 16), ("mlp", "embed")),
      "encoder/encoder_norm/scale": ((16,), ("embed",)),
      "decoder/relpos_bias/rel_embedding": ((2, 32), ("heads", "relpos_buckets")),
      "decoder/layers_0/pre_self_attention_layer_norm/scale": ((16,), ("embed",)),
      "decoder/layers_0/self_attention/value/kernel": ((16, 16), ("embed", "joined_kv")),
      "decoder/layers_0/pre_cross_attention_layer_norm/scale": ((16,), ("embed",)),
      "decoder/layers_0/encoder_decoder_attention/key/kernel": ((16, 16), ("embed", "joined_kv")),
      "decoder/decoder_norm/scale": ((16,), ("embed",)),
      "decoder/logits_dense/kernel": ((16, 64), ("embed", "vocab")),
  }
  for path, (shape, axes) in expect.items():
    assert shapes[path].shape == shape, path
    assert tuple(specs[path]) == axes, path
  # 2 enc layers x 9 + 2 dec layers x 14 + embed + 2 relpos + 2 norms + logits_dense.
  assert len(shapes) == 2 * 9 + 2 * 14 + 6
  assert all(len(s) == len(shapes[p].shape) for p, s in specs.items()), "every param has axes"


def test_t5_1_0_has_relu_wi_and_no_logits_dense():
  cfg = TINY.replace(mlp_activations=("relu",), logits_via_embedding=True)
  params = nn.meta.unbox(jax.eval_shape(lambda: _init(T5(cfg))))["params"]
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  assert "encoder/layers_0/mlp/wi/kernel" in flat and "decoder/logits_dense/kernel" not in flat


def test_presets_have_t5x_shapes():
  assert get_config("t5_1_1_large").emb_dim == 1024 and PRESETS["t5_1_1_xxl"].mlp_dim == 10240
  assert get_config("t5_1_0_11b").num_heads == 128 and get_config("t5_1_0_3b").head_dim == 128
  assert all(not c.logits_via_embedding for n, c in PRESETS.items() if n.startswith("t5_1_1"))
  with pytest.raises(ValueError, match="unknown T5 preset 't5_2'"):
    get_config("t5_2")


def _logits(cfg, params, enc, dec_in, tgt, dtype, **model_kw):
  """Logits of T5(cfg in `dtype`) with `params` cast to `dtype` (float64: inside numerics.float64())."""
  model = T5(cfg.replace(dtype=dtype), **model_kw)
  return model.apply({"params": numerics.cast(params, dtype)}, enc, dec_in, tgt,
                     enable_dropout=False)


def test_padding_is_masked():
  params = _init(T5(TINY))["params"]
  enc, dec_in, tgt = _batch()
  # Changing a padded input token's id to a (non-zero) token would change the output; changing the
  # padding *length* must not: add trailing padding to both inputs and targets. Other shapes
  # sum in another order: bound derived from float32's own error (tests/numerics.py).
  enc2 = jnp.pad(enc, ((0, 0), (0, 5)))
  dec2, tgt2 = jnp.pad(dec_in, ((0, 0), (0, 3))), jnp.pad(tgt, ((0, 0), (0, 3)))
  numerics.check_equivalent(
      lambda dt: _logits(TINY, params, enc2, dec2, tgt2, dt)[:, :4],
      lambda dt: _logits(TINY, params, enc, dec_in, tgt, dt), where=np.asarray(tgt > 0))


def test_prompt_seam_equals_virtual_tokens():
  """A prompt equal to the embeddings of tokens [a, b, c] == those tokens prepended to the input.

  This proves the encoder attends the prompt and the decoder's cross-attention sees it (and that
  the prompt positions get the same relative positions as real tokens)."""
  plain = T5(TINY)
  params = _init(plain)["params"]
  virtual = jnp.array([11, 12, 13])
  table = params["token_embedder"]["embedding"]
  init = lambda rng, shape: table[virtual]
  prompted = T5(TINY, prompt=prompt_factory(functools.partial(PromptTuning, length=3, init=init),
                                            length=3))
  p_params = _init(prompted)["params"]
  np.testing.assert_array_equal(p_params["encoder"]["prompt"]["prompt"]["prompt"], table[virtual])
  p_params = dict(p_params, **{k: v for k, v in params.items() if k != "encoder"})
  p_params["encoder"] = dict(params["encoder"], prompt=p_params["encoder"]["prompt"])

  enc, dec_in, tgt = _batch()
  prompt_kw = dict(prompt=prompted.prompt)
  prepended = jnp.concatenate([jnp.broadcast_to(virtual, (2, 3)), enc], axis=1)
  # Bound derived from float32's own error (tests/numerics.py); padded targets attend nothing
  # and their logits are arbitrary (float32 and float64 fill a fully masked row differently).
  numerics.check_equivalent(
      lambda dt: _logits(TINY, p_params, enc, dec_in, tgt, dt, **prompt_kw),
      lambda dt: _logits(TINY, params, prepended, dec_in, tgt, dt), where=np.asarray(tgt > 0))
  with_prompt = prompted.apply({"params": p_params}, enc, dec_in, tgt, enable_dropout=False)
  # And the prompt matters: another prompt gives other logits.
  p_params["encoder"]["prompt"]["prompt"]["prompt"] = table[jnp.array([20, 21, 22])]
  other = prompted.apply({"params": p_params}, enc, dec_in, tgt, enable_dropout=False)
  assert np.abs(np.asarray(other) - np.asarray(with_prompt)).max() > 1e-3


def test_encode_length_includes_prompt_and_mask():
  prompted = T5(TINY, prompt=prompt_factory(functools.partial(PromptTuning, length=4), length=4))
  variables = _init(prompted)
  enc, _, _ = _batch()
  encoded = prompted.apply(variables, enc, enable_dropout=False, method=T5.encode)
  assert encoded.shape == (2, 7 + 4, 16)  # [batch, P + T, embed]
  mask = prompted.apply(variables, enc, method=T5.encoder_input_mask)
  np.testing.assert_array_equal(mask[1], [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0])


def _greedy_without_cache(model, params, enc, steps):
  """Reference decoder: re-run the full teacher-forced model for every new token."""
  tokens = jnp.zeros((enc.shape[0], steps + 1), jnp.int32)
  for i in range(steps):
    targets = jnp.where(jnp.arange(steps + 1) <= i, 1, 0) * jnp.ones_like(tokens)  # all valid
    logits = model.apply({"params": params}, enc, tokens, targets, enable_dropout=False)
    tokens = tokens.at[:, i + 1].set(jnp.argmax(logits[:, i], axis=-1).astype(tokens.dtype))
  out = np.asarray(tokens[:, 1:])
  after_eos = np.cumsum(np.cumsum(out == 1, axis=1), axis=1) > 1  # strictly after the first EOS
  return np.where(after_eos, 0, out)


@pytest.mark.parametrize("with_prompt", [False, True])
def test_kv_cache_greedy_matches_full_recompute(with_prompt):
  prompt = (prompt_factory(functools.partial(PromptTuning, length=2), length=2)
            if with_prompt else None)
  model = T5(TINY.replace(vocab_size=64), prompt=prompt)
  params = _init(model)["params"]
  # Keep EOS (id 1) out of reach so all 8 steps are compared.
  params["decoder"]["logits_dense"]["kernel"] = params["decoder"]["logits_dense"]["kernel"].at[
      :, 1].set(-10.0)
  enc, _, _ = _batch()
  with numerics.float64():  # two programs' argmax choices: compared in float64 (numerics)
    model, params = numerics.in_float64(model, params)
    cached = greedy_decode(model, params, enc, 8)
    np.testing.assert_array_equal(cached, _greedy_without_cache(model, params, enc, 8))


def test_greedy_pads_after_eos():
  model = T5(TINY.replace(vocab_size=4))  # EOS (id 1) is likely within a few steps
  params = _init(model, seed=5)["params"]
  enc = jnp.array([[2, 3, 1, 0], [3, 3, 2, 1]])
  with numerics.float64():  # two programs' argmax choices: compared in float64 (numerics)
    model, params = numerics.in_float64(model, params)
    out = np.asarray(greedy_decode(model, params, enc, 6))
    assert (out == 1).any(), "this seed must produce an EOS for the test to mean anything"
    np.testing.assert_array_equal(out, _greedy_without_cache(model, params, enc, 6))


def test_dropout_changes_outputs_only_when_enabled():
  cfg = TINY.replace(dropout_rate=0.5)
  model = T5(cfg)
  params = _init(model)["params"]
  enc, dec_in, tgt = _batch()
  a = model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False)
  b = model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False)
  c = model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=True,
                  rngs={"dropout": jax.random.PRNGKey(3)})
  np.testing.assert_array_equal(a, b)
  assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3


def test_bfloat16_activations_close_to_float32():
  params = _init(T5(TINY))["params"]
  enc, dec_in, tgt = _batch()
  l32 = _logits(TINY, params, enc, dec_in, tgt, jnp.float32)
  with numerics.float64():
    l64 = _logits(TINY, params, enc, dec_in, tgt, jnp.float64)
  l16 = T5(TINY.replace(dtype=jnp.bfloat16)).apply({"params": params}, enc, dec_in, tgt,
                                                   enable_dropout=False)
  assert l16.dtype == jnp.float32  # logits_dense computes in float32, as t5x
  # The same computation at bfloat16's unit roundoff: float32's own error scaled by
  # eps_bf16 / eps_f32 (tests/numerics.py).
  # Padded target positions attend nothing: their logits are arbitrary.
  valid = np.asarray(tgt > 0)
  numerics.assert_close(np.asarray(l16)[valid], np.asarray(l32)[valid], np.asarray(l64)[valid],
                        eps=numerics.EPS_BF16, what="bfloat16 logits")


def _prompt_vjp(policy, params, prompt_factory_, dtype=jnp.float32):
  """(bytes of the residuals the backward pass keeps, d sum(logits) / d prompt) under `policy`;
  the frozen weights are constants (prompt tuning differentiates the prompt only)."""
  model = T5(TINY.replace(remat_policy=policy, dtype=dtype), prompt=prompt_factory_)
  params = numerics.cast(params, dtype)
  frozen = {id(x) for x in jax.tree_util.tree_leaves(params)}
  enc, dec_in, tgt = _batch()

  def loss(prompt):
    tree = dict(params, encoder=dict(params["encoder"], prompt=prompt))
    return model.apply({"params": tree}, enc, dec_in, tgt, enable_dropout=False).sum()

  out, vjp = jax.vjp(loss, params["encoder"]["prompt"])
  # The vjp closes over the residuals (and the frozen weights, which are not residuals).
  kept = sum(x.nbytes for x in jax.tree_util.tree_leaves(vjp) if id(x) not in frozen)
  (grad,) = vjp(jnp.ones_like(out))
  return kept, grad["prompt"]["prompt"]


def test_remat_policies_keep_less_and_give_the_same_prompt_gradient():
  """'none' > 'attention' and 'none' > 'dots' > 'minimal' > 'full' in what the backward pass
  keeps (a policy that is not wired would keep what 'none' keeps), and every policy gives the
  prompt gradient of 'none'. 'attention' drops at least the attention weights of every layer
  (encoder self-attention, decoder self- and cross-attention). Recomputation fuses
  differently: bound from float32's own error against float64 (tests/numerics.py)."""
  prompt = prompt_factory(functools.partial(PromptTuning, length=2), length=2)
  params = _init(T5(TINY, prompt=prompt))["params"]
  kept = {}
  ref32 = _prompt_vjp("none", params, prompt)[1]
  with numerics.float64():
    ref64 = _prompt_vjp("none", params, prompt, jnp.float64)[1]
  for policy in ("none", "attention", "dots", "minimal", "full"):
    kept[policy], grad = _prompt_vjp(policy, params, prompt)
    numerics.assert_close(grad, ref32, ref64, what=f"remat {policy} prompt gradient")
  assert kept["none"] > kept["dots"] > kept["minimal"] > kept["full"] > 0, kept
  enc, dec_in, _ = _batch()
  batch, enc_len, dec_len = enc.shape[0], enc.shape[1] + 2, dec_in.shape[1]  # + 2 prompt
  weights = sum(TINY.num_heads * q * k * 4 * batch for q, k in
                [(enc_len, enc_len)] * TINY.num_encoder_layers
                + [(dec_len, dec_len), (dec_len, enc_len)] * TINY.num_decoder_layers)
  assert kept["none"] - kept["attention"] >= weights, (kept, weights)
  with pytest.raises(ValueError,
                     match="remat_policy must be one of none, attention, minimal, dots, full"):
    TINY.replace(remat_policy="everything")


def test_attention_remat_recomputes_the_same_dropout():
  """Under 'attention' the backward pass recomputes the attention weights, dropout included:
  with attention dropout on, the prompt gradient equals the one of 'none' for the same key (a
  recomputation that drew a new mask would differ by far more than rounding)."""
  prompt = prompt_factory(functools.partial(PromptTuning, length=2), length=2)
  config = TINY.replace(dropout_rate=0.3)
  params = _init(T5(config, prompt=prompt))["params"]
  enc, dec_in, tgt = _batch()
  rng = jax.random.PRNGKey(7)

  def grad(policy, dtype=jnp.float32):
    model = T5(config.replace(remat_policy=policy, dtype=dtype), prompt=prompt)
    p = numerics.cast(params, dtype)

    def loss(prompt_params):
      tree = dict(p, encoder=dict(p["encoder"], prompt=prompt_params))
      logits = model.apply({"params": tree}, enc, dec_in, tgt, enable_dropout=True,
                           rngs={"dropout": rng})
      # Padded target positions attend nothing: their logits are arbitrary (left out).
      return jnp.sum(logits ** 2 * (tgt > 0)[..., None])
    return jax.grad(loss)(p["encoder"]["prompt"])["prompt"]["prompt"]

  # All three under x64: dropout draws its masks in the precision of its keep probability, so
  # float32 and float64 runs share masks only when both run with x64 on.
  with numerics.float64():
    ref32, ref64 = grad("none"), grad("none", jnp.float64)
    numerics.assert_close(grad("attention"), ref32, ref64, what="'attention' remat, dropout")


@pytest.mark.parametrize("remat", ["none", "full"])
def test_relative_position_bias_is_computed_once_per_stack(remat, monkeypatch):
  """Issue 11: the mask and relative-position bias are turned into one additive attention bias
  per stack, not per layer (4 + 4 layers: 1 bias in the encoder, 1 in the decoder), also under
  remat and through the prompt-tuning gradient; the layers see the same values."""
  from prompt_jax.models import layers  # pylint: disable=g-import-not-at-top
  calls = []
  original = layers.RelativePositionBiases.__call__

  def counting(self, qlen, klen, bidirectional=True):
    calls.append((qlen, klen, bidirectional))
    return original(self, qlen, klen, bidirectional)

  monkeypatch.setattr(layers.RelativePositionBiases, "__call__", counting)
  config = TINY.replace(num_encoder_layers=4, num_decoder_layers=4, remat_policy=remat)
  model = T5(config, prompt=prompt_factory(functools.partial(PromptTuning, length=3), 3))
  enc, dec_in, tgt = _batch()
  params = _init(model)["params"]
  calls.clear()

  def loss(prompt):
    p = dict(params, encoder=dict(params["encoder"], prompt=prompt))
    return jnp.sum(model.apply({"params": p}, enc, dec_in, tgt, enable_dropout=False) ** 2)

  jax.grad(loss)(params["encoder"]["prompt"])
  # T' = 7 inputs + 3 prompt positions; targets 4.
  assert calls == [(10, 10, True), (4, 4, False)], calls


@pytest.mark.parametrize("qlen,klen,bidirectional", [(5, 7, True), (300, 40, True),
                                                     (8, 8, False), (1, 9, False),
                                                     (700, 700, True)])
def test_relative_position_biases_are_t5xs_q_by_k_bucket_table(qlen, klen, bidirectional):
  """The biases equal t5x's construction, the bucket of every (q, k) pair computed on the host
  ([q, k] numpy), exactly; ours computes a bucket per distance (q + k - 1 of them) and indexes
  the [q, k] layout on the device, so a long sequence no longer costs O(q * k) host memory."""
  from prompt_jax.models import layers  # pylint: disable=g-import-not-at-top
  module = layers.RelativePositionBiases(num_buckets=32, max_distance=128, num_heads=3)
  params = module.init(jax.random.PRNGKey(0), qlen, klen, bidirectional)
  table = np.asarray(params["params"]["rel_embedding"].value)  # [heads, buckets]
  buckets = layers.relative_position_bucket(
      np.arange(klen)[None, :] - np.arange(qlen)[:, None], bidirectional, 32, 128)  # [q, k]
  np.testing.assert_array_equal(np.asarray(module.apply(params, qlen, klen, bidirectional)),
                                table[:, buckets][None])
