"""Prefix tuning (Li & Liang 2021): encoder and decoder prefixes by default, and the initialisation
from the activations of real words (their Section 7.4) in the direct and reparameterised forms."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax import trees
from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.prompts import prefix, specs
from tests import numerics
from tests.prompts import helpers

CFG = helpers.TINY
P = 3
D = CFG.num_heads * CFG.head_dim


def _own(model, side):
  """The initialised prefix parameters of `side` ('encoder' / 'decoder'), as numpy."""
  enc, dec_in, tgt = helpers.batch()
  variables = jax.jit(lambda rng: model.init(rng, enc, dec_in, tgt, enable_dropout=False))(
      jax.random.PRNGKey(0))
  own = nn.meta.unbox(variables)["params"][side]["layer_prompts"]
  return jax.tree_util.tree_map(np.asarray, own)


def _rms_norm(x, scale):
  return x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + 1e-6) * scale


def test_encoder_and_decoder_prefixes_by_default():
  spec = specs.deep_prefix(length=P)
  assert spec.decoder
  kw = specs.model_kwargs(spec, CFG)
  assert "layer_prompts" in kw and "decoder_layer_prompts" in kw
  assert trees.is_trainable("decoder/layer_prompts/key", spec.trainable_regex)
  assert trees.is_trainable("encoder/layer_prompts/key", spec.trainable_regex)
  assert not trees.is_trainable("decoder/layers_0/self_attention/key/kernel",
                                spec.trainable_regex)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_direct_prefixes_start_at_the_words_keys_and_values(side):
  """Layer 0's prefix keys/values are the frozen layer-0 projections of the words' (RMS-normed)
  embeddings, written out in numpy (the decoder reads the words shifted right, as its input)."""
  spec = specs.deep_prefix(length=P, init_words="a b")  # 2 words repeated to P = 3 tokens
  model = T5(CFG, **spec.model_kwargs(helpers.word_backbone()))
  own = _own(model, side)
  assert own["key"].shape == (2, P, D)
  frozen = helpers.frozen()
  ids = np.array([6, 7, 6])  # 'a b' -> [6, 7] (5 + index), repeated to P
  if side == "decoder":
    ids = np.array([0, 6, 7])  # the decoder's input: the words shifted right
  layer = frozen[side]["layers_0"]
  attention = layer["attention" if side == "encoder" else "self_attention"]
  norm = layer["pre_attention_layer_norm" if side == "encoder" else
               "pre_self_attention_layer_norm"]["scale"]
  x = lambda dtype: _rms_norm(np.asarray(frozen["token_embedder"]["embedding"], dtype)[ids],
                              np.asarray(norm, dtype))
  for kind in ("key", "value"):
    kernel = lambda dtype, kind=kind: np.asarray(attention[kind]["kernel"], dtype).reshape(16, D)
    ref32 = x(np.float32) @ kernel(np.float32)
    ref64 = x(np.float64) @ kernel(np.float64)
    # Bound: the numpy formula's own float32 error against its float64 evaluation (numerics.py).
    numerics.assert_close(own[kind][0], ref32, ref64, what=f"{side} layer-0 {kind}")
  # Deeper layers come from the same run of the frozen model: compare with word_activations.
  key, value = prefix.word_activations(CFG, frozen, [6, 7, 6], which=side)
  np.testing.assert_array_equal(own["key"], np.asarray(key))
  np.testing.assert_array_equal(own["value"], np.asarray(value))


def test_reparameterised_prefixes_reproduce_the_words_activations_at_step_0():
  """With the MLP (m >= P) the output layer is solved by least squares: the folded prefixes are
  the words' activations up to the solve's rounding; bound: the same least-squares solve in
  float32 numpy against its float64 evaluation (numerics.py)."""
  spec = specs.deep_prefix(length=P, hidden=8, init_words="a b", decoder=False)
  model = T5(CFG, **spec.model_kwargs(helpers.word_backbone()))
  own = _own(model, "encoder")
  module = prefix.DeepPrefix(length=P, num_layers=2, num_heads=CFG.num_heads,
                             head_dim=CFG.head_dim, emb_dim=16, hidden=8)
  folded = prefix.fold(own, module)
  key, value = (np.asarray(a) for a in prefix.word_activations(CFG, helpers.frozen(), [6, 7, 6]))
  target = np.asarray(prefix._flat_kv(jnp.asarray(key), jnp.asarray(value)))  # [P, 2·L·D]
  hidden = np.tanh(own["embedding"] @ own["wi_kernel"] + own["wi_bias"])  # [P, m]

  def solved(dtype):
    h, t = hidden.astype(dtype), target.astype(dtype)
    return h @ np.linalg.lstsq(h, t, rcond=None)[0]
  numerics.assert_close(np.asarray(prefix._flat_kv(folded["key"], folded["value"])),
                        solved(np.float32), solved(np.float64), what="folded words init")
  assert np.abs(target).max() > 0.1  # the activations are not trivially small


def test_words_init_needs_words_that_encode():
  with pytest.raises(ConfigError, match="encode to no tokens"):
    specs.deep_prefix(length=P, init_words=" ").model_kwargs(helpers.word_backbone())
