"""Prompt initialisers (Lester et al. 2021) as closures `(rng, shape) -> array`.

Two layers:
  * closures (`*_init`), usable anywhere a Flax initializer is: uniform [0, s), symmetric uniform
    [-s, s], normal, sampled vocabulary, class labels, from a string, from an array or a file.
    Those that need the frozen model close over its embedding table [V, H] and a vocabulary.
    Method modules use only these (no gin).
  * gin-configurable *specs* (`uniform()`, `from_sampled_vocab()`, ...): `spec(embedding [V, H],
    vocabulary) -> init`, which a method spec calls once the frozen embedding table is loaded.
"""
import logging
from typing import Callable, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax import npy
from prompt_jax.errors import ConfigError

Array = jax.Array
# An initializer is a closure (rng, shape) -> array; it may close over the frozen embedding table.
PromptInit = Callable[[Array, tuple], Array]
DEFAULT_POPULATION = 5000


def uniform_init(scale: float = 0.5) -> PromptInit:
  """Uniform on [0, scale): what the original prompt-tuning code does."""
  def init(rng, shape):
    return jax.random.uniform(rng, shape, jnp.float32, 0.0, scale)
  return init


def symmetric_uniform_init(scale: float = 0.5) -> PromptInit:
  """Uniform on [-scale, scale]: what the prompt-tuning paper describes."""
  def init(rng, shape):
    return jax.random.uniform(rng, shape, jnp.float32, -scale, scale)
  return init


def normal_init(stddev: float = 0.5) -> PromptInit:
  def init(rng, shape):
    return stddev * jax.random.normal(rng, shape, jnp.float32)
  return init


def _check_width(table, shape, what: str) -> None:
  if table.shape[-1] != shape[-1]:
    raise ConfigError(f"{what}: embedding table width {table.shape[-1]} != prompt width "
                      f"{shape[-1]}")


def sampled_vocab_init(table, population_size: int = DEFAULT_POPULATION) -> PromptInit:
  """Rows of the frozen embedding table [V, H] drawn without replacement from the first
  `population_size` rows (with replacement, and a warning, when P > population_size)."""
  if population_size <= 0:
    raise ConfigError(f"population_size must be > 0, got {population_size}")
  table = np.asarray(table, np.float32)
  population = min(population_size, table.shape[0])

  def init(rng, shape):
    _check_width(table, shape, "sampled-vocabulary init")
    length = shape[0]
    replace = length > population
    if replace:
      logging.warning("prompt length %d > %d rows to sample from: sampling with replacement",
                      length, population)
    rows = jax.random.choice(rng, population, (length,), replace=replace)
    return jnp.asarray(table)[rows]  # [P, H]
  return init


def label_embeddings(table, vocabulary, labels: Sequence[str]) -> np.ndarray:
  """[len(labels), H]: each label's subword embeddings, mean-pooled."""
  table = np.asarray(table, np.float32)
  rows = []
  for label in labels:
    ids = list(vocabulary.encode(label))
    if not ids:
      raise ConfigError(f"class label {label!r} encodes to no tokens")
    if max(ids) >= table.shape[0]:
      raise ConfigError(f"class label {label!r} has token id {max(ids)} outside the embedding "
                        f"table of {table.shape[0]} rows")
    rows.append(table[ids].mean(axis=0))
  return np.stack(rows)  # [C, H]


def class_label_init(table, vocabulary, labels: Sequence[str],
                     fallback: Optional[PromptInit] = None) -> PromptInit:
  """Positions 0..k-1: the mean subword embedding of each class label; the rest `fallback`
  (default: sampled vocabulary)."""
  labels = list(labels)
  label_rows = label_embeddings(table, vocabulary, labels)  # [C, H]
  rest = fallback or sampled_vocab_init(table)

  def init(rng, shape):
    _check_width(label_rows, shape, "class-label init")
    if len(labels) > shape[0]:
      raise ConfigError(f"{len(labels)} class labels do not fit a prompt of length {shape[0]}; "
                        f"use PROMPT_LENGTH >= {len(labels)}")
    prompt = jnp.asarray(rest(rng, shape), jnp.float32)  # [P, H]
    return prompt.at[:len(labels)].set(jnp.asarray(label_rows))
  return init


def string_init(table, vocabulary, text: str,
                fallback: Optional[PromptInit] = None) -> PromptInit:
  """The first P token embeddings of `text`; positions past its end from `fallback`."""
  table = np.asarray(table, np.float32)
  ids = list(vocabulary.encode(text))
  if not ids:
    raise ConfigError(f"prompt text {text!r} encodes to no tokens")
  rest = fallback or sampled_vocab_init(table)

  def init(rng, shape):
    _check_width(table, shape, "string init")
    used = ids[:shape[0]]
    if len(ids) > shape[0]:
      logging.warning("prompt text has %d tokens; only the first %d are used", len(ids), shape[0])
    prompt = jnp.asarray(rest(rng, shape), jnp.float32)  # [P, H]
    return prompt.at[:len(used)].set(jnp.asarray(table[used]))
  return init


