"""The Pallas TPU flash-attention path (attention_implementation='pallas') equals the einsum
reference, on one attention call and through the whole model, run on CPU in Pallas TPU
interpret mode (the kernel's own code, interpreted; no TPU here).

Bounds are derived (tests/numerics.py): the float32 kernel must be within 8x the float32 einsum
reference's own distance to the float64 einsum result (the kernel has no float64;
`attention_implementation` sends float64 to the einsum reference). Lengths are not multiples of
the kernel's 128-block, so the padding of both lengths, and the masking of padded keys, is what
is checked; 137 keys take two blocks.

Float64 comparisons read only query rows with some visible key: a row the caller masks
entirely (T5's padding positions: every logit -1e10 + bias) is uniform over the real keys in
float32, where -1e10 swallows the bias, but not in float64, so there the einsum path itself is
off by O(1). Those rows are compared with the float32 einsum path instead.

Interpret mode must be on where the gradient is taken, not only around the forward call: the
kernel's backward-pass kernels are traced then.
"""
import contextlib
import functools

import flax.linen as nn
import jax
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import T5, layers
from prompt_jax.prompts import PromptTuning, prompt_factory
from tests import numerics
from tests.models.test_t5 import TINY, _batch

HEADS, HEAD_DIM = 2, 8


def _inputs(q_len, k_len, dtype):
  """query, key, value [2, length, heads, kv], the additive bias [2, heads, q, k] (a padding
  mask hiding the second example's last 37 keys plus a relative-position-like [1, heads, q, k]
  bias) and the query rows with a visible key [2, q]. Self-attention (q_len == k_len) masks the
  padded queries' rows too, as T5's encoder does."""
  rng = np.random.RandomState(0)
  q = rng.randn(2, q_len, HEADS, HEAD_DIM)
  k, v = (rng.randn(2, k_len, HEADS, HEAD_DIM) for _ in range(2))
  valid_k = np.array([[1] * k_len, [1] * (k_len - 37) + [0] * 37])
  valid_q = valid_k if q_len == k_len else np.ones((2, q_len), int)
  mask = valid_q[:, None, :, None] * valid_k[:, None, None, :]  # [batch, 1, q, k]
  relpos = rng.randn(1, HEADS, q_len, k_len)  # [1, heads, q, k]
  bias = np.where(mask > 0, 0.0, -1e10) + relpos
  return [numerics.cast(x, dtype) for x in (q, k, v, bias)], valid_q > 0


def _attention(impl, q, k, v, bias, dtype):
  return layers.dot_product_attention(q, k, v, bias, dtype=dtype, implementation=impl)


@functools.lru_cache(maxsize=None)
def _results(impl, q_len, k_len, dtype):
  """The output [2, q, heads, kv] and the gradients of a loss reading only the query rows with
  a visible key, w.r.t. query, key, value and bias: as numpy float64 arrays."""
  (q, k, v, bias), rows = _inputs(q_len, k_len, dtype)
  g = numerics.cast(np.random.RandomState(1).randn(*q.shape) * rows[:, :, None, None], dtype)

  def loss(q, k, v, bias):
    return jnp.sum(_attention(impl, q, k, v, bias, dtype) * g)

  with pltpu.force_tpu_interpret_mode():  # the backward pass's kernels are traced in it too
    out = _attention(impl, q, k, v, bias, dtype)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, bias)
  return tuple(np.asarray(x, np.float64) for x in (out, *grads))


def _reference(q_len, k_len, dtype):
  if dtype == jnp.float64:
    with numerics.float64():
      return _results("einsum", q_len, k_len, dtype)
  return _results("einsum", q_len, k_len, dtype)


@pytest.mark.parametrize("q_len,k_len", [(137, 137), (8, 137)], ids=["self", "cross"])
def test_pallas_attention_and_its_gradients_equal_the_einsum_reference(q_len, k_len):
  _, rows = _inputs(q_len, k_len, np.float32)
  pallas32 = _results("pallas", q_len, k_len, jnp.float32)
  ref32, ref64 = _reference(q_len, k_len, jnp.float32), _reference(q_len, k_len, jnp.float64)
  names = ("output", "d query", "d key", "d value", "d bias")
  for name, var, r32, r64 in zip(names, pallas32, ref32, ref64):
    where = rows if name == "output" else ...  # the loss reads only `rows`: gradients all agree
    numerics.assert_close(var[where], r32[where], r64[where], what=f"pallas attention {name}")
  # Rows masked entirely: the float32 einsum path's uniform average over the real keys.
  limit = numerics.bound(ref32[0][rows], ref64[0][rows])
  masked = np.abs(pallas32[0][~rows] - ref32[0][~rows])
  assert masked.size == (0 if q_len != k_len else 37 * HEADS * HEAD_DIM)
  assert masked.max(initial=0.0) <= limit, (masked.max(), limit)


