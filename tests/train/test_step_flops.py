"""The compiled prompt-tuning step computes no gradient of the frozen weights (issue 11,
acceptance 2), read from XLA's cost analysis of the compiled programs.

A full fine-tuning step (the same `make_train_step`, every parameter trainable) does, on top of
the prompt-tuning step, one weight-gradient matmul per dense kernel: 2 x tokens x fan_in x
fan_out FLOPs each, and the relative-position tables', which we count from the model's shapes
(`_weight_gradient_flops`). The
prompt step must be cheaper by at least 90% of that count; a step that differentiated the frozen
weights (and dropped the result) would be about as expensive as full fine-tuning.
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from prompt_jax import trees
from prompt_jax.models import T5, T5Config
from prompt_jax.prompts import PromptTuning, prompt_factory, specs
from prompt_jax.train import state as state_lib

CFG = T5Config(vocab_size=128, emb_dim=64, num_heads=4, head_dim=16, mlp_dim=128,
               num_encoder_layers=2, num_decoder_layers=2, dtype=jnp.float32,
               mlp_activations=("gelu", "linear"), logits_via_embedding=False, dropout_rate=0.0)
B, T, P, S = 4, 32, 8, 8  # batch, inputs, prompt, targets


def _batch():
  rng = np.random.RandomState(0)
  enc = rng.randint(2, CFG.vocab_size, (B, T)).astype(np.int32)
  tgt = rng.randint(2, CFG.vocab_size, (B, S)).astype(np.int32)
  dec_in = np.concatenate([np.zeros((B, 1), np.int32), tgt[:, :-1]], axis=1)
  return {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in,
          "decoder_target_tokens": tgt, "decoder_loss_weights": np.ones_like(tgt)}


def _weight_gradient_flops() -> int:
  """2 x tokens x fan_in x fan_out for every dense kernel of the backbone, and the tables."""
  e, qkv, m = CFG.emb_dim, CFG.num_heads * CFG.head_dim, CFG.mlp_dim
  n_mlp_in = len(CFG.mlp_activations)
  enc_tokens, dec_tokens = B * (T + P), B * S
  enc_layer = enc_tokens * (4 * e * qkv + n_mlp_in * e * m + m * e)
  dec_layer = (dec_tokens * (4 * e * qkv + n_mlp_in * e * m + m * e)  # self-attn + MLP
               + dec_tokens * 2 * e * qkv + enc_tokens * 2 * e * qkv)  # cross-attn q,o / k,v
  logits = dec_tokens * e * CFG.vocab_size
  # The relative-position bias tables, [buckets, heads] x a one-hot [buckets, q, k] (t5x's
  # matmul form), one per stack.
  relative = CFG.relative_attention_num_buckets * CFG.num_heads * ((T + P) ** 2 + S ** 2)
  return 2 * (CFG.num_encoder_layers * enc_layer + CFG.num_decoder_layers * dec_layer + logits
              + relative)


def _step_flops(model, trainable, frozen, batch) -> float:
  tx = optax.sgd(0.1)
  state = state_lib.TrainState(jnp.int32(0), trainable, tx.init(trainable))
  step = jax.jit(state_lib.make_train_step(model, tx))
  compiled = step.lower(state, frozen, batch, jax.random.PRNGKey(0)).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])


# bfloat16 on CPU: the dense layers' products go through layers.float32_summed_einsum, whose
# backward pass computes only the gradients asked for.
DTYPES = pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])


def _prompt_model(dtype=jnp.float32, remat_policy="none"):
  """(model, batch, all params, the prompt's, the frozen rest) of a tiny prompt-tuning T5."""
  model = T5(CFG.replace(dtype=dtype, remat_policy=remat_policy),
             prompt=prompt_factory(functools.partial(PromptTuning, length=P), P))
  batch = _batch()
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch["encoder_input_tokens"][:1],
                                    batch["decoder_input_tokens"][:1],
                                    batch["decoder_target_tokens"][:1],
                                    enable_dropout=False))["params"]
  prompt_params, frozen = trees.split(params, specs.DEFAULT_REGEX)
  return model, batch, params, prompt_params, frozen


