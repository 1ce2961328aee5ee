"""errors: check_integer, the one integer check behind TRAIN_STEPS, BATCH_SIZE, RANDOM_SEED,
PROMPT_LENGTH, beam_size, ... (numpy integers count; bools, floats and strings do not)."""
import numpy as np
import pytest

from prompt_jax import errors
from prompt_jax.errors import ConfigError, check_integer


@pytest.mark.parametrize("value", [0, 7, np.int32(3), np.int64(-2), np.uint8(5)])
def test_integers_pass(value):
  check_integer(value, "X")


@pytest.mark.parametrize("value", [True, False, 3.0, np.float32(3), "3", None, [3]])
def test_non_integers_are_one_line(value):
  with pytest.raises(ConfigError) as e:
    check_integer(value, "TRAIN_STEPS")
  assert str(e.value) == f"TRAIN_STEPS must be an integer, got {value!r}"


def test_bound_and_its_note():
  check_integer(1, "CHECKPOINT_PERIOD", 1)
  with pytest.raises(ConfigError) as e:
    check_integer(0, "EVAL_PERIOD", 1, " (0: no evaluation)")
  assert str(e.value) == "EVAL_PERIOD must be >= 1 (0: no evaluation), got 0"
  with pytest.raises(ConfigError, match=r"^X must be >= 0, got -1$"):
    check_integer(np.int64(-1), "X", 0)


def test_none_only_where_allowed():
  check_integer(None, "KEEP_CHECKPOINTS", 1, none_ok=True)
  with pytest.raises(ConfigError, match=r"^RANDOM_SEED must be an integer or None, got 'a'$"):
    check_integer("a", "RANDOM_SEED", none_ok=True)
  with pytest.raises(ConfigError, match=r"^KEEP_CHECKPOINTS must be >= 1, got 0$"):
    check_integer(0, "KEEP_CHECKPOINTS", 1, none_ok=True)


def test_causes_walks_the_chain_once_each():
  """errors.causes: the error, what it was raised from (__cause__) or while handling
  (__context__), and stops at a cycle instead of looping."""
  from prompt_jax.errors import causes  # pylint: disable=g-import-not-at-top
  inner, middle, outer = KeyError("a"), ValueError("b"), RuntimeError("c")
  middle.__context__ = inner
  outer.__cause__ = middle
  assert list(causes(outer)) == [outer, middle, inner]
  inner.__context__ = outer  # a cycle
  assert list(causes(outer)) == [outer, middle, inner]
  assert not list(causes(None))


def test_a_mistyped_flag_gets_a_did_you_mean():
  """`export --fromat=peft` said only `unrecognized arguments`."""
  parser = errors.OneLineParser(prog="prompt-jax export")
  parser.add_argument("--format", default="npy")
  parser.add_argument("--output", default=None)
  with pytest.raises(errors.ConfigError) as e:
    parser.parse_args(["--fromat=peft"])
  assert str(e.value) == ("unrecognized arguments: --fromat=peft; did you mean --format? "
                          "(prompt-jax export --help lists the flags)")
  with pytest.raises(errors.ConfigError) as e:  # nothing close: no guess
    parser.parse_args(["--zzz"])
  assert str(e.value) == "unrecognized arguments: --zzz (prompt-jax export --help lists the flags)"


def test_a_mistyped_flag_through_the_cli(capsys):
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  assert cli.main(["export", "--fromat=peft", "--gin.MODEL_DIR='/nonexistent'"]) == 2
  err = capsys.readouterr().err
  assert err.strip().splitlines() == [
      "prompt-jax export: error: unrecognized arguments: --fromat=peft; did you mean --format? "
      "(prompt-jax export --help lists the flags)"]


def test_a_mistyped_flag_is_said_before_tensorflow_loads():
  """The flags were parsed only after TensorFlow's import (4 s on a 2-core machine) for
  `prompt-jax train --bogus` or `eval --help`; they are now checked first."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ("import sys; from prompt_jax import cli; rc = cli.main([{!r}, '--fromat=peft']); "
          "print(rc, 'tensorflow' in sys.modules)")
  for command in ("train", "export", "inspect"):  # (export's parser imported TensorFlow)
    done = subprocess.run([sys.executable, "-c", code.format(command)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.stdout.split() == ["2", "False"], (command, done.stdout, done.stderr)
    (line,) = done.stderr.splitlines()  # no TensorFlow/CUDA lines either
    assert line.startswith(f"prompt-jax {command}: error: unrecognized arguments: --fromat=peft")


def test_the_cli_names_export_formats_as_export_does():
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import export  # pylint: disable=g-import-not-at-top
  assert set(cli.EXPORT_FORMATS) == set(export.FORMATS)


def test_our_warnings_are_our_lines_and_the_handler_goes_with_the_command(capsys):
  """logging.warning of ours (a random backbone, a checkpoint moved aside) showed as Python's
  default 'WARNING:root:...'; an in-process caller keeps its own logging set-up afterwards."""
  import logging  # pylint: disable=g-import-not-at-top
  from prompt_jax import console  # pylint: disable=g-import-not-at-top
  root = logging.getLogger()
  before = list(root.handlers)
  root.handlers[:] = []  # as `prompt-jax` starts: nothing configured logging yet
  try:
    with console.quiet(tensorflow=False):
      logging.warning("INITIAL_CHECKPOINT_PATH is empty: the backbone is randomly initialised")
      logging.info("not shown")
    assert root.handlers == []
  finally:
    root.handlers[:] = before
  assert capsys.readouterr().err == ("warning: INITIAL_CHECKPOINT_PATH is empty: the backbone is "
                                     "randomly initialised\n")
