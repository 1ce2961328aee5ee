"""Output features of every task: T5's SentencePiece vocabulary, resolved lazily.

`prompt_jax.vocab.get_vocabulary()` is gin-configurable and reads $PROMPT_JAX_SPM_PATH; its default
lives on GCS. Tasks are registered at import time, so their features hold a `LazyVocabulary` that
calls `get_vocabulary()` only when a vocabulary property is first needed (tokenizing, decoding,
`vocab_size`). Importing and listing tasks therefore never touches GCS or the disk, and gin bindings
or environment variables set after the import still apply.
"""
from typing import Any, Callable, Mapping

import seqio

from prompt_jax import vocab as vocab_lib


class LazyVocabulary(seqio.Vocabulary):
  """A `seqio.Vocabulary` that forwards every call to `resolve()`'s vocabulary.

  `resolve` is called on each access; `prompt_jax.vocab.get_vocabulary` caches the loaded model per
  path, so this costs a dictionary lookup once the model is loaded.
  """

  def __init__(self, resolve: Callable[[], seqio.Vocabulary] = vocab_lib.get_vocabulary):
    super().__init__(extra_ids=0)
    self._resolve = resolve

  @property
  def vocabulary(self) -> seqio.Vocabulary:
    """The resolved vocabulary (loads it on first use)."""
    return self._resolve()

  # Everything below forwards to the resolved vocabulary, including its own EOS/UNK cleaning.
  @property
  def bos_id(self):
    return self.vocabulary.bos_id

  @property
  def eos_id(self):
    return self.vocabulary.eos_id

  @property
  def pad_id(self) -> int:
    return self.vocabulary.pad_id

  @property
  def unk_id(self):
    return self.vocabulary.unk_id

  @property
  def extra_ids(self) -> int:
    return self.vocabulary.extra_ids

  @property
  def vocab_size(self) -> int:
    return self.vocabulary.vocab_size

  @property
  def _base_vocab_size(self) -> int:
    return self.vocabulary._base_vocab_size  # pylint: disable=protected-access

  def _encode(self, s):
    return self.vocabulary._encode(s)  # pylint: disable=protected-access

  def _decode(self, ids):
    return self.vocabulary._decode(ids)  # pylint: disable=protected-access

  def _encode_tf(self, s):
    return self.vocabulary._encode_tf(s)  # pylint: disable=protected-access

  def _decode_tf(self, ids):
    return self.vocabulary._decode_tf(ids)  # pylint: disable=protected-access

  def encode(self, s):
    return self.vocabulary.encode(s)

  def decode(self, ids):
    return self.vocabulary.decode(ids)

  def encode_tf(self, s):
    return self.vocabulary.encode_tf(s)

  def decode_tf(self, ids):
    return self.vocabulary.decode_tf(ids)

  def __getattr__(self, name: str) -> Any:
    # Only called for attributes not found normally (e.g. `sp_model`, `sentencepiece_model_file`).
    if name.startswith("_"):
      raise AttributeError(name)
    return getattr(self.vocabulary, name)

  def __eq__(self, other) -> bool:
    if isinstance(other, LazyVocabulary):
      return self._resolve is other._resolve
    if isinstance(other, seqio.Vocabulary):
      return self.vocabulary == other
    return NotImplemented

  def __hash__(self) -> int:
    return hash(self._resolve)

  def __repr__(self) -> str:
    return f"LazyVocabulary({getattr(self._resolve, '__name__', self._resolve)!r})"


# One shared instance, so that every task's features compare equal (mixtures require it).
VOCABULARY = LazyVocabulary()

DEFAULT_OUTPUT_FEATURES: Mapping[str, seqio.Feature] = {
    "inputs": seqio.Feature(vocabulary=VOCABULARY, add_eos=True, required=False),
    "targets": seqio.Feature(vocabulary=VOCABULARY, add_eos=True),
}
