"""Prefix tuning's third prefix set: key/value prefixes in the decoder's cross-attention
(Li & Liang's reference code, seq2seq/prefixTuning.py `use_cross_prefix`: wte2/control_trans2
passed as the 'encoder_decoder' past keys/values), `decoder/cross_layer_prompts/...`."""
import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax import cli, paths, run_setup, trees
from prompt_jax.errors import ConfigError
from prompt_jax.models import T5, decoding
from prompt_jax.prompts import prefix, specs
from tests import numerics
from tests.prompts import helpers

CFG = helpers.TINY  # H = 16, 2 + 2 layers, D = 2 heads x 8
P = 3
D = CFG.num_heads * CFG.head_dim
MLP_LEAVES = {"embedding", "wi_kernel", "wi_bias", "wo_kernel", "wo_bias"}
CROSS = "decoder/cross_layer_prompts/"


def _model(spec, backbone=None):
  return T5(CFG, **spec.model_kwargs(backbone or specs.Backbone(CFG)))


def _params(spec, seed=0):
  """The spec's own parameters from init, every other leaf the cached plain T5's."""
  return helpers.with_frozen(helpers.init(_model(spec), seed), helpers.frozen())


def _leaves(flat, under):
  """{name: leaf} of the flat tree's leaves under `under`."""
  return {k[len(under):]: v for k, v in flat.items() if k.startswith(under)}


# (a) The tree and the count.

def test_cross_set_has_its_own_embedding_and_mlp_and_is_counted():
  spec = specs.deep_prefix(length=P, hidden=6, cross=True)
  flat = helpers.flat(helpers.init(_model(spec)))
  assert set(_leaves(flat, CROSS)) == MLP_LEAVES
  # The other two sets keep their paths (runs trained before the cross set load unchanged).
  assert set(_leaves(flat, "decoder/layer_prompts/")) == MLP_LEAVES
  assert set(_leaves(flat, "encoder/layer_prompts/")) == MLP_LEAVES
  assert _leaves(flat, CROSS)["wo_kernel"].shape == (6, 2 * 2 * D)  # m, 2·L·D
  trainable = {k: v for k, v in flat.items() if trees.is_trainable(k, spec.trainable_regex)}
  assert {k for k in trainable if k.startswith(CROSS)} == {CROSS + n for n in MLP_LEAVES}
  assert all(k.startswith(("encoder/layer_prompts/", "decoder/layer_prompts/", CROSS))
             for k in trainable), sorted(trainable)
  count = sum(int(np.prod(v.shape)) for v in trainable.values())
  per_set = P * 16 + 16 * 6 + 6 + 2 * 2 * D * 6 + 2 * 2 * D
  assert spec.num_trainable_params(CFG) == count == 3 * per_set
  # Direct form: 2·L·P·D per set.
  direct = specs.deep_prefix(length=P, cross=True)
  d_flat = helpers.flat(helpers.init(_model(direct)))
  assert d_flat[CROSS + "key"].shape == (2, P, D)
  assert direct.num_trainable_params(CFG) == 3 * 2 * 2 * P * D == sum(
      int(np.prod(v.shape)) for k, v in d_flat.items()
      if trees.is_trainable(k, direct.trainable_regex))


def test_cross_is_off_by_default_and_needs_the_decoder_set():
  spec = specs.deep_prefix(length=P, hidden=6)  # what a run recorded before `cross` reads as
  assert not spec.cross
  assert "decoder_cross_prompts" not in specs.model_kwargs(spec, CFG)
  assert not any(k.startswith("decoder/cross_layer_prompts")
                 for k in helpers.flat(helpers.init(_model(spec))))
  with pytest.raises(ConfigError, match="PREFIX_CROSS=True.*PREFIX_DECODER=True"):
    specs.model_kwargs(specs.deep_prefix(length=P, decoder=False, cross=True), CFG)


def _gin_spec(bindings):
  """The spec gin/prompts/prefix.gin binds, with `bindings` after it."""
  gin.clear_config()
  cli._register_configurables()  # pylint: disable=protected-access  (the file binds AdamW)
  try:
    gin.add_config_file_search_path(paths.gin_dir())
    gin.parse_config_files_and_bindings(["prompts/prefix.gin"], bindings, finalize_config=False)
    return run_setup.model_spec(config=CFG).prompt
  finally:
    gin.clear_config()


