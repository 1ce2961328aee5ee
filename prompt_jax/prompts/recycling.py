"""Prompt recycling (Lester et al. 2022, "Reducing Retraining by Recycling Parameter-Efficient
Prompts"; google-research/prompt-tuning `prompt_tuning/recycling/recycle.py`): map a prompt trained
on one frozen model (source) to another model that shares its vocabulary (target), using only the
two embedding tables.

  vec2vec_linear       W = argmin ||S W - T||  (least squares; the reference's `TFLstSqRecycler`)
                       recycled = prompt @ W
  vec2vec_mlp          T ~ Dense(H_t) relu Dense(k·H_t) (S), k = 4, Adam 3e-4, 25 epochs of
                       batches of 50 (the reference's `JaxRecycler` and its sst2.json settings)
  linear_combination   x = argmin ||x S - prompt|| (the prompt as a combination of source token
                       embeddings), recycled = x T  (the reference's `LinearCombinationRecycler`)

S [V, H_s] and T [V, H_t] are the same vocabulary rows of the two tables (`select_rows`: rows
[offset, offset + num_words), the reference's 4000 words after the first 1000; it also filters to
English words with a word list this package does not ship). The fit error is the reference's loss,
optax.l2_loss averaged: mean(0.5 (S W - T)^2) for the vec2vec recyclers, and for
linear_combination the error of reconstructing the prompt from the source embeddings,
mean(0.5 (x S - prompt)^2). Least squares runs in float64 (numpy).
"""
import dataclasses
from typing import Callable, Dict

import numpy as np

METHODS = ("vec2vec_linear", "vec2vec_mlp", "linear_combination")
DEFAULT_NUM_WORDS = 4000
DEFAULT_WORD_OFFSET = 1000


@dataclasses.dataclass
class Recycled:
  prompt: np.ndarray  # [P, H_t] float32
  fit_error: float


def _l2(pred: np.ndarray, target: np.ndarray) -> float:
  return float(np.mean(0.5 * np.square(np.asarray(pred, np.float64) - target)))


def select_rows(num_rows: int, num_words: int = DEFAULT_NUM_WORDS,
                word_offset: int = DEFAULT_WORD_OFFSET) -> np.ndarray:
  """Row ids [offset, offset + num_words) of a table; ValueError if they do not fit."""
  if num_words < 1 or word_offset < 0:
    raise ValueError(f"--num_words must be >= 1 and --word_offset >= 0, got {num_words} and "
                     f"{word_offset}")
  if word_offset + num_words > num_rows:
    raise ValueError(f"--word_offset {word_offset} + --num_words {num_words} exceeds the "
                     f"vocabulary's {num_rows} entries; use --word_offset + --num_words <= "
                     f"{num_rows}")
  return np.arange(word_offset, word_offset + num_words)


def vec2vec_linear(prompt: np.ndarray, source: np.ndarray, target: np.ndarray) -> Recycled:
  s, t = np.asarray(source, np.float64), np.asarray(target, np.float64)
  w = np.linalg.lstsq(s, t, rcond=None)[0]  # [H_s, H_t]
  recycled = np.asarray(prompt, np.float64) @ w  # [P, H_t]
  return Recycled(recycled.astype(np.float32), _l2(s @ w, t))


def linear_combination(prompt: np.ndarray, source: np.ndarray,
                       target: np.ndarray) -> Recycled:
  s, t = np.asarray(source, np.float64), np.asarray(target, np.float64)
  p = np.asarray(prompt, np.float64)
  x = np.linalg.lstsq(s.T, p.T, rcond=None)[0].T  # [P, V]: x @ S ~ prompt
  return Recycled((x @ t).astype(np.float32), _l2(x @ s, p))


def vec2vec_mlp(prompt: np.ndarray, source: np.ndarray, target: np.ndarray, *,
                hidden_scale: int = 4, epochs: int = 25, batch_size: int = 50,
                learning_rate: float = 3e-4, seed: int = 0) -> Recycled:
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  width = target.shape[-1]

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(width)(nn.relu(nn.Dense(hidden_scale * width)(x)))

  mlp = MLP()
  s = jnp.asarray(source, jnp.float32)
  t = jnp.asarray(target, jnp.float32)
  rng, init_rng = jax.random.split(jax.random.PRNGKey(seed))
  params = mlp.init(init_rng, s[:1])
  tx = optax.adam(learning_rate)
  opt_state = tx.init(params)

  def loss(p, x, y):
    return jnp.mean(optax.l2_loss(mlp.apply(p, x), y))

  @jax.jit
  def step(p, o, x, y):
    value, grads = jax.value_and_grad(loss)(p, x, y)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o, value

  n = s.shape[0]
  num_batches = max(n // batch_size, 1)  # whole batches only: one shape, one compilation
  for _ in range(epochs):
    rng, shuffle = jax.random.split(rng)
    order = np.asarray(jax.random.permutation(shuffle, n))
    for b in range(num_batches):
      idx = order[b * batch_size:(b + 1) * batch_size]
      params, opt_state, _ = step(params, opt_state, s[idx], t[idx])
  recycled = np.asarray(mlp.apply(params, jnp.asarray(prompt, jnp.float32)))
  return Recycled(recycled.astype(np.float32), _l2(np.asarray(mlp.apply(params, s)), target))


RECYCLERS: Dict[str, Callable[..., Recycled]] = {
    "vec2vec_linear": vec2vec_linear, "vec2vec_mlp": vec2vec_mlp,
    "linear_combination": linear_combination}


def check_tables(source: np.ndarray, target: np.ndarray, prompt: np.ndarray) -> None:
  """One ValueError for tables of different vocabularies or a prompt of the wrong width."""
  if source.shape[0] != target.shape[0]:
    raise ValueError(f"the source model's vocabulary has {source.shape[0]} entries and the "
                     f"target's {target.shape[0]}: recycling needs two models that share one "
                     f"vocabulary")
  if prompt.ndim != 2 or prompt.shape[1] != source.shape[1]:
    raise ValueError(f"the prompt has shape {tuple(prompt.shape)}, expected [P, "
                     f"{source.shape[1]}] (the source model's width)")


def recycle(prompt: np.ndarray, source_table: np.ndarray, target_table: np.ndarray,
            method: str, rows: np.ndarray) -> Recycled:
  """`method`'s recycled [P, H_t] prompt and fit error on the vocabulary rows `rows`."""
  if method not in RECYCLERS:
    raise ValueError(f"unknown recycler {method!r}; choose from {', '.join(METHODS)}")
  check_tables(source_table, target_table, prompt)
  return RECYCLERS[method](prompt, source_table[rows], target_table[rows])
