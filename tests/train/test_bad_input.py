"""Every user mistake gets one clear line: the bad-input table.

Each row is one mistake a user makes on the command line, in gin, in data files or with
checkpoints, run as `python -m prompt_jax ...` in a subprocess. Each must: exit non-zero (2 for
a configuration, 1 for a run that cannot go on), print exactly one `prompt-jax <cmd>: error:`
line on stderr that says what was wrong and what to do (the `expect` text), print no traceback
(only `--verbose` does, see the last test), and leave everything previously written unchanged.
The subprocesses run concurrently (3 at a time) so the table takes about a minute on 2 cores.
"""
import concurrent.futures
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
from typing import Callable, List, Optional

import numpy as np
import pytest

from tests.train import common

NO_EVAL = "--gin.prompt_jax.train.eval_before_training=False"
CB_ROW = ('{"premise": "It rained.", "hypothesis": "It was wet.", "label": "entailment", '
          '"idx": %d}\n')


@dataclasses.dataclass
class Case:
  id: str
  argv: Callable[["Context"], List[str]]
  expect: str  # in the error line
  code: int = 2
  model_dir: str = "previous"  # "previous": a copy of a trained run; "fresh": must stay absent
  devices: int = 1
  python_code: Optional[str] = None


@dataclasses.dataclass
class Context:
  tmp: str
  model_dir: str
  previous: str  # an untouched trained run (2 steps)

  def path(self, *parts):
    return os.path.join(self.tmp, *parts)


def train(ctx: Context, *extra: str, steps: int = 3) -> List[str]:
  return ["train"] + common.flags(ctx.model_dir, steps, NO_EVAL, *extra)


def _damaged(model_dir: str, step: int) -> str:
  """Flips one byte in the middle of the largest array data file (OCDBT's `d/`) of checkpoint
  `step`; returns the checkpoint's path."""
  ckpt = os.path.join(model_dir, "checkpoints", str(step))
  files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ckpt, "state")) for f in fs
           if os.path.basename(d) == "d" and "ocdbt" in d]
  largest = max(files, key=os.path.getsize)
  with open(largest, "r+b") as f:
    f.seek(os.path.getsize(largest) // 2)
    byte = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([byte[0] ^ 0xFF]))
  return ckpt


def _bad_jsonl(ctx):
  d = ctx.path("data", "super_glue", "CB")
  os.makedirs(d)
  with open(os.path.join(d, "train.jsonl"), "w") as f:
    f.write(CB_ROW % 0 + '{"premise": "It rained.", "hypothesis": \n' + CB_ROW % 2)
  return ctx.path("data")


def _bad_tsv(ctx):
  d = ctx.path("data", "glue", "SST-2")
  os.makedirs(d)
  with open(os.path.join(d, "train.tsv"), "w") as f:
    f.write("sentence\tlabel\nA fine film .\t1\nA dull one .\tmaybe\n")
  return ctx.path("data")


def _good_cb(ctx):
  d = ctx.path("data", "super_glue", "CB")
  os.makedirs(d)
  with open(os.path.join(d, "train.jsonl"), "w") as f:
    f.writelines(CB_ROW % i for i in range(8))
  return ctx.path("data")


def _npy(ctx, name, value, allow_pickle=False):
  path = ctx.path(name)
  np.save(path, value, allow_pickle=allow_pickle)
  return path


def _gin_file(ctx, text):
  path = ctx.path("mine.gin")
  with open(path, "w") as f:
    f.write(text)
  return path


def _t5x_run(ctx):
  """A MODEL_DIR as t5x.train leaves it: its config.gin is t5x's (tests/t5x run the real one)."""
  os.makedirs(os.path.join(ctx.model_dir, "checkpoint_2"))
  with open(os.path.join(ctx.model_dir, "config.gin"), "w") as f:
    f.write("from __gin__ import dynamic_registration\nimport __main__ as train_script\n"
            "train_script.train.model_dir = %MODEL_DIR\n")
  return ctx.model_dir


def _without_checkpoints(ctx):
  """The trained run with its checkpoints gone (a save that never committed leaves this)."""
  shutil.rmtree(os.path.join(ctx.model_dir, "checkpoints"))
  return ctx.model_dir


def _holding_the_export(ctx):
  """A directory for --output that already holds a file of the export's name."""
  folder = ctx.path("exports")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "prompt_step2.npy"), "w") as f:
    f.write("a prompt trained elsewhere\n")
  return folder


