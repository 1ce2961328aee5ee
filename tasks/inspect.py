"""`prompt-jax tasks`: list the registered tasks, or show preprocessed examples of one.

  prompt-jax tasks [--filter SUBSTRING]                 every task and mixture, with splits/labels
  prompt-jax tasks NAME [-n 3] [--split validation] [--data_dir DIR] [--tokens] [--spm_path P]

Examples are shown as text after the task's text preprocessors (what the model reads, before
tokenization); `--tokens` runs the full pipeline and shows token ids and their decoding (which
shows token-level steps such as the target sentinel) with each feature's own vocabulary. Tasks
on the package's T5 vocabulary (`features.VOCABULARY`) need its SentencePiece model: --spm_path,
else $PROMPT_JAX_SPM_PATH, else T5's GCS model; tasks with another vocabulary ignore --spm_path.
Bad input (unknown task or split, missing or malformed data) exits 2, other failures 1.
"""
import argparse
import os
import sys
import traceback
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import seqio
import tensorflow as tf

from prompt_jax import errors
from prompt_jax import vocab as vocab_lib
from prompt_jax.tasks import features
from prompt_jax.tasks import few_shot
from prompt_jax.tasks import readers
from prompt_jax.tasks import registration
from prompt_jax.tasks import sources

EXIT_CONFIG_ERROR = 2  # bad input, as every other subcommand
EXIT_FAILURE = 1
_TOKENIZE_STEPS = (seqio.preprocessors.tokenize, seqio.preprocessors.tokenize_and_append_eos)


def _as_python(value: Any) -> Any:
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray):
    return [_as_python(v) for v in value.tolist()] if value.dtype == object else value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, dict):
    return {k: _as_python(v) for k, v in value.items()}
  return value


def _task(name: str) -> seqio.Task:
  few_shot.ensure_registered(name)
  if name in seqio.MixtureRegistry.names():
    tasks = ", ".join(t.name for t in seqio.get_mixture_or_task(name).tasks)
    raise ValueError(f"{name!r} is a mixture of {tasks}; show one of its tasks.")
  return seqio.get_mixture_or_task(name)


def _split(task: seqio.Task, split: Optional[str]) -> str:
  if split is None:
    return "validation" if "validation" in task.splits else task.splits[0]
  if split not in task.splits:
    raise ValueError(f"task {task.name!r} has no split {split!r}; use one of "
                     f"{', '.join(task.splits)}.")
  return split


def text_examples(name: str, split: Optional[str] = None, num_examples: Optional[int] = 3,
                  seed: Optional[int] = None) -> List[Dict[str, Any]]:
  """The first examples of a task after its text preprocessors, as Python values.

  Args:
    name: a task name (few-shot names are registered on demand).
    split: the split; default "validation" when the task has one.
    num_examples: how many (None: all).
    seed: seed for stochastic text preprocessors.

  Returns:
    Dicts with "inputs"/"targets" strings and the preprocessors' other features.
  """
  task = _task(name)
  ds = task.source.get_dataset(split=_split(task, split), shuffle=False)
  with seqio.utils.map_seed_manager(seed):
    for step in task.preprocessors:
      if step in _TOKENIZE_STEPS or isinstance(step, seqio.CacheDatasetPlaceholder):
        break
      ds = seqio.utils.add_kwargs_to_transform(
          step, sequence_length=None, output_features=task.output_features)(ds)
  if num_examples is not None:
    ds = ds.take(num_examples)
  return [_as_python(ex) for ex in ds.as_numpy_iterator()]


def token_examples(name: str, split: Optional[str] = None, num_examples: int = 3,
                   sequence_length: Optional[Dict[str, int]] = None) -> List[Dict[str, Any]]:
  """The first fully preprocessed examples: {"inputs": ids, "targets": ids, ...}."""
  task = _task(name)
  ds = task.get_dataset(sequence_length=sequence_length, split=_split(task, split),
                        shuffle=False, try_in_mem_cache=False)
  return [_as_python(ex) for ex in ds.take(num_examples).as_numpy_iterator()]


def _describe(name: str) -> str:
  provider = seqio.get_mixture_or_task(name)
  if isinstance(provider, seqio.Mixture):
    return f"{name}  [mixture: {', '.join(t.name for t in provider.tasks)}]"
  labels = registration.registered_label_set(name)
  text = f"{name}  splits={','.join(provider.splits)}"
  return text + (f"  labels={'|'.join(labels)}" if labels else "")


def _list(substring: str) -> int:
  names = sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))
  names = [n for n in names if substring in n]
  for name in names:
    print(_describe(name))
  print(f"{len(names)} tasks and mixtures; few-shot versions: <task>_<K>shot_seed<S> "
        f"(K per class) or <task>_<K>total_seed<S>.", file=sys.stderr)
  return 0


def _is_default(vocab: seqio.Vocabulary) -> bool:
  """Whether `vocab` is the package's T5 vocabulary (compared without loading it)."""
  return isinstance(vocab, features.LazyVocabulary) and vocab == features.VOCABULARY


