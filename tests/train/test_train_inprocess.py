"""Trainer on the embedded tiny T5, in-process (1 device): frozen params, optimizer state,
kill/restart resume, and the bad-input errors of `prompt-jax train`."""
import io
import json
import contextlib
import os

import jax
import numpy as np
import pytest

from prompt_jax import checkpoints
from prompt_jax import cli
from prompt_jax import trees
from prompt_jax.embedded import CHECKPOINT_DIR
from tests.train import common


def run_cli(argv):
  """(exit code, stderr) of `prompt-jax <argv>` run in this process."""
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = cli.main(list(argv))
  return code, err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A 4-step run returning (metrics, run, state) via the gin-configured loop."""
  import gin  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import loop  # pylint: disable=g-import-not-at-top
  model_dir = str(tmp_path_factory.mktemp("trained"))
  rest, bindings = cli.split_gin_dot_flags(common.flags(
      model_dir, 4, "--gin.EVAL_PERIOD=4", "--gin.prompt_jax.train.eval_steps=2"))
  cli.parse_gin([a.split("=", 1)[1] for a in rest], bindings, [])
  result = loop.train(return_state=True, infer_fn=inference.evaluate)
  gin.clear_config()
  return model_dir, result


def test_final_evaluation_metrics_and_summaries(trained):
  model_dir, (metrics, _, _) = trained
  assert 0.0 <= metrics["training_eval/accuracy"] <= 1.0
  assert 0.0 <= metrics["inference_eval/embedded_last_letter/accuracy"] <= 100.0
  for sub in ("train", "training_eval/embedded_last_letter",
              "inference_eval/embedded_last_letter"):
    assert any(f.startswith("events.out.tfevents")
               for f in os.listdir(os.path.join(model_dir, sub))), sub


def test_frozen_bit_identical_prompt_changed_opt_state_prompt_only(trained):
  model_dir, (_, run, state) = trained
  _, restored = checkpoints.load(CHECKPOINT_DIR)
  restored = trees.flatten(restored)
  frozen = trees.flatten(run.frozen)
  assert set(frozen) == set(restored)  # every backbone parameter is frozen
  for name, value in frozen.items():
    np.testing.assert_array_equal(np.asarray(value), restored[name], err_msg=name)
    assert np.asarray(value).tobytes() == restored[name].tobytes(), name
  trainable = trees.flatten(state.params)
  assert list(trainable) == ["encoder/prompt/prompt/prompt"]
  first = common.prompt_at(model_dir, 1)
  last = common.prompt_at(model_dir, 4)
  assert not np.array_equal(first, last)
  assert int(state.step) == 4
  # Optimizer slots: only arrays shaped like the prompt (plus scalar counters).
  leaves = jax.tree_util.tree_leaves(state.opt_state)
  prompt_shape = trainable["encoder/prompt/prompt/prompt"].shape
  assert all(tuple(l.shape) in {(), (1,), tuple(prompt_shape)} or l.size <= prompt_shape[0]
             for l in leaves), [l.shape for l in leaves]
  assert sum(l.size for l in leaves) <= 4 * np.prod(prompt_shape) + 16
  for sub in ("train", "config.gin", "checkpoints/4"):
    assert os.path.exists(os.path.join(model_dir, sub)), sub


def test_kill_and_restart_resumes_bitwise(tmp_path, monkeypatch):
  from prompt_jax import run_setup  # pylint: disable=g-import-not-at-top
  initialised = []  # the parameters each `prepare` initialised (run_setup._init's names)
  real_init = run_setup._init  # pylint: disable=protected-access
  monkeypatch.setattr(run_setup, "_init", lambda model, lengths, rng, shardings, names: (
      initialised.extend(names), real_init(model, lengths, rng, shardings, names))[1])
  full = str(tmp_path / "full")
  assert run_cli(["train"] + common.flags(full, 5))[0] == 0
  assert initialised == ["encoder/prompt/prompt/prompt"]
  resumed = str(tmp_path / "resumed")
  # First launch "dies" right after checkpointing step 2; the same command then resumes.
  assert run_cli(["train"] + common.flags(resumed, 5,
                                          "--gin.prompt_jax.train.stop_after_step=2"))[0] == 0
  assert sorted(os.listdir(os.path.join(resumed, "checkpoints"))) == ["1", "2"]
  initialised.clear()
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert run_cli(["train"] + common.flags(resumed, 5))[0] == 0
  assert "restored step 2" in out.getvalue()
  # The resume takes the prompt from the checkpoint: its init is not compiled.
  assert initialised == []
  assert common.prompt_at(full, 5).tobytes() == common.prompt_at(resumed, 5).tobytes()


def test_a_failed_evaluation_saves_the_steps_trained_before_it(tmp_path, monkeypatch):
  """An evaluation between checkpoints that fails (a validation file damaged at line 41, found
  only when first read) lost every step since the last checkpoint: the step is saved first,
  and the same command, once the data is fixed, continues from it."""
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import loop  # pylint: disable=g-import-not-at-top
  real = loop.teacher_forced_eval

  def damaged(*unused_args, **unused_kwargs):
    raise ConfigError("val.jsonl:41: malformed JSON (Unterminated string, column 51)")

  monkeypatch.setattr(loop, "teacher_forced_eval", damaged)
  model_dir = str(tmp_path / "m")
  argv = ["train"] + common.flags(model_dir, 4, "--gin.EVAL_PERIOD=2",
                                  "--gin.CHECKPOINT_PERIOD=4",
                                  "--gin.prompt_jax.train.eval_before_training=False")
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    code, err = run_cli(argv)
  assert code == 2 and "val.jsonl:41: malformed JSON" in err, err
  assert os.listdir(os.path.join(model_dir, "checkpoints")) == ["2"]
  assert (f"the evaluation of step 2 failed: saved {model_dir}/checkpoints/2 first; once "
          f"fixed, run the same command to continue from it") in out.getvalue()
  monkeypatch.setattr(loop, "teacher_forced_eval", real)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert run_cli(argv)[0] == 0
  assert "restored step 2" in out.getvalue()
  assert "training_eval step 2: " in out.getvalue()  # the failed evaluation is done now


def _assert_error(argv, model_dir, expected):
  before = sorted(os.walk(model_dir)) if os.path.exists(model_dir) else None
  mtimes = ({os.path.join(d, f): os.path.getmtime(os.path.join(d, f))
             for d, _, fs in os.walk(model_dir) for f in fs} if before is not None else None)
  code, err = run_cli(argv)
  assert code == 2, err
  lines = [l for l in err.strip().splitlines() if l.startswith("prompt-jax")]
  assert len(lines) == 1 and expected in lines[0], err
  if before is None:
    assert not os.path.exists(model_dir), "a failed run wrote to MODEL_DIR"
  else:
    assert sorted(os.walk(model_dir)) == before
    assert mtimes == {os.path.join(d, f): os.path.getmtime(os.path.join(d, f))
                      for d, _, fs in os.walk(model_dir) for f in fs}


def test_missing_required_macro(tmp_path):
  _assert_error(["train", "--gin_file=runs/prompt_finetune.gin",
                 "--gin_file=models/t5_1_1_small.gin", "--gin.TRAIN_STEPS=3"],
                str(tmp_path / "m"), "missing required macros MODEL_DIR")


def test_unknown_task(tmp_path):
  d = str(tmp_path / "m")
  _assert_error(["train"] + common.flags(d, 3, "--gin.MIXTURE_OR_TASK_NAME='no_such_task'"), d,
                "no_such_task")


def test_unknown_gin_parameter(tmp_path):
  d = str(tmp_path / "m")
  _assert_error(["train"] + common.flags(d, 3, "--gin.prompt_jax.train.no_such_arg=1"), d,
                "no_such_arg")


def test_unreachable_initial_checkpoint(tmp_path):
  d = str(tmp_path / "m")
  _assert_error(["train"] + common.flags(
      d, 3, f"--gin.INITIAL_CHECKPOINT_PATH='{tmp_path}/nowhere/checkpoint_1'"), d,
      "INITIAL_CHECKPOINT_PATH")


def test_more_class_labels_than_prompt_length(tmp_path):
  d = str(tmp_path / "m")
  _assert_error(["train"] + common.flags(
      d, 3, "--gin_file=prompts/from_class_labels.gin", "--gin.PROMPT_LENGTH=2",
      "--gin.CLASS_LABELS=['a', 'b', 'c']"), d, "class labels do not fit")


def test_prompt_file_of_wrong_shape(tmp_path):
  d = str(tmp_path / "m")
  bad = tmp_path / "prompt.npy"
  np.save(bad, np.zeros((3, 64), np.float32))
  _assert_error(["train"] + common.flags(d, 3, "--gin_file=prompts/from_file.gin",
                                         f"--gin.PROMPT_FILE='{bad}'"), d, "PROMPT_FILE")


def test_train_steps_below_restored_step(trained):
  model_dir, _ = trained
  _assert_error(["train"] + common.flags(model_dir, 2), model_dir, "TRAIN_STEPS=2 is below")


def test_command_line_beats_run_file(tmp_path):
  """A packaged run file listed after the user's gin file cannot override the user's value."""
  import gin  # pylint: disable=g-import-not-at-top
  user = tmp_path / "mine.gin"
  user.write_text("BATCH_SIZE = 4\nPROMPT_LENGTH = 5\n")
  cli.parse_gin([str(user), "runs/embedded_default.gin"], ["PROMPT_LENGTH = 6"], [])
  assert gin.query_parameter("%BATCH_SIZE") == 4
  assert gin.query_parameter("%PROMPT_LENGTH") == 6
  gin.clear_config()


def test_eval_and_infer_subcommands(trained, tmp_path):
  model_dir, _ = trained
  common_flags = ["--gin_file=models/embedded_tiny.gin", "--gin.PROMPT_LENGTH=8",
                  "--gin.MIXTURE_OR_TASK_NAME='embedded_last_letter'",
                  "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
                  "--gin.INITIAL_CHECKPOINT_PATH=@prompt_jax.embedded_checkpoint_path()",
                  "--gin.BATCH_SIZE=64"]
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    code, err = run_cli(["eval", "--gin_file=runs/prompt_eval.gin",
                         f"--gin.MODEL_DIR='{model_dir}'"] + common_flags)
  assert code == 0, err
  assert "final metrics: embedded_last_letter/accuracy=" in out.getvalue()
  # infer from the frozen checkpoint + a PROMPT_FILE, into a fresh MODEL_DIR.
  infer_dir = tmp_path / "infer"
  code, err = run_cli(["infer", "--gin_file=runs/prompt_infer.gin",
                       f"--gin.MODEL_DIR='{infer_dir}'",
                       f"--gin.PROMPT_FILE='{model_dir}/numpy_checkpoints/checkpoint_4/"
                       f"{common.PROMPT_NPY}'"] + common_flags)
  assert code == 0, err
  import json  # pylint: disable=g-import-not-at-top
  lines = (infer_dir / "inference" / "embedded_last_letter-validation.jsonl").read_text()
  rows = [json.loads(l) for l in lines.splitlines()]
  assert len(rows) == 256 and set(rows[0]) == {"inputs", "prediction", "targets"}
  assert all(r["prediction"] in "abcd" for r in rows)  # rank classification over the labels


def test_eval_of_a_run_started_from_a_prompt_file_uses_what_it_trained(trained, tmp_path):
  """A run of prompts/from_file.gin keeps PROMPT_FILE (its start) in config.gin: `eval` given
  only MODEL_DIR evaluates the run's checkpoint, a PROMPT_FILE you name evaluates that file."""
  import json  # pylint: disable=g-import-not-at-top
  start_dir, _ = trained
  start = f"{start_dir}/numpy_checkpoints/checkpoint_4/{common.PROMPT_NPY}"
  model_dir = str(tmp_path / "from_file")
  code, err = run_cli(["train"] + common.flags(model_dir, 2, "--gin_file=prompts/from_file.gin",
                                               f"--gin.PROMPT_FILE='{start}'",
                                               "--gin.prompt_jax.train.eval_steps=1"))
  assert code == 0, err
  assert not np.array_equal(common.prompt_at(model_dir, 2), np.load(start))  # it trained
  eval_dir = os.path.join(model_dir, "eval")

  def evaluated(*extra):
    """(the JSON record eval wrote, stdout); each eval must add a file, overwriting none."""
    before = set(os.listdir(eval_dir)) if os.path.isdir(eval_dir) else set()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      code, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'", *extra])
    assert code == 0, err
    added = set(os.listdir(eval_dir)) - before
    assert len(added) == 1, (before, added)
    return json.loads(open(os.path.join(eval_dir, added.pop())).read()), out.getvalue()

  record, out = evaluated()
  assert record["checkpoint"] == os.path.join(model_dir, "checkpoints", "2"), record
  assert record["step"] == 2 and record["prompt_file"] is None, record
  assert record["decoding"] == {"method": "greedy", "beam_size": 4, "alpha": 0.6}, record
  assert "uses the run's trained checkpoint" in out
  record, _ = evaluated(f"--gin.PROMPT_FILE='{start}'")
  assert record["prompt_file"] == start and record["checkpoint"] is None, record
  # Another file of the same name (every run's .npy export has it) is a result of its own.
  other = f"{model_dir}/numpy_checkpoints/checkpoint_2/{common.PROMPT_NPY}"
  record, _ = evaluated(f"--gin.PROMPT_FILE='{other}'")
  assert record["prompt_file"] == other, record
  # Another frozen model (here the same weights, moved): said first, and recorded.
  import shutil  # pylint: disable=g-import-not-at-top
  from prompt_jax import embedded  # pylint: disable=g-import-not-at-top
  trained_on = record["initial_checkpoint"]
  assert trained_on and os.path.samefile(trained_on, embedded.CHECKPOINT_DIR), record
  moved = str(tmp_path / "moved_backbone")
  shutil.copytree(embedded.CHECKPOINT_DIR, moved)
  before = set(os.listdir(eval_dir))
  record, out = evaluated(f"--gin.INITIAL_CHECKPOINT_PATH='{moved}'")
  assert record["initial_checkpoint"] == moved, record
  (added,) = set(os.listdir(eval_dir)) - before  # the run's own result stays as it was
  assert added.startswith("embedded_last_letter-validation-step2-on-moved_backbone-"), added
  assert "inference_eval_validation_step2-on-moved_backbone-" in " ".join(os.listdir(model_dir))
  assert (f"note: the prompt runs on INITIAL_CHECKPOINT_PATH='{moved}', not the frozen model it "
          f"was trained on (@prompt_jax.embedded_checkpoint_path()); its results are filed "
          f"apart (-on-moved_backbone-") in out, out


