"""The T5 vocabulary (real SentencePiece model from ../shared/data when present)."""
import pytest

from prompt_jax import vocab


def test_real_t5_vocabulary_encodes_hello_world(spm_path):
  v = vocab.get_vocabulary(str(spm_path))
  assert v.encode("Hello world") == [8774, 296]
  assert v.vocab_size == 32100  # 32000 pieces + 100 sentinels
  assert v.decode([8774, 296]) == "Hello world"
  vocab.check_fits(v, 32128)  # T5's padded embedding table
  with pytest.raises(ValueError, match="32100 ids but .*token_embedder/embedding has only 32000"):
    vocab.check_fits(v, 32000)


def test_missing_local_vocabulary_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.model"):
    vocab.get_vocabulary(str(tmp_path / "nope.model"))


def test_default_is_t5_public_vocabulary_and_env_overrides(monkeypatch, spm_path):
  monkeypatch.delenv(vocab.SPM_PATH_ENV, raising=False)
  default = vocab.get_vocabulary()  # lazy: nothing is read from GCS until first use
  assert default.sentencepiece_model_file == (
      "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model")
  assert default.extra_ids == 100
  monkeypatch.setenv(vocab.SPM_PATH_ENV, str(spm_path))
  assert vocab.get_vocabulary().sentencepiece_model_file == str(spm_path)
