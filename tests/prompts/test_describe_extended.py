"""`prompt-jax describe` with issue 16's gin files (visibility, P-tuning, wayward prompts) prints
the count of each spec's formula; each file alone gives its source's main-setting count."""
import pytest

from prompt_jax import run_setup
from tests.prompts.test_describe_methods import _describe



@pytest.mark.parametrize("files,bindings,expected", [
    # P-tuning, PEFT's defaults: MLP, m = H = 1024, P = 20: P·H + (H·m + m) + (m² + m) + (m·H + H)
    (["prompts/p_tuning.gin"], [], 20 * 1024 + 3 * 1024 * 1024 + 3 * 1024),
    # P-tuning with the paper's BiLSTM (2 layers) + MLP head, m = 1024:
    (["prompts/p_tuning.gin"], ["P_TUNING_ENCODER='lstm'"],
     20 * 1024 + 2 * (4 * 1024 * 1024 + 4 * 1024 * 1024 + 8 * 1024)
     + 2 * (4 * 1024 * 2048 + 4 * 1024 * 1024 + 8 * 1024)
     + (2048 * 2048 + 2048) + (2048 * 1024 + 1024)),
    (["prompts/wayward.gin"], [], 102_400),  # plain prompt tuning's P·H, P = 100
    (["prompts/visibility.gin"], ["PROMPT_VISIBILITY='input->prompt'"], 102_400),  # no params
], ids=["p_tuning_mlp", "p_tuning_lstm", "wayward", "visibility"])
def test_file_alone_count_on_t5_1_1_large(capsys, files, bindings, expected):
  count, spec = _describe(capsys, ["models/t5_1_1_large.gin"] + files, bindings)
  assert count == expected
  assert count == spec.num_trainable_params(run_setup.t5_config(preset="t5_1_1_large"))


@pytest.mark.parametrize("bindings", [["P_TUNING_HIDDEN=48"],
                                      ["P_TUNING_ENCODER='lstm'", "P_TUNING_HIDDEN=40",
                                       "P_TUNING_LAYERS=3", "PROMPT_LENGTH=7"]])
def test_p_tuning_count_equals_spec_formula(capsys, bindings):
  count, spec = _describe(capsys, ["models/t5_1_1_small.gin", "prompts/p_tuning.gin",
                                   "runs/prompt_finetune.gin"], bindings)
  assert type(spec).__name__ == "PTuningSpec"
  assert count == spec.num_trainable_params(run_setup.t5_config(preset="t5_1_1_small"))
