"""Cross entropy with z-loss and t5x's loss normalisation."""
import functools
import math
import numbers
from typing import Any, Optional, Tuple, Union

import jax
import jax.numpy as jnp

from prompt_jax.errors import ConfigError

Array = jax.Array
NUM_REAL_TARGET_TOKENS = "NUM_REAL_TARGET_TOKENS"
T5X_ONLY_FACTORS = ("NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE")


def cross_entropy_with_z_loss(logits: Array, targets: Array,
                              z_loss: float = 1e-4) -> Tuple[Array, Array]:
  """Per-token (loss, z_loss) [B, S]: -log p(target) + z_loss * logsumexp(logits)^2 (t5x), in
  at least float32 whatever the logits' dtype. See `_cross_entropy` for what the gradient keeps."""
  return _cross_entropy(logits, targets, float(z_loss))


def _forward(logits: Array, targets: Array, z_loss: float):
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))  # [B, S, V]
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, S]
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [B, S]
  z = z_loss * jnp.square(log_z)
  return (log_z - target_logit + z, z), log_z


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cross_entropy(logits: Array, targets: Array, z_loss: float) -> Tuple[Array, Array]:
  """The cross entropy whose backward pass keeps only the logits as they came (bfloat16 logits
  stay bfloat16) and log Z [B, S], and recomputes the softmax from them (issue 11: no second
  float32 copy of the logits). Differentiating the plain formula kept the float32 copy of
  bfloat16 logits besides them: T5 1.0 small in bfloat16 (tied embeddings: bfloat16 logits),
  1 layer, batch 8 x 128 targets, the compiled step's temporaries went from 2.87 to 2.37
  float32 logits' sizes. Float32 logits (T5 1.1's float32 output projection, float32 runs):
  2.29-2.30 either way, the logits and their gradient (the least without chunking the output
  projection) plus the rest of the step."""
  return _forward(logits, targets, z_loss)[0]


def _cross_entropy_fwd(logits: Array, targets: Array, z_loss: float):
  outputs, log_z = _forward(logits, targets, z_loss)
  return outputs, (logits, targets, log_z)


def _cross_entropy_bwd(z_loss: float, residuals, cotangents):
  logits, targets, log_z = residuals
  g_loss, g_z = cotangents  # [B, S] each
  probs = jnp.exp(logits.astype(log_z.dtype) - log_z[..., None])  # softmax [B, S, V]
  # d loss = (1 + 2 z_loss log Z) p - onehot(target); d z = 2 z_loss log Z p.
  scale = g_loss + 2.0 * z_loss * log_z * (g_loss + g_z)  # [B, S]
  onehot = jax.nn.one_hot(targets, logits.shape[-1], dtype=log_z.dtype)  # [B, S, V]
  grad = scale[..., None] * probs - g_loss[..., None] * onehot
  return grad.astype(logits.dtype), None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def check_normalizing_factor(factor: Any) -> None:
  """One ConfigError unless `factor` is one `normalizing_factor` reads: None, a positive number
  or 'NUM_REAL_TARGET_TOKENS' (t5x's other names are not implemented here)."""
  if factor is None or (isinstance(factor, str) and factor == NUM_REAL_TARGET_TOKENS):
    return
  if (isinstance(factor, numbers.Real) and not isinstance(factor, bool)
      and math.isfinite(factor) and factor > 0):
    return
  unsupported = (" (t5x's NUM_TOTAL_TARGET_TOKENS and AVERAGE_PER_SEQUENCE are not supported)"
                 if factor in T5X_ONLY_FACTORS else "")
  raise ConfigError(f"LOSS_NORMALIZING_FACTOR must be {NUM_REAL_TARGET_TOKENS!r}, a positive "
                    f"number or None (the sum over tokens), got {factor!r}{unsupported}")


def normalizing_factor(weights: Array,
                       loss_normalizing_factor: Optional[Union[float, str]]) -> Array:
  """t5x's choices: None (sum over tokens), a constant, or 'NUM_REAL_TARGET_TOKENS'."""
  if loss_normalizing_factor is None:
    return jnp.float32(1.0)
  if loss_normalizing_factor == NUM_REAL_TARGET_TOKENS:
    return jnp.maximum(jnp.sum(weights), 1.0)
  return jnp.float32(loss_normalizing_factor)


def compute_loss(logits: Array, batch, z_loss: float = 1e-4,
                 loss_normalizing_factor=NUM_REAL_TARGET_TOKENS):
  """(loss, metrics) of a teacher-forced batch; padding (target 0) has no weight."""
  targets = batch["decoder_target_tokens"]  # [B, S]
  weights = batch.get("decoder_loss_weights")
  if weights is None:
    weights = (targets > 0)
  weights = weights.astype(jnp.float32)
  token_loss, token_z = cross_entropy_with_z_loss(logits, targets, z_loss)
  factor = normalizing_factor(weights, loss_normalizing_factor)
  loss = jnp.sum(token_loss * weights) / factor
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32) * weights
  # Sequence accuracy: every real target token right.
  seq_correct = jnp.all((correct > 0) | (weights == 0), axis=-1).astype(jnp.float32)
  metrics = {
      "loss": loss,
      "z_loss": jnp.sum(token_z * weights) / factor,
      "cross_ent_loss_per_token": jnp.sum((token_loss - token_z) * weights) /
                                  jnp.maximum(jnp.sum(weights), 1.0),
      "accuracy": jnp.sum(correct) / jnp.maximum(jnp.sum(weights), 1.0),
      "sequence_accuracy": jnp.mean(seq_correct),
      "num_tokens": jnp.sum(weights),
  }
  return loss, metrics
