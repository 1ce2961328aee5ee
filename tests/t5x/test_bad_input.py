"""Acceptance 5: bad inputs under t5x give one clear line each."""
import re

import pytest

from tests.t5x import common


def _lines(proc):
  return proc.stdout.splitlines()


def test_a_method_that_does_not_exist_is_named(tmp_path):
  proc = common.run_t5x("train", common.embedded_train_args(
      str(tmp_path / "m"), 1, "--gin.prompt_jax.model_spec.prompt=@prompt_jax.no_such_method()"),
      check=False)
  assert proc.returncode != 0
  assert any("No configurable matching" in l and "prompt_jax.no_such_method" in l
             for l in _lines(proc)), proc.stdout[-3000:]


def test_a_method_file_that_does_not_exist_is_named(tmp_path):
  proc = common.run_t5x("train", common.embedded_train_args(
      str(tmp_path / "m"), 1, "--gin_file=t5x/prompts/no_such_method.gin"), check=False)
  assert proc.returncode != 0
  assert any("no_such_method.gin" in l and re.search("(?i)unable to find|not found", l)
             for l in _lines(proc)), proc.stdout[-3000:]


def test_initial_checkpoint_of_another_model_size(tmp_path):
  # The shipped checkpoint is 64-d; the configured backbone is 128-d.
  proc = common.run_t5x("train", common.embedded_train_args(
      str(tmp_path / "m"), 1, "--gin.prompt_jax.t5_config.emb_dim=128"), check=False)
  assert proc.returncode != 0
  errors = [l for l in _lines(proc) if l.startswith("prompt_jax.errors.ConfigError:")]
  assert errors and "INITIAL_CHECKPOINT_PATH" in errors[0], proc.stdout[-3000:]
  assert "(260, 64)" in errors[0] and "(260, 128)" in errors[0], errors[0]


@pytest.mark.parametrize("code", [
    "import prompt_jax.t5x.models",  # what gin/t5x/models/prompt.gin imports
    "import prompt_jax.t5x.optim",
    "from prompt_jax.t5x import PromptEncoderDecoderModel"])
def test_importing_prompt_jax_t5x_without_t5x_says_how_to_install(code):
  proc = common.run_python(code, with_t5x=False, timeout=300)
  assert proc.returncode != 0
  last = _lines(proc)[-1]
  assert last.startswith("ImportError: prompt_jax.t5x needs t5x"), proc.stdout[-2000:]
  assert "pip install" in last and "github.com/google-research/t5x" in last


def test_gin_dir_needs_no_t5x():
  """README's first t5x step, `python -m prompt_jax.t5x gin_dir`, printed the install hint's
  traceback where t5x was not importable yet: it needs nothing of t5x."""
  proc = common.run_python("import runpy, sys; sys.argv = ['prompt_jax.t5x', 'gin_dir']; "
                           "runpy.run_module('prompt_jax.t5x', run_name='__main__')",
                           with_t5x=False, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:]
  assert proc.stdout.strip() == str(common.GIN_DIR)
