"""DPT, decomposed prompt tuning (Xiao et al. 2023): the prompt is a product A·B.

  prompt [P, H] = A [P, r] · B [r, H], both trainable.

Trainable parameters: r·(P + H) (`encoder/prompt/prompt/{a,b}`).
Initialisation: uniform on [-0.5, 0.5] (the reference code) or normal (the paper's option).
`fold(params)` exports the effective [P, H] prompt for plain `PromptTuning`; `svd_factors(prompt,
r)` goes the other way (exact when r = min(P, H)).
"""
from typing import Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax.prompts import initializers

Array = jax.Array


def num_trainable_params(length: int, emb_dim: int, rank: int) -> int:
  return rank * (length + emb_dim)


class LowRankPrompt(nn.Module):
  """[P, H] prompt = A·B (broadcast over the batch by the placement)."""
  length: int
  rank: int
  init_a: initializers.PromptInit = initializers.symmetric_uniform_init(0.5)
  init_b: initializers.PromptInit = initializers.symmetric_uniform_init(0.5)

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True) -> Array:
    del input_tokens, deterministic
    if self.rank <= 0:
      raise ValueError(f"DPT rank r must be > 0, got {self.rank}")
    a = self.param("a", nn.with_logical_partitioning(self.init_a, ("prompt", "prompt_rank")),
                   (self.length, self.rank))  # [P, r]
    b = self.param("b", nn.with_logical_partitioning(self.init_b, ("prompt_rank", "prompt_embed")),
                   (self.rank, embedded.shape[-1]))  # [r, H]
    return jnp.dot(a, b)  # [P, H]


def fold(params) -> Array:
  """The effective prompt [P, H] from LowRankPrompt's params {'a', 'b'} (for PromptTuning)."""
  return jnp.dot(params["a"], params["b"])  # [P, H]


def svd_factors(prompt, rank: int) -> Tuple[np.ndarray, np.ndarray]:
  """(A [P, r], B [r, H]) with A·B the best rank-r approximation of `prompt` [P, H]."""
  prompt = np.asarray(prompt, np.float64)
  if not 0 < rank <= min(prompt.shape):
    raise ValueError(f"rank must be in [1, min(P, H)={min(prompt.shape)}], got {rank}")
  u, s, vt = np.linalg.svd(prompt, full_matrices=False)
  root = np.sqrt(s[:rank])
  return ((u[:, :rank] * root).astype(np.float32),  # [P, r]
          (root[:, None] * vt[:rank]).astype(np.float32))  # [r, H]
