"""The per-layer hook of the seam (deep prompts): key/value prefixes in encoder self-attention."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax.models import T5, T5Config
from prompt_jax.models.layers import MultiHeadDotProductAttention
from tests import numerics

TINY = T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                num_encoder_layers=2, num_decoder_layers=1, dtype=jnp.float32,
                logits_via_embedding=True, dropout_rate=0.0)


class FixedPrefix(nn.Module):
  """A test hook: the same learned [P, heads, kv] key/value prefix for every example and layer.
  Hooks receive a `models.LayerContext` (layer index, hidden states, ...)."""
  length: int

  @nn.compact
  def __call__(self, ctx, deterministic=True):
    x = ctx.x
    k = self.param("key", nn.initializers.normal(1.0), (self.length, 2, 8))
    v = self.param("value", nn.initializers.normal(1.0), (self.length, 2, 8))
    batch = x.shape[0]
    expand = lambda a: jnp.broadcast_to(a, (batch,) + a.shape)  # [batch, P, heads, kv]
    return x, (expand(k), expand(v))


def _numpy_attention(x, params, mask, bias, k_p, v_p, dtype):
  """The attention with a key/value prefix written out in numpy, computed in `dtype`."""
  x, mask, bias, k_p, v_p = (np.asarray(a, dtype) for a in (x, mask, bias, k_p, v_p))
  p = {k: np.asarray(v["kernel"], dtype) for k, v in params.items()}
  proj = lambda name: (x @ p[name]).reshape(2, 5, 2, 8)
  q, k, v = proj("query"), proj("key"), proj("value")
  k_all, v_all = np.concatenate([k_p, k], 1), np.concatenate([v_p, v], 1)
  logits = np.einsum("bqhd,bkhd->bhqk", q, k_all)
  full_bias = np.concatenate([np.zeros((1, 2, 5, 3), dtype), bias], -1)
  full_mask = np.concatenate([np.ones((2, 1, 5, 3), dtype), mask], -1)
  logits = logits + full_bias + np.where(full_mask > 0, 0.0, -1e10).astype(dtype)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", w, v_all).reshape(2, 5, 16) @ p["out"]


def test_attention_with_kv_prefix_matches_numpy():
  rng = np.random.RandomState(0)
  x = rng.randn(2, 5, 16).astype(np.float32)
  mask = np.ones((2, 1, 5, 5), np.float32)
  mask[1, ..., 3:] = 0
  bias = rng.randn(1, 2, 5, 5).astype(np.float32)
  k_p = rng.randn(2, 3, 2, 8).astype(np.float32)
  v_p = rng.randn(2, 3, 2, 8).astype(np.float32)
  params = MultiHeadDotProductAttention(num_heads=2, head_dim=8).init(
      jax.random.PRNGKey(0), x, x, mask, bias)
  p = nn.meta.unbox(params)["params"]

  def ours(dtype):
    attn = MultiHeadDotProductAttention(num_heads=2, head_dim=8, dtype=dtype)
    p_, x_, mask_, bias_, k_, v_ = numerics.cast((p, x, mask, bias, k_p, v_p), dtype)
    return attn.apply({"params": p_}, x_, x_, mask_, bias_, kv_prefix=(k_, v_))

  # Bound: the numpy formula's own float32 error against its float64 evaluation (numerics.py).
  numerics.check_equivalent(ours, lambda dt: _numpy_attention(x, p, mask, bias, k_p, v_p, dt))


def _batch():
  enc = jnp.array([[5, 6, 7, 1, 0], [9, 1, 0, 0, 0]])
  tgt = jnp.array([[3, 4, 1], [5, 1, 0]])
  dec_in = jnp.array([[0, 3, 4], [0, 5, 0]])
  return enc, dec_in, tgt


def test_layer_hook_params_live_under_encoder_and_change_outputs():
  enc, dec_in, tgt = _batch()
  plain = T5(TINY)
  params = nn.meta.unbox(plain.init(jax.random.PRNGKey(0), enc, dec_in, tgt))["params"]
  deep = T5(TINY, layer_prompts=lambda name: FixedPrefix(length=4, name=name))
  d_params = nn.meta.unbox(deep.init(jax.random.PRNGKey(0), enc, dec_in, tgt))["params"]
  assert d_params["encoder"]["layer_prompts"]["key"].shape == (4, 2, 8)
  d_params = dict(params, encoder=dict(params["encoder"],
                                       layer_prompts=d_params["encoder"]["layer_prompts"]))
  base = plain.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False)
  with_prefix = deep.apply({"params": d_params}, enc, dec_in, tgt, enable_dropout=False)
  assert np.abs(np.asarray(base) - np.asarray(with_prefix)).max() > 1e-3

  # A prefix of length 0 is the plain model: the same arithmetic (concatenating nothing), so
  # the logits are bitwise equal.
  empty = T5(TINY, layer_prompts=lambda name: FixedPrefix(length=0, name=name))
  e_params = dict(params, encoder=dict(params["encoder"], layer_prompts={
      "key": jnp.zeros((0, 2, 8)), "value": jnp.zeros((0, 2, 8))}))
  np.testing.assert_array_equal(
      empty.apply({"params": e_params}, enc, dec_in, tgt, enable_dropout=False), base)
