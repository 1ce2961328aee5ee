"""Cross entropy with z-loss and t5x's loss normalisation."""
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp

Array = jax.Array
NUM_REAL_TARGET_TOKENS = "NUM_REAL_TARGET_TOKENS"


def cross_entropy_with_z_loss(logits: Array, targets: Array,
                              z_loss: float = 1e-4) -> Tuple[Array, Array]:
  """Per-token (loss, z_loss) [B, S]: -log p(target) + z_loss * logsumexp(logits)^2 (t5x)."""
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))  # [B, S, V]
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, S]
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [B, S]
  z = z_loss * jnp.square(log_z)
  return log_z - target_logit + z, z


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
