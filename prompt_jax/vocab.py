"""The T5 SentencePiece vocabulary (32000 pieces + 100 sentinel ids; model vocab padded to 32128)."""
import functools
import os
from typing import TYPE_CHECKING, Optional

import gin

from prompt_jax.errors import ConfigError

if TYPE_CHECKING:  # imported where used: `plan` and `bench` import this module without seqio
  import seqio

DEFAULT_SPM_PATH = "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model"
DEFAULT_EXTRA_IDS = 100
# Environment override for machines that keep the vocabulary on local disk.
SPM_PATH_ENV = "PROMPT_JAX_SPM_PATH"


@functools.lru_cache(maxsize=None)
def _cached_vocabulary(path: str, extra_ids: int) -> "seqio.SentencePieceVocabulary":
  import seqio  # pylint: disable=g-import-not-at-top,redefined-outer-name
  return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)


@gin.configurable
def get_vocabulary(path: Optional[str] = None,
                   extra_ids: int = DEFAULT_EXTRA_IDS) -> "seqio.SentencePieceVocabulary":
  """T5's vocabulary: `path`, else $PROMPT_JAX_SPM_PATH, else T5's public GCS model."""
  path = path or os.environ.get(SPM_PATH_ENV) or DEFAULT_SPM_PATH
  if not path.startswith("gs://") and not os.path.exists(path):
    raise FileNotFoundError(
        f"SentencePiece model {path!r} does not exist; pass the path of a .model file "
        f"(or set ${SPM_PATH_ENV}).")
  return _cached_vocabulary(path, extra_ids)


def check_readable(vocabulary: "seqio.Vocabulary", where: str) -> "seqio.Vocabulary":
  """`vocabulary` with its model read now (seqio reads a SentencePiece model lazily), so that a
  file that is not one (a directory, a text file) is one ConfigError naming `where` ("--spm
  x.txt"), not an exception from the first encode or decode."""
  try:
    vocabulary.vocab_size  # pylint: disable=pointless-statement
  except Exception as e:  # pylint: disable=broad-except
    message = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(f"{where} is not a SentencePiece model that can be read ({message}); "
                      f"pass a .model file") from e
  return vocabulary


def check_fits(vocab: "seqio.Vocabulary", embedding_rows: int) -> None:
  """Raises if `vocab` has ids the model's embedding table cannot look up."""
  if vocab.vocab_size > embedding_rows:
    raise ValueError(
        f"vocabulary has {vocab.vocab_size} ids but the model's embedding table "
        f"token_embedder/embedding has only {embedding_rows} rows; use a model config whose "
        f"vocab_size is >= {vocab.vocab_size} (T5 uses 32128).")
