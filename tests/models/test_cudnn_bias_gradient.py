"""cuDNN's fused attention computes the bias gradient only where the bias is differentiated
(`layers._cudnn_attention`): in prompt tuning T5's relative-position bias is frozen, and jax's
cuDNN call would otherwise compute its gradient in every layer's backward pass (on an H200, T5
1.1 base: 2.3 ms of a 34.5 ms step in `fmha_dbias`, docs/benchmarks.md).

cuDNN needs a GPU, but what the step asks of it is in the traced program: jax's cuDNN primitives
carry `variadic_args=(has_bias, has_dbias)`, and tracing them needs only the cuDNN version
check, which these tests answer. On CPU the routing is checked numerically with jax.nn's 'xla'
kernel in cuDNN's place; the GPU's own numbers come from `prompt-jax bench attention`
(dq, dk, dv against a float64 einsum) and a device check (docs/benchmarks.md).
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from prompt_jax import trees
from prompt_jax.models import T5, layers
from prompt_jax.prompts import PromptTuning, prompt_factory, specs
from prompt_jax.train import state as state_lib
from tests import numerics
from tests.train.test_step_flops import CFG, _batch

P = 8


@pytest.fixture
def cudnn_traceable(monkeypatch):
  """Lets jax trace its cuDNN attention on a machine without cuDNN (tracing only: the
  primitives' abstract evaluation needs no GPU)."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(cudnn_attention, "check_cudnn_version", lambda *a, **k: 91000)
  return cudnn_attention


def _cudnn_calls(jaxpr):
  """[(primitive name, variadic_args)] of jax's cuDNN attention in a jaxpr, nested ones too."""
  found = []

  def walk(j):
    for eqn in j.eqns:
      if "dot_product_attention" in eqn.primitive.name:
        found.append((eqn.primitive.name.replace("_wrapper", ""), eqn.params["variadic_args"]))
      for param in eqn.params.values():
        for sub in (param if isinstance(param, (tuple, list)) else (param,)):
          inner = getattr(sub, "jaxpr", None)
          if inner is not None:
            walk(getattr(inner, "jaxpr", inner))

  walk(jaxpr.jaxpr)
  return found


def _attention_inputs(dtype=jnp.bfloat16):
  rng = np.random.RandomState(0)
  q, k, v = (jnp.asarray(rng.randn(2, 16, 2, 64), dtype) for _ in range(3))
  relpos = jnp.asarray(rng.randn(1, 2, 16, 16), jnp.float32)  # [1, heads, q, k]
  lengths = jnp.array([16, 9], jnp.int32)
  return q, k, v, relpos, lengths


@pytest.mark.parametrize("form", ["lengths", "dense"])
def test_the_bias_gradient_is_asked_for_only_when_the_bias_is_differentiated(
    cudnn_traceable, form):
  q, k, v, relpos, lengths = _attention_inputs()

  def loss(q, relpos):
    bias = relpos.astype(jnp.bfloat16) * 2
    if form == "lengths":
      bias = layers.PaddedBias(bias, lengths, lengths)
    out = layers.dot_product_attention(q, k, v, bias, dtype=jnp.bfloat16, implementation="cudnn")
    return out.astype(jnp.float32).sum()

  original = cudnn_traceable._dot_product_attention  # pylint: disable=protected-access
  frozen = _cudnn_calls(jax.make_jaxpr(jax.grad(loss))(q, relpos))
  assert frozen == [("dot_product_attention_fwd", (True, False)),
                    ("dot_product_attention_bwd", (True, False))]
  differentiated = _cudnn_calls(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(q, relpos))
  assert differentiated == [("dot_product_attention_fwd", (True, True)),
                            ("dot_product_attention_bwd", (True, True))]
  assert cudnn_traceable._dot_product_attention is original  # pylint: disable=protected-access


def test_the_prompt_tuning_step_asks_for_no_bias_gradient(cudnn_traceable):
  """The whole train step on cuDNN: prompt tuning (the relative-position tables frozen) asks for
  no bias gradient in any layer; full fine-tuning (the tables trained) asks for it in every
  self-attention layer whose bias is T5's relative one (cross-attention has no bias)."""
  del cudnn_traceable
  model = T5(CFG.replace(dtype=jnp.bfloat16, attention_implementation="cudnn"),
             prompt=prompt_factory(functools.partial(PromptTuning, length=P), P))
  batch = _batch()
  params = nn.meta.unbox(jax.eval_shape(lambda: model.init(
      jax.random.PRNGKey(0), batch["encoder_input_tokens"][:1],
      batch["decoder_input_tokens"][:1], batch["decoder_target_tokens"][:1],
      enable_dropout=False))["params"])
  prompt, frozen = trees.split(params, specs.DEFAULT_REGEX)
  tx = optax.sgd(0.1)

  def backward_calls(trainable, rest):
    state = jax.eval_shape(lambda t: state_lib.TrainState(jnp.int32(0), t, tx.init(t)), trainable)
    step = state_lib.make_train_step(model, tx)
    calls = _cudnn_calls(jax.make_jaxpr(step)(state, rest, batch, jax.random.PRNGKey(0)))
    return [args for name, args in calls if name.endswith("bwd")]

  layers_n = CFG.num_encoder_layers + CFG.num_decoder_layers
  prompt_bwd = backward_calls(prompt, frozen)
  # Every layer's attention is differentiated but decoder layer 0's self-attention (the prompt
  # does not reach it); none asks for the bias gradient.
  assert len(prompt_bwd) == layers_n + CFG.num_decoder_layers - 1
  assert all(not has_dbias for _, has_dbias in prompt_bwd)
  full_bwd = backward_calls(params, {})
  assert len(full_bwd) == layers_n + CFG.num_decoder_layers
  assert sum(has_dbias for _, has_dbias in full_bwd) == layers_n  # the self-attentions


@pytest.mark.parametrize("differentiate_bias", [False, True])
def test_the_routing_gives_jax_nn_gradients(monkeypatch, differentiate_bias):
  """`_cudnn_attention`'s custom_vjp (the bias perturbed or not), run with jax.nn's 'xla' kernel
  in cuDNN's place on CPU: its gradients equal the kernel's own autodiff, within the
  float64-derived bound."""
  monkeypatch.setattr(layers, "_jax_nn_attention", _xla_in_place_of_cudnn)
  q, k, v, relpos, lengths = _attention_inputs(jnp.float32)
  cotangent = jnp.asarray(np.random.RandomState(1).randn(*q.shape), jnp.float32)
  argnums = (0, 1, 2, 3) if differentiate_bias else (0, 1, 2)

  def grads(attention, dtype):
    def loss(q, k, v, relpos):
      out = attention(q.astype(dtype), k.astype(dtype), v.astype(dtype),
                      relpos.astype(dtype), lengths, lengths)
      return (out.astype(cotangent.dtype) * cotangent).sum()
    return jax.grad(loss, argnums=argnums)(q, k, v, relpos)

  direct = _xla_in_place_of_cudnn
  ours = grads(layers._cudnn_attention, jnp.float32)  # pylint: disable=protected-access
  reference = grads(direct, jnp.float32)
  for got, want, name in zip(ours, reference, "qkvb"):
    # The same kernel and the same autodiff, only routed: equal to float32 rounding (both are
    # within float32's own error of the float64 result, which bounds their difference).
    with numerics.float64():
      exact = grads(direct, jnp.float64)["qkvb".index(name)]
    bound = 2 * float(jnp.max(jnp.abs(want - exact.astype(jnp.float32)))) + 1e-7
    np.testing.assert_allclose(got, want, rtol=0, atol=bound, err_msg=f"d{name}")


def _xla_in_place_of_cudnn(query, key, value, bias, query_lengths, key_lengths,
                           implementation="xla", bias_gradient=True):
  del implementation, bias_gradient  # 'xla' differentiates what is asked
  return jax.nn.dot_product_attention(query, key, value, bias=bias, scale=1.0,
                                      query_seq_lengths=query_lengths,
                                      key_value_seq_lengths=key_lengths, implementation="xla")
