"""Numerical-equivalence bounds derived from the computation's own rounding error.

Two programs that compute the same function in float32 (another partitioning, another
formulation, another library) differ only by rounding. We measure the rounding error of one of
them, the reference, against the same reference run in float64 (jax x64, torch double), and
require the variant to be no farther from the float64 result than FACTOR times that error:

    max|variant - ref64| <= FACTOR * max(max|ref32 - ref64|, EPS32 * max|ref64|)

Why FACTOR = 8: float32 evaluations of one function that differ only in the order of their
sums have errors of the same distribution, so the variant's error is about the reference's.
Measured here: 5 Adafactor steps (lr 0.3) of the embedded default on a 4 x 2 mesh vs 1 device,
7 prompt seeds, max-norm over the 512 prompt values: variant error / reference error between
0.55 and 1.64. FACTOR = 8 leaves a 5x margin over the worst ratio seen, on any CPU (the
ratio, not the error, is what the bound rests on). A real bug (a dropped shard, a wrong mask,
a missing scale) moves results by >= 1e-3, orders of magnitude above these bounds.
The floor `EPS32 * max|ref64|` (one float32 ulp at the result's scale) keeps the bound meaningful
when the float32 reference happens to be exact.

`check_equivalent` also runs the variant in float64 and requires it to agree with the float64
reference to the same multiple of the float32 error scaled to float64's unit roundoff (rounding
error is proportional to the unit roundoff for a fixed order of operations): the equivalence is
then checked about nine orders of magnitude more tightly than float32 allows.

For a lower-precision variant of the same computation (bfloat16 activations), `assert_close`
takes `eps=`: the bound scales the float32 reference error by eps / EPS32.
"""
import contextlib
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

FACTOR = 8.0
EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)
EPS_BF16 = float(jnp.finfo(jnp.bfloat16).eps)


@contextlib.contextmanager
def float64():
  """64-bit JAX inside the block (jnp.float64 arrays stay float64)."""
  with jax.enable_x64(True):
    yield


def cast(tree: Any, dtype) -> Any:
  """Floating leaves of `tree` as numpy arrays of `dtype`; other leaves unchanged."""

  def leaf(x):
    a = np.asarray(x)
    return a.astype(dtype) if np.issubdtype(a.dtype, np.floating) or a.dtype == jnp.bfloat16 else x

  return jax.tree_util.tree_map(leaf, tree)


def in_float64(model, params):
  """`model` computing in float64 and `params` cast to it (use inside `float64()`): where two
  different programs (KV cache vs full recompute, greedy vs beam 1, one device vs a mesh) must
  make the same argmax / top-k choices, they are compared in float64, where a near-tie flipped by
  rounding needs a tie within ~1e-16 relative instead of float32's ~1e-7."""
  return model.clone(config=model.config.replace(dtype=jnp.float64)), cast(params, np.float64)


def _np(x) -> np.ndarray:
  return np.asarray(jax.device_get(x)).astype(np.float64)


def bound(ref32, ref64, *, factor: float = FACTOR, eps: float = EPS32) -> float:
  """FACTOR x the float32 reference's own error (scaled to a unit roundoff `eps`), floored at
  one ulp of the result's scale."""
  ref32, ref64 = _np(ref32), _np(ref64)
  err = float(np.abs(ref32 - ref64).max()) if ref64.size else 0.0
  scale = float(np.abs(ref64).max()) if ref64.size else 0.0
  return factor * max(err * eps / EPS32, eps * scale)


def assert_close(variant, ref32, ref64, *, factor: float = FACTOR, eps: float = EPS32,
                 what: str = "variant") -> float:
  """max|variant - ref64| <= bound(ref32, ref64); returns the distance (for reporting)."""
  variant, ref64 = _np(variant), _np(ref64)
  assert variant.shape == ref64.shape, (what, variant.shape, ref64.shape)
  distance = float(np.abs(variant - ref64).max()) if ref64.size else 0.0
  limit = bound(ref32, ref64, factor=factor, eps=eps)
  err32 = float(np.abs(_np(ref32) - ref64).max()) if ref64.size else 0.0
  assert distance <= limit, (
      f"{what}: max|variant - float64 reference| = {distance:.3g} exceeds {limit:.3g} "
      f"({factor:g} x the float32 reference's own error {err32:.3g}, unit roundoff {eps:.3g})")
  return distance


