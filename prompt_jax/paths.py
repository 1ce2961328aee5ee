"""Where the packaged resources (gin files) live, for wheel and editable installs alike, a
user's path made absolute, an earlier file or run kept aside, whether Google Cloud Storage
can be reached, and the file that keeps a path from being a directory."""
import hashlib
import os
import pathlib
import socket
import threading
from typing import Callable, Optional

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


def label(path: str, keep_extension: bool = True) -> str:
  """'<name>-<8 hex digits of its absolute path's sha1>': a file-name-safe label of a path that
  two paths of one name (every prompt export is `encoder.prompt.prompt.prompt.npy`) never share."""
  where = absolute(str(path).rstrip("/") or "/")
  name = os.path.basename(where)
  if not keep_extension:
    name = os.path.splitext(name)[0]
  return f"{name or 'root'}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"


def nearest_existing(path: str) -> str:
  """`path` itself if it exists, else its nearest existing ancestor (a local path)."""
  while not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return path


def probe_writable(directory: str) -> None:
  """OSError unless a file can be written in `directory` (a temporary file, removed)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryFile(dir=directory, prefix=".prompt_jax_write_probe") as f:
    f.write(b"\0" * 65536)
    f.flush()
    os.fsync(f.fileno())


def not_a_directory_message(model_dir: str) -> str:
  """'' when MODEL_DIR is (or can be created as) a directory; else one line naming the file in
  its way, MODEL_DIR itself or a parent. URLs (gs://...) are not checked."""
  if "://" in model_dir:
    return ""
  path = os.path.abspath(model_dir)
  existing = nearest_existing(path)
  if not os.path.exists(existing) or os.path.isdir(existing):
    return ""
  what = "it" if existing == path else f"{existing}, a parent of it,"
  return (f"MODEL_DIR {model_dir} cannot be a directory: {what} is a file; choose another "
          f"MODEL_DIR or move that file away")


def keep_aside(path: str) -> str:
  """Renames `path` (a file or a directory) to the first free `<path>.replaced-<k>`, k = 1, 2,
  ..., so nothing a user wrote or trained is replaced; returns the new path."""
  k = 1
  while os.path.exists(f"{path}.replaced-{k}"):
    k += 1
  os.rename(path, f"{path}.replaced-{k}")
  return f"{path}.replaced-{k}"


GCS_HOST = "storage.googleapis.com"
# Set, these send GCS requests elsewhere (a proxy resolves the host; an emulator replaces it).
_GCS_ELSEWHERE = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "STORAGE_EMULATOR_HOST",
                  "CLOUD_STORAGE_EMULATOR_ENDPOINT")


def unreachable_gcs(timeout_s: float = 5.0,
                    resolve: Optional[Callable[..., object]] = None) -> Optional[str]:
  """Why Google Cloud Storage cannot be reached from this machine ('storage.googleapis.com does
  not resolve'), or None: it resolves, a proxy or emulator is set, or the lookup takes longer
  than `timeout_s` (then GCS's own client decides). Offline, a gs:// checkpoint otherwise hangs
  in GCS's credential and retry loops for minutes before any error."""
  if any(os.environ.get(k) for k in _GCS_ELSEWHERE):
    return None
  failed = []
  resolve = resolve or socket.getaddrinfo

  def look_up():
    try:
      resolve(GCS_HOST, 443)
    except OSError as e:  # socket.gaierror: the name does not resolve
      failed.append(e)

  thread = threading.Thread(target=look_up, daemon=True)
  thread.start()
  thread.join(timeout_s)
  return f"{GCS_HOST} does not resolve" if failed else None
