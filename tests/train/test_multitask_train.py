"""Multi-task prompts through `prompt-jax train` (issue 16, acceptance 4 and 7): the embedded
two-task mixture trains every task's prompt; a run whose data has no task index, a task index
outside NUM_TASKS and concat-features sizes that do not add up to the model width each stop with
one error line."""
import concurrent.futures
import json
import os

import numpy as np
import pytest

from tests.train import common

MIXTURE = "--gin.MIXTURE_OR_TASK_NAME='embedded_last_first'"
NO_EVAL = "--gin.prompt_jax.train.eval_before_training=False"


def _argv(model_dir, steps, *extra):
  return ["train"] + common.flags(model_dir, steps, NO_EVAL, "--gin_file=prompts/multitask.gin",
                                  "--gin.PROMPT_LENGTH=4", *extra)


def _exported(model_dir, step, name):
  return np.load(os.path.join(model_dir, "numpy_checkpoints", f"checkpoint_{step}",
                              f"encoder.prompt.prompt.{name}.npy"))


# `prompt-jax` printing the label set of each `inference.predict_tokens` call.
RECORD_LABELS = """
import sys
from prompt_jax import cli
from prompt_jax.evaluation import inference
_predict = inference.predict_tokens
def predict_tokens(*args, labels=None, **kwargs):
  print("predict_tokens labels=%s" % (list(labels) if labels else None), flush=True)
  return _predict(*args, labels=labels, **kwargs)
inference.predict_tokens = predict_tokens
sys.exit(cli.main(sys.argv[1:]))
"""


