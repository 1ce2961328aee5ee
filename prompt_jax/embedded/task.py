"""A synthetic, deterministic classification task over byte strings, registered with seqio.

Strings are 6-10 letters from 'abcd'. The tiny T5 was pretrained on instructions
"<instruction>: <letters>" -> one letter, for every instruction in INSTRUCTIONS. The embedded
prompt-tuning task `embedded_last_letter` drops the instruction: its inputs are the bare
letters, its target the last letter, so a prompt has to learn to stand in for "last:".
Chance accuracy is 25%.

A second task, `embedded_first_letter` (bare letters -> first letter), and the two-task mixture
`embedded_last_first` (last -> task 0, first -> task 1, each example carrying its `task_index`)
are the embedded multi-task example: one prompt cannot serve both, a prompt per task can.
"""
import collections
from typing import Callable, Dict, List, Tuple

import numpy as np
import seqio
import tensorflow as tf

LETTERS = "abcd"
INSTRUCTIONS: Dict[str, Callable[[str], str]] = {
    "first": lambda s: s[0],
    "last": lambda s: s[-1],
    "second": lambda s: s[1],
    "most": lambda s: sorted(collections.Counter(s).items(), key=lambda kv: (-kv[1], kv[0]))[0][0],
}
TASK_NAME = "embedded_last_letter"
TARGET_INSTRUCTION = "last"
SECOND_TASK_NAME = "embedded_first_letter"
MIXTURE_NAME = "embedded_last_first"  # task_index 0: last letter, 1: first letter
SPLIT_SEEDS = {"train": 0, "validation": 1, "test": 2}
SPLIT_SIZES = {"train": 4096, "validation": 256, "test": 256}
VOCABULARY = seqio.ByteVocabulary()
MODEL_VOCAB_SIZE = 260  # ByteVocabulary's 259 ids, padded


def random_letters(rng: np.random.Generator) -> str:
  return "".join(rng.choice(list(LETTERS), int(rng.integers(6, 11))))


def examples(split: str, instruction: str = TARGET_INSTRUCTION,
             with_instruction: bool = False) -> List[Tuple[str, str]]:
  """Deterministic (inputs, targets) pairs of a split."""
  rng = np.random.default_rng(SPLIT_SEEDS[split] + 1000 * sorted(INSTRUCTIONS).index(instruction))
  out = []
  for _ in range(SPLIT_SIZES[split]):
    letters = random_letters(rng)
    inputs = f"{instruction}: {letters}" if with_instruction else letters
    out.append((inputs, INSTRUCTIONS[instruction](letters)))
  return out


def _dataset_fn(split: str, shuffle_files: bool, seed=None,
                instruction: str = TARGET_INSTRUCTION) -> tf.data.Dataset:
  del shuffle_files, seed
  pairs = examples(split, instruction)
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": [p[0] for p in pairs], "targets": [p[1] for p in pairs]})


def accuracy(targets, predictions) -> Dict[str, float]:
  return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def _decode(text, *unused_args, **unused_kwargs) -> str:
  return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def _first_letter_fn(split: str, shuffle_files: bool, seed=None) -> tf.data.Dataset:
  return _dataset_fn(split, shuffle_files, seed, instruction="first")


def register() -> None:
  if TASK_NAME in seqio.TaskRegistry.names():
    return
  features = {k: seqio.Feature(VOCABULARY, add_eos=True) for k in ("inputs", "targets")}
  for name, fn in ((TASK_NAME, _dataset_fn), (SECOND_TASK_NAME, _first_letter_fn)):
    seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(fn, splits=tuple(SPLIT_SIZES),
                                        num_input_examples=dict(SPLIT_SIZES)),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features=features, postprocess_fn=_decode, metric_fns=[accuracy])
  try:
    from prompt_jax.tasks import multitask, registration  # pylint: disable=g-import-not-at-top
    for name in (TASK_NAME, SECOND_TASK_NAME):
      registration.register_label_set(name, list(LETTERS))
    multitask.register_multitask_mixture(MIXTURE_NAME, [TASK_NAME, SECOND_TASK_NAME])
  except ImportError:
    pass


register()