def test_pallas_attention_bfloat16():
  """bfloat16 (the kernel keeps scores in float32, weights x values in bfloat16): within 8x the
  error of the einsum path with float32 logits, the same arrangement, both against the float64
  result of the same bfloat16-rounded inputs (the rounding of the inputs is common to both)."""
  (q, k, v, bias), rows = _inputs(137, 137, jnp.bfloat16)
  with pltpu.force_tpu_interpret_mode():
    out = layers.dot_product_attention(q, k, v, bias, dtype=jnp.bfloat16, implementation="pallas")
  ref16 = layers.dot_product_attention(q, k, v, bias, dtype=jnp.bfloat16, float32_logits=True)
  with numerics.float64():
    ref64 = layers.dot_product_attention(*numerics.cast([q, k, v, bias], np.float64),
                                         dtype=jnp.float64)
  out, ref16, ref64 = (np.asarray(x, np.float64)[rows] for x in (out, ref16, ref64))
  numerics.assert_close(out, ref16, ref64, what="pallas attention, bfloat16")


def test_selection_needs_a_tpu_or_interpret_mode_and_auto_never_picks_pallas():
  q = jnp.zeros((1, 4, 2, 64), jnp.float32)
  pick = lambda req, dt, dropout=False: layers.attention_implementation(req, q, q, dt, dropout)
  if jax.default_backend() != "tpu":
    with pytest.raises(ValueError, match="needs a TPU"):
      pick("pallas", jnp.float32)
  for mode in (contextlib.nullcontext(), pltpu.force_tpu_interpret_mode()):
    with mode:
      for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        assert pick("auto", dtype) != "pallas"  # opt-in until measured on a TPU
  with pltpu.force_tpu_interpret_mode():
    assert pick("pallas", jnp.float32) == "pallas"
    assert pick("pallas", jnp.bfloat16) == "pallas"
    assert pick("pallas", jnp.float32, dropout=True) == "einsum"  # the kernel has no dropout
    with numerics.float64():
      assert pick("pallas", jnp.float64) == "einsum"


def test_pallas_attention_through_the_model_loss_and_prompt_gradient():
  """Tiny T5 with a 3-token prompt: encoder 10 positions, decoder 4, each padded to one
  128-block by the kernel; the loss and the prompt's gradient equal the einsum path's within
  1e-5 relative (float32 on CPU) and within the derived bound of the float64 reference."""
  enc, dec_in, tgt = _batch()
  prompt = prompt_factory(functools.partial(PromptTuning, length=3), 3)

  def model(impl, dtype):
    return T5(TINY.replace(dtype=dtype, attention_implementation=impl), prompt=prompt)

  with numerics.float64():
    params64 = numerics.cast(nn.meta.unbox(model("einsum", jnp.float64).init(
        jax.random.PRNGKey(0), enc, dec_in, tgt, enable_dropout=False))["params"], np.float64)

  def loss_and_prompt_grad(impl, dtype):
    p = numerics.cast(params64, dtype)

    def loss(prompt_value):
      q = jax.tree_util.tree_map(lambda x: x, p)
      q["encoder"]["prompt"]["prompt"]["prompt"] = prompt_value
      out = model(impl, dtype).apply({"params": q}, enc, dec_in, tgt, enable_dropout=False)
      return -jnp.sum(jax.nn.log_softmax(out) * jax.nn.one_hot(tgt, out.shape[-1])
                      * (tgt > 0)[..., None])

    with pltpu.force_tpu_interpret_mode():  # the backward pass's kernels are traced in it too
      value, grad = jax.jit(jax.value_and_grad(loss))(
          p["encoder"]["prompt"]["prompt"]["prompt"])
    return np.asarray(value, np.float64), np.asarray(grad, np.float64)

  pallas32 = loss_and_prompt_grad("pallas", jnp.float32)
  ref32 = loss_and_prompt_grad("einsum", jnp.float32)
  with numerics.float64():
    ref64 = loss_and_prompt_grad("einsum", jnp.float64)
  for name, var, r32, r64 in zip(("loss", "prompt gradient"), pallas32, ref32, ref64):
    numerics.assert_close(var, r32, r64, what=f"{name} (pallas attention)")
    relative = np.abs(var - r32).max() / np.abs(r32).max()
    assert relative <= 1e-5, (name, relative)