def _show_tokens(args: argparse.Namespace) -> int:
  """Token ids after the full pipeline, decoded with each feature's own vocabulary."""
  output_features = _task(args.name).output_features
  vocabs = {k: output_features[k].vocabulary for k in ("inputs", "targets")
            if k in output_features}
  if args.spm_path and not any(_is_default(v) for v in vocabs.values()):
    own = ", ".join(sorted({type(v).__name__ for v in vocabs.values()}))
    print(f"prompt-jax tasks: note: --spm_path is not used; {args.name} has its own vocabulary "
          f"({own})", file=sys.stderr)
  for vocab in vocabs.values():  # loaded now: inside tf.data a failure reads "in user code:"
    if _is_default(vocab):
      try:
        vocab.vocabulary.vocab_size  # pylint: disable=pointless-statement
      except FileNotFoundError:
        raise
      except Exception as e:  # pylint: disable=broad-except  # gs:// unreachable (tf OpError),
        # not a SentencePiece model (protobuf DecodeError), ...: one line either way.
        reason = getattr(e, "message", None) or str(e) or type(e).__name__
        raise FileNotFoundError(
            f"cannot load T5's SentencePiece model ({reason.splitlines()[0]}); pass "
            f"--spm_path=/path/to/sentencepiece.model (or set ${vocab_lib.SPM_PATH_ENV})") from e
  for i, ex in enumerate(token_examples(args.name, args.split, args.num_examples)):
    print(f"--- example {i}")
    for key, vocab in vocabs.items():
      if key in ex:
        print(f"{key} ({len(ex[key])} tokens): {ex[key]}")
        print(f"{key} decoded: {vocab.decode(ex[key])}")
  return 0


def _show(args: argparse.Namespace) -> int:
  if args.tokens:
    return _show_tokens(args)
  for i, ex in enumerate(text_examples(args.name, args.split, args.num_examples)):
    print(f"--- example {i}")
    for key in ("inputs", "targets"):
      if key in ex:
        print(f"{key}: {ex[key]}")
    extra = {k: v for k, v in ex.items() if k not in ("inputs", "targets")}
    if extra:
      print(f"other features: {extra}")
  return 0


def main(argv: Sequence[str], verbose: bool = False) -> int:
  """Entry point of `prompt-jax tasks` (argv excludes the program and subcommand names);
  `verbose` (prompt-jax --verbose): an error's traceback before its one line."""
  parser = errors.OneLineParser(
      prog="prompt-jax tasks",
      description="List registered seqio tasks, or show preprocessed examples of one.")
  parser.add_argument("name", nargs="?", help="task to show; omit to list all tasks")
  parser.add_argument("-n", "--num_examples", type=int, default=3,
                      help="examples to show (default 3)")
  parser.add_argument("--split", default=None, help="default: validation when available")
  parser.add_argument("--filter", default="", help="list only names containing this")
  parser.add_argument("--data_dir", default=None,
                      help=f"local data dir (else gin/${sources.DATA_DIR_ENV}; unset: TFDS)")
  parser.add_argument("--tfds_data_dir", default=None,
                      help="TFDS data dir override for seqio tasks (as train's)")
  parser.add_argument("--tokens", action="store_true",
                      help="show token ids after the full pipeline, decoded with the task's own "
                           "vocabulary (T5's SentencePiece model for the package's tasks)")
  parser.add_argument("--spm_path", default=None,
                      help="T5 SentencePiece model for --tokens on tasks with the package's "
                           f"default vocabulary (else ${vocab_lib.SPM_PATH_ENV}, else T5's GCS "
                           "model); tasks with their own vocabulary ignore it")
  args = parser.parse_args(list(argv))
  if args.num_examples < 1:
    print(f"prompt-jax tasks: error: -n/--num_examples must be >= 1, got {args.num_examples}",
          file=sys.stderr)
    return EXIT_CONFIG_ERROR
  if args.data_dir:
    sources.set_data_dir(args.data_dir)
  if args.tfds_data_dir:  # (the flag the error of a dataset TFDS has not prepared names)
    seqio.set_tfds_data_dir_override(args.tfds_data_dir)
  if args.spm_path:
    os.environ[vocab_lib.SPM_PATH_ENV] = args.spm_path
  if args.name is None:
    return _list(args.filter)
  try:
    return _show(args)
  except (registration.UnknownTaskError, readers.DataFormatError, FileNotFoundError,
          ValueError) as e:
    if verbose:
      traceback.print_exc()
    print(f"prompt-jax tasks: error: {(str(e) or type(e).__name__).splitlines()[0]}",
          file=sys.stderr)
    return EXIT_CONFIG_ERROR
  except tf.errors.OpError as e:  # E.g. a TFDS label outside the label set: not the input.
    if verbose:
      traceback.print_exc()
    print(f"prompt-jax tasks: error: {e.message.splitlines()[0]}", file=sys.stderr)
    return EXIT_FAILURE
