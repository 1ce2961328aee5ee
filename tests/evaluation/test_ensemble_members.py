"""Trained MODEL_DIRs a plain [P, H] bank row cannot hold (a PROMPT_VISIBILITY other than full,
a TRAINABLE_REGEX wider than the method's) join an ensemble as their own module members, with
everything the run trained: each equals its run alone (they were silently folded into a row,
losing the visibility mask and the extra trained weights)."""
import json

import pytest

from prompt_jax.evaluation import ensemble
from tests.evaluation.test_ensemble import (TASK, assert_each_run_equals_its_infer,
                                            ensemble_rows, run_cli)

RUNS = {
    # input positions cannot see the prompt: the encoder's mask, not the prompt, differs
    "causal": ["--gin_file=prompts/visibility.gin",
               "--gin.PROMPT_VISIBILITY='prompt->input,prompt->prompt;causal'"],
    # the encoder's final norm trained beside the prompt
    "norm": ["--gin.TRAINABLE_REGEX='encoder/(prompt/.*|encoder_norm/.*)'"],
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """2-step prompt-tuning runs on the embedded default, one per RUNS entry."""
  from tests.train import common  # pylint: disable=g-import-not-at-top
  runs = {}
  for name, extra in RUNS.items():
    model_dir = str(tmp_path_factory.mktemp(name))
    code, _, err = run_cli(["train"] + common.flags(model_dir, 2, *extra))
    assert code == 0, err
    runs[name] = model_dir
  return runs


def test_such_runs_are_module_members_with_all_they_trained(trained):
  """Neither folds into a bank row; the wider run's member holds its trained encoder_norm."""
  from tests.train import common  # pylint: disable=g-import-not-at-top
  config = common.embedded_tiny_config()
  for name, path in trained.items():
    member = ensemble.load_member(name, path, config, None)
    assert member.entry is None, name
    assert member.spec.visibility == ensemble.run_method(path).visibility
  norm = ensemble.load_member("norm", trained["norm"], config, None)
  assert "encoder/encoder_norm/scale" in norm.trainable, sorted(norm.trainable)


def test_each_such_run_in_the_ensemble_equals_the_run_alone(trained, tmp_path):
  model_dir = tmp_path / "ens"
  _, rows = ensemble_rows(trained, str(model_dir))
  report = json.load(open(model_dir / "ensemble" / f"{TASK}-validation.json"))
  assert [p["method"] for p in report["prompts"]] == ["PromptTuning"] * 2, report["prompts"]
  _, rows64 = ensemble_rows(trained, str(tmp_path / "ens64"), float64=True)
  assert_each_run_equals_its_infer(trained, rows, rows64)
