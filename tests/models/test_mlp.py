"""T5 1.1's gated-GELU MLP: `layers.gated_gelu` has the gradient of the expression it replaces
(bounds derived from float32's own error against float64, tests/numerics.py), computes the same
forward values bit for bit, and keeps only the two `wi` matmul outputs for the backward pass."""
import contextlib
import functools
import io

import flax.linen as nn
import jax
from jax import ad_checkpoint
import jax.numpy as jnp
import numpy as np

from prompt_jax.models import layers
from tests import numerics


def _plain(gate, linear):
  return jax.nn.gelu(gate, approximate=True) * linear


def _inputs(dtype):
  rng = np.random.RandomState(0)
  # [batch, length, mlp]; scale 3 reaches GELU's curved part and both tails
  gate, linear, g = (rng.randn(2, 5, 16) * 3.0 for _ in range(3))
  return [numerics.cast(x, dtype) for x in (gate, linear, g)]


def test_gated_gelu_values_and_gradients_match_the_expression():
  gate, linear, _ = _inputs(jnp.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(layers.gated_gelu)(gate, linear)),
                                np.asarray(jax.jit(_plain)(gate, linear)))

  def grads(fn, wrt, dtype):
    gate, linear, g = _inputs(dtype)
    return jax.vjp(fn, gate, linear)[1](g)[wrt]

  for wrt, name in ((0, "gate"), (1, "linear")):
    numerics.check_equivalent(functools.partial(grads, layers.gated_gelu, wrt),
                              functools.partial(grads, _plain, wrt),
                              what=f"gated_gelu gradient w.r.t. {name}")


def test_bfloat16_gated_gelu_rounds_once_from_float32():
  """In bfloat16 both passes are the float32 computation rounded once at the end (the float32
  one is checked against float64 above): a bfloat16 expression would round after each
  operation (and XLA CPU converts each of those roundings separately)."""
  gate, linear, g = _inputs(jnp.bfloat16)
  wide = [x.astype(jnp.float32) for x in (gate, linear, g)]
  out, vjp = jax.vjp(jax.jit(layers.gated_gelu), gate, linear)
  out32, vjp32 = jax.vjp(jax.jit(layers.gated_gelu), *wide[:2])
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(out, np.float32),
                                np.asarray(out32.astype(jnp.bfloat16), np.float32))
  np.testing.assert_array_equal(np.asarray(out32), np.asarray(jax.jit(_plain)(*wide[:2])))
  for got, want in zip(vjp(g), vjp32(wide[2])):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(want.astype(jnp.bfloat16), np.float32))


def test_mlp_block_keeps_only_the_two_matmul_outputs(monkeypatch):
  """Differentiating the gated GELU as written keeps five more [batch, length, mlp] arrays (the
  tanh and its pieces): the custom_vjp's backward pass recomputes them from the gate."""
  block = layers.MlpBlock(intermediate_dim=16, activations=("gelu", "linear"), dropout_rate=0.0)
  x = jnp.asarray(np.random.RandomState(1).randn(2, 5, 8), jnp.float32)  # [batch, length, embed]
  params = block.init(jax.random.PRNGKey(0), x)

  def kept():
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
      ad_checkpoint.print_saved_residuals(lambda x: block.apply(params, x).sum(), x)
    return sum(line.startswith("f32[2,5,16]") for line in listing.getvalue().splitlines())

  assert kept() == 2
  monkeypatch.setattr(layers, "gated_gelu", _plain)
  assert kept() == 7


def test_compiled_gradient_does_not_keep_the_forward_tanh(monkeypatch):
  """What XLA allocates: without the optimisation barrier in the backward rule, XLA merges the
  recomputed tanh with the forward pass's (CSE) and keeps it alive across the stack, as plain
  autodiff does; with it, the compiled gradient of three MLP blocks needs less temporary memory
  than the plain expression's, by at least one [batch, length, mlp] array."""

  class Stack(nn.Module):
    @nn.compact
    def __call__(self, x):
      for i in range(3):
        x = x + layers.MlpBlock(intermediate_dim=256, activations=("gelu", "linear"),
                                dropout_rate=0.0, name=f"mlp_{i}")(x)
      return x

  stack, x = Stack(), jnp.ones((4, 64, 32), jnp.float32)  # [batch, length, embed]
  params = stack.init(jax.random.PRNGKey(0), x)

  def temp_bytes():
    grad = jax.jit(jax.grad(lambda x: stack.apply(params, x).sum()))
    return grad.lower(x).compile().memory_analysis().temp_size_in_bytes

  ours = temp_bytes()
  monkeypatch.setattr(layers, "gated_gelu", _plain)
  plain = temp_bytes()
  assert plain - ours >= 4 * 64 * 256 * 4, (ours, plain)
