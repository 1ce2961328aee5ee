"""Fixtures for the task tests: a clean data-dir setting, the real data root, the vocabulary."""
import pathlib

import pytest

from prompt_jax import tasks
from prompt_jax import vocab as vocab_lib


@pytest.fixture(autouse=True)
def no_data_dir(monkeypatch):
  """Every test starts (and ends) with no data dir: TFDS unless the test sets one."""
  monkeypatch.delenv(tasks.DATA_DIR_ENV, raising=False)
  tasks.set_data_dir(None)
  yield
  tasks.set_data_dir(None)


@pytest.fixture
def networked(monkeypatch):
  """GCS resolves, as on a machine with network: TFDS is asked (the tests mock it), not refused
  at once as on this offline one (tasks/sources.py `_check_tfds_reachable`)."""
  from prompt_jax import paths  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(paths, "unreachable_gcs", lambda *a, **k: None)


@pytest.fixture
def data_root(shared_data) -> pathlib.Path:
  """../shared/data, set as the data dir (skips when absent)."""
  root = shared_data("super_glue").parent
  tasks.set_data_dir(root)
  return root


@pytest.fixture
def t5_vocab(spm_path, monkeypatch):
  """The real T5 vocabulary, resolved through $PROMPT_JAX_SPM_PATH like users do."""
  monkeypatch.setenv(vocab_lib.SPM_PATH_ENV, str(spm_path))
  return tasks.features.VOCABULARY


@pytest.fixture
def write_file():
  """write_file(path, text): writes a file, creating its folders; returns the path."""

  def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path

  return write
