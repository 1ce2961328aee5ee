"""Shared fixtures: the real data folder `../shared/data` (tests using it skip cleanly without it)."""
import os
import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(
    os.environ.get("PROMPT_JAX_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def shared_path(*parts: str) -> pathlib.Path:
  """A path under ../shared/data; skips the calling test when it is absent."""
  path = SHARED_DATA.joinpath(*parts)
  if not path.exists():
    pytest.skip(f"{path} is absent (real data lives in ../shared/data)")
  return path


@pytest.fixture
def spm_path() -> pathlib.Path:
  """The real T5 32k SentencePiece model."""
  return shared_path("t5_spm", "spiece.model")


@pytest.fixture
def shared_data():
  """`shared_data('super_glue', 'CB')`: a path under ../shared/data, or skip the test."""
  return shared_path
