"""`python -m t5x.train` resumes a prompt-tuning run from its own MODEL_DIR (preemption recovery).

t5x's MultiOptimizer stores None as the optimizer state of every frozen parameter; t5x's orbax
checkpointer saves those Nones as placeholders but on restore asks to read them as arrays, so a
second `t5x.train` in the same MODEL_DIR failed (NOT_FOUND .../param_states.<frozen>/.zarray).
prompt_jax.t5x.optim.MultiOptimizer leaves them out of the checkpoint. The check: 3 steps, then
a restart that continues to 6, gives bitwise the checkpoint of an uninterrupted 6-step run
(prompt and Adafactor state; the data iterator is checkpointed too), whether the 3-step
checkpoint was written by our optimizer or, as before the fix, by t5x's own MultiOptimizer.
"""
import os

import numpy as np
import pytest

from tests.t5x import common

# The data iterator is checkpointed, so a restart continues the same batches.
SAVE_DATASET = "--gin.utils.SaveCheckpointConfig.save_dataset=True"
# The optimizer before the fix (t5x's own), to write a checkpoint with None placeholders.
T5X_MULTI_OPTIMIZER = """\
from __gin__ import dynamic_registration
from t5x import adafactor
from t5x import optimizers
from prompt_jax.t5x import optim as prompt_optim
OPTIMIZER = @optimizers.MultiOptimizer()
optimizers.MultiOptimizer.traversals_and_optimizers = (
    (@prompt_optim.trainable_traversal(), @adafactor.Adafactor()),)
"""


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  common.require_t5x()
  model_dir = str(tmp_path_factory.mktemp("t5x_6_steps"))
  common.run_t5x("train", common.embedded_train_args(model_dir, 6, SAVE_DATASET))
  return common.read_t5x_checkpoint(os.path.join(model_dir, "checkpoint_2006"))


def _none_placeholders(checkpoint: str) -> int:
  import json  # pylint: disable=g-import-not-at-top
  tree = json.load(open(os.path.join(checkpoint, "state", "_METADATA")))["tree_metadata"]
  return sum(v["value_metadata"]["value_type"] == "None" for v in tree.values())


@pytest.mark.parametrize("first_optimizer", ["prompt_jax", "t5x"])
def test_t5x_train_resumes_from_its_model_dir_bitwise(first_optimizer, uninterrupted, tmp_path):
  model_dir = str(tmp_path / "run")
  first = [SAVE_DATASET]
  if first_optimizer == "t5x":
    gin_file = tmp_path / "t5x_multi_optimizer.gin"
    gin_file.write_text(T5X_MULTI_OPTIMIZER)
    first.append(f"--gin_file={gin_file}")
  common.run_t5x("train", common.embedded_train_args(model_dir, 3, *first))
  placeholders = _none_placeholders(os.path.join(model_dir, "checkpoint_2003"))
  # t5x's optimizer saves a None per frozen array (52 in the tiny model); ours none.
  assert (placeholders > 0) == (first_optimizer == "t5x"), placeholders
  after_3 = common.read_t5x_checkpoint(os.path.join(model_dir, "checkpoint_2003"))

  common.run_t5x("train", common.embedded_train_args(model_dir, 6, SAVE_DATASET))
  resumed = common.read_t5x_checkpoint(os.path.join(model_dir, "checkpoint_2006"))
  assert sorted(resumed) == sorted(uninterrupted)
  trained = [k for k in resumed if "prompt" in k]
  assert "target/encoder/prompt/prompt/prompt" in trained
  assert any(k.startswith("state/param_states/encoder/prompt/") for k in trained)
  for name in trained + ["state/step"]:
    assert np.array_equal(resumed[name], uninterrupted[name]), name
  # The restart trained on: the prompt moved after step 3.
  assert not np.array_equal(after_3["target/encoder/prompt/prompt/prompt"],
                            resumed["target/encoder/prompt/prompt/prompt"])
