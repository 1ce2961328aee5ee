"""Acceptance 1 and 3: prompt_jax's embedded default under t5x's own `train`, `eval` and `infer`.

1. `python -m t5x.train --gin_file=t5x/runs/embedded_default.gin` learns as `prompt-jax train`
   does in the same number of steps (inference accuracy from 41% -- chance is 25% -- to >= 90%);
   every frozen array of its checkpoint is bitwise the shipped checkpoint's; only the prompt has
   optimizer state.
3. Both ways: the t5x checkpoint is evaluated / predicted by `prompt-jax eval / infer` with the
   same metrics and predictions as `t5x.eval / t5x.infer` (greedy), but for float32 near-ties
   (tests/numerics.py; none on this checkpoint so far); a prompt trained by
   `prompt-jax train` and exported by `prompt-jax export` is evaluated by `t5x.eval` with the
   metrics `prompt-jax eval` reports.
The comparisons use an early checkpoint (3 steps: accuracy inside (25%, 100%)), where a wrong
prompt, mask or decoding would show. Its batches are fixed (common.FIXED_TRAIN_ORDER): with
t5x's new shuffle seed per run, 3 steps reached 100% on one CI machine (seeds 0-3 give 72%, 84%,
68%, 92%).
"""
import glob
import json
import os
import re

import numpy as np
import pytest

from tests.t5x import common
from tests.train.common import cli_subprocess, embedded_float64_answers, embedded_near_ties

TRAIN_STEPS = 300  # gin/runs/embedded_default.gin's TRAIN_STEPS (checked below)
EARLY = common.EMBEDDED_STEP + 3
EMBEDDED_FLAGS = ["--gin.MIXTURE_OR_TASK_NAME='embedded_last_letter'",
                  "--gin.MIXTURE_OR_TASK_MODULE='prompt_jax.embedded.task'",
                  "--gin.PROMPT_LENGTH=8"]


@pytest.fixture(scope="module")
def t5x_run(tmp_path_factory):
  """The embedded default under t5x.train (300 steps), evaluated before and after training."""
  common.require_t5x()
  model_dir = str(tmp_path_factory.mktemp("t5x_default"))
  common.run_t5x("train", [
      "--gin_file=t5x/runs/embedded_default.gin", f"--gin.MODEL_DIR='{model_dir}'",
      "--gin.RANDOM_SEED=0", *common.FIXED_TRAIN_ORDER,
      "--gin.__main__.train.run_eval_before_training=True"], timeout=900)
  return model_dir


@pytest.fixture(scope="module")
def early_checkpoint(tmp_path_factory):
  """A t5x checkpoint of the embedded default after 3 steps."""
  model_dir = str(tmp_path_factory.mktemp("t5x_early"))
  common.run_t5x("train", common.embedded_train_args(model_dir, EARLY - common.EMBEDDED_STEP))
  return os.path.join(model_dir, f"checkpoint_{EARLY}")


@pytest.fixture(scope="module")
def early_near_ties(early_checkpoint):
  """{input text: bool}: validation examples whose answer may differ between t5x's greedy
  decoding and prompt-jax's rank classification of the early checkpoint for float32 rounding
  alone (tests/train/common.embedded_near_ties). Elsewhere the two must agree exactly (they do
  because this checkpoint's greedy answer is the best label; a wrong prompt, mask or decoder
  breaks that far from ties). The checkpoint's frozen arrays are the shipped ones (bitwise, as
  test_frozen_arrays_bitwise_and_only_the_prompt_has_optimizer_state checks)."""
  saved = common.read_t5x_checkpoint(early_checkpoint)
  return embedded_near_ties(saved["target/encoder/prompt/prompt/prompt"], greedy=True)


@pytest.fixture(scope="module")
def early_answers(early_checkpoint):
  """{input text: (greedy answer, best label)} of the early checkpoint in float64
  (tests/train/common.embedded_float64_answers)."""
  saved = common.read_t5x_checkpoint(early_checkpoint)
  return embedded_float64_answers(saved["target/encoder/prompt/prompt/prompt"])


def _may_differ(near_ties, answers):
  """{input text: bool}: t5x's greedy answer and prompt-jax's rank-classified one may differ
  there: a float32 near-tie, or an example whose float64 greedy answer is not its best label
  (greedy decoding left the label set: 1 of 256 on the early checkpoint, EOS first)."""
  return {t: tie or answers[t][0] != answers[t][1] for t, tie in near_ties.items()}


def _within_near_ties(a, b, near_ties):
  """Two accuracies (%) of the validation set equal but for the share of examples that may
  differ (each moves an accuracy by 100 / 256), those being rare (<= 5%: else the check is
  empty)."""
  ties = sum(near_ties.values())
  assert ties <= 0.05 * len(near_ties), ties
  assert abs(a - b) <= 100 * ties / len(near_ties) + 1e-9, (a, b, ties)


