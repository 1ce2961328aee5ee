"""An allocation that fails (a batch, length or PROMPT_LENGTH too large for the machine) is one
line saying what to lower, exit 1, whichever allocator refused: numpy's MemoryError (as
PROMPT_LENGTH=100000 gave, building the [q, k] relative-position buckets) or XLA's
RESOURCE_EXHAUSTED. 1 PiB exceeds any x86-64 or arm64 process's address space (48 bits of
virtual address = 256 TiB), so both allocations fail on every machine, whatever its overcommit
setting, without touching memory."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax import cli

PEBIBYTE = 1 << 50


def _raised(fn):
  try:
    fn()
  except Exception as e:  # pylint: disable=broad-except
    return e
  pytest.skip("this machine allocated a pebibyte")


def _wrapped(error):
  """As the train loop sees it: raised inside a gin configurable's call."""
  try:
    try:
      raise error
    except Exception as inner:  # pylint: disable=broad-except
      raise RuntimeError("the train step failed") from inner
  except RuntimeError as outer:
    return outer


@pytest.mark.parametrize("allocate", [
    lambda: np.empty((PEBIBYTE,), np.int8),
    lambda: jax.block_until_ready(jnp.zeros((PEBIBYTE,), jnp.int8)),
], ids=["numpy", "xla"])
def test_a_failed_allocation_is_one_line_naming_what_to_lower(allocate, capsys):
  error = _raised(allocate)
  for e in (error, _wrapped(error)):
    assert cli._error("train", e, verbose=False) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("prompt-jax train: error: out of memory ("), err
    assert "lower BATCH_SIZE, TASK_FEATURE_LENGTHS or PROMPT_LENGTH" in err[0], err


def test_other_resource_errors_are_not_called_memory(capsys):
  """A full disk is RESOURCE_EXHAUSTED too (tensorstore): not an out-of-memory line."""
  e = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: No space left on device")
  assert cli._error("train", e, verbose=False) == 1
  assert "out of memory" not in capsys.readouterr().err
