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


def test_a_method_file_before_the_run_file_is_refused(tmp_path):
  """`--gin_file=t5x/prompts/prefix.gin --gin_file=t5x/runs/embedded_default.gin` trained plain
  prompt tuning, exit 0: the run file includes the model file, which binds the default method
  again, and the later file wins in gin. It is one ConfigError now, and nothing is trained."""
  model_dir = tmp_path / "m"
  proc = common.run_t5x("train", ["--gin_file=t5x/prompts/prefix.gin",
                                  *common.embedded_train_args(str(model_dir), 1)], check=False)
  assert proc.returncode != 0
  errors = [l for l in _lines(proc) if l.startswith("prompt_jax.errors.ConfigError:")]
  assert errors == [
      "prompt_jax.errors.ConfigError: --gin_file=t5x/prompts/prefix.gin comes before "
      "--gin_file=t5x/runs/embedded_default.gin, which includes a model file and with it the "
      "default method (prompt tuning, PROMPT_LENGTH=100): in gin the later file wins, so "
      "t5x/prompts/prefix.gin would be ignored; give it after "
      "t5x/runs/embedded_default.gin"], proc.stdout[-3000:]
  assert not list(model_dir.glob("checkpoint_*"))


def test_gin_file_order_error_finds_includes_at_any_depth(tmp_path):
  """Which orders are refused: a method file (or a file including one) before a file that
  includes a model file; the model, then the method, then a run file is the documented order."""
  from prompt_jax.t5x import network  # pylint: disable=g-import-not-at-top
  search = [str(common.GIN_DIR)]
  mine = tmp_path / "my_method.gin"
  mine.write_text("include 't5x/prompts/dpt.gin'\nPROMPT_LENGTH = 20\n")
  assert network.gin_file_order_error(
      ["t5x/models/t5_1_1_base_prompt.gin", "t5x/prompts/dpt.gin",
       "t5x/runs/prompt_finetune.gin"], search) is None
  assert network.gin_file_order_error(
      ["t5x/runs/embedded_default.gin", "t5x/prompts/prefix.gin"], search) is None
  assert network.gin_file_order_error(["t5x/prompts/no_such.gin"], search) is None
  error = network.gin_file_order_error(
      [str(mine), "t5x/models/t5_1_1_base_prompt.gin"], search)
  assert error and error.startswith(f"--gin_file={mine} comes before "
                                    f"--gin_file=t5x/models/t5_1_1_base_prompt.gin"), error
  assert "so t5x/prompts/dpt.gin would be ignored" in error
  # prompt-jax's own checks of method files, on the files t5x is given: an initialiser before a
  # method file that sets its own (residual's P0), two methods, an initialiser DPT cannot use.
  base = "t5x/models/t5_1_1_base_prompt.gin"
  assert network.gin_file_order_error(
      [base, "t5x/prompts/residual.gin", "t5x/prompts/from_class_labels.gin"], search) is None
  assert network.gin_file_order_error(
      [base, "t5x/prompts/from_class_labels.gin", "t5x/prompts/residual.gin"], search
  ).startswith("--gin_file=t5x/prompts/from_class_labels.gin comes before "
               "--gin_file=t5x/prompts/residual.gin, a method file that sets its own "
               "initialisation")
  assert network.gin_file_order_error(
      [base, "t5x/prompts/dpt.gin", "t5x/prompts/residual.gin"], search
  ).startswith("--gin_file=t5x/prompts/dpt.gin and --gin_file=t5x/prompts/residual.gin each "
               "choose the prompt method")
  assert network.gin_file_order_error(
      [base, "t5x/prompts/dpt.gin", "t5x/prompts/uniform.gin"], search
  ).startswith("--gin_file=t5x/prompts/uniform.gin starts a [P, H] prompt, which "
               "t5x/prompts/dpt.gin's dpt does not have")
  # prefix_ipt.gin includes prefix.gin: one method file, which an initialiser cannot start
  assert network.gin_file_order_error([base, "t5x/prompts/prefix_ipt.gin"], search) is None
  assert network.gin_file_order_error(
      [base, "t5x/prompts/prefix_ipt.gin", "t5x/prompts/uniform.gin"], search
  ).startswith("--gin_file=t5x/prompts/uniform.gin starts a [P, H] prompt, which "
               "t5x/prompts/prefix_ipt.gin's deep_prefix does not have"), search


def test_eval_with_another_prompt_length_names_the_parameter(tmp_path):
  """t5x.eval of a PROMPT_LENGTH=8 checkpoint without --gin.PROMPT_LENGTH=8 (the model file's
  100) ended in flax's ScopeParamShapeError, raised in prompt_jax/prompts/tuning.py."""
  model_dir = tmp_path / "m"
  common.run_t5x("train", common.embedded_train_args(str(model_dir), 1))
  proc = common.run_t5x("eval", [
      "--gin_file=t5x/models/embedded_tiny_prompt.gin", "--gin_file=t5x/runs/prompt_eval.gin",
      "--gin.MIXTURE_OR_TASK_NAME='embedded_last_letter'",
      f"--gin.CHECKPOINT_PATH='{model_dir}/checkpoint_{common.EMBEDDED_STEP + 1}'",
      f"--gin.EVAL_OUTPUT_DIR='{tmp_path / 'eval'}'"], check=False)
  assert proc.returncode != 0
  errors = [l for l in _lines(proc) if l.startswith("prompt_jax.errors.ConfigError:")]
  assert errors == [
      "prompt_jax.errors.ConfigError: the checkpoint's encoder/prompt/prompt/prompt has shape "
      "(8, 64); the gin config builds it with shape (100, 64): set the gin values it was "
      "trained with (e.g. PROMPT_LENGTH, the method's gin file)"], proc.stdout[-3000:]


def test_eval_of_a_missing_checkpoint_names_checkpoint_path(tmp_path):
  """t5x/runs/prompt_eval.gin binds INITIAL_CHECKPOINT_PATH = %CHECKPOINT_PATH: the error named
  INITIAL_CHECKPOINT_PATH, which the user never set."""
  missing = tmp_path / "no_run" / "checkpoint_5"
  proc = common.run_t5x("eval", [
      "--gin_file=t5x/models/embedded_tiny_prompt.gin", "--gin_file=t5x/runs/prompt_eval.gin",
      "--gin.MIXTURE_OR_TASK_NAME='embedded_last_letter'", "--gin.PROMPT_LENGTH=8",
      f"--gin.CHECKPOINT_PATH='{missing}'", f"--gin.EVAL_OUTPUT_DIR='{tmp_path / 'eval'}'"],
      check=False)
  assert proc.returncode != 0
  errors = [l for l in _lines(proc) if l.startswith("prompt_jax.errors.ConfigError:")]
  assert len(errors) == 1 and errors[0].startswith(
      "prompt_jax.errors.ConfigError: CHECKPOINT_PATH: "), proc.stdout[-3000:]
  assert str(missing) in errors[0]
