"""The cross entropy's hand-written backward pass (train/losses.py) against the plain formula
differentiated by JAX, in float64, and what the compiled step keeps for it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.train import losses
from tests import numerics


def _plain(logits, targets, z_loss):
  """The formula as it was, differentiated by JAX (the reference)."""
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  z = z_loss * jnp.square(log_z)
  return log_z - target_logit + z, z


def _objective(fn, weights):
  """A loss using both outputs with other weights, as a cotangent for each: a wrong term of
  either output's gradient shows."""
  def objective(logits, targets):
    token_loss, z = fn(logits, targets, 1e-2)  # a large z_loss: its terms must be right too
    return jnp.sum(token_loss * weights) + 3.0 * jnp.sum(z * weights[::-1])
  return objective


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gradient_equals_the_plain_formulas(dtype):
  rng = np.random.RandomState(0)
  logits = rng.standard_normal((3, 5, 97)) * 4.0
  targets = rng.randint(0, 97, (3, 5)).astype(np.int32)
  weights = (rng.rand(3, 5) > 0.3).astype(np.float64)

  def run(fn, dt):
    objective = _objective(fn, jnp.asarray(weights, jnp.promote_types(dt, jnp.float32)))
    value, grad = jax.value_and_grad(objective)(jnp.asarray(logits, dt), jnp.asarray(targets))
    return np.asarray(value, np.float64), np.asarray(grad.astype(jnp.float32), np.float64)

  ours = run(losses.cross_entropy_with_z_loss, dtype)
  plain32 = run(_plain, dtype)
  with numerics.float64():
    plain64 = run(_plain, jnp.float64)
    ours64 = run(losses.cross_entropy_with_z_loss, jnp.float64)
  assert ours[1].shape == logits.shape
  if dtype == jnp.bfloat16:  # the same bfloat16 rounding of the logits on both sides
    numerics.assert_close(ours[1], plain32[1], plain64[1], eps=numerics.EPS_BF16,
                          what="bfloat16 gradient")
    return
  for i, what in enumerate(("loss", "gradient")):
    numerics.assert_close(ours[i], plain32[i], plain64[i], what=what)
    numerics.assert_close(ours64[i], plain32[i], plain64[i], eps=numerics.EPS64,
                          what=f"{what} (float64)")


def test_bfloat16_logits_keep_no_float32_copy_for_the_gradient():
  """bfloat16 logits (T5 1.0 in bfloat16: tied embeddings, no float32 output projection): the
  gradient's residual is the logits themselves, so the compiled value-and-grad holds fewer
  float32 [B, S, V] arrays than differentiating the plain formula (which kept a float32 copy)."""
  shape = (4, 64, 4096)  # [B, S, V]
  targets = jax.ShapeDtypeStruct(shape[:2], jnp.int32)
  weights = jnp.ones(shape[:2], jnp.float32)

  def temp_bytes(fn):
    # the logits come from a matmul in the step: made inside, from a [B, S, 8] input
    def objective(x, w, targets):
      return _objective(fn, weights)((x @ w).astype(jnp.bfloat16), targets)
    x = jax.ShapeDtypeStruct(shape[:2] + (8,), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((8, shape[2]), jnp.bfloat16)
    compiled = jax.jit(jax.grad(objective)).lower(x, w, targets).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  float32_logits = np.prod(shape) * 4
  ours, plain = temp_bytes(losses.cross_entropy_with_z_loss), temp_bytes(_plain)
  assert ours <= plain - 0.4 * float32_logits, (ours / float32_logits, plain / float32_logits)