def _file_model_dir(ctx):
  path = ctx.path("model_dir_is_a_file")
  with open(path, "w") as f:
    f.write("not a directory\n")
  return path


def _read_only_dir(ctx):
  """A directory this process cannot write: chmod 555, or (root ignores permissions) a
  directory of the kernel's sysfs, where no one can create files."""
  if os.geteuid() != 0:
    path = ctx.path("read_only")
    os.makedirs(path)
    os.chmod(path, 0o555)
    return os.path.join(path, "run")
  if not os.path.isdir("/sys/kernel"):
    pytest.skip("running as root without /sys: no directory is read-only to this process")
  return "/sys/kernel/prompt_jax_run"


# MODEL_DIR on a full filesystem: no file may grow past 16 KiB (RLIMIT_FSIZE; writes then fail
# with EFBIG as they fail with ENOSPC on a full disk).
FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
from prompt_jax import cli
sys.exit(cli.main(sys.argv[1:]))
"""

# A task whose splits have no rows (an empty or all-filtered data file), registered, then the CLI.
NO_ROWS = """
import sys
import seqio
import tensorflow as tf
from prompt_jax import cli
from prompt_jax.embedded import task

def _empty(split, shuffle_files, seed=None):
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": tf.constant([], tf.string), "targets": tf.constant([], tf.string)})

seqio.TaskRegistry.add(
    "test_no_rows", source=seqio.FunctionDataSource(_empty, splits=("train", "validation")),
    preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
    output_features={k: seqio.Feature(task.VOCABULARY, add_eos=True) for k in ("inputs", "targets")})
