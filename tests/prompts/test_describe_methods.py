"""`prompt-jax describe` with each method's gin file prints the count of its formula, whatever
the order of the --gin_file flags (no include-order trap between method and run files)."""
import re

import gin
import pytest

from prompt_jax import cli
from prompt_jax import run_setup

MODEL = "models/t5_1_1_small.gin"  # H = 512, 8 + 8 layers, D = 6 heads x 64 = 384
H, L, D = 512, 8, 384


def _describe(capsys, files, bindings):
  argv = ["describe"] + [f"--gin_file={f}" for f in files] + [f"--gin.{b}" for b in bindings]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  spec = run_setup.model_spec().prompt
  gin.clear_config()
  count = int(re.search(r"trainable parameters: ([\d,]+)", out).group(1).replace(",", ""))
  return count, spec


@pytest.mark.parametrize("method_first", [True, False], ids=["method_first", "run_first"])
def test_dpt_count_is_r_times_p_plus_h_in_any_order(capsys, method_first):
  files = ["prompts/dpt.gin", "runs/prompt_finetune.gin"]
  count, spec = _describe(capsys, [MODEL] + (files if method_first else files[::-1]),
                          ["PROMPT_LENGTH=20", "DPT_RANK=4"])
  assert type(spec).__name__ == "DPTSpec"
  assert count == 4 * (20 + H)


@pytest.mark.parametrize("method,bindings,formula", [
    ("residual", ["PROMPT_LENGTH=10"], 10 * H + (2 * H * 400 + 400 + 3 * H)),
    # Encoder prefixes only (PREFIX_DECODER=False turns the cross set off too; prefix.gin's
    # default also prefixes the decoder: below).
    ("prefix", ["PROMPT_LENGTH=10", "PREFIX_HIDDEN=None", "PREFIX_DECODER=False"],
     2 * L * 10 * D),
    ("prefix", ["PROMPT_LENGTH=10", "PREFIX_HIDDEN=32", "PREFIX_DECODER=False"],
     10 * H + H * 32 + 32 + 2 * L * D * 32 + 2 * L * D),
    # prefix.gin's default: three sets, the encoder's and the decoder's self-attention and the
    # decoder's cross-attention (8 + 8 + 8 layers; seq2seq/prefixTuning.py use_cross_prefix).
    ("prefix", ["PROMPT_LENGTH=10", "PREFIX_HIDDEN=32"],
     3 * (10 * H + H * 32 + 32 + 2 * L * D * 32 + 2 * L * D)),
    ("prefix", ["PROMPT_LENGTH=10", "PREFIX_HIDDEN=32", "PREFIX_CROSS=False"],  # two sets
     2 * (10 * H + H * 32 + 32 + 2 * L * D * 32 + 2 * L * D)),
])
def test_method_count_equals_its_formula(capsys, method, bindings, formula):
  count, spec = _describe(capsys, [MODEL, f"prompts/{method}.gin", "runs/prompt_finetune.gin"],
                          bindings)
  assert count == formula
  assert count == spec.num_trainable_params(run_setup.t5_config(preset="t5_1_1_small"))


@pytest.mark.parametrize("method", ["idpg", "idpg_multilayer"])
def test_generator_methods_count_equals_spec_formula(capsys, method):
  count, spec = _describe(capsys, [MODEL, f"prompts/{method}.gin", "runs/prompt_finetune.gin"],
                          ["PROMPT_LENGTH=5"])
  assert count == spec.num_trainable_params(run_setup.t5_config(preset="t5_1_1_small"))


# Issue 8, acceptance 1: each method's gin file alone, no other flags, on T5 1.1 large
# (H = 1024, 24 + 24 layers) prints the paper's main-setting count.
@pytest.mark.parametrize("files,bindings,expected", [
    ([], [], 102_400),  # prompt tuning: P = 100, P·H
    (["prompts/dpt.gin"], [], 11_240),  # r = 10: r·(P + H)
    (["prompts/residual.gin"], [], 925_072),  # m = 400: P·H + 2·H·m + m + 3·H
    (["prompts/idpg.gin"], [], 107_776),  # S-IDPG PHM, t = 5, m = 256, n = 16
    (["prompts/idpg_multilayer.gin"], [], 133_136),  # M-IDPG Table 1, one PHM rule set
    (["prompts/idpg_multilayer.gin"], ["IDPG_PHM_SHARED_RULES=False"], 137_232),  # two
], ids=["prompt_tuning", "dpt", "residual", "s_idpg_phm", "m_idpg_one_rule_set",
        "m_idpg_two_rule_sets"])
def test_method_file_alone_gives_the_papers_count_on_t5_1_1_large(capsys, files, bindings,
                                                                  expected):
  count, _ = _describe(capsys, ["models/t5_1_1_large.gin"] + files, bindings)
  assert count == expected


# Issue 16, acceptance 1 (multi-task, MPT, per-layer): each gin file alone on T5 1.1 large prints
# the count of its source's main setting, and equals the spec's formula under other bindings.
@pytest.mark.parametrize("method,bindings,expected", [
    ("multitask", [], 100 * 1024 + 8 * 100 * 1024),  # add: P·H + T·P·H = 921,600
    ("mpt", [], 100 * 1024 + 6 * (100 + 1024)),  # rank 1: P·H + T·(P·r + r·H) = 109,144
    ("per_layer", [], 24 * 10 * 1024),  # L·P·H = 245,760
    ("multitask", ["MULTITASK_COMBINE='concat_length'", "MULTITASK_TASK_LENGTH=5"],
     100 * 1024 + 8 * 5 * 1024),
    ("multitask", ["MULTITASK_COMBINE='concat_features'", "MULTITASK_SHARED_FEATURES=1000"],
     100 * 1000 + 8 * 100 * 24),
    ("multitask", ["MULTITASK_COMBINE='project'", "MULTITASK_SHARED_FEATURES=16"],
     100 * 16 + 8 * (16 * 1024 + 1024)),
    ("mpt", ["NUM_TASKS=1", "MPT_RANK=4"], 100 * 1024 + 4 * (100 + 1024)),
    ("per_layer", ["PER_LAYER_MODE='add'", "PROMPT_LENGTH=3"], 24 * 3 * 1024),
])
def test_multitask_mpt_per_layer_counts_on_t5_1_1_large(capsys, method, bindings, expected):
  count, spec = _describe(capsys, ["models/t5_1_1_large.gin", f"prompts/{method}.gin"],
                          bindings)
  assert count == expected == spec.num_trainable_params(run_setup.t5_config(
      preset="t5_1_1_large"))