def test_prefix_gin_gives_three_sets_and_prefix_decoder_false_one():
  spec = _gin_spec([])
  assert spec.decoder and spec.cross
  spec = _gin_spec(["PREFIX_CROSS = False"])
  assert spec.decoder and not spec.cross
  spec = _gin_spec(["PREFIX_DECODER = False"])  # P-tuning v2 style: the cross set follows
  assert not spec.decoder and not spec.cross


# (b) The prefixes are attended; length 0 is the plain model.

def test_cross_prefixes_change_the_logits_and_length_0_is_the_plain_model():
  spec = specs.deep_prefix(length=P, hidden=6, cross=True)
  model = _model(spec)
  params = _params(spec)
  base = np.asarray(helpers.logits(model, params))
  moved = helpers.perturbed(params, regex=CROSS + ".*")
  assert np.abs(np.asarray(helpers.logits(model, moved)) - base).max() > 1e-3
  # Only the cross set moved: the same model without it gives other logits too.
  no_cross = specs.deep_prefix(length=P, hidden=6)
  kept = helpers.unflat({k: v for k, v in helpers.flat(params).items()
                         if not k.startswith(CROSS)})
  assert np.abs(np.asarray(helpers.logits(_model(no_cross), kept)) - base).max() > 1e-3
  # P = 0: no parameters, the same arithmetic as the plain model (concatenating nothing).
  empty = _model(specs.deep_prefix(length=0, hidden=6, cross=True))
  np.testing.assert_array_equal(np.asarray(helpers.logits(empty, helpers.frozen())),
                                np.asarray(helpers.logits(T5(CFG), helpers.frozen())))


# (c) The cross prefixes are what the definition says.

def _hand_cross_attention(prefixes):
  """An interceptor replacing every decoder layer's `encoder_decoder_attention` by the definition
  written out in jnp: softmax(q·[K_prefix; K_enc] + [0; bias]) · [V_prefix; V_enc], projected
  out; `prefixes` (key, value) [L, P, D] in the computing dtype."""

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    if module.name != "encoder_decoder_attention" or context.method_name != "__call__":
      return next_fun(*args, **kwargs)
    assert kwargs.get("kv_prefix") is None  # the plain model gives none
    y, encoded, mask, bias = args
    assert mask is None
    layer = int(module.parent.name.split("_")[-1])
    p = module.variables["params"]
    heads, dim = module.num_heads, module.head_dim
    kernel = lambda name: p[name]["kernel"].reshape(-1, heads * dim)
    q = (y @ kernel("query")).reshape(y.shape[:2] + (heads, dim))
    k = (encoded @ kernel("key")).reshape(encoded.shape[:2] + (heads, dim))
    v = (encoded @ kernel("value")).reshape(encoded.shape[:2] + (heads, dim))
    batch = y.shape[0]
    kp, vp = (jnp.broadcast_to(a[layer].reshape(1, -1, heads, dim), (batch, a.shape[1], heads, dim))
              for a in prefixes)
    k, v = jnp.concatenate([kp, k], 1), jnp.concatenate([vp, v], 1)
    full_bias = jnp.concatenate([jnp.zeros(bias.shape[:-1] + (kp.shape[1],), bias.dtype),
                                 bias], -1)  # [B, 1, q, P + T]
    w = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) + full_bias, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(y.shape[:2] + (heads * dim,))
    return out @ p["out"]["kernel"].reshape(heads * dim, -1)
  return interceptor