@DTYPES
def test_prompt_step_computes_no_frozen_weight_gradients(dtype):
  model, batch, params, prompt_params, frozen = _prompt_model(dtype)
  assert trees.flatten(prompt_params).keys() == {"encoder/prompt/prompt/prompt"}
  prompt_step = _step_flops(model, prompt_params, frozen, batch)
  full_step = _step_flops(model, params, {}, batch)
  weight_grads = _weight_gradient_flops()
  saved = full_step - prompt_step
  print(f"FLOPs: prompt step {prompt_step:.4g}, full fine-tuning step {full_step:.4g}, "
        f"difference {saved:.4g}, weight-gradient matmuls {weight_grads:.4g}")
  # The full step's extra work is (at least) the weight-gradient matmuls; all of them missing
  # from the prompt step (90%: the cost analysis also counts elementwise work both share).
  assert saved >= 0.9 * weight_grads, (prompt_step, full_step, weight_grads)
  assert prompt_step <= full_step - 0.9 * weight_grads


def _jaxpr_step_flops(model, trainable, frozen, batch) -> float:
  from prompt_jax import bench  # pylint: disable=g-import-not-at-top
  tx = optax.sgd(0.1)
  state = state_lib.TrainState(jnp.int32(0), trainable, tx.init(trainable))
  step = jax.jit(state_lib.make_train_step(model, tx))
  return bench.matmul_flops(jax.make_jaxpr(step)(state, frozen, batch, jax.random.PRNGKey(0)))


@DTYPES
def test_bench_matmul_flops_count_the_step_exactly(dtype):
  """The MFU numerator of `bench train_step` (bench.matmul_flops on the traced step, the same on
  every backend): a full fine-tuning step runs exactly the weight-gradient matmuls more, plus the
  activation backward of what the prompt cannot reach (decoder layer 0's self-attention). Exact
  integers: a scan or remat body counted once or twice, or a dot missed, breaks the equality."""
  model, batch, params, prompt_params, frozen = _prompt_model(dtype)
  prompt_step = _jaxpr_step_flops(model, prompt_params, frozen, batch)
  full_step = _jaxpr_step_flops(model, params, {}, batch)
  e, qkv, h, d = CFG.emb_dim, CFG.num_heads * CFG.head_dim, CFG.num_heads, CFG.head_dim
  # Decoder layer 0's self-attention, backward with respect to its input: dx of the q, k, v
  # and output projections, and of both score matmuls (two products each).
  decoder_self_attention = 2 * (4 * B * S * e * qkv + 4 * B * h * S * S * d)
  assert full_step - prompt_step == _weight_gradient_flops() + decoder_self_attention


def test_remat_policies_recompute_the_same_products_in_bfloat16():
  """The bfloat16 dense products on CPU are custom_vjp calls (layers.float32_summed_einsum), which
  jax.checkpoint_policies' dot rules do not see: 'minimal' and 'dots' save them by name. Each
  policy recomputes exactly the FLOPs it recomputes in float32 (unnamed, 'minimal' recomputed
  every projection, as 'full'; with the input kept as a residual for a frozen kernel, each
  attention's context product too)."""
  recomputed = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    for policy in ("none", "minimal", "dots", "full"):
      model, batch, _, prompt_params, frozen = _prompt_model(dtype, policy)
      recomputed[dtype, policy] = _jaxpr_step_flops(model, prompt_params, frozen, batch)
  for policy in ("minimal", "dots", "full"):
    assert (recomputed[jnp.bfloat16, policy] - recomputed[jnp.bfloat16, "none"]
            == recomputed[jnp.float32, policy] - recomputed[jnp.float32, "none"]), policy
  assert recomputed[jnp.float32, "full"] > recomputed[jnp.float32, "minimal"]
