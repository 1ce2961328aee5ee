"""DPT, decomposed prompt tuning (Xiao et al. 2023), and its rank probe (their Section 2).

DPT (Section 3):   prompt [P, H] = A [P, r] · B [r, H], both trainable.
Rank probe:        prompt [P, H] = U [P, k] · ReLU(diag(s)) [k, k] · Vᵀ [k, H], U, s, V trainable,
                   off-diagonal entries fixed at zero; U, s, V start from the SVD of an initial
                   prompt (s > 0), and the number of positive entries of s — the prompt's rank —
                   is what the probe watches while training.

Trainable parameters: DPT r·(P + H) (`encoder/prompt/prompt/{a,b}`); probe k·(P + H + 1)
(`encoder/prompt/prompt/{u,s,v}`).
Initialisation of A and B: Gaussian (the paper), uniform on [-0.5, 0.5] (the reference code), or
the truncated SVD of a given prompt (`svd_factors`, exact when r = min(P, H)).
`fold(params)` exports the effective [P, H] prompt for plain `PromptTuning` (both methods).
"""
from typing import Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax.prompts import initializers
from prompt_jax.prompts.seam import Method

Array = jax.Array


def num_trainable_params(length: int, emb_dim: int, rank: int) -> int:
  return rank * (length + emb_dim)


def num_trainable_params_probe(length: int, emb_dim: int, rank: int) -> int:
  return rank * (length + emb_dim + 1)


def check_rank(rank: int, length: int, emb_dim: int, what: str = "DPT rank r") -> None:
  """One clear ValueError unless 0 < rank <= min(P, H)."""
  if not 0 < rank <= min(length, emb_dim):
    raise ValueError(f"{what}={rank} must be in [1, min(P={length}, H={emb_dim})="
                     f"{min(length, emb_dim)}]")


class LowRankPrompt(Method):
  """[P, H] prompt = A·B (broadcast over the batch by the placement)."""
  length: int
  rank: int
  init_a: initializers.PromptInit = initializers.symmetric_uniform_init(0.5)
  init_b: initializers.PromptInit = initializers.symmetric_uniform_init(0.5)

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Array:
    del input_tokens, deterministic, context
    check_rank(self.rank, self.length, embedded.shape[-1])
    a = self.param("a", nn.with_logical_partitioning(self.init_a, ("prompt", "prompt_rank")),
                   (self.length, self.rank))  # [P, r]
    b = self.param("b", nn.with_logical_partitioning(self.init_b, ("prompt_rank", "prompt_embed")),
                   (self.rank, embedded.shape[-1]))  # [r, H]
    return jnp.dot(a, b)  # [P, H]


def _svd_parts(prompt: Array, rank: int) -> Tuple[Array, Array, Array]:
  """(U [P, k], s [k], V [H, k]) of the truncated SVD of `prompt` [P, H], s > 0."""
  u, s, vt = jnp.linalg.svd(prompt.astype(jnp.float32), full_matrices=False)
  # A prompt of lower rank than k has zero singular values: start them positive (ReLU'(0) = 0
  # would freeze them) at a float32 ulp of the largest.
  s = jnp.maximum(s[:rank], jnp.finfo(jnp.float32).eps * s[0])
  return u[:, :rank], s, vt[:rank].T


class RankProbe(Method):
  """[P, H] prompt = U · ReLU(diag(s)) · Vᵀ, from the SVD of `prompt_init`'s prompt (s > 0)."""
  length: int
  rank: int
  prompt_init: initializers.PromptInit = initializers.uniform_init()

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Array:
    del input_tokens, deterministic, context
    h_dim, k = embedded.shape[-1], self.rank
    check_rank(k, self.length, h_dim, "rank-probe rank k")
    # U, s and V come from one SVD: one key for the initial prompt, drawn while initialising
    # (otherwise Flax only evaluates the initialisers' shapes: any key will do).
    key = self.make_rng("params") if self.is_initializing() else jax.random.PRNGKey(0)
    parts = lambda i: (lambda rng, shape: _svd_parts(self.prompt_init(key, (self.length, h_dim)), k)[i])
    u = self.param("u", nn.with_logical_partitioning(parts(0), ("prompt", "prompt_rank")),
                   (self.length, k))  # [P, k]
    s = self.param("s", nn.with_logical_partitioning(parts(1), ("prompt_rank",)), (k,))  # [k]
    v = self.param("v", nn.with_logical_partitioning(parts(2), ("prompt_embed", "prompt_rank")),
                   (h_dim, k))  # [H, k]
    return (u * nn.relu(s)) @ v.T  # [P, H]


def positive_count(params) -> Array:
  """[] int32: the probe's rank, the number of positive entries of s."""
  return jnp.sum(params["s"] > 0).astype(jnp.int32)


def fold(params) -> Array:
  """The effective prompt [P, H] of LowRankPrompt {'a', 'b'} or RankProbe {'u', 's', 'v'}
  params (for PromptTuning)."""
  if "s" in params:
    return (params["u"] * nn.relu(params["s"])) @ params["v"].T
  return jnp.dot(params["a"], params["b"])  # [P, H]


def svd_factors(prompt, rank: int) -> Tuple[np.ndarray, np.ndarray]:
  """(A [P, r], B [r, H]) with A·B the best rank-r approximation of `prompt` [P, H]."""
  prompt = np.asarray(prompt, np.float64)
  check_rank(rank, *prompt.shape, what="rank")
  u, s, vt = np.linalg.svd(prompt, full_matrices=False)
  root = np.sqrt(s[:rank])
  return ((u[:, :rank] * root).astype(np.float32),  # [P, r]
          (root[:, None] * vt[:rank]).astype(np.float32))  # [r, H]
