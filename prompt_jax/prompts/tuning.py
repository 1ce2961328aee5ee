"""Prompt tuning (Lester et al. 2021): one learned [P, H] prompt shared by every example.

Trainable parameters: P * H (`encoder/prompt/prompt/prompt`, as google-research/prompt-tuning).
"""
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
# An initializer is a closure (rng, shape) -> array; it may close over the frozen embedding table.
PromptInit = Callable[[Array, tuple], Array]


def uniform_init(scale: float = 0.5) -> PromptInit:
  """Uniform on [0, scale): what the original prompt-tuning code does."""
  def init(rng, shape):
    return jax.random.uniform(rng, shape, jnp.float32, 0.0, scale)
  return init


class PromptTuning(nn.Module):
  """Returns the same [P, H] prompt for every example (broadcast by the placement)."""
  length: int
  init: PromptInit = uniform_init()

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True) -> Array:
    del input_tokens, deterministic
    prompt = self.param("prompt",
                        nn.with_logical_partitioning(self.init, ("prompt", "prompt_embed")),
                        (self.length, embedded.shape[-1]))
    return prompt  # [P, H]