sys.exit(cli.main(sys.argv[1:]))
"""

EVAL_FLAGS = ["--gin_file=models/embedded_tiny.gin", "--gin.PROMPT_LENGTH=8",
              "--gin.MIXTURE_OR_TASK_NAME='embedded_last_letter'",
              "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
              "--gin.INITIAL_CHECKPOINT_PATH=@prompt_jax.embedded_checkpoint_path()",
              "--gin.BATCH_SIZE=8"]

CASES = [
    # --- command line ---
    Case("unknown_command", lambda c: ["trian"], "unknown command 'trian'; did you mean train?"),
    Case("misspelled_flag", lambda c: train(c, "--gin_fle=runs/prompt_finetune.gin"),
         "unrecognized arguments: --gin_fle"),
    Case("gin_flag_without_value", lambda c: train(c) + ["--gin.MODEL_DIR"],
         "--gin.MODEL_DIR needs a value"),
    Case("process_index_out_of_range", lambda c: train(
        c, "--coordinator_address=127.0.0.1:1", "--process_count=2", "--process_index=2"),
         "--process_index=2 must be in [0, --process_count=2)"),
    # a process that finds no coordinator (or whose others never start) was silent for 300 s,
    # then aborted from C++ (SIGABRT, a stack trace)
    Case("process_never_joined", lambda c: train(
        c, "--coordinator_address=127.0.0.1:1", "--process_count=2", "--process_index=1",
        "--initialization_timeout=4"), "process 1 of 2 (--coordinator_address=127.0.0.1:1): "
                                       "not all 2 processes joined within 4 s: start each "
                                       "--process_index 0..1 once"),
    Case("initialization_timeout_zero", lambda c: train(
        c, "--coordinator_address=127.0.0.1:1", "--process_count=2", "--process_index=1",
        "--initialization_timeout=0"), "--initialization_timeout must be > 0 seconds, got 0"),
    Case("process_count_without_coordinator", lambda c: train(c, "--process_count=2"),
         "--process_count > 1 needs --coordinator_address"),
    Case("data_dir_missing", lambda c: train(c, f"--data_dir={c.path('no_such_dir')}"),
         "--data_dir"),
    Case("process_index_without_coordinator", lambda c: train(c, "--process_index=1"),
         "--process_index=1 needs --coordinator_address"),  # ran alone as process 0 of 1
    Case("unquoted_string_binding", lambda c: train(c, f"--gin.PROMPT_FILE={c.path('p.npy')}"),
         "a string value needs quotes inside the flag: --gin.PROMPT_FILE=\"'"),
    *(Case(f"{command}_misspelled_flag", lambda c, command=command: [command, "--bogus"],
           f" (prompt-jax {command} --help lists the flags)")
      for command in ("tasks", "bench", "sweep", "recycle", "plan")),
    # --- gin ---
    Case("misspelled_macro", lambda c: train(c, "--gin.TRAIN_STPES=5"),
         "--gin.TRAIN_STPES sets a macro that nothing uses; did you mean TRAIN_STEPS?"),
    Case("misspelled_configurable", lambda c: train(c, "--gin.prompt_jax.trian.stats_period=5"),
         "did you mean prompt_jax.train?"),
    Case("misspelled_parameter", lambda c: train(c, "--gin.prompt_jax.train.stats_perod=5"),
         "did you mean stats_period?"),
    Case("misspelled_gin_file", lambda c: ["train", "--gin_file=runs/embeded_default.gin"],
         "did you mean runs/embedded_default.gin?"),
    Case("gin_syntax_error", lambda c: train(c, f"--gin_file={_gin_file(c, 'BATCH_SIZE = (8')}"),
         "mine.gin"),
    Case("wrong_value_type", lambda c: train(c, "--gin.TRAIN_STEPS='five'"),
         "TRAIN_STEPS must be an integer, got 'five'"),
    *(Case(f"{macro.lower()}_not_an_integer", lambda c, macro=macro: train(
        c, f"--gin.{macro}='abc'"), f"{macro} must be an integer, got 'abc'", model_dir="fresh")
      for macro in ("PROMPT_LENGTH", "BATCH_SIZE", "RANDOM_SEED")),  # were a bare TypeError
    Case("batch_size_zero", lambda c: train(c, "--gin.BATCH_SIZE=0"),
         "BATCH_SIZE must be >= 1, got 0", model_dir="fresh"),  # was "not divisible by ... 1"
    Case("eval_batch_size_not_an_integer", lambda c: [
        "eval", f"--gin.MODEL_DIR='{c.model_dir}'", "--gin.BATCH_SIZE='abc'"],
         "BATCH_SIZE must be an integer, got 'abc'"),
    Case("infer_random_seed_not_an_integer", lambda c: [
        "infer", f"--gin.MODEL_DIR='{c.model_dir}'", "--gin.RANDOM_SEED='abc'"],
         "RANDOM_SEED must be an integer or None, got 'abc'"),
    Case("eval_random_seed_not_an_integer", lambda c: [
        "eval", f"--gin.MODEL_DIR='{c.model_dir}'", "--gin.RANDOM_SEED='abc'"],
         "RANDOM_SEED must be an integer or None, got 'abc'"),  # was accepted
    *(Case(f"loss_normalizing_factor_{name}", lambda c, value=value: train(
        c, f"--gin.LOSS_NORMALIZING_FACTOR={value}"),
           f"LOSS_NORMALIZING_FACTOR must be 'NUM_REAL_TARGET_TOKENS', a positive number or None "
           f"(the sum over tokens), got {value}", model_dir="fresh")
      for name, value in (("unknown", "'bogus'"), ("zero", "0"))),  # were written, then failed
    *(Case(f"learning_rate_{name}", lambda c, value=value: train(
        c, f"--gin.LEARNING_RATE={value}"),
           f"LEARNING_RATE must be a number >= 0, got {shown}: e.g. --gin.LEARNING_RATE=0.3",
           model_dir="fresh")  # a string failed after writing the run; -1 trained uphill
      for name, value, shown in (("a_string", "'fast'", "'fast'"), ("negative", "-1", "-1"),
                                 ("quoted_number", "'0.3'", "'0.3'"))),
    Case("learning_rate_beyond_float32", lambda c: train(c, "--gin.LEARNING_RATE=1e39"),
         "LEARNING_RATE=1e+39 is beyond float32's range (at most 3.403e+38)",
         model_dir="fresh"),  # two numpy 'overflow encountered in cast' warnings, then NaN
    Case("keep_no_checkpoints", lambda c: train(c, "--gin.KEEP_CHECKPOINTS=0"),
         "KEEP_CHECKPOINTS must be >= 1 or None (keep them all), got 0"),
    Case("checkpoint_period_zero", lambda c: train(c, "--gin.CHECKPOINT_PERIOD=0"),
         "CHECKPOINT_PERIOD must be >= 1, got 0"),
    Case("stats_period_zero", lambda c: train(c, "--gin.prompt_jax.train.stats_period=0"),
         "prompt_jax.train.stats_period must be >= 1, got 0"),
    Case("missing_model_dir", lambda c: ["train", "--gin_file=runs/embedded_default.gin"],
         "missing required macro MODEL_DIR", model_dir="fresh"),
    Case("unknown_task", lambda c: train(c, "--gin.MIXTURE_OR_TASK_NAME='embedded_last_leter'"),
         "did you mean embedded_last_letter"),
    Case("unknown_split", lambda c: train(c, "--gin.train/prompt_jax.DatasetConfig.split='dev'"),
         "has no split 'dev'"),
    *(Case(f"unknown_{what}_split", lambda c, flags=flags: train(
        c, "--gin.EVAL_SPLIT='dev'", *flags), "has no split 'dev'", model_dir="fresh")
      for what, flags in (("eval", ["--gin.EVAL_PERIOD=1"]),  # were found after writing
                          ("eval_before_training",
                           ["--gin.prompt_jax.train.eval_before_training=True"]))),
    Case("feature_lengths_missing_a_key",
         lambda c: train(c, "--gin.TASK_FEATURE_LENGTHS={'inputs': 16}"),
         "TASK_FEATURE_LENGTHS"),
    Case("batch_not_divisible_by_devices", lambda c: train(c, "--gin.BATCH_SIZE=3"),
         "BATCH_SIZE=3 is not divisible by the data-parallel size 2", devices=2),
    Case("num_partitions_not_dividing_devices", lambda c: train(c, "--gin.NUM_PARTITIONS=3"),
         "NUM_PARTITIONS=3", devices=2),
    Case("num_partitions_not_dividing_the_model", lambda c: train(c, "--gin.NUM_PARTITIONS=8"),
         "NUM_PARTITIONS=8 splits decoder/logits_dense/kernel (64, 260) along a dimension of 260 "
         "over 8 devices ('model' mesh axis), which do not divide it; the largest NUM_PARTITIONS "
         "this model fits is 4", devices=8),  # was blamed on INITIAL_CHECKPOINT_PATH
    Case("eval_num_partitions_not_dividing_devices", lambda c: [
        "eval", f"--gin.MODEL_DIR='{c.model_dir}'", "--gin.NUM_PARTITIONS=3"],
         "NUM_PARTITIONS=3 must divide the 1 devices here"),
    Case("prompt_length_zero", lambda c: train(c, "--gin.PROMPT_LENGTH=0"),
         "PROMPT_LENGTH must be >= 1"),
    Case("prompt_length_negative", lambda c: train(c, "--gin.PROMPT_LENGTH=-3"),
         "PROMPT_LENGTH must be >= 1, got -3"),  # said 'prompt length must be >= 0'
    Case("prefix_length_negative", lambda c: train(
        c, "--gin_file=prompts/prefix.gin", "--gin.PROMPT_LENGTH=-3"),
         "PROMPT_LENGTH must be >= 0, got -3"),  # prefixes in the layers alone take 0
    Case("more_class_labels_than_prompt_tokens", lambda c: train(
        c, "--gin_file=prompts/from_class_labels.gin", "--gin.PROMPT_LENGTH=2",
        "--gin.CLASS_LABELS=['a', 'b', 'c']"), "class labels do not fit", model_dir="fresh"),
    # --- data ---
    Case("training_split_without_rows", lambda c: train(
        c, "--gin.MIXTURE_OR_TASK_NAME='test_no_rows'"),
         "the 'train' split of test_no_rows has no examples", model_dir="fresh",
         python_code=NO_ROWS),
    Case("malformed_jsonl_line", lambda c: train(
        c, f"--data_dir={_bad_jsonl(c)}", "--gin.MIXTURE_OR_TASK_NAME='super_glue_cb_v102'"),
         "train.jsonl:2: malformed JSON"),
    Case("malformed_tsv_line", lambda c: train(
        c, f"--data_dir={_bad_tsv(c)}", "--gin.MIXTURE_OR_TASK_NAME='glue_sst2_v002'"),
         "train.tsv:3: label 'maybe' is not in the label set"),
    Case("missing_sentencepiece_file", lambda c: train(
        c, f"--data_dir={_good_cb(c)}", "--gin.MIXTURE_OR_TASK_NAME='super_glue_cb_v102'",
        f"--gin.get_vocabulary.path='{c.path('no.model')}'"), "SentencePiece model"),
    # --- checkpoints and prompts ---
    Case("initial_checkpoint_missing", lambda c: train(
        c, f"--gin.INITIAL_CHECKPOINT_PATH='{c.path('nowhere', 'checkpoint_1')}'"),
         "INITIAL_CHECKPOINT_PATH"),
    Case("initial_checkpoint_of_another_size", lambda c: train(
        c, "--gin.prompt_jax.t5_config.emb_dim=128"), "INITIAL_CHECKPOINT_PATH"),
    Case("model_file_after_the_embedded_default", lambda c: train(  # once trained the tiny model
        c, "--gin_file=models/t5_1_1_small.gin"),  # under t5_1_1_small's name, without a word
         "'token_embedder/embedding' has shape (260, 64) but the config expects (32128, 512)",
         model_dir="fresh"),
    Case("vocabulary_larger_than_embedding", lambda c: train(
        c, "--gin.prompt_jax.t5_config.vocab_size=128"), "vocabulary has 259 ids"),
    Case("prompt_file_of_wrong_shape", lambda c: train(
        c, "--gin_file=prompts/from_file.gin",
        f"--gin.PROMPT_FILE='{_npy(c, 'p.npy', np.zeros((3, 64), np.float32))}'"),
         "PROMPT_FILE"),
    Case("dropout_rate_above_one", lambda c: train(c, "--gin.DROPOUT_RATE=2.0"),
         "dropout_rate (DROPOUT_RATE) must be a number in [0, 1), got 2.0"),
    Case("prompt_file_of_nan", lambda c: train(  # a diverged run's export: a NaN loss at once
        c, "--gin_file=prompts/from_file.gin",
        f"--gin.PROMPT_FILE='{_npy(c, 'p.npy', np.full((8, 64), np.nan, np.float32))}'"),
         "holds 512 NaN or Inf value(s) of 512, not usable numbers"),
    Case("prompt_file_pickled", lambda c: train(
        c, "--gin_file=prompts/from_file.gin",
        f"--gin.PROMPT_FILE='{_npy(c, 'p.npy', np.array([{'a': 1}]), allow_pickle=True)}'"),
         "PROMPT_FILE"),
    Case("resume_with_another_prompt_length", lambda c: train(c, "--gin.PROMPT_LENGTH=4"),
         "holds params/encoder/prompt/prompt/prompt of shape (8, 64)"),
    Case("resume_with_another_method", lambda c: train(c, "--gin_file=prompts/dpt.gin"),
         "was written for another method or model: this configuration has "
         "params/encoder/prompt/prompt/a, params/encoder/prompt/prompt/b, which the checkpoint "
         "lacks; the checkpoint holds params/encoder/prompt/prompt/prompt, which"),  # not 'shape None'
    Case("resume_with_another_optimizer", lambda c: train(
        c, "--gin.prompt_jax.train.optimizer=@prompt_jax.adamw()"),
         "was written for another optimizer: this configuration has opt_state/"),
    Case("resume_with_another_batch_size", lambda c: train(c, "--gin.BATCH_SIZE=4"),
         "was written with BATCH_SIZE=8"),
    Case("resume_with_another_seed", lambda c: train(c, "--gin.RANDOM_SEED=3"),
         "the data pipeline differs from the one checkpoint"),
    Case("train_steps_below_the_checkpoint", lambda c: train(c, steps=1),
         "TRAIN_STEPS=1 is below the step 2"),
    Case("eval_without_checkpoint", lambda c: [
        "eval", "--gin_file=runs/prompt_eval.gin", f"--gin.MODEL_DIR='{c.model_dir}'",
        *EVAL_FLAGS], "nothing to evaluate", model_dir="fresh"),
    Case("infer_checkpoint_path_not_a_checkpoint", lambda c: [
        "infer", "--gin_file=runs/prompt_infer.gin", f"--gin.MODEL_DIR='{c.model_dir}'",
        f"--gin.CHECKPOINT_PATH='{c.path()}'", *EVAL_FLAGS],
         "/state): name a MODEL_DIR/checkpoints/<step> directory, a t5x checkpoint_<step> "
         "directory, or leave CHECKPOINT_PATH out for the run's latest", model_dir="fresh"),
    Case("eval_checkpoint_path_of_a_step_not_saved", lambda c: [
        "eval", f"--gin.MODEL_DIR='{c.model_dir}'",
        f"--gin.CHECKPOINT_PATH='{c.model_dir}/checkpoints/7'"],
         "/checkpoints/7' does not exist: name a MODEL_DIR/checkpoints/<step> directory (the "
         "steps in "),
    Case("eval_checkpoint_path_of_another_prompt_length", lambda c: [
        "eval", f"--gin.MODEL_DIR='{c.model_dir}'", *EVAL_FLAGS, "--gin.PROMPT_LENGTH=4",
        f"--gin.CHECKPOINT_PATH='{c.previous}/checkpoints/2'"],  # named only the shape wanted
         "of shape (4, 64); it holds encoder/prompt/prompt/prompt of shape (8, 64): set "
         "the gin values it was trained with (e.g. PROMPT_LENGTH)", model_dir="fresh"),
    Case("describe_model_dir_without_a_run", lambda c: [
        "describe", f"--gin.MODEL_DIR='{c.model_dir}'"],
         "/model_dir does not exist: point it at a run's directory, or name a model file",
         model_dir="fresh"),  # was gin's "Required bindings for t5_config"; then "holds no run"
    Case("eval_of_a_t5x_train_run", lambda c: ["eval", f"--gin.MODEL_DIR='{_t5x_run(c)}'"],
         "is a run of t5x.train, whose config.gin prompt-jax does not read: evaluate it with "
         "--gin.CHECKPOINT_PATH=", model_dir="fresh"),
    # a copy's config.gin names the original's MODEL_DIR: eval of the copy evaluated the
    # original and wrote its results there
    Case("eval_with_a_copied_runs_config_gin", lambda c: [
        "eval", f"--gin_file={c.model_dir}/config.gin"],
         "/config.gin is the config.gin of a run in "),
    Case("eval_of_a_run_without_checkpoints", lambda c: [
        "eval", f"--gin.MODEL_DIR='{_without_checkpoints(c)}'"],
         "/model_dir holds no checkpoint (train first, or) set CHECKPOINT_PATH or "
         "PROMPT_FILE"),  # (did not say that this run has none)
    Case("export_of_a_t5x_train_run", lambda c: ["export", f"--gin.MODEL_DIR='{_t5x_run(c)}'"],
         "is a run of t5x.train, whose config.gin prompt-jax does not read: export it with "
         "--gin.CHECKPOINT_PATH=", model_dir="fresh"),  # (said "evaluate it")
    Case("export_output_dir_holds_the_file", lambda c: [
        "export", f"--gin.MODEL_DIR='{c.model_dir}'", f"--output={_holding_the_export(c)}"],
         "/exports/prompt_step2.npy already exists: export never replaces it"),
    Case("export_damaged_checkpoint_path", lambda c: [
        "export", f"--gin.MODEL_DIR='{c.model_dir}'",
        f"--gin.CHECKPOINT_PATH='{_damaged(c.model_dir, 2)}'"],
         "cannot read the checkpoint"),
    # --- MODEL_DIR ---
    Case("model_dir_is_a_file", lambda c: train(c), "is a file", model_dir="file"),
    Case("model_dir_read_only", lambda c: train(c), "is not writable", model_dir="read_only"),
    # eval's and infer's results: refused after the work, in TensorFlow's summary writer's words
    Case("eval_model_dir_read_only", lambda c: [
        "eval", f"--gin.MODEL_DIR='{c.model_dir}'", "--gin_file=prompts/from_file.gin",
        f"--gin.PROMPT_FILE='{_npy(c, 'p.npy', np.zeros((8, 64), np.float32))}'", *EVAL_FLAGS],
         "), and eval writes its results there: choose a writable MODEL_DIR",
         model_dir="read_only"),
    Case("infer_model_dir_read_only", lambda c: [
        "infer", f"--gin.MODEL_DIR='{c.model_dir}'", "--gin_file=prompts/from_file.gin",
        f"--gin.PROMPT_FILE='{_npy(c, 'p.npy', np.zeros((8, 64), np.float32))}'", *EVAL_FLAGS],
         "), and infer writes its results there: choose a writable MODEL_DIR",
         model_dir="read_only"),
    # eval's and ensemble-eval's results failed only after all the work, with a traceback line
    Case("eval_model_dir_is_a_file", lambda c: [
        "eval", f"--gin.MODEL_DIR='{c.model_dir}'", "--gin_file=prompts/from_file.gin",
        f"--gin.PROMPT_FILE='{_npy(c, 'p.npy', np.zeros((8, 64), np.float32))}'", *EVAL_FLAGS],
         "cannot be a directory: it is a file; choose another MODEL_DIR", model_dir="file"),
    Case("ensemble_eval_model_dir_below_a_file", lambda c: [
        "ensemble-eval", f"--gin.MODEL_DIR='{c.model_dir}/ens'",
        f"--gin.ENSEMBLE_PROMPTS=['{_npy(c, 'p.npy', np.zeros((8, 64), np.float32))}']",
        *EVAL_FLAGS], "/model_dir_is_a_file, a parent of it, is a file", model_dir="file"),
    Case("model_dir_full", lambda c: train(c), "is not writable (", model_dir="fresh",
         python_code=FULL_DISK),
]


def snapshot(root: str) -> dict:
  if not os.path.exists(root):
    return {"<absent>": True}
  if os.path.isfile(root):
    return {"<file>": hashlib.sha256(open(root, "rb").read()).hexdigest()}
  out = {}
  for d, dirs, files in os.walk(root):
    for name in dirs + files:
      p = os.path.join(d, name)
      if os.path.isdir(p):
        out[os.path.relpath(p, root)] = "dir"
      else:
        st = os.stat(p)
        out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns,
                                         hashlib.sha256(open(p, "rb").read()).hexdigest())
  return out


def run(case: Case, tmp: str, previous: str):
  os.makedirs(tmp)
  ctx = Context(tmp, os.path.join(tmp, "model_dir"), previous)
  if case.model_dir == "previous":
    shutil.copytree(previous, ctx.model_dir)
  elif case.model_dir == "file":
    ctx.model_dir = _file_model_dir(ctx)
  elif case.model_dir == "read_only":
    ctx.model_dir = _read_only_dir(ctx)
  argv = case.argv(ctx)
  before = snapshot(ctx.model_dir)
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={case.devices}",
             JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  cmd = ([sys.executable, "-c", case.python_code, *argv] if case.python_code else
         [sys.executable, "-m", "prompt_jax", *argv])
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
  return proc, before, snapshot(ctx.model_dir)


@pytest.fixture(scope="module")
def previous(tmp_path_factory):
  """A trained run (2 steps) that the mistakes must leave as it is."""
  d = str(tmp_path_factory.mktemp("previous"))
  proc = common.cli_subprocess(["train"] + common.flags(d, 2, NO_EVAL))
  assert proc.returncode == 0, proc.stdout[-3000:]
  return d


@pytest.fixture(scope="module")
def results(previous, tmp_path_factory):
  tmp = str(tmp_path_factory.mktemp("bad_input"))
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    futures = {c.id: pool.submit(run, c, os.path.join(tmp, c.id), previous) for c in CASES}
    return {k: f for k, f in futures.items()}


def test_the_table_has_at_least_20_distinct_mistakes():
  assert len({c.id for c in CASES}) == len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, results):
  proc, before, after = results[case.id].result()
  output = f"--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-3000:]}"
  assert proc.returncode == case.code, output
  lines = [l for l in proc.stderr.splitlines() if l.startswith("prompt-jax")]
  assert len(lines) == 1, output
  assert ": error: " in lines[0] and case.expect in lines[0], output
  assert "Traceback" not in proc.stderr + proc.stdout, output
  assert after == before, "a failed run changed what was there before"
  if case.id.startswith(VALUE_CASES + RESUME_CASES):  # refused before train announced 'for abc
    assert " steps into " not in proc.stdout, output  # steps into ...': the one line


# Values `loop.train(check_only=True)` refuses: before `train` says what it is about to run.
VALUE_CASES = ("wrong_value_type", "learning_rate_", "batch_size_zero", "keep_no_checkpoints",
               "checkpoint_period_zero", "stats_period_zero", "prompt_length_",
               "loss_normalizing_factor_")
# What the checkpoint to resume was written with (its metadata), checked before the backbone
# is read: a changed PROMPT_LENGTH or BATCH_SIZE printed the 'for N steps into' line first.
RESUME_CASES = ("resume_with_", "train_steps_below")


def test_verbose_adds_the_traceback(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "prompt_jax", "train", "--verbose"] +
      common.flags(str(tmp_path / "m"), 3, NO_EVAL, "--gin.TRAIN_STEPS='five'"),
      env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3"),
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2
  assert "Traceback" in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("prompt-jax train: error: TRAIN_STEPS")
