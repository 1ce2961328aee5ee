"""'chunked' attention (layers._chunked_attention): the einsum path run a few (batch, head) pairs
at a time, each chunk recomputed in the backward pass. It must compute what the einsum path
computes (outputs and gradients of q, k, v and the bias, with and without dropout, for every
bias form and both ways a chunk is cut), keep no array of the attention scores' size for the
backward pass, and be what 'auto' picks only where it was measured to pay.

Bounds are derived (tests/numerics.py): the float32 'chunked' result within 8x the float32 einsum
path's own distance to the float64 einsum result ('chunked' in float64 is the einsum path, so
the float64 side is not run for it).
"""
import contextlib
import io

import jax
from jax import ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import layers
from tests import numerics

BATCH, LENGTH, HEADS, KV = 4, 7, 4, 8
# Each row's real positions (the rest padding, at the end as seqio pads).
VALID = np.array([[1] * 7, [1] * 4 + [0] * 3, [1] * 6 + [0], [1] * 2 + [0] * 5], bool)


def _inputs(dtype, bias_shape):
  rng = np.random.RandomState(0)
  q, k, v, g = (rng.randn(BATCH, LENGTH, HEADS, KV) for _ in range(4))
  bias = None
  if bias_shape is not None:
    mask = VALID[:, None, :, None] & VALID[:, None, None, :]  # [batch, 1, q, k]
    bias = rng.randn(*bias_shape) + np.where(mask[:bias_shape[0]] > 0, 0.0, -1e10)
  return [None if x is None else numerics.cast(x, dtype) for x in (q, k, v, bias, g)]


def _vjp(impl, bias_shape, dtype, dropout_rate=0.0):
  """(output, d/dq, d/dk, d/dv, d/dbias) of sum(attention * g)."""
  q, k, v, bias, g = _inputs(dtype, bias_shape)
  rng = jax.random.PRNGKey(3)

  def attention(q, k, v, bias):
    return layers.dot_product_attention(
        q, k, v, bias, dropout_rng=rng, dropout_rate=dropout_rate,
        deterministic=dropout_rate == 0.0, dtype=dtype, implementation=impl)

  if bias is None:
    out, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, None), q, k, v)
    return (out,) + vjp(g)
  out, vjp = jax.vjp(attention, q, k, v, bias)
  return (out,) + vjp(g)


@pytest.mark.parametrize("budget_pairs", [2, 8])  # within one batch row; two whole rows
@pytest.mark.parametrize("bias_shape", [(BATCH, HEADS, LENGTH, LENGTH), (1, HEADS, LENGTH, LENGTH),
                                        (BATCH, 1, LENGTH, LENGTH), None])
@pytest.mark.parametrize("dropout_rate", [0.0, 0.3])
def test_chunked_equals_einsum_outputs_and_gradients(budget_pairs, bias_shape, dropout_rate,
                                                     monkeypatch):
  """Chunks of 2 pairs (a chunk within one batch row, heads sliced) and of 8 pairs (whole batch
  rows, a broadcast bias expanded per chunk); the same dropout draw as the einsum path for the
  same key (a chunk drawing its own mask would differ by O(1)); the bias gradient (a trainable
  relative-position bias, as in full fine-tuning) summed over its broadcast dimensions."""
  monkeypatch.setattr(layers, "CHUNK_BYTES", budget_pairs * LENGTH * LENGTH * 4)
  assert layers.chunk_pairs(BATCH, HEADS, LENGTH, LENGTH) == budget_pairs
  # Under x64 for both dtypes: dropout draws its masks in the precision of its keep
  # probability, so float32 and float64 runs share masks only when both run with x64 on.
  with numerics.float64():
    ref32 = _vjp("einsum", bias_shape, jnp.float32, dropout_rate)
    ref64 = _vjp("einsum", bias_shape, jnp.float64, dropout_rate)
    got = _vjp("chunked", bias_shape, jnp.float32, dropout_rate)
  # Padded query rows mask every key: -1e10 swamps the bias in float32 (a uniform average) but
  # not in float64, so their outputs differ by O(1) between the precisions (as in
  # test_fused_attention); every other entry, and every gradient, is compared.
  real = np.broadcast_to(VALID[:, :, None, None], ref32[0].shape) if bias_shape else np.ones(
      ref32[0].shape, bool)
  names = ("output", "d/dq", "d/dk", "d/dv", "d/dbias")
  for i, (name, a, b, c) in enumerate(zip(names, got, ref32, ref64)):
    a, b, c = (np.asarray(x) for x in (a, b, c))
    if i == 0:
      a, b, c = a[real], b[real], c[real]
    assert a.shape == b.shape, name
    numerics.assert_close(a, b, c, what=f"chunked {name}")


