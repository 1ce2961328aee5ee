"""The one seam between prompt methods and the frozen model.

A *method* answers "given this batch, what prompt embeddings?":
  method(input_tokens [B, T], embedded [B, T, H], deterministic) -> prompt [B, P, H] (or [P, H])
A *placement* decides where they go:
  place(prompt [B, P, H], embedded [B, T, H], input_tokens [B, T]) -> (embedded' [B, T+P, H],
                                                                      mask [B, T+P])
`Prompt` joins the two into the module the encoder calls (`T5(config, prompt=...)`).
"""
import functools
from typing import Callable, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Placement = Callable[[Array, Array, Array], Tuple[Array, Array]]


def prefix(prompt: Array, embedded: Array, input_tokens: Array) -> Tuple[Array, Array]:
  """Prompt tokens before the input (Lester et al.'s default)."""
  batch = embedded.shape[0]
  prompt = jnp.broadcast_to(prompt, (batch,) + prompt.shape[-2:]).astype(embedded.dtype)
  mask = jnp.concatenate(
      [jnp.ones(prompt.shape[:2], bool), input_tokens > 0], axis=1)  # [batch, P + T]
  return jnp.concatenate([prompt, embedded], axis=1), mask  # [batch, P + T, embed]


PLACEMENTS = {"prefix": prefix}


def get_placement(name_or_fn) -> Placement:
  if callable(name_or_fn):
    return name_or_fn
  if name_or_fn not in PLACEMENTS:
    raise ValueError(f"unknown prompt position {name_or_fn!r}; choose one of {sorted(PLACEMENTS)}")
  return PLACEMENTS[name_or_fn]


class Prompt(nn.Module):
  """A prompt method and its placement, as the encoder's seam module.

  Attributes:
    method: a factory `method(name='prompt')` of the module producing prompt embeddings.
    length: P, the number of prompt positions the method produces.
    placement: where the prompt goes: a name in PLACEMENTS or a placement function.
  """
  method: Callable[..., nn.Module]
  length: int
  placement: object = "prefix"

  def setup(self):
    self.prompt = self.method(name="prompt")

  def __call__(self, input_tokens: Array, embedded: Array,
               deterministic: bool = True) -> Tuple[Array, Array]:
    prompt = self.prompt(input_tokens, embedded, deterministic=deterministic)  # [B?, P, H]
    if prompt.shape[-2] != self.length:
      raise ValueError(f"the prompt method produced {prompt.shape[-2]} positions, "
                       f"expected length={self.length}")
    return get_placement(self.placement)(prompt, embedded, input_tokens)

  def input_mask(self, input_tokens: Array) -> Array:
    """[B, T + P] mask of the placed sequence, from the tokens alone (no parameters touched)."""
    batch, length = input_tokens.shape
    dummy_prompt = jnp.zeros((batch, self.length, 1), jnp.float32)
    dummy_embedded = jnp.zeros((batch, length, 1), jnp.float32)
    return get_placement(self.placement)(dummy_prompt, dummy_embedded, input_tokens)[1]


def prompt_factory(method: Callable[..., nn.Module], length: int,
                   placement="prefix") -> Callable[..., nn.Module]:
  """What `T5(config, prompt=...)` takes: `prompt_factory(PromptTuning-factory, P)`."""
  return functools.partial(Prompt, method=method, length=length, placement=placement)
