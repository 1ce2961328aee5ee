"""Acceptance 2: each method's t5x gin file (gin/t5x/prompts/<method>.gin) trains 2 steps under
`python -m t5x.train` on the embedded default, and the parameters t5x trains (those with
optimizer state in its checkpoint) are the method's, as many as `prompt-jax describe` counts
with the same gin files and bindings, and the run file's assignment_map skips every one of them
(none is left for t5x to warn about).

Not covered: ipt_encoder (needs an IPT_TABLE_FILE from IPT's pre-training), dpt_rank_probe and
prefix_ipt (variants of DPT and prefix whose t5x files are the same one-line includes).
"""
import os

import gin
import numpy as np
import pytest

from prompt_jax import cli
from prompt_jax.train import describe
from tests.t5x import common

# (method file, extra bindings shared by both CLIs); BATCH_SIZE small for speed.
METHODS = {
    "uniform": [],
    "from_class_labels": ["CLASS_LABELS = ['a', 'b', 'c', 'd']"],
    "from_file": [],  # PROMPT_FILE: an [8, 64] .npy written by the test
    "dpt": ["PROMPT_LENGTH = 16", "DPT_RANK = 4"],
    "residual": ["PROMPT_LENGTH = 16", "RESIDUAL_BOTTLENECK = 32"],
    "prefix": ["PROMPT_LENGTH = 4", "PREFIX_HIDDEN = 32"],
    "idpg": ["IDPG_BOTTLENECK = 32"],
    "idpg_multilayer": [],
    "ipt": [],
}


def _describe_count(method_file: str, bindings) -> int:
  cli.parse_gin(["runs/embedded_default.gin", method_file], list(bindings), [])
  try:
    return describe.describe(print_fn=lambda *_: None)["trainable"]
  finally:
    gin.clear_config()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_trains_two_steps_under_t5x_with_describes_count(method, tmp_path):
  common.require_t5x()
  bindings = list(METHODS[method]) + ["BATCH_SIZE = 4"]
  if method == "from_file":
    path = tmp_path / "prompt.npy"
    np.save(path, np.random.default_rng(0).uniform(-0.5, 0.5, (8, 64)).astype(np.float32))
    bindings.append(f"PROMPT_FILE = '{path}'")
  expected = _describe_count(f"prompts/{method}.gin", bindings)

  model_dir = str(tmp_path / "t5x")
  proc = common.run_t5x("train", common.embedded_train_args(
      model_dir, 2, f"--gin_file=t5x/prompts/{method}.gin",
      *[f"--gin.{b.replace(' = ', '=')}" for b in bindings]))
  # The method's parameters are skipped by the run file's assignment_map (t5x warns of any it
  # neither maps nor finds in INITIAL_CHECKPOINT_PATH), e.g. prefix's decoder/cross_layer_prompts.
  # (An optax optimizer's step counters, which name no parameter, are left to fallback_to_scratch.)
  unmatched = [l for l in proc.stdout.splitlines()
               if "did not match assignment map" in l and "key=target/" in l]
  assert not unmatched, unmatched
  saved = common.read_t5x_checkpoint(os.path.join(model_dir, "checkpoint_2002"))
  trained = common.trained_paths(saved)
  assert trained and all("prompt" in p for p in trained), sorted(trained)
  assert sum(int(np.prod(v.shape)) for v in trained.values()) == expected