def test_labelled_tasks_of_a_plain_mixture_are_rank_classified(trained, monkeypatch):
  """seqio evaluates a mixture task by task: each labelled task gets its labels (not greedy
  decoding, which scores text that is no label), as it would alone."""
  import seqio  # pylint: disable=g-import-not-at-top
  from prompt_jax.embedded import task  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  _, (_, run, _) = trained
  name = "test_plain_last_first"
  if name not in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.add(name, [task.TASK_NAME, task.SECOND_TASK_NAME], default_rate=1.0)
  seen = []
  real = inference.predict_tokens

  def recording(run, inputs, **kw):
    seen.append(kw.get("labels"))
    return real(run, inputs, **kw)
  monkeypatch.setattr(inference, "predict_tokens", recording)
  cfg = data_lib.DatasetConfig(mixture_or_task_name=name, split="validation", batch_size=64,
                               task_feature_lengths={"inputs": 16, "targets": 4}, shuffle=False)
  metrics = inference.evaluate(run, cfg, None, step=0)
  assert all(labels for labels in seen), seen  # None: decoded
  assert sorted(map(tuple, seen)) == sorted([tuple(inference.label_set(task.TASK_NAME)),
                                             tuple(inference.label_set(task.SECOND_TASK_NAME))])
  assert {f"{t}/accuracy" for t in (task.TASK_NAME, task.SECOND_TASK_NAME)} <= set(metrics)