def check_equivalent(variant_fn: Callable[[Any], Any], reference_fn: Callable[[Any], Any], *,
                     where: Optional[np.ndarray] = None, factor: float = FACTOR,
                     check_float64: bool = True, what: str = "variant") -> None:
  """`variant_fn(dtype)` and `reference_fn(dtype)` compute one function in `dtype` (jnp.float32
  or jnp.float64, called inside `float64()` for the latter). Asserts the float32 variant is
  within `bound` of the float64 reference and, with `check_float64`, that the float64 variant
  agrees with it to the same bound at float64's unit roundoff. `where` selects the entries that
  must agree (e.g. non-padding positions)."""
  ref32 = _np(reference_fn(jnp.float32))
  var32 = _np(variant_fn(jnp.float32))
  with float64():
    ref64 = _np(reference_fn(jnp.float64))
    var64 = _np(variant_fn(jnp.float64)) if check_float64 else None
  if where is not None:
    ref32, var32, ref64 = ref32[where], var32[where], ref64[where]
    var64 = var64[where] if var64 is not None else None
  assert_close(var32, ref32, ref64, factor=factor, what=what)
  if var64 is not None:
    assert_close(var64, ref32, ref64, factor=factor, eps=EPS64, what=f"{what} (float64)")


def near_ties(scores32, scores64, *, factor: float = FACTOR) -> np.ndarray:
  """Where float32 programs computing `scores` [..., C] may pick different argmax choices.

  A choice (rank classification's label) compared across programs of different shapes (alone
  vs batched with other prompts, padded, another batch split) cannot be required to be
  bitwise equal: XLA gives no such guarantee across shapes, and a near-tie may flip. Each float32
  program is within `bound(scores32, scores64)` of the float64 scores (the premise above), so
  their choices can differ only where the float64 top-2 margin is at most twice that bound.
  Returns a bool array [...] marking those positions."""
  s64 = _np(scores64)
  limit = bound(scores32, scores64, factor=factor)
  top = np.sort(s64, axis=-1)
  return (top[..., -1] - top[..., -2]) <= 2 * limit


def assert_same_choices(got, want, near_tie, *, what: str = "choices",
                        max_near_tie_share: float = 0.05) -> int:
  """`got` == `want` wherever `near_tie` (from `near_ties`) is False; returns how many differ.
  Near-ties must stay rare (`max_near_tie_share`), so the comparison keeps its teeth: a wrong
  mask or prompt changes choices far from any tie."""
  got, want, near_tie = np.asarray(got), np.asarray(want), np.asarray(near_tie, bool)
  assert got.shape == want.shape == near_tie.shape, (what, got.shape, want.shape, near_tie.shape)
  differ = got != want
  bad = np.flatnonzero(differ & ~near_tie)
  assert bad.size == 0, (
      f"{what}: {bad.size} of {got.size} differ away from any float32 near-tie (first at "
      f"{bad[:5].tolist()}: {got.flat[bad[:5]].tolist()} vs {want.flat[bad[:5]].tolist()})")
  share = float(near_tie.mean()) if near_tie.size else 0.0
  assert share <= max_near_tie_share, (
      f"{what}: {share:.1%} of choices are within float32 rounding of a tie; the bound "
      f"is too loose to check anything")
  return int(differ.sum())


def greedy_near_ties(model, params, encoder_input_tokens, steps: int, *,
                     factor: float = FACTOR) -> np.ndarray:
  """[B] rows whose greedy decoding may differ between float32 programs (another decoding loop,
  beam 1, another batch or device layout, t5x's decoder): the float64 greedy path has a step, up
  to its EOS, whose top-2 logit margin is at most twice `bound` of the float32 teacher-forced
  logits along that path (each float32 program is within that bound of float64; from the first
  such step on, their paths may part)."""
  from prompt_jax.models import decoding  # pylint: disable=g-import-not-at-top
  enc = jnp.asarray(encoder_input_tokens)

  def logits(m, p, tokens):
    """Teacher-forced logits [B, L, V] along `tokens` [B, L] (BOS = 0; every position valid)."""
    dec_in = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))
    return m.apply({"params": p}, enc, dec_in, jnp.ones_like(tokens), enable_dropout=False)

  with float64():
    m64, p64 = in_float64(model, params)
    tokens = jnp.asarray(decoding.greedy_decode(m64, p64, enc, steps), jnp.int32)
    ref64 = _np(logits(m64, p64, tokens))
  ref32 = _np(logits(model, params, tokens))
  toks = np.asarray(tokens)
  eos = np.where((toks == 1).any(-1), np.argmax(toks == 1, axis=-1), steps - 1)
  valid = np.arange(steps)[None, :] <= eos[:, None]  # [B, L] steps up to and including EOS
  limit = bound(ref32[valid], ref64[valid], factor=factor)
  top = np.sort(ref64, axis=-1)
  return ((top[..., -1] - top[..., -2] <= 2 * limit) & valid).any(-1)