def test_two_task_mixture_trains_each_tasks_prompt(tmp_path):
  model_dir = str(tmp_path / "run")
  out = common.cli_subprocess(_argv(model_dir, 3, MIXTURE, "--gin.NUM_TASKS=2"), timeout=600)
  assert out.returncode == 0, out.stdout[-3000:]
  first, last = (_exported(model_dir, s, "task_prompts") for s in (1, 3))
  assert first.shape == last.shape == (2, 4, 64)  # [NUM_TASKS, P, H] of the embedded tiny T5
  for task in range(2):  # both tasks' examples are in the batches: both prompts move
    assert np.abs(last[task] - first[task]).max() > 0, task
  shared = [_exported(model_dir, s, "shared_prompt") for s in (1, 3)]
  assert np.abs(shared[1] - shared[0]).max() > 0
  # The multi-task checkpoint serves both tasks in one `infer` batch (rows of the mixture's
  # validation split interleave the tasks; each row is decoded with its own task's prompt).
  out = common.cli_subprocess(["infer", "--gin_file=runs/prompt_infer.gin",
                               f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=8"],
                              timeout=600, python_code=RECORD_LABELS)
  assert out.returncode == 0, out.stdout[-3000:]
  # Rank classification, never free decoding (whose answers need not be labels): a mixture has
  # no label set, each of its tasks has.
  used = [l for l in out.stdout.splitlines() if l.startswith("predict_tokens labels=")]
  assert used and all(l == "predict_tokens labels=['a', 'b', 'c', 'd']" for l in used), used
  path = os.path.join(model_dir, "inference", "embedded_last_first-validation.jsonl")
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == 2 * 256 and {r["task"] for r in rows} == {0, 1}
  first_batch = {r["task"] for r in rows[:8]}
  assert first_batch == {0, 1}, first_batch
  # Each row is rank-classified on its own task's labels ('abcd'), as `eval` predicts it: the
  # same prediction as infer on that task (the mixture's copy, whose rows carry the task index).
  assert all(r["prediction"] in list("abcd") for r in rows), [r["prediction"] for r in rows]
  copies = ["embedded_last_first__0_embedded_last_letter",
            "embedded_last_first__1_embedded_first_letter"]

  def infer_task(name):
    return common.cli_subprocess(["infer", "--gin_file=runs/prompt_infer.gin",
                                  f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=8",
                                  f"--gin.MIXTURE_OR_TASK_NAME='{name}'"], timeout=600)

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    outs = list(pool.map(infer_task, copies))
  for k, (name, out) in enumerate(zip(copies, outs)):
    assert out.returncode == 0, out.stdout[-3000:]
    with open(os.path.join(model_dir, "inference", f"{name}-validation.jsonl")) as f:
      alone = {}
      for line in f:
        row = json.loads(line)
        alone.setdefault(row["inputs"], set()).add(row["prediction"])
    mine = [r for r in rows if r["task"] == k]
    assert len(mine) == 256 and all(alone[r["inputs"]] == {r["prediction"]} for r in mine), k

  # `--input` texts get the prompt of the task --input_task names (index or name): the
  # predictions of those rows in the mixture. Without it: one line naming the choices (it was
  # "no `task_ids` feature; train on a mixture registered with ...", which it was).
  texts = [r["inputs"] for r in rows if r["task"] == 1][:3]
  infer_inputs = ["infer", "--gin_file=runs/prompt_infer.gin", f"--gin.MODEL_DIR='{model_dir}'",
                  *[f"--input={t}" for t in texts]]
  out = common.cli_subprocess(infer_inputs + ["--input_task=embedded_first_letter"], timeout=600)
  assert out.returncode == 0, out.stdout[-3000:]
  with open(os.path.join(model_dir, "inference", "embedded_last_first-inputs-task1.jsonl")) as f:
    got = [json.loads(line) for line in f]
  in_mixture = {r["inputs"]: r["prediction"] for r in rows if r["task"] == 1}
  assert [g["prediction"] for g in got] == [in_mixture[t] for t in texts]
  assert {g["task"] for g in got} == {1}
  out = common.cli_subprocess(infer_inputs, timeout=600)
  assert out.returncode == 2 and out.stdout.strip().splitlines()[-1] == (
      "prompt-jax infer: error: this multi-task prompt needs each input's task: give "
      "--input_task=<index or name>, one of 0 (embedded_last_letter), 1 (embedded_first_letter)")


BAD = {
    "no_task_index": (["--gin.NUM_TASKS=2"],  # the single-task embedded default
                      "no `task_ids` feature; train on a mixture registered with"),
    "task_index_out_of_range": ([MIXTURE, "--gin.NUM_TASKS=1"],
                                "task index 1 but the prompt has NUM_TASKS=1"),
    "concat_features_sizes": ([MIXTURE, "--gin.NUM_TASKS=2",
                               "--gin.MULTITASK_COMBINE='concat_features'",
                               "--gin.MULTITASK_SHARED_FEATURES=64"],
                              "must add up to the model width 64"),
}


def test_bad_multitask_inputs_give_one_error_line(tmp_path):
  def run(name):
    extra, _ = BAD[name]
    return common.cli_subprocess(_argv(str(tmp_path / name), 2, *extra), timeout=600)

  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    results = dict(zip(BAD, pool.map(run, BAD)))
  for name, (_, expect) in BAD.items():
    out = results[name]
    errors = [l for l in out.stdout.splitlines() if l.startswith("prompt-jax train: error:")]
    assert out.returncode == 2, (name, out.stdout[-3000:])
    assert len(errors) == 1 and expect in errors[0], (name, errors, out.stdout[-2000:])
    assert "Traceback" not in out.stdout, name
    if name != "task_index_out_of_range":  # checked before anything is written
      assert not os.path.exists(tmp_path / name / "checkpoints"), name


@pytest.mark.parametrize("feature", ["task_index"])
def test_task_index_feature_name_is_shared(feature):
  from prompt_jax.prompts import multitask  # pylint: disable=g-import-not-at-top
  from prompt_jax.tasks import multitask as tasks_multitask  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import data  # pylint: disable=g-import-not-at-top
  assert multitask.TASK_INDEX == tasks_multitask.TASK_INDEX == data.TASK_INDEX == feature
