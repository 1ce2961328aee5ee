"""`prompt-jax infer` on a plain seqio mixture (no task ids) whose tasks differ in size: every row
of every task is predicted, once, as `infer` on that task alone predicts it (rank-classified on
its task's labels), the tasks' rows interleaved and each naming its task.

seqio's own mixture sampling stops at the first task to run out (`stop_on_empty_dataset`), which
dropped the larger task's remaining rows, and a mixture declares no labels, so its rows were
decoded freely.
"""
import json
import os

import numpy as np
import seqio

from prompt_jax.embedded import task as embedded_task
from prompt_jax.tasks import registration
from tests.evaluation.test_ensemble import EMB
from tests.evaluation.test_ensemble import run_cli
from tests.train.test_mixture_epoch import SMALL  # 40 rows of the embedded first-letter task

MIXTURE = "test_plain_unequal_mixture"
FLAGS = ["--gin_file=models/embedded_tiny.gin", "--gin.PROMPT_LENGTH=4",
         "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
         "--gin.INITIAL_CHECKPOINT_PATH=@prompt_jax.embedded_checkpoint_path()",
         "--gin.BATCH_SIZE=8"]

registration.register_label_set(SMALL, list(embedded_task.LETTERS))
if MIXTURE not in seqio.MixtureRegistry.names():
  seqio.MixtureRegistry.add(MIXTURE, [embedded_task.TASK_NAME, SMALL], default_rate=1.0)


def _infer(model_dir, prompt, name):
  code, out, err = run_cli(["infer", f"--gin.MODEL_DIR='{model_dir}'", *FLAGS,
                            f"--gin.PROMPT_FILE='{prompt}'",
                            f"--gin.MIXTURE_OR_TASK_NAME='{name}'"])
  assert code == 0, (out[-3000:], err[-3000:])
  with open(os.path.join(model_dir, "inference", f"{name}-validation.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_infer_on_a_plain_mixture_predicts_every_row_as_its_task_alone(tmp_path):
  prompt = str(tmp_path / "p.npy")
  np.save(prompt, (3.0 * np.random.RandomState(0).randn(4, EMB)).astype(np.float32))
  model_dir = tmp_path / "out"
  rows = _infer(model_dir, prompt, MIXTURE)
  sizes = {embedded_task.TASK_NAME: 256, SMALL: 40}
  assert len(rows) == sum(sizes.values())
  assert [r["task_name"] for r in rows[:4]] == [embedded_task.TASK_NAME, SMALL] * 2
  for name, size in sizes.items():
    mine = [r for r in rows if r["task_name"] == name]
    alone = _infer(model_dir, prompt, name)
    assert len(mine) == len(alone) == size, name
    assert all("task_name" not in r for r in alone)
    # The same rows, in the task's order, with the same (label) predictions.
    assert [(r["inputs"], r["targets"], r["prediction"]) for r in mine] == [
        (r["inputs"], r["targets"], r["prediction"]) for r in alone], name
    assert {r["prediction"] for r in mine} <= set(embedded_task.LETTERS), name


def test_an_input_longer_than_the_feature_length_says_how_to_fit_it():
  """The line held the whole text, however long, and named TASK_FEATURE_LENGTHS without saying
  what to set."""
  import pytest  # pylint: disable=g-import-not-at-top
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import run as run_lib  # pylint: disable=g-import-not-at-top

  class Characters:  # a token per character code
    def encode(self, text):
      return [ord(c) for c in text]

  vocabulary = Characters()
  assert run_lib.encode_inputs(["ab"], vocabulary, 4).tolist() == [[97, 98, 1, 0]]
  with pytest.raises(ConfigError) as error:
    run_lib.encode_inputs(["x" * 500], vocabulary, 16)
  assert str(error.value) == (
      f"--input {'x' * 57 + '...'!r} is 501 tokens with EOS, longer than the inputs feature "
      f"length 16: shorten it, or raise TASK_FEATURE_LENGTHS' 'inputs' to at least 501 "
      f"(--gin.TASK_FEATURE_LENGTHS=\"{{'inputs': 501, 'targets': ...}}\")")