def test_cross_prefix_logits_equal_the_definition_written_out():
  """The prefixed model's logits against the plain model whose cross-attention is the
  definition written by hand with the direct prefixes concatenated; bound: the hand-written
  model's own float32 error against its float64 evaluation (numerics.py)."""
  spec = specs.deep_prefix(length=P, cross=True, decoder=True)  # direct: key, value [L, P, D]
  model = _model(spec)
  params = helpers.perturbed(_params(spec), regex=r".*layer_prompts.*")  # every set moved
  plain_model = T5(CFG, **{k: v for k, v in spec.model_kwargs(specs.Backbone(CFG)).items()
                           if k != "decoder_cross_prompts"})
  own = params["decoder"]["cross_layer_prompts"]
  plain = helpers.unflat({k: v for k, v in helpers.flat(params).items()
                          if not k.startswith(CROSS)})
  assert np.abs(np.asarray(own["key"])).max() > 0.1

  def hand(dtype):
    prefixes = tuple(jnp.asarray(np.asarray(own[kind], dtype)) for kind in ("key", "value"))
    with nn.intercept_methods(_hand_cross_attention(prefixes)):
      return helpers.logits_fn(plain_model, plain)(dtype)

  # The hand-written path is taken (it differs from the plain model's own cross-attention).
  assert np.abs(np.asarray(hand(jnp.float32))
                - np.asarray(helpers.logits(plain_model, plain))).max() > 1e-3
  _, _, tgt = helpers.batch()
  numerics.check_equivalent(helpers.logits_fn(model, params), hand,
                            where=np.asarray(tgt) > 0, what="cross-prefixed logits")


def test_cross_prefix_composes_with_the_cross_bias_as_attention_does():
  """`cross_bias` [batch, 1, L, T']: the prefixes get a zero column block, the encoder's
  padding stays masked (extra padding of the input leaves the logits unchanged)."""
  spec = specs.deep_prefix(length=P, hidden=6, cross=True)
  model = _model(spec)
  params = helpers.perturbed(_params(spec), regex=r".*layer_prompts.*")
  helpers.assert_masks_right(model, params)


# (d) Decoding with the KV cache.

def test_greedy_with_the_kv_cache_follows_the_full_forwards_argmax():
  """Greedy decoding (cache, one token a step, cross prefixes each step) against the
  teacher-forced full forward on its own path: the argmax at every step up to EOS is the token
  it chose. In float64, where a near-tie would need ~1e-16 relative (numerics.in_float64)."""
  from tests.models import test_decoding  # pylint: disable=g-import-not-at-top
  spec = specs.deep_prefix(length=P, hidden=6, cross=True)
  model = _model(spec)
  params = helpers.perturbed(_params(spec), regex=r".*layer_prompts.*")
  params = test_decoding.decodable(params, eos=(0, 1.0))
  enc = helpers.batch()[0]
  with numerics.float64():
    m64, p64 = numerics.in_float64(model, params)
    greedy = np.asarray(decoding.greedy_decode(m64, p64, enc, 6))
    dec_in = jnp.pad(jnp.asarray(greedy[:, :-1]), ((0, 0), (1, 0)))
    full = np.asarray(m64.apply({"params": p64}, enc, dec_in, jnp.ones_like(greedy),
                                enable_dropout=False))
    tokens, _ = decoding.beam_decode(m64, p64, enc, 6, beam_size=1, alpha=0.0)
  eos = np.where((greedy == 1).any(-1), np.argmax(greedy == 1, axis=-1), greedy.shape[1] - 1)
  valid = np.arange(greedy.shape[1])[None, :] <= eos[:, None]
  np.testing.assert_array_equal(full.argmax(-1)[valid], greedy[valid])
  np.testing.assert_array_equal(np.asarray(tokens)[:, 0], greedy)
  # The cross prefixes steer the decoding: without them the path is another.
  no_cross = specs.deep_prefix(length=P, hidden=6)
  kept = helpers.unflat({k: v for k, v in helpers.flat(params).items()
                         if not k.startswith(CROSS)})
  with numerics.float64():
    m64, p64 = numerics.in_float64(_model(no_cross), kept)
    other = np.asarray(decoding.greedy_decode(m64, p64, enc, 6))
  assert not np.array_equal(other, greedy)


# (e) Export: fold, then the direct form.

def test_folded_cross_prefix_gives_the_reparameterised_logits():
  spec = specs.deep_prefix(length=P, hidden=6, cross=True)
  params = helpers.perturbed(_params(spec), regex=r".*layer_prompts.*")
  folded = spec.fold(params, CFG)
  assert sorted(folded) == ["cross_prefix", "decoder_prefix", "prefix"]
  assert folded["cross_prefix"].shape == (2, 2, P, D)  # [key/value, L, P, D]
  direct = specs.deep_prefix(length=P, cross=True)
  d_params = dict(params)
  d_params["encoder"] = dict(params["encoder"], layer_prompts={
      "key": folded["prefix"][0], "value": folded["prefix"][1]})
  d_params["decoder"] = dict(
      params["decoder"],
      layer_prompts={"key": folded["decoder_prefix"][0], "value": folded["decoder_prefix"][1]},
      cross_layer_prompts={"key": folded["cross_prefix"][0],
                           "value": folded["cross_prefix"][1]})
  # The folded prefixes (computed once in float32) in place of the MLP: the bound is the
  # reparameterised model's own float32 error against its float64 evaluation (numerics.py); the
  # float64 variant is not checked, its prefixes were rounded to float32 by the fold.
  helpers.check_same_logits(_model(direct), d_params, _model(spec), params, check_float64=False)


