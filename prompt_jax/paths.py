"""Where the packaged resources (gin files) live, for wheel and editable installs alike, and a
user's path made absolute."""
import os
import pathlib

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def gin_dir() -> str:
  """The directory of the packaged gin files.

  A wheel carries the repository's `gin/` as `prompt_jax/gin/`; an editable install or a source
  checkout reads the repository's `gin/` in place (it has no `__init__.py` on purpose: a regular
  package named `gin` at the repository root would shadow gin-config).
  """
  for candidate in (_PACKAGE_DIR / "gin", _PACKAGE_DIR.parent / "gin"):
    if candidate.is_dir():
      return str(candidate)
  raise FileNotFoundError(
      f"prompt_jax's gin files are missing (looked in {_PACKAGE_DIR / 'gin'} and "
      f"{_PACKAGE_DIR.parent / 'gin'}); reinstall prompt_jax with `pip install -e .`.")


def absolute(path: str) -> str:
  """A local path made absolute (against the working directory); URLs (gs://...) unchanged."""
  if "://" in path:
    return path
  return os.path.abspath(os.path.expanduser(path))
