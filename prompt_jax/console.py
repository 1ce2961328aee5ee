"""What the user sees: our own lines, not TensorFlow/CUDA/absl messages they cannot act on.

`quiet()` (what `prompt-jax` runs under unless `--verbose`) sets TensorFlow's C++ log level in
the environment before TensorFlow is imported, imports it with file descriptor 2 pointed at
/dev/null (TF 2.21 prints "oneDNN custom operations are on", "Could not find cuda drivers" and
an absl::InitializeLog notice at import, whatever TF_CPP_MIN_LOG_LEVEL says), sets absl and the
noisy libraries' Python loggers to ERROR and ignores their Python warnings. Errors still show.

TensorFlow only feeds data here: it is always kept off the GPUs, which belong to JAX.
"""
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import warnings
from typing import Callable, Iterator, Optional

# Python loggers of libraries whose INFO/WARNING lines are not actionable for a user.
_NOISY_LOGGERS = ("absl", "tensorflow", "seqio", "orbax", "jax._src.xla_bridge", "urllib3",
                  "tensorflow_datasets", "clu", "etils")
_NOISY_MODULES = r"(tensorflow|tensorflow_datasets|tensorflow_text|seqio|tf_keras|keras|orbax|" \
                 r"clu|google\.protobuf|etils|absl)(\.|$)"


def import_tensorflow(silence_import: bool = True):
  """Imports TensorFlow (with its import-time C++ messages discarded) and hides the GPUs from it.

  Safe to call again: a second import is a no-op.
  """
  if "tensorflow" in sys.modules or not silence_import:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  else:
    tf = _import_with_stderr_discarded()
  try:
    tf.config.set_visible_devices([], "GPU")
  except (RuntimeError, ValueError):  # already initialised: nothing to change now
    pass
  return tf


_ctrl_c_seen = False  # set by `_raise_interrupt`: a Ctrl-C arrived during this command


def _raise_interrupt(signum, frame) -> None:  # pylint: disable=unused-argument
  global _ctrl_c_seen
  _ctrl_c_seen = True
  raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_remembered() -> Iterator[None]:
  """Ctrl-C raises KeyboardInterrupt as Python's own handler does, and is remembered
  (`ctrl_c_seen`): an interrupt raised inside a garbage-collection callback (JAX has one) is
  only printed by Python ("Exception ignored in ..."), so the run went on; the training loop's
  signal watch stops a run that saw one (train/guards.py). Only where Ctrl-C would raise (the
  default handler, the main thread): an ignored SIGINT (a sweep's job) is left ignored."""
  global _ctrl_c_seen
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
    yield
    return
  _ctrl_c_seen = False
  previous_hook = sys.unraisablehook

  def hook(unraisable):  # the swallowed interrupt's "Exception ignored in" traceback: not ours
    if not issubclass(unraisable.exc_type, KeyboardInterrupt):
      previous_hook(unraisable)

  signal.signal(signal.SIGINT, _raise_interrupt)
  sys.unraisablehook = hook
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.unraisablehook = previous_hook
    _ctrl_c_seen = False  # a later run in this process (a notebook, a test) starts afresh


def ctrl_c_seen() -> bool:
  """Whether a Ctrl-C arrived in this `ctrl_c_remembered` block (even one that was swallowed)."""
  return _ctrl_c_seen


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
  """Ctrl-C held back until the block ends, then raised as KeyboardInterrupt: TensorFlow's
  import (2-3 s here) lost a Ctrl-C that arrived inside it (the run went on). Only where
  Ctrl-C would raise (the main thread, Python's or `ctrl_c_remembered`'s handler)."""
  global _ctrl_c_seen
  previous = signal.getsignal(signal.SIGINT)
  if (threading.current_thread() is not threading.main_thread()
      or previous not in (signal.default_int_handler, _raise_interrupt)):
    yield
    return
  pending = []
  signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
  if pending:
    if previous is _raise_interrupt:  # inside `ctrl_c_remembered`: remembered there
      _ctrl_c_seen = True
    raise KeyboardInterrupt


