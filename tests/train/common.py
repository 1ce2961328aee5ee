"""Shared by the trainer tests: a small, fast embedded-default configuration and runners."""
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

PROMPT_NPY = "encoder.prompt.prompt.prompt.npy"
# The embedded default shrunk for speed: no eval, tiny batches, unshuffled data (so sharded
# multi-process data gives the same global batches, as a set, as one process does).
FAST_FLAGS = [
    "--gin_file=runs/embedded_default.gin",
    "--gin.BATCH_SIZE=8",
    "--gin.EVAL_PERIOD=0",
    "--gin.CHECKPOINT_PERIOD=1",
    "--gin.prompt_jax.train.stats_period=1",
    "--gin.train/prompt_jax.DatasetConfig.shuffle=False",
]


def flags(model_dir: str, steps: int, *extra: str) -> List[str]:
  return FAST_FLAGS + [f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}",
                       *extra]


def embedded_tiny_config(**overrides):
  """The embedded default's model (gin/models/embedded_tiny.gin) as a T5Config, built by
  `prompt_jax.t5_config(**overrides)` (e.g. dropout_rate=0.0); gin's config is left cleared."""
  import gin  # pylint: disable=g-import-not-at-top
  from prompt_jax import run_setup  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  gin.parse_config_files_and_bindings([os.path.join(os.path.dirname(run_setup.__file__), "..",
                                                    "gin", "models", "embedded_tiny.gin")], [])
  try:
    return run_setup.t5_config(**overrides)
  finally:
    gin.clear_config()


def tensorboard_scalars(model_dir: str, tag: str, subdir: str = "train") -> Dict[int, float]:
  """{step: value} of a scalar summary in MODEL_DIR/<subdir>'s event files, read independently
  of our writer (TensorFlow's summary iterator)."""
  import glob  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  values = {}
  for f in glob.glob(os.path.join(model_dir, subdir, "events.out.tfevents*")):
    for event in tf.compat.v1.train.summary_iterator(f):
      for v in event.summary.value:
        if v.tag == tag:
          values[event.step] = (float(tf.make_ndarray(v.tensor)) if v.HasField("tensor")
                                else v.simple_value)
  return values


def prompt_at(model_dir: str, step: int) -> np.ndarray:
  return np.load(os.path.join(model_dir, "numpy_checkpoints", f"checkpoint_{step}", PROMPT_NPY))


def cli_subprocess(argv: Sequence[str], devices: int = 1, timeout: float = 240,
                   env: Optional[Dict[str, Optional[str]]] = None, wait: bool = True,
                   python_code: Optional[str] = None):
  """Runs `python -m prompt_jax <argv>` (or `python -c python_code <argv>`) with `devices`
  fake CPU devices; `env` adds to (a None value removes from) the environment."""
  full_env = dict(os.environ)
  full_env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  full_env["JAX_PLATFORMS"] = "cpu"
  full_env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  full_env.update(env or {})
  full_env = {k: v for k, v in full_env.items() if v is not None}  # env={NAME: None}: unset
  cmd = ([sys.executable, "-c", python_code, *argv] if python_code
         else [sys.executable, "-m", "prompt_jax", *argv])
  if not wait:
    return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
  return subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True, timeout=timeout)


# `prompt-jax` that sends itself SIGTERM right after logging step {step} (the argument of
# .format): the preemption arrives at a known step however fast the machine runs, where a test
# that signals on reading the line from outside races the run's end. SIGNAL_AT_STEP: the same
# with {signal} (a name in `signal`, e.g. SIGINT for Ctrl-C) sent {times} times.
SIGTERM_AT_STEP = """
import os, signal, sys
from prompt_jax import cli
from prompt_jax.train import summaries
_log = summaries.log
def log_then_sigterm(message, *args):
  _log(message, *args)
  if (message % args if args else message).startswith("step {step}/"):
    os.kill(os.getpid(), signal.SIGTERM)
summaries.log = log_then_sigterm
sys.exit(cli.main(sys.argv[1:]))
"""
SIGNAL_AT_STEP = SIGTERM_AT_STEP.replace(
    "    os.kill(os.getpid(), signal.SIGTERM)",
    "    for _ in range({times}):\n      os.kill(os.getpid(), signal.{signal})")
assert SIGNAL_AT_STEP != SIGTERM_AT_STEP


