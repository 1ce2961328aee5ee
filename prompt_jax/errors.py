"""Errors a user can act on: the CLI prints their message as one line.

ConfigError: a configuration that cannot work (exit 2, before anything is written).
RunError: a run that cannot go on (non-finite loss, no intact checkpoint, a write that failed);
  the message says what was kept and what to do (exit 1).
Preempted: the run saved a checkpoint on SIGTERM and stopped; the same command resumes (exit 143,
  the status of a process ended by SIGTERM, so schedulers and wrappers see "terminated", not
  "finished").
"""
import argparse
import difflib
import numbers
import os
from typing import Any, Dict, Iterator, Optional


def causes(e: Optional[BaseException]) -> Iterator[BaseException]:
  """`e`, then each error it was raised from or while handling (`__cause__`, else
  `__context__`), once each."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    yield e
    e = e.__cause__ or e.__context__


def did_you_mean(name: str, choices) -> str:
  """'; did you mean X?' for the closest of `choices`, or ''."""
  close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
  return f"; did you mean {close[0]}?" if close else ""


class ConfigError(ValueError):
  """A run configuration that cannot work (message names the macro/value and what is expected)."""


class RunError(RuntimeError):
  """A run that stopped and cannot go on by itself (message: what happened, what is kept, what
  to do)."""


class Preempted(Exception):
  """SIGTERM (TPU VM / SLURM preemption), or Ctrl-C (`interrupted`): a checkpoint at `step` was
  saved, the run stopped."""

  def __init__(self, message: str, step: int, interrupted: bool = False):
    super().__init__(message)
    self.step = step
    self.interrupted = interrupted


def check_integer(value: Any, what: str, least: Optional[int] = None, more: str = "",
                  none_ok: bool = False) -> None:
  """One ConfigError unless `value` is an integer (numpy's too; not a bool) >= `least`;
  `more` follows the bound in the message (" (0: no evaluation)"), `none_ok` lets None pass."""
  if none_ok and value is None:
    return
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise ConfigError(f"{what} must be an integer{' or None' if none_ok else ''}, got {value!r}")
  if least is not None and value < least:
    raise ConfigError(f"{what} must be >= {least}{more}, got {value}")


class OneLineParser(argparse.ArgumentParser):
  """argparse whose usage errors are a ConfigError (one line, exit 2 through the CLI's one error
  path) instead of a usage block and `sys.exit(2)` from inside the parser; a mistyped flag gets
  a "did you mean", a flag of another command its `hints` entry ({"--gin_file": "plan takes
  --model=..."})."""

  def __init__(self, *args, hints: Optional[Dict[str, str]] = None, **kwargs):
    super().__init__(*args, **kwargs)
    self.hints = dict(hints or {})

  def error(self, message):
    hint = ""
    if message.startswith(_UNRECOGNIZED):
      flags = [o for o in self._option_string_actions if o.startswith("--")]
      for arg in message[len(_UNRECOGNIZED):].split():
        name = arg.split("=", 1)[0]
        if name in self.hints:
          hint = f"; {self.hints[name]}"
        elif arg.startswith("-"):
          hint = did_you_mean(name, flags)
        if hint:
          break
    raise ConfigError(f"{message}{hint} ({self.prog} --help lists the flags)")


_UNRECOGNIZED = "unrecognized arguments: "


def make_dirs(directory: str, what: str) -> None:
  """`os.makedirs(directory, exist_ok=True)`, or one ConfigError line starting with `what`
  ("--output /a/b.npy") when a file is in the way or the place is not writable."""
  try:
    os.makedirs(directory or ".", exist_ok=True)
  except OSError as e:
    raise ConfigError(f"{what}: cannot create the directory {directory} "
                      f"({e.strerror or e}); choose another place") from e