def array_init(value, what: str = "prompt array", prompt: bool = False) -> PromptInit:
  """A fixed array (e.g. a trained prompt), shape-checked against the parameter; `prompt`: it
  is a [P, H] prompt, and a mismatch says which of P (PROMPT_LENGTH) or H (the model) differs."""
  value = np.asarray(value)

  def init(rng, shape):
    del rng
    if tuple(value.shape) != tuple(shape):
      raise ConfigError(f"{what} has shape {tuple(value.shape)}, the parameter needs "
                        f"{tuple(shape)}{_prompt_hint(value.shape, shape) if prompt else ''}")
    return jnp.asarray(value, jnp.float32)
  return init


def _prompt_hint(have, need) -> str:
  if len(have) != 2 or len(need) != 2:
    return ": a [PROMPT_LENGTH, emb_dim] array"
  if have[1] != need[1]:
    return (f": its width {have[1]} is another model's embedding size (this one's is "
            f"{need[1]}); use the model the prompt was trained with (its models/*.gin and "
            f"INITIAL_CHECKPOINT_PATH)")
  return f": set --gin.PROMPT_LENGTH={have[0]}, the file's length"


def load_prompt_file(path: str, macro: str = "PROMPT_FILE") -> np.ndarray:
  return npy.load(path, f"{macro} {path!r}", npy.EXPORT_HINT)


def file_init(path: str) -> PromptInit:
  """A prompt saved as `.npy`; its shape must equal the parameter's ([P, H] for a prompt)."""
  return array_init(load_prompt_file(path), what=f"PROMPT_FILE {path!r}", prompt=True)


# ===== gin specs: spec(embedding [V, H], vocabulary) -> init =====

def _embedding_table(embedding, embedding_file: Optional[str]):
  if embedding_file:
    hint = "save the embedding table [V, H] with numpy.save"
    table = npy.load(embedding_file, f"EMBEDDING_FILE {embedding_file!r}", hint)
    if table.ndim != 2:
      raise ConfigError(f"EMBEDDING_FILE {embedding_file!r} has shape {table.shape}, not an "
                        f"embedding table [V, H]; {hint}")
    return table
  if embedding is None:
    raise ConfigError("this prompt initialiser needs the frozen embedding table "
                      "(INITIAL_CHECKPOINT_PATH) or EMBEDDING_FILE")
  return np.asarray(embedding, np.float32)


@gin.configurable(module="prompt_jax")
def uniform(scale: float = 0.5):
  """Uniform on [0, scale), as the original prompt-tuning code."""
  def spec(embedding=None, vocabulary=None):
    del embedding, vocabulary
    return uniform_init(scale)
  return spec


@gin.configurable(module="prompt_jax")
def symmetric_uniform(scale: float = 0.5):
  """Uniform on [-scale, scale], as the prompt-tuning paper says."""
  def spec(embedding=None, vocabulary=None):
    del embedding, vocabulary
    return symmetric_uniform_init(scale)
  return spec


@gin.configurable(module="prompt_jax")
def normal(stddev: float = 0.5):
  def spec(embedding=None, vocabulary=None):
    del embedding, vocabulary
    return normal_init(stddev)
  return spec


@gin.configurable(module="prompt_jax")
def from_sampled_vocab(population_size: int = DEFAULT_POPULATION,
                       embedding_file: Optional[str] = None):
  """Rows sampled (without replacement) from the first `population_size` token embeddings."""
  def spec(embedding=None, vocabulary=None):
    del vocabulary
    return sampled_vocab_init(_embedding_table(embedding, embedding_file), population_size)
  return spec


@gin.configurable(module="prompt_jax")
def from_class_labels(class_labels: Sequence[str] = gin.REQUIRED,
                      fallback=None, embedding_file: Optional[str] = None):
  """First len(CLASS_LABELS) rows: each label's mean token embedding; the rest from `fallback`

  (a spec; default from_sampled_vocab()), as Lester et al.'s class-label initialisation.
  """
  class_labels = list(class_labels)

  def spec(embedding=None, vocabulary=None):
    table = _embedding_table(embedding, embedding_file)
    if vocabulary is None:
      raise ConfigError("from_class_labels needs the task's vocabulary")
    rest = (fallback or from_sampled_vocab())(embedding=table, vocabulary=vocabulary)
    return class_label_init(table, vocabulary, class_labels, rest)
  return spec


@gin.configurable(module="prompt_jax")
def from_string(text: str = gin.REQUIRED, fallback=None, embedding_file: Optional[str] = None):
  """The first PROMPT_LENGTH token embeddings of `text` (the rest from `fallback`)."""
  def spec(embedding=None, vocabulary=None):
    table = _embedding_table(embedding, embedding_file)
    if vocabulary is None:
      raise ConfigError("from_string needs the task's vocabulary")
    rest = (fallback or from_sampled_vocab())(embedding=table, vocabulary=vocabulary)
    return string_init(table, vocabulary, text, rest)
  return spec


@gin.configurable(module="prompt_jax")
def from_file(path: str = gin.REQUIRED):
  """A prompt saved as `.npy` (e.g. MODEL_DIR/numpy_checkpoints/checkpoint_<step>/...npy)."""
  def spec(embedding=None, vocabulary=None):
    del embedding, vocabulary
    return file_init(path)
  return spec


def resolve(init_spec, embedding=None, vocabulary=None) -> PromptInit:
  """The closure of an initialiser spec (one of the gin specs above); with no embedding table
  (shapes only) any closure will do, so uniform."""
  if init_spec is None or embedding is None:
    return uniform_init()
  return init_spec(embedding=embedding, vocabulary=vocabulary)