def _gin_int(path, name):
  return int(re.search(rf"^{name} = (\d+)", open(path).read(), re.M).group(1))


def test_same_number_of_steps_as_prompt_jax_default():
  ours = _gin_int(common.GIN_DIR / "runs" / "embedded_default.gin", "TRAIN_STEPS")
  t5x = _gin_int(common.GIN_DIR / "t5x" / "runs" / "embedded_default.gin", "TRAIN_STEPS")
  assert ours == TRAIN_STEPS and t5x == common.EMBEDDED_STEP + TRAIN_STEPS


def test_t5x_train_learns_from_chance_to_90_percent(t5x_run):
  rows = [json.loads(l) for l in open(os.path.join(
      t5x_run, "inference_eval", "embedded_last_letter-metrics.jsonl"))]
  accuracy = {r["step"]: r["accuracy"] for r in rows}
  # Before training: the sampled-vocabulary prompt is near chance (25%; prompt-jax: 41%).
  assert accuracy[common.EMBEDDED_STEP] < 50, accuracy
  assert accuracy[common.EMBEDDED_STEP + TRAIN_STEPS] >= 90, accuracy


def test_frozen_arrays_bitwise_and_only_the_prompt_has_optimizer_state(t5x_run):
  from prompt_jax import checkpoints, embedded, trees  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import get_config  # pylint: disable=g-import-not-at-top
  saved = common.read_t5x_checkpoint(
      os.path.join(t5x_run, f"checkpoint_{common.EMBEDDED_STEP + TRAIN_STEPS}"))
  _, initial = checkpoints.load(embedded.CHECKPOINT_DIR)
  initial = trees.flatten(initial)
  target = {k[len("target/"):]: v for k, v in saved.items() if k.startswith("target/")}
  assert set(target) - set(initial) == {"encoder/prompt/prompt/prompt"}
  for name, value in initial.items():
    assert target[name].dtype == np.float32 and np.array_equal(
        target[name].view(np.uint32), np.asarray(value, np.float32).view(np.uint32)), name
  assert list(common.trained_paths(saved)) == ["encoder/prompt/prompt/prompt"]
  states = [k for k in saved if k.startswith("state/param_states/")]
  assert states and all(k.startswith("state/param_states/encoder/prompt/") for k in states)
  del get_config


def _t5x_eval_accuracy(tmp_path, checkpoint, *extra, method_files=()):
  """`method_files` go after the model's file and the run's, as README's t5x.eval does."""
  out = str(tmp_path / "t5x_eval")
  common.run_t5x("eval", ["--gin_file=t5x/models/embedded_tiny_prompt.gin",
                          "--gin_file=t5x/runs/prompt_eval.gin", *method_files,
                          *EMBEDDED_FLAGS, *extra,
                          f"--gin.CHECKPOINT_PATH='{checkpoint}'",
                          f"--gin.EVAL_OUTPUT_DIR='{out}'"])
  rows = [json.loads(l) for l in open(glob.glob(
      os.path.join(out, "inference_eval", "*-metrics.jsonl"))[0])]
  return rows[-1]["accuracy"]


def _prompt_jax(cmd, model_dir, *extra, timeout=600):
  proc = cli_subprocess([cmd, "--gin_file=runs/embedded_default.gin",
                         f"--gin.MODEL_DIR='{model_dir}'", *extra], timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-4000:]
  return proc


def _prompt_jax_eval_accuracy(model_dir, *extra):
  _prompt_jax("eval", model_dir, *extra)
  files = glob.glob(os.path.join(model_dir, "eval", "embedded_last_letter-validation-*.json"))
  return json.load(open(files[0]))["metrics"]["embedded_last_letter/accuracy"]


def test_t5x_checkpoint_gives_the_same_metrics_under_t5x_eval_and_prompt_jax_eval(
    early_checkpoint, early_near_ties, early_answers, tmp_path):
  checkpoint = early_checkpoint
  t5x_acc = _t5x_eval_accuracy(tmp_path, checkpoint)
  ours = _prompt_jax_eval_accuracy(str(tmp_path / "pj"), f"--gin.CHECKPOINT_PATH='{checkpoint}'")
  assert 25 < t5x_acc < 100  # an informative checkpoint (not chance, not saturated)
  _within_near_ties(ours, t5x_acc, _may_differ(early_near_ties, early_answers))