def _import_with_stderr_discarded():
  """`import tensorflow` with fd 2 on /dev/null; Python errors raised by the import still show
  (they are raised after fd 2 is restored)."""
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)
  return tf


@contextlib.contextmanager
def quiet(enabled: bool = True, tensorflow: bool = True) -> Iterator[None]:
  """Runs a command with only our lines on screen (restores logger levels and warning filters
  on exit, so an in-process caller keeps its own settings). `tensorflow`: import it now (the
  commands that read data); `enabled=False` (--verbose) changes nothing else."""
  if not enabled:
    if tensorflow:
      with sigint_deferred():
        import_tensorflow(silence_import=False)
    yield
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # C++ INFO/WARNING/ERROR after import
  os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
  levels = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
  absl_verbosity = None
  try:
    from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
    absl_verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
  except ImportError:
    absl_logging = None
  # Our own warnings (logging.warning: a random backbone, a checkpoint moved aside) as our
  # lines, "warning: ...", not Python's default "WARNING:root:...".
  ours = None
  if not logging.getLogger().handlers:
    ours = logging.StreamHandler(sys.stderr)
    ours.setLevel(logging.WARNING)
    ours.setFormatter(logging.Formatter("warning: %(message)s"))
    logging.getLogger().addHandler(ours)
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", module=_NOISY_MODULES)
    for name in _NOISY_LOGGERS:
      logging.getLogger(name).setLevel(logging.ERROR)
    # orbax logs a failed background write (disk full) with its traceback on the absl logger
    # before re-raising it where we wait for the save; the loop turns that into one line.
    for name in ("absl", "orbax"):
      logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
      if tensorflow:
        with sigint_deferred():  # TensorFlow's import loses a Ctrl-C that lands inside it
          import_tensorflow()
      yield
    finally:
      if ours is not None:
        logging.getLogger().removeHandler(ours)
      for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
      if absl_logging is not None and absl_verbosity is not None:
        absl_logging.set_verbosity(absl_verbosity)


@contextlib.contextmanager
def missing_glyphs_quiet() -> Iterator[None]:
  """Drawing a figure whose text has characters the font lacks (a run named 模型): matplotlib's
  'UserWarning: Glyph N ... missing from font(s)' lines, with their source lines, are not the
  user's to fix; the characters draw as boxes."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from")
    yield


def clock_text(seconds: float) -> str:
  """'HH:MM:SS' with hours that do not wrap at a day (a 30-hour ETA is '30:00:00', not
  '06:00:00'); negative times read as zero."""
  total = int(max(seconds, 0.0))
  return f"{total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}"


class Meter:
  """Progress of long work with a known total, e.g. prediction over a large split:
  'eval: 1,024/8,192 examples (12%) 85.3 examples/s ETA 00:01:24', at most once per `period_s`
  seconds (so short work prints nothing), through `emit` (default: print to stdout)."""

  def __init__(self, label: str, total: int, unit: str = "examples", period_s: float = 10.0,
               clock: Callable[[], float] = time.monotonic,
               emit: Optional[Callable[[str], None]] = None):
    self.label, self.total, self.unit, self.period_s = label, total, unit, period_s
    self._clock = clock
    self._emit = emit or (lambda text: print(text, flush=True))
    self._start = self._last = clock()

  def line(self, done: int, now: float) -> str:
    elapsed = max(now - self._start, 1e-9)
    rate = done / elapsed
    eta = clock_text((self.total - done) / rate) if rate > 0 else "?"
    percent = 100.0 * done / max(self.total, 1)
    return (f"{self.label}: {done:,}/{self.total:,} {self.unit} ({percent:.0f}%) "
            f"{rate:.1f} {self.unit}/s ETA {eta}")

  def update(self, done: int) -> Optional[str]:
    """Emits (and returns) a line when `period_s` passed since the last one."""
    now = self._clock()
    if now - self._last < self.period_s or done >= self.total:
      return None
    self._last = now
    text = self.line(done, now)
    self._emit(text)
    return text