# (f) Initialisation from the words' activations.

def _own_cross(spec):
  model = _model(spec, helpers.word_backbone())
  enc, dec_in, tgt = helpers.batch()
  variables = jax.jit(lambda rng: model.init(rng, enc, dec_in, tgt, enable_dropout=False))(
      jax.random.PRNGKey(0))
  return jax.tree_util.tree_map(np.asarray,
                                nn.meta.unbox(variables)["params"]["decoder"][
                                    "cross_layer_prompts"])


def test_direct_cross_prefixes_start_at_the_words_cross_attention_keys_and_values():
  """Layer l's cross prefixes are its `encoder_decoder_attention` key/value projections of the
  frozen encoder's output on the words (repeated to P tokens), written out in numpy."""
  spec = specs.deep_prefix(length=P, init_words="a b", cross=True)
  own = _own_cross(spec)
  frozen = helpers.frozen()
  ids = jnp.array([[6, 7, 6]])  # 'a b' -> [6, 7], repeated to P
  encoded = np.asarray(T5(CFG).apply({"params": frozen}, ids, enable_dropout=False,
                                     method=T5.encode))[0]  # [P, H]
  for layer in range(CFG.num_decoder_layers):
    attention = frozen["decoder"][f"layers_{layer}"]["encoder_decoder_attention"]
    for kind in ("key", "value"):
      kernel = np.asarray(attention[kind]["kernel"]).reshape(CFG.emb_dim, D)
      ref = lambda dt, kernel=kernel: encoded.astype(dt) @ kernel.astype(dt)
      # Bound: the product's own float32 error against its float64 evaluation (numerics.py).
      numerics.assert_close(own[kind][layer], ref(np.float32), ref(np.float64),
                            what=f"cross layer-{layer} {kind}")
  key, value = prefix.word_activations(CFG, frozen, [6, 7, 6], which="cross")
  np.testing.assert_array_equal(own["key"], np.asarray(key))
  np.testing.assert_array_equal(own["value"], np.asarray(value))
  # Not the decoder's self-attention activations (another attention, other inputs).
  self_key, _ = prefix.word_activations(CFG, frozen, [6, 7, 6], which="decoder")
  assert np.abs(np.asarray(self_key) - np.asarray(key)).max() > 1e-2


def test_reparameterised_cross_prefixes_reproduce_the_words_activations_at_step_0():
  """With the MLP (m >= P) the output layer is solved by least squares; bound: the same solve in
  float32 numpy against its float64 evaluation (numerics.py)."""
  spec = specs.deep_prefix(length=P, hidden=8, init_words="a b", cross=True)
  own = _own_cross(spec)
  folded = prefix.fold(own, spec.decoder_cross_hook(specs.Backbone(CFG))(name=None))
  key, value = (np.asarray(a) for a in prefix.word_activations(
      CFG, helpers.frozen(), [6, 7, 6], which="cross"))
  target = np.asarray(prefix._flat_kv(jnp.asarray(key), jnp.asarray(value)))  # [P, 2·L·D]
  hidden = np.tanh(own["embedding"] @ own["wi_kernel"] + own["wi_bias"])  # [P, m]

  def solved(dtype):
    h, t = hidden.astype(dtype), target.astype(dtype)
    return h @ np.linalg.lstsq(h, t, rcond=None)[0]
  numerics.assert_close(np.asarray(prefix._flat_kv(folded["key"], folded["value"])),
                        solved(np.float32), solved(np.float64), what="folded cross words init")
  assert np.abs(target).max() > 0.1


def test_word_activations_names_its_attention():
  with pytest.raises(ValueError, match="which must be one of"):
    prefix.word_activations(CFG, helpers.frozen(), [6], which="self")