def test_greedy_decoding_predictions(trained):
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  from prompt_jax.embedded import task  # pylint: disable=g-import-not-at-top
  _, (_, run, _) = trained
  texts = [p[0] for p in task.examples("validation")[:8]]
  inputs = np.zeros((8, 16), np.int32)
  for i, t in enumerate(texts):
    ids = list(task.VOCABULARY.encode(t)) + [1]
    inputs[i, :len(ids)] = ids
  greedy = inference.predict_tokens(run, inputs, batch_size=8, max_decode_length=4)
  ranked = inference.predict_tokens(run, inputs, batch_size=8, max_decode_length=4,
                                    labels=list("abcd"), vocabulary=task.VOCABULARY)
  assert len(greedy) == len(ranked) == 8
  assert all(len(r) == 1 for r in ranked)
  assert all(len(g) <= 4 and 1 not in g for g in greedy)


def test_beam_and_rank_predictions_through_the_mesh(trained):
  """predict_tokens / decode_rows / label_scores on the run's mesh, with a partial last batch."""
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  from prompt_jax.embedded import task  # pylint: disable=g-import-not-at-top
  from prompt_jax.models.decoding import DecodingConfig  # pylint: disable=g-import-not-at-top
  _, (_, run, _) = trained
  inputs = np.zeros((6, 16), np.int32)
  for i, (text, _) in enumerate(task.examples("validation")[:6]):
    ids = list(task.VOCABULARY.encode(text)) + [1]
    inputs[i, :len(ids)] = ids
  kw = dict(batch_size=4, max_decode_length=4)  # batches of 4 and 2 (+ 2 padding rows)
  greedy = inference.predict_tokens(run, inputs, **kw)
  beam1 = inference.predict_tokens(run, inputs, decoding_cfg=DecodingConfig("beam", 1, 0.0),
                                   **kw)
  # Beam 1 with alpha 0 is greedy, row for row, up to float32 near-ties (two programs).
  from prompt_jax import trees  # pylint: disable=g-import-not-at-top
  from tests import numerics  # pylint: disable=g-import-not-at-top
  ties = numerics.greedy_near_ties(run.model, trees.merge(run.trainable, run.frozen), inputs, 4)
  numerics.assert_same_choices(np.array([str(b) for b in beam1]),
                               np.array([str(g) for g in greedy]), ties,
                               what="beam 1 vs greedy", max_near_tie_share=0.5)
  tokens, scores = inference.decode_rows(run, inputs, decoding_cfg=DecodingConfig("beam", 3),
                                         **kw)
  assert tokens.shape == (6, 4) and scores.shape == (6,)
  assert (scores < 0).all()
  label_ids = inference.label_tokens(list("abcd"), task.VOCABULARY)  # [4, 2]
  label_scores = inference.label_scores(run, inputs, label_ids, batch_size=4)
  assert label_scores.shape == (6, 4) and (label_scores < 0).all()
  ranked = inference.predict_tokens(run, inputs, labels=list("abcd"), vocabulary=task.VOCABULARY,
                                    **kw)
  best = np.argmax(label_scores, axis=1)
  assert ranked == [[int(label_ids[b, 0])] for b in best]


