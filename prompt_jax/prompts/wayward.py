"""Wayward prompts (Khashabi et al. 2022, "Prompt Waywardness"; google-research/prompt-tuning
`prompt_tuning/extended/train/wayward.py`): plain prompt tuning whose training loss adds

  gamma * d(prompt, E[discrete prompt tokens]),   d(x, y) = sum_p ||x_p - y_p||^2 / P

the squared L2 distance between the learned [P, H] prompt and the frozen embeddings of a discrete
prompt text, normalised by the prompt length as the reference's `squared_l2_distance`. The prompt
module is `tuning.PromptTuning` (the same parameter, `encoder/prompt/prompt/prompt`).
`prompt-jax inspect` (evaluation/inspect.py `cosine_neighbours`) lists a prompt's nearest
vocabulary entries, to read what it became.
"""
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def squared_l2_distance(x: Array, y: Array) -> Array:
  """sum over positions of ||x_p - y_p||^2, divided by the number of positions P ([P, H] each)."""
  return jnp.sum(jnp.square(x - y)) / x.shape[0]


def regulariser(token_ids: Sequence[int], gamma: float):
  """`fn(params) -> gamma * d(prompt, embedding[token_ids])` on the model's nested params (the
  discrete prompt's embeddings read from the frozen table, no gradient into it)."""
  ids = np.asarray(token_ids, np.int32)

  def fn(params) -> Array:
    prompt = params["encoder"]["prompt"]["prompt"]["prompt"]  # [P, H]
    table = jax.lax.stop_gradient(params["token_embedder"]["embedding"])  # [V, H]
    target = jnp.take(table, ids, axis=0).astype(prompt.dtype)  # [P, H]
    return gamma * squared_l2_distance(prompt, target)
  return fn