def test_t5x_infer_predictions_equal_prompt_jax_infer(early_checkpoint, early_near_ties,
                                                      early_answers, tmp_path):
  checkpoint = early_checkpoint
  out = str(tmp_path / "t5x_infer")
  common.run_t5x("infer", ["--gin_file=t5x/models/embedded_tiny_prompt.gin",
                           "--gin_file=t5x/runs/prompt_infer.gin", *EMBEDDED_FLAGS,
                           "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
                           f"--gin.CHECKPOINT_PATH='{checkpoint}'",
                           f"--gin.INFER_OUTPUT_DIR='{out}'"])
  # t5x.infer writes <task>-predict.jsonl-<shard>-of-<n> (+ a .COMPLETED marker).
  t5x_rows = [json.loads(l) for f in sorted(glob.glob(os.path.join(out, "*-predict.jsonl*")))
              if not f.endswith(".COMPLETED") for l in open(f)]
  model_dir = str(tmp_path / "pj")
  _prompt_jax("infer", model_dir, f"--gin.CHECKPOINT_PATH='{checkpoint}'")
  ours = [json.loads(l) for l in open(glob.glob(
      os.path.join(model_dir, "inference", "embedded_last_letter-validation.jsonl"))[0])]
  t5x_pred = [r["prediction"] for r in t5x_rows]
  assert len(t5x_pred) == len(ours) == 256
  assert [r["inputs"]["inputs_pretokenized"] for r in t5x_rows] == [r["inputs"] for r in ours]
  from tests import numerics  # pylint: disable=g-import-not-at-top
  may_differ = _may_differ(early_near_ties, early_answers)
  numerics.assert_same_choices(t5x_pred, [r["prediction"] for r in ours],
                               [may_differ[r["inputs"]] for r in ours],
                               what="t5x.infer vs prompt-jax infer")
  # Where greedy decoding leaves the label set (away from near-ties), each side gives its own
  # float64 answer: t5x the greedy text, prompt-jax the best label.
  for got_t5x, row in zip(t5x_pred, ours):
    greedy, best = early_answers[row["inputs"]]
    if greedy != best and not early_near_ties[row["inputs"]]:
      assert (got_t5x, row["prediction"]) == (greedy, best), row["inputs"]
  # Not all equal to the target: the early checkpoint still errs, so agreement is informative.
  assert any(r["prediction"] != r["targets"] for r in ours)


def test_prompt_jax_prompt_evaluated_by_t5x_eval(tmp_path):
  common.require_t5x()
  model_dir = str(tmp_path / "pj_train")
  _prompt_jax("train", model_dir, "--gin.TRAIN_STEPS=3", "--gin.EVAL_PERIOD=0",
              "--gin.CHECKPOINT_PERIOD=3", "--gin.prompt_jax.train.eval_before_training=False")
  proc = cli_subprocess(["export", "--format=npy", f"--gin.MODEL_DIR='{model_dir}'"])
  assert proc.returncode == 0, proc.stdout[-4000:]
  prompt_file = glob.glob(os.path.join(model_dir, "export", "*.npy"))[0]
  ours = _prompt_jax_eval_accuracy(model_dir)
  from prompt_jax import embedded  # pylint: disable=g-import-not-at-top
  t5x_acc = _t5x_eval_accuracy(
      tmp_path, os.path.join(embedded.CHECKPOINT_DIR, f"checkpoint_{common.EMBEDDED_STEP}"),
      f"--gin.PROMPT_FILE='{prompt_file}'",
      # before the run file, as README's t5x.eval: the run file's FALLBACK_INIT_RNG = None came
      # after from_file.gin's 0 ("An init_rng must be provided with fallback_to_scratch")
      method_files=["--gin_file=t5x/prompts/from_file.gin"])
  assert 25 < ours < 100
  # t5x decodes greedily, prompt-jax rank-classifies: equal but for float32 near-ties.
  prompt = np.load(prompt_file)
  _within_near_ties(t5x_acc, ours, _may_differ(embedded_near_ties(prompt, greedy=True),
                                               embedded_float64_answers(prompt)))


def test_t5x_checkpoint_exports_given_only_its_model_file(early_checkpoint, tmp_path):
  """`prompt-jax export` of a t5x.train checkpoint asked for MIXTURE_OR_TASK_NAME and
  TASK_FEATURE_LENGTHS, which export never reads: the model file (and the method's, here the
  default) is enough, and the .npy holds the checkpoint's prompt."""
  out = str(tmp_path / "exported.npy")
  proc = cli_subprocess(["export", "--format=npy", "--gin_file=models/embedded_tiny.gin",
                         f"--gin.CHECKPOINT_PATH='{early_checkpoint}'",
                         f"--gin.MODEL_DIR='{tmp_path / 'pj'}'", f"--output={out}"])
  assert proc.returncode == 0, proc.stdout[-4000:]
  flat = common.read_t5x_checkpoint(early_checkpoint)
  prompt, = common.trained_paths(flat).values()
  np.testing.assert_array_equal(np.load(out), prompt)