def test_bad_beam_size_is_a_one_line_error_before_loading(trained):
  model_dir, _ = trained
  _assert_error(["eval", "--gin_file=runs/prompt_eval.gin", "--gin_file=decoding/beam.gin",
                 "--gin_file=models/embedded_tiny.gin", f"--gin.MODEL_DIR='{model_dir}'",
                 "--gin.MIXTURE_OR_TASK_NAME='embedded_last_letter'",
                 "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
                 "--gin.INITIAL_CHECKPOINT_PATH=@prompt_jax.embedded_checkpoint_path()",
                 "--gin.prompt_jax.decoding_config.beam_size=0"], model_dir,
                "decoding_config.beam_size must be >= 1 (e.g. 4, as T5), got 0")


def test_help_lists_t5x_flags(capsys):
  with pytest.raises(SystemExit):
    cli.main(["train", "--help"])
  text = capsys.readouterr().out
  for flag in ("--gin_file", "--gin_bindings", "--gin.NAME=VALUE", "--gin_search_paths",
               "--tfds_data_dir", "--multiprocess_gpu", "--coordinator_address",
               "--process_count", "--process_index"):
    assert flag in text, flag


def test_missing_macro_referenced_by_a_prompt_file(tmp_path):
  d = str(tmp_path / "m")
  _assert_error(["train"] + common.flags(d, 3, "--gin_file=prompts/from_class_labels.gin"), d,
                "missing required macro CLASS_LABELS")


