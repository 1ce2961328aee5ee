"""Prompt tuning (Lester et al. 2021): one learned [P, H] prompt shared by every example.

Trainable parameters: P * H (`encoder/prompt/prompt/prompt`, as google-research/prompt-tuning).
"""
import flax.linen as nn
import jax

from prompt_jax.prompts import initializers
from prompt_jax.prompts.seam import Method

Array = jax.Array


class PromptTuning(Method):
  """Returns the same [P, H] prompt for every example (broadcast by the placement)."""
  length: int
  init: initializers.PromptInit = initializers.uniform_init()

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Array:
    del input_tokens, deterministic, context
    prompt = self.param("prompt",
                        nn.with_logical_partitioning(self.init, ("prompt", "prompt_embed")),
                        (self.length, embedded.shape[-1]))
    return prompt  # [P, H]
