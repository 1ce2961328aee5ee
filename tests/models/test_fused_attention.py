"""The fused attention path (jax.nn.dot_product_attention: cuDNN on GPU, XLA elsewhere) equals the
einsum reference (issue 11, acceptance 2), on one attention call and through the whole model.

Bounds are derived (tests/numerics.py): the fused float32 result must be within 8x the float32
einsum reference's own distance to the float64 einsum result (the fused kernels have no float64;
`attention_implementation` sends float64 to the einsum reference).
"""
import contextlib
import functools
import io

import flax.linen as nn
import jax
from jax import ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import T5, layers
from prompt_jax.prompts import PromptTuning, prompt_factory
from tests import numerics
from tests.models.test_t5 import TINY, _batch

DISTANCES = {}  # reported by the bench/docs: max |fused - float64 reference|


def _inputs(dtype):
  rng = np.random.RandomState(0)
  q, k, v = (rng.randn(2, 7, 3, 8) for _ in range(3))  # [batch, length, heads, kv]
  valid = np.array([[1] * 7, [1] * 4 + [0] * 3])
  mask = valid[:, None, :, None] * valid[:, None, None, :]  # [batch, 1, q, k]
  relpos = rng.randn(1, 3, 7, 7)  # [1, heads, q, k]
  bias = np.where(mask > 0, 0.0, -1e10) + relpos  # the mask as the caller gives it: additive
  return [numerics.cast(x, dtype) for x in (q, k, v, bias)]


def test_selection_by_backend_and_dtype():
  q = jnp.zeros((1, 4, 2, 64), jnp.bfloat16)
  pick = lambda req, dt, dropout=False: layers.attention_implementation(req, q, q, dt, dropout)
  assert pick("einsum", jnp.float32) == "einsum"
  assert pick("auto", jnp.float32, dropout=True) == "einsum"  # fused kernels have no dropout
  assert pick("xla", jnp.float32) == "xla"
  with numerics.float64():
    assert pick("auto", jnp.float64) == "einsum"
  expected = "cudnn" if jax.default_backend() == "gpu" else "einsum"
  assert pick("auto", jnp.bfloat16) == expected
  assert pick("auto", jnp.float32) == "einsum"  # cuDNN attention needs bfloat16/float16
  with pytest.raises(ValueError, match="attention_implementation"):
    pick("flash", jnp.float32)


def test_fused_attention_equals_einsum_reference():
  def run(impl, dtype):
    q, k, v, bias = _inputs(dtype)
    return layers.dot_product_attention(q, k, v, bias, dtype=dtype, implementation=impl)

  # Against float64, only the real query rows: a padded row masks every key, and -1e10 swamps
  # the relative-position bias in float32 (a uniform average) but not in float64, so there the
  # two differ by O(1) and would inflate the bound until it tested nothing.
  valid = np.array([[1] * 7, [1] * 4 + [0] * 3], bool)[:, :, None, None]  # [batch, q, 1, 1]
  numerics.check_equivalent(functools.partial(run, "xla"), functools.partial(run, "einsum"),
                            where=np.broadcast_to(valid, (2, 7, 3, 8)), check_float64=False,
                            what="fused attention")
  # Every entry, padded rows too, against the float32 einsum path (both average them alike).
  out32 = np.asarray(run("xla", jnp.float32))
  ref32 = np.asarray(run("einsum", jnp.float32))
  DISTANCES["one call"] = float(np.abs(out32 - ref32).max())
  assert DISTANCES["one call"] <= 1e-5  # the figure


