"""The data-dir setting (flag > gin > env) and the lazily resolved vocabulary."""
import gin
import pytest

from prompt_jax import tasks
from prompt_jax import vocab as vocab_lib
from prompt_jax.tasks import features


def test_data_dir_precedence_flag_then_gin_then_env(monkeypatch, tmp_path):
  assert tasks.get_data_dir() is None
  monkeypatch.setenv(tasks.DATA_DIR_ENV, str(tmp_path / "env"))
  assert tasks.get_data_dir() == str(tmp_path / "env")
  try:
    gin.parse_config(f"prompt_jax.tasks.local_data_dir.path = '{tmp_path / 'gin'}'")
    assert tasks.get_data_dir() == str(tmp_path / "gin")
    tasks.set_data_dir(tmp_path / "flag")
    assert tasks.get_data_dir() == str(tmp_path / "flag")
  finally:
    # Restore the default without clearing other modules' gin bindings.
    gin.bind_parameter("prompt_jax.tasks.local_data_dir.path", None)
  tasks.set_data_dir(None)
  assert tasks.get_data_dir() == str(tmp_path / "env")


def test_task_vocabulary_is_resolved_at_use_not_at_import(monkeypatch, spm_path, tmp_path):
  feature = tasks.get_task("super_glue_rte_v102").output_features["targets"]
  assert feature.vocabulary is features.VOCABULARY
  assert feature.add_eos
  missing = tmp_path / "missing.model"
  monkeypatch.setenv(vocab_lib.SPM_PATH_ENV, str(missing))
  with pytest.raises(FileNotFoundError, match="missing.model"):
    feature.vocabulary.vocab_size  # pylint: disable=pointless-statement
  monkeypatch.setenv(vocab_lib.SPM_PATH_ENV, str(spm_path))
  assert feature.vocabulary.vocab_size == 32100
  assert feature.vocabulary.encode("Hello world") == [8774, 296]
  assert feature.vocabulary == vocab_lib.get_vocabulary()