def test_chunked_keeps_no_array_of_the_scores_size(monkeypatch):
  """The einsum path keeps its weights [batch, heads, q, k] for the backward pass; 'chunked'
  keeps only each chunk's inputs and recomputes the rest (a chunk body that saved its weights
  would show [8, 2, q, k] here)."""
  monkeypatch.setattr(layers, "CHUNK_BYTES", 2 * LENGTH * LENGTH * 4)  # 8 chunks of 2 pairs
  q, k, v, bias, _ = _inputs(jnp.float32, (1, HEADS, LENGTH, LENGTH))
  bias_kept = f"f32[1,{HEADS},{LENGTH},{LENGTH}] from a constant"  # held by the caller anyway

  def kept(impl):
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
      ad_checkpoint.print_saved_residuals(lambda q, k, v: layers.dot_product_attention(
          q, k, v, bias, implementation=impl).sum(), q, k, v)
    lines = listing.getvalue().splitlines()
    # Arrays ending in [q, k], other than the bias.
    return [l for l in lines if f",{LENGTH},{LENGTH}]" in l.split(" ")[0]
            and not l.startswith(bias_kept)]

  assert len(kept("einsum")) == 1, kept("einsum")  # the weights
  assert kept("chunked") == [], kept("chunked")


def test_chunk_pairs():
  """The most (batch, head) pairs whose float32 scores fit the budget, among the divisors of the
  heads and the heads times the divisors of the batch; never 1 when 2 are possible."""
  mb = 1 << 20
  assert layers.chunk_pairs(8, 6, 612, 612, budget=4 * mb) == 2  # 1.5 MB of scores a pair
  assert layers.chunk_pairs(8, 6, 612, 612, budget=5 * mb) == 3
  assert layers.chunk_pairs(8, 6, 612, 612, budget=8 * mb) == 3  # 4 and 5 divide neither
  assert layers.chunk_pairs(8, 6, 612, 612, budget=10 * mb) == 6  # one whole batch row
  assert layers.chunk_pairs(8, 6, 612, 612, budget=20 * mb) == 12  # two rows
  assert layers.chunk_pairs(8, 6, 612, 612, budget=1) == 2  # at least 2
  assert layers.chunk_pairs(1, 1, 612, 612, budget=1) == 1  # unless there is only 1
  assert layers.chunk_pairs(32, 6, 164, 164, budget=4 * mb) == 24
  assert layers.chunk_pairs(4, 2, 8, 8, budget=4 * mb) == 8  # everything in one chunk


def test_auto_picks_chunked_only_for_recomputed_float32_weights_on_one_cpu(monkeypatch):
  q = jnp.zeros((2, 16, 2, 8), jnp.float32)

  def pick(requested, dtype, dropout=False, recompute=False):
    return layers.attention_implementation(requested, q, q, dtype, dropout, recompute)

  on_cpu = jax.default_backend() == "cpu"
  assert pick("auto", jnp.float32, recompute=True) == ("chunked" if on_cpu else
                                                       pick("auto", jnp.float32))
  assert pick("auto", jnp.float32, dropout=True, recompute=True) == (
      "chunked" if on_cpu else "einsum")  # 'chunked' takes dropout; jax.nn's kernels do not
  assert pick("auto", jnp.float32) == ("einsum" if on_cpu else pick("auto", jnp.float32))
  assert pick("auto", jnp.bfloat16, recompute=True) != "chunked"  # measured slower
  assert pick("chunked", jnp.bfloat16) == "chunked"  # asked for: taken
  assert pick("chunked", jnp.float32, dropout=True) == "chunked"
  with numerics.float64():
    assert pick("chunked", jnp.float64) == "einsum"  # the float64 reference
  monkeypatch.setattr(jax, "device_count", lambda: 8)  # a mesh would gather its lax.map
  assert pick("auto", jnp.float32, recompute=True) != "chunked"


def test_bfloat16_chunked_within_bfloat16_error_of_einsum():
  """bfloat16 inputs (products summed in float32 on CPU): within bfloat16's error scaled from
  the float32 einsum path's own (tests/numerics.py, eps=)."""
  shape = (BATCH, HEADS, LENGTH, LENGTH)
  ref32 = _vjp("einsum", shape, jnp.float32)
  with numerics.float64():
    ref64 = _vjp("einsum", shape, jnp.float64)
  got = _vjp("chunked", shape, jnp.bfloat16)
  real = np.broadcast_to(VALID[:, :, None, None], ref32[0].shape)
  for i, (a, b, c) in enumerate(zip(got, ref32, ref64)):
    a, b, c = (np.asarray(x, np.float64) for x in (a, b, c))
    if i == 0:
      a, b, c = a[real], b[real], c[real]
    numerics.assert_close(a, b, c, eps=numerics.EPS_BF16, what=f"bfloat16 chunked {i}")