def test_fused_attention_through_the_model_logits_and_prompt_gradient():
  enc, dec_in, tgt = _batch()
  prompt = prompt_factory(functools.partial(PromptTuning, length=3), 3)

  def model(impl, dtype):
    return T5(TINY.replace(dtype=dtype, attention_implementation=impl), prompt=prompt)

  params64 = None

  def params(dtype):
    nonlocal params64
    if params64 is None:
      with numerics.float64():
        params64 = numerics.cast(nn.meta.unbox(model("einsum", jnp.float64).init(
            jax.random.PRNGKey(0), enc, dec_in, tgt, enable_dropout=False))["params"],
            np.float64)
    return numerics.cast(params64, dtype)

  def logits(impl, dtype):
    return model(impl, dtype).apply({"params": params(dtype)}, enc, dec_in, tgt,
                                    enable_dropout=False)

  def prompt_grad(impl, dtype):
    p = params(dtype)

    def loss(prompt_value):
      q = jax.tree_util.tree_map(lambda x: x, p)
      q["encoder"]["prompt"]["prompt"]["prompt"] = prompt_value
      out = model(impl, dtype).apply({"params": q}, enc, dec_in, tgt, enable_dropout=False)
      return jnp.sum(jax.nn.log_softmax(out) * jax.nn.one_hot(tgt, out.shape[-1]) * (tgt > 0)[
          ..., None])
    return jax.grad(loss)(p["encoder"]["prompt"]["prompt"]["prompt"])

  where = np.asarray(tgt > 0)  # padded target rows are never read
  numerics.check_equivalent(functools.partial(logits, "xla"), functools.partial(logits, "einsum"),
                            where=where, check_float64=False, what="logits (fused attention)")
  numerics.check_equivalent(functools.partial(prompt_grad, "xla"),
                            functools.partial(prompt_grad, "einsum"), check_float64=False,
                            what="prompt gradient (fused attention)")
  DISTANCES["model logits"] = float(np.abs(np.asarray(logits("xla", jnp.float32))
                                           - np.asarray(logits("einsum", jnp.float32)))[where].max())
  assert DISTANCES["model logits"] <= 1e-5


def test_softmax_gradient_and_one_array_of_scores_kept_per_attention(monkeypatch):
  """layers.softmax has jax.nn.softmax's gradient (bound: float32's own error against float64),
  and an attention call keeps one array of the scores' size for the backward pass (the softmax
  output, which the value matmul needs too), where with jax.nn.softmax it keeps two (its
  backward pass keeps exp(x - max) besides)."""
  rng = np.random.RandomState(0)
  x64 = rng.randn(2, 3, 5, 7) * 4.0  # [batch, heads, q, k] attention scores
  g64 = rng.randn(*x64.shape)

  def grad(fn, dtype):
    x, g = numerics.cast(x64, dtype), numerics.cast(g64, dtype)
    return jax.vjp(fn, x)[1](g)[0]

  numerics.check_equivalent(functools.partial(grad, layers.softmax),
                            functools.partial(grad, jax.nn.softmax), what="softmax gradient")

  def scores_kept():
    """Residuals of the scores' shape, as jax's public print_saved_residuals lists them."""
    q, k, v, bias = _inputs(jnp.float32)
    bias = bias[:1]  # [1, heads, q, k]: not of the scores' shape [batch, heads, q, k]
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
      ad_checkpoint.print_saved_residuals(lambda q, k, v: layers.dot_product_attention(
          q, k, v, bias, implementation="einsum").sum(), q, k, v)
    scores = f"f32[{q.shape[0]},{q.shape[2]},{q.shape[1]},{k.shape[1]}]"
    return sum(line.startswith(scores) for line in listing.getvalue().splitlines())

  assert scores_kept() == 1
  monkeypatch.setattr(layers, "softmax", jax.nn.softmax)
  assert scores_kept() == 2


def test_bfloat16_softmax_rounds_once_from_float32():
  """In bfloat16 both passes of layers.softmax are its float32 computation (checked against
  float64 above) rounded once, from the bfloat16 input (forward) and the bfloat16 output and
  cotangent (backward): a bfloat16 softmax would round after each operation."""
  rng = np.random.RandomState(0)
  x, g = (jnp.asarray(rng.randn(2, 3, 5, 7) * 4.0, jnp.bfloat16) for _ in range(2))
  y, vjp = jax.vjp(jax.jit(layers.softmax), x)
  (dx,) = vjp(g)
  assert y.dtype == dx.dtype == jnp.bfloat16

  @jax.jit
  def float32_rounded_once(x, g):
    y = jax.nn.softmax(x.astype(jnp.float32))
    y32, g32 = y.astype(jnp.bfloat16).astype(jnp.float32), g.astype(jnp.float32)
    dx = y32 * (g32 - jnp.sum(g32 * y32, axis=-1, keepdims=True))  # from the bfloat16 y kept
    return y.astype(jnp.bfloat16), dx.astype(jnp.bfloat16)

  for got, want in zip((y, dx), float32_rounded_once(x, g)):
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
