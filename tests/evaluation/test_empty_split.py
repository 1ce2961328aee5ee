"""A task split with no examples (an empty data file, or a filter that drops every row) is a
one-line error naming the task and split from eval, infer, ensemble-eval and infer with
PROMPT_BANK, with nothing written to MODEL_DIR; and a multi-task prompt run, which needs each
row's task id, is refused as an ensemble or bank member in one line. A missing data file is the
reader's one line from each command; infer reads only the tasks of a mixture that have the split."""
import json

import numpy as np
import pytest
import seqio
import tensorflow as tf

from prompt_jax.embedded import task as embedded_task
from tests.evaluation.test_ensemble import EMB
from tests.evaluation.test_ensemble import run_cli

EMPTY = "test_eval_no_rows"
FLAGS = ["--gin_file=models/embedded_tiny.gin", f"--gin.MIXTURE_OR_TASK_NAME='{EMPTY}'",
         "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
         "--gin.INITIAL_CHECKPOINT_PATH=@prompt_jax.embedded_checkpoint_path()",
         "--gin.BATCH_SIZE=8"]


def _no_rows(split, shuffle_files, seed=None):
  del split, shuffle_files, seed
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": tf.constant([], tf.string), "targets": tf.constant([], tf.string)})


def _accuracy(targets, predictions):
  return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def _register(name, rows_fn, splits=("train", "validation")):
  """A text task of the embedded vocabulary whose rows `rows_fn(split, shuffle_files, seed)`
  gives (once per process)."""
  if name not in seqio.TaskRegistry.names():
    seqio.TaskRegistry.add(
        name, source=seqio.FunctionDataSource(rows_fn, splits=splits),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features={k: seqio.Feature(embedded_task.VOCABULARY, add_eos=True)
                         for k in ("inputs", "targets")},
        metric_fns=[_accuracy])


_register(EMPTY, _no_rows)


def _one_line_error(command, argv, model_dir, expected):
  code, out, err = run_cli([command] + argv)
  assert code == 2, (out, err)
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith(f"prompt-jax {command}: error:"), err
  for text in expected:
    assert text in lines[0], lines[0]
  written = [str(p) for p in model_dir.rglob("*") if p.is_file()] if model_dir.exists() else []
  assert not written, written


@pytest.fixture(scope="module")
def multitask_run(tmp_path_factory):
  """A 2-step multi-task prompt run (NUM_TASKS=2) on the embedded two-task mixture."""
  from tests.train import common  # pylint: disable=g-import-not-at-top
  model_dir = str(tmp_path_factory.mktemp("multitask"))
  code, _, err = run_cli(["train"] + common.flags(
      model_dir, 2, "--gin.prompt_jax.train.eval_before_training=False",
      "--gin_file=prompts/multitask.gin", "--gin.PROMPT_LENGTH=4", "--gin.NUM_TASKS=2",
      "--gin.MIXTURE_OR_TASK_NAME='embedded_last_first'"))
  assert code == 0, err
  return model_dir


@pytest.mark.parametrize("command", ["ensemble-eval", "bank-infer"])
def test_a_multitask_run_is_refused_as_a_member_in_one_line(command, multitask_run, tmp_path):
  model_dir = tmp_path / "out"
  prompt = str(tmp_path / "p.npy")
  np.save(prompt, (3.0 * np.random.RandomState(0).randn(4, EMB)).astype(np.float32))
  argv = [f"--gin.MODEL_DIR='{model_dir}'", "--gin_file=models/embedded_tiny.gin",
          "--gin.MIXTURE_OR_TASK_NAME='embedded_last_letter'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
          "--gin.INITIAL_CHECKPOINT_PATH=@prompt_jax.embedded_checkpoint_path()",
          "--gin.BATCH_SIZE=8"]
  if command == "ensemble-eval":
    argv += [f"--gin.ENSEMBLE_PROMPTS={{'mt': '{multitask_run}', 'p': '{prompt}'}}"]
  else:
    command = "infer"
    argv += [f"--gin.PROMPT_BANK={{'embedded_last_letter': '{multitask_run}'}}"]
  _one_line_error(command, argv, model_dir, ["NUM_TASKS=2", multitask_run])


TRAIN_ONLY = "test_eval_train_only"
PART_MIXTURE = "test_eval_mixture_part_validation"