def test_evaluators_are_cached_per_everything_they_read():
  """A second evaluation in one process that changes only the seed (or use_cached, or the task
  module) gets its own seqio.Evaluator, not the first one's cached datasets."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  cfg = data_lib.DatasetConfig(mixture_or_task_name="embedded_last_letter", split="validation",
                               batch_size=8, task_feature_lengths={"inputs": 16, "targets": 4})
  first = inference._evaluator(cfg, None)  # pylint: disable=protected-access
  assert inference._evaluator(cfg, None) is first  # pylint: disable=protected-access
  other = inference._evaluator(dataclasses.replace(cfg, seed=1), None)  # pylint: disable=protected-access
  assert other is not first


def _inference_eval_scalars(model_dir: str, subdir: str = "inference_eval"):
  """{(task dir, tag): {step: value}} of every scalar under MODEL_DIR/<subdir>."""
  import glob  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = {}
  root = os.path.join(model_dir, subdir)
  for f in glob.glob(os.path.join(root, "**", "events.out.tfevents*"), recursive=True):
    for event in tf.compat.v1.train.summary_iterator(f):
      for v in event.summary.value:
        value = float(tf.make_ndarray(v.tensor)) if v.HasField("tensor") else v.simple_value
        out.setdefault((os.path.relpath(os.path.dirname(f), root), v.tag),
                       []).append((event.step, value))
  return out


def test_eval_of_another_split_or_a_prompt_file_leaves_trainings_curve_alone(trained):
  """`eval` on the test split, and of a PROMPT_FILE, write their TensorBoard points to their
  own directories: training's inference_eval curve (validation, which `sweep report` reads as
  the run's) keeps exactly its points."""
  import gin  # pylint: disable=g-import-not-at-top
  model_dir, _ = trained
  before = _inference_eval_scalars(model_dir)
  assert any(steps and steps[-1][0] == 4 for steps in before.values()), before
  prompt = os.path.join(model_dir, "numpy_checkpoints", "checkpoint_4", common.PROMPT_NPY)
  try:
    code, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'", "--gin.EVAL_SPLIT='test'"])
    assert code == 0, err
    code, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'",
                         f"--gin.PROMPT_FILE='{prompt}'"])
    assert code == 0, err
  finally:
    gin.clear_config()
  assert _inference_eval_scalars(model_dir) == before
  test = _inference_eval_scalars(model_dir, "inference_eval_test")
  assert test and all([st for st, _ in v] == [4] for v in test.values()), test
  with open(os.path.join(model_dir, "eval",
                         "embedded_last_letter-test-step4.json")) as f:
    result = json.load(f)
  assert result["split"] == "test"
  assert (("embedded_last_letter", "eval/accuracy") in test
          and test[("embedded_last_letter", "eval/accuracy")][0][1]
          == pytest.approx(result["metrics"]["embedded_last_letter/accuracy"]))
  prompt_dirs = [d for d in os.listdir(model_dir)
                 if d.startswith("inference_eval_validation_encoder.prompt.prompt.prompt-")]
  assert len(prompt_dirs) == 1, os.listdir(model_dir)
