"""Parameterised hypercomplex multiplication (PHM) layers (Zhang et al. 2021), as IDPG uses them.

A PHM kernel W [in, out] = sum_i A_i ⊗ S_i with rule matrices A_i [n, n] and blocks
S_i [in/n, out/n]: in·out/n + n³ parameters instead of in·out. The rule A [n, n, n] may be shared
by several layers (IDPG shares one A by both generator layers).
"""
import jax
import jax.numpy as jnp

Array = jax.Array


def check_divides(n: int, **dims: int) -> None:
  """Raises one clear ValueError unless n > 0 divides every named dimension."""
  if n <= 0:
    raise ValueError(f"PHM n must be > 0, got {n}")
  bad = {k: v for k, v in dims.items() if v % n}
  if bad:
    names = ", ".join(f"{k}={v}" for k, v in bad.items())
    raise ValueError(f"PHM n={n} must divide {names}")


def kernel(rule: Array, blocks: Array) -> Array:
  """sum_i kron(rule[i] [n, n], blocks[i] [in/n, out/n]) -> [in, out]."""
  n, a, b = blocks.shape
  # kron(A, S)[p*a + r, q*b + s] = A[p, q] * S[r, s]
  w = jnp.einsum("ipq,irs->prqs", rule, blocks)  # [n, in/n, n, out/n]
  return w.reshape(n * a, n * b)  # [in, out]


def num_params(n: int, in_dim: int, out_dim: int, bias: bool = True) -> int:
  """Blocks + bias of one PHM layer (the n³ rule is counted once by whoever owns it)."""
  return in_dim * out_dim // n + (out_dim if bias else 0)