def _embedded_validation(prompt_length: int):
  """The embedded default's (runs/embedded_default.gin) pieces to score its validation set with
  a prompt-tuning prompt of `prompt_length`: (model, with_prompt(prompt, dtype) -> params,
  sorted input texts, their [B, 16] tokens, the label texts, their [C, L] tokens)."""
  import functools  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from prompt_jax import checkpoints, cli, embedded, run_setup  # pylint: disable=g-import-not-at-top
  from prompt_jax.embedded import task  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import run as run_lib  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import T5  # pylint: disable=g-import-not-at-top
  from prompt_jax.prompts import PromptTuning, prompt_factory  # pylint: disable=g-import-not-at-top
  from tests import numerics  # pylint: disable=g-import-not-at-top
  cli.parse_gin(["runs/embedded_default.gin"], [], [])
  try:
    config = run_setup.t5_config()
  finally:
    gin.clear_config()
  model = T5(config, prompt=prompt_factory(functools.partial(PromptTuning, length=prompt_length),
                                           prompt_length))
  _, frozen = checkpoints.load(embedded.CHECKPOINT_DIR)

  def with_prompt(prompt, dtype):
    params = numerics.cast(frozen, dtype)
    return dict(params, encoder=dict(params["encoder"], prompt={"prompt": {
        "prompt": np.asarray(prompt, dtype)}}))

  texts = sorted({text for text, _ in task.examples("validation")})
  enc = jnp.asarray(run_lib.encode_inputs(texts, task.VOCABULARY, 16))
  label_texts = inference.label_set("embedded_last_letter")
  labels = jnp.asarray(inference.label_tokens(label_texts, task.VOCABULARY))
  return model, with_prompt, texts, enc, label_texts, labels


def embedded_near_ties(prompt32: np.ndarray, prompt64: Optional[np.ndarray] = None, *,
                       greedy: bool = False) -> Dict[str, bool]:
  """{validation input text: bool} for the embedded default (runs/embedded_default.gin: the
  shipped tiny T5, inputs of 16 tokens) under the prompt-tuning prompt `prompt32` [P, 64]:
  examples whose answer may differ between two float32 programs for rounding alone
  (tests/numerics.py): the best label's log-likelihood within twice the derived float32 bound of
  the next, or, with `greedy` (one side decodes greedily, e.g. t5x's evaluation), a greedy step
  within it. `prompt64`: the prompt's float64 value where `prompt32` is itself rounded (a
  folded DPT prompt A·B); default `prompt32`."""
  from prompt_jax.models import decoding  # pylint: disable=g-import-not-at-top
  from tests import numerics  # pylint: disable=g-import-not-at-top
  model, with_prompt, texts, enc, _, labels = _embedded_validation(prompt32.shape[0])
  params32 = with_prompt(prompt32, np.float32)
  s32 = decoding.score_targets(model, params32, enc, labels)
  with numerics.float64():
    m64, _ = numerics.in_float64(model, {})
    s64 = decoding.score_targets(m64, with_prompt(
        prompt32 if prompt64 is None else prompt64, np.float64), enc, labels)
  ties = numerics.near_ties(s32, s64)
  if greedy:
    ties |= numerics.greedy_near_ties(model, params32, enc, 4)
  return dict(zip(texts, ties.tolist()))


def embedded_float64_answers(prompt: np.ndarray) -> Dict[str, Tuple[str, str]]:
  """{validation input text: (greedy answer, best label)} of the embedded default under the
  prompt-tuning prompt `prompt` [P, 64], both computed in float64: greedy decoding of 4 target
  tokens (the text before EOS, as t5x's evaluation and infer decode it) and rank classification
  over the task's labels (prompt-jax's). They differ, for no rounding, where greedy decoding
  leaves the label set (EOS first, another letter); elsewhere a float32 t5x and prompt-jax must
  agree but for near-ties (`embedded_near_ties(..., greedy=True)`)."""
  from prompt_jax.embedded import task  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import decoding  # pylint: disable=g-import-not-at-top
  from tests import numerics  # pylint: disable=g-import-not-at-top
  model, with_prompt, texts, enc, label_texts, labels = _embedded_validation(prompt.shape[0])
  with numerics.float64():
    m64, p64 = numerics.in_float64(model, with_prompt(prompt, np.float64))
    scores = np.asarray(decoding.score_targets(m64, p64, enc, labels))
    tokens = np.asarray(decoding.greedy_decode(m64, p64, enc, 4))
  greedy = [task.VOCABULARY.decode(inference.until_eos(row)) for row in tokens]
  best = [label_texts[i] for i in scores.argmax(-1)]
  return dict(zip(texts, zip(greedy, best)))


def fill_the_disk_after_one_save(monkeypatch) -> List:
  """Makes `np.save` write one file and then fail as a full disk does (OSError ENOSPC) on
  every later call; returns the list the saved files' handles are appended to."""
  real_save, saved = np.save, []

  def save_then_fail(f, array, *args, **kwargs):
    if saved:
      raise OSError(28, "No space left on device")
    saved.append(f)
    real_save(f, array, *args, **kwargs)

  monkeypatch.setattr(np, "save", save_then_fail)
  return saved