_register(TRAIN_ONLY, lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices(
    {"inputs": ["a b c"] * 3, "targets": ["c"] * 3}), splits=("train",))
EMPTY_MIXTURE = "test_eval_mixture_empty_part"
for _name, _tasks in ((PART_MIXTURE, ["embedded_last_letter", TRAIN_ONLY]),
                      (EMPTY_MIXTURE, ["embedded_last_letter", EMPTY])):
  if _name not in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.add(_name, _tasks, default_rate=1.0)


@pytest.mark.parametrize("mixture", [PART_MIXTURE, EMPTY_MIXTURE])
@pytest.mark.parametrize("command", ["infer", "bank-infer"])
def test_infer_on_a_mixture_reads_the_tasks_that_have_the_split(command, mixture, tmp_path):
  """A mixture whose second task has no validation split (seqio's Mixture.splits is the union
  of its tasks'), or an empty one: infer reads every validation row of the first task and
  skips the second, as seqio's Evaluator does; with PROMPT_BANK it used to ask the second task
  for the split."""
  prompt = str(tmp_path / "p.npy")
  np.save(prompt, (3.0 * np.random.RandomState(0).randn(4, EMB)).astype(np.float32))
  argv = [f"--gin.MODEL_DIR='{tmp_path}'", f"--gin.MIXTURE_OR_TASK_NAME='{mixture}'"]
  argv += [f for f in FLAGS if "MIXTURE_OR_TASK_NAME" not in f]
  if command == "infer":
    argv += ["--gin.PROMPT_LENGTH=4", f"--gin.PROMPT_FILE='{prompt}'"]
    name = f"{mixture}-validation.jsonl"
  else:
    argv += [f"--gin.PROMPT_BANK={{'embedded_last_letter': '{prompt}'}}"]
    name = f"{mixture}-validation-bank.jsonl"
  code, _, err = run_cli(["infer"] + argv)
  assert code == 0, err
  with open(tmp_path / "inference" / name) as f:
    rows = [json.loads(l) for l in f]
  expected = len(list(seqio.get_mixture_or_task("embedded_last_letter").get_dataset(
      sequence_length={"inputs": 16, "targets": 4}, split="validation", shuffle=False)))
  assert len(rows) == expected > 0
  key = "task" if command == "bank-infer" else "task_name"
  assert {r.get(key, "embedded_last_letter") for r in rows} == {"embedded_last_letter"}


MISSING = "test_eval_missing_file"
MISSING_TEXT = "/nowhere/rte/val.jsonl: no such file; set DATA_DIR"


def _missing_file(split, shuffle_files, seed=None):
  raise FileNotFoundError(MISSING_TEXT)


_register(MISSING, _missing_file)


@pytest.mark.parametrize("task,expected", [
    (EMPTY, f"task {EMPTY}'s split 'validation' has no examples"),
    # The data reader's FileNotFoundError (a task's file that is not there): the reader's own
    # line (eval and ensemble-eval said it as an internal error, exit 1).
    (MISSING, MISSING_TEXT)])
@pytest.mark.parametrize("command", ["eval", "infer", "ensemble-eval", "bank-infer"])
def test_an_empty_split_or_a_missing_file_is_one_line_and_writes_nothing(command, task,
                                                                         expected, tmp_path):
  model_dir = tmp_path / "out"
  prompt = str(tmp_path / "p.npy")
  np.save(prompt, (3.0 * np.random.RandomState(0).randn(4, EMB)).astype(np.float32))
  argv = [f"--gin.MODEL_DIR='{model_dir}'", f"--gin.MIXTURE_OR_TASK_NAME='{task}'"]
  argv += [f for f in FLAGS if "MIXTURE_OR_TASK_NAME" not in f]
  if command in ("eval", "infer"):
    argv += ["--gin.PROMPT_LENGTH=4", f"--gin.PROMPT_FILE='{prompt}'"]
  elif command == "ensemble-eval":
    argv += [f"--gin.ENSEMBLE_PROMPTS={{'a': '{prompt}', 'b': '{prompt}'}}"]
  else:
    command = "infer"
    argv += [f"--gin.PROMPT_BANK={{'{task}': '{prompt}'}}"]
  _one_line_error(command, argv, model_dir, [expected])
