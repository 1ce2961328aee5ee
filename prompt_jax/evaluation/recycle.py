"""`prompt-jax recycle`: map a trained prompt from one frozen model to another that shares its
vocabulary (prompts/recycling.py), writing each recycled prompt as `.npy` and the fit errors.

  prompt-jax recycle --prompt=MODEL_DIR/numpy_checkpoints/checkpoint_1000/encoder.prompt.prompt.prompt.npy \\
      --source=gs://t5-data/pretrained_models/t5x/t5_1_1_lm100k_base/checkpoint_1100000 \\
      --target=gs://t5-data/pretrained_models/t5x/t5_1_1_lm100k_large/checkpoint_1100000 \\
      --output_dir=/tmp/recycled

--source / --target: a checkpoint `checkpoints.load` reads (t5x or HF) or a `.npy` [V, H]
embedding table. Writes OUTPUT_DIR/<method>.npy ([P, H_target] float32) for each --methods entry
and OUTPUT_DIR/recycle.json ({method: {"fit_error", "path", "shape"}, "rows": [first, last],
"prompt", "source", "target"}). Files recycled from other inputs are never replaced.
"""
import argparse
import json
import os
import sys
import time
from typing import List, Optional, Sequence

import numpy as np

from prompt_jax import errors
from prompt_jax import npy
from prompt_jax.errors import ConfigError
from prompt_jax.prompts import recycling


def _parser() -> argparse.ArgumentParser:
  p = errors.OneLineParser(prog="prompt-jax recycle", description=__doc__.split("\n\n")[0])
  p.add_argument("--prompt", required=True, help="the trained prompt, a [P, H_source] .npy")
  p.add_argument("--source", required=True,
                 help="the model the prompt was trained on: a checkpoint or a [V, H] .npy table")
  p.add_argument("--target", required=True, help="the model to recycle to (same vocabulary)")
  p.add_argument("--output_dir", required=True)
  p.add_argument("--methods", default=",".join(recycling.METHODS),
                 help=f"comma-separated, from {', '.join(recycling.METHODS)}")
  p.add_argument("--num_words", type=int, default=recycling.DEFAULT_NUM_WORDS,
                 help="vocabulary rows the recyclers are fitted on ...")
  p.add_argument("--word_offset", type=int, default=recycling.DEFAULT_WORD_OFFSET,
                 help="... starting at this row (the reference skips the 1000 most frequent)")
  p.add_argument("--source_vocabulary", default=None,
                 help="optional SentencePiece model of the source; with --target_vocabulary "
                      "both must be the same vocabulary")
  p.add_argument("--target_vocabulary", default=None)
  return p


def _load_matrix(path: str, flag: str, kind: str) -> np.ndarray:
  """A 2-D numeric .npy as float32 (`npy.load`'s one-line errors, naming `flag`)."""
  array = npy.load(path, f"{flag} {path}", f"pass a {kind} as one numeric .npy (numpy.save)")
  if array.ndim != 2:
    raise ConfigError(f"{flag} {path} has shape {array.shape}; expected a {kind}")
  return array.astype(np.float32)


def embedding_table(path: str, what: str) -> np.ndarray:
  """[V, H] float32: a .npy table, or `token_embedder/embedding` of a checkpoint."""
  if path.endswith(".npy"):
    if not os.path.exists(path):
      raise ConfigError(f"--{what} {path} does not exist; pass a checkpoint or a [V, H] .npy")
    return _load_matrix(path, f"--{what}", "[V, H] embedding table")
  from prompt_jax import checkpoints  # pylint: disable=g-import-not-at-top
  try:  # the table alone: the other weights of the checkpoint are never read
    return checkpoints.load_array(path, "token_embedder/embedding", np.float32)
  except checkpoints.CheckpointError as e:
    raise ConfigError(f"--{what}: {e}") from e
  except (OSError, ValueError) as e:
    raise ConfigError(f"--{what} {path!r} cannot be read: {e}") from e


def _check_vocabularies(source: Optional[str], target: Optional[str]) -> None:
  if source is None or target is None:
    return
  for flag, path in (("--source_vocabulary", source), ("--target_vocabulary", target)):
    if not os.path.isfile(path):
      raise ConfigError(f"{flag} {path} is not a file; pass a SentencePiece .model file")
  with open(source, "rb") as f, open(target, "rb") as g:
    if f.read() != g.read():
      raise ConfigError(f"--source_vocabulary {source} and --target_vocabulary {target} differ: "
                        f"recycling needs two models that share one vocabulary")


def _where(path: str) -> str:
  return path if "://" in path else os.path.abspath(path)


def _previous(output_dir: str, paths: Sequence[str], inputs: dict) -> dict:
  """The recycle.json to write: `inputs`, over the entries of OUTPUT_DIR's recycle.json when it
  records the same inputs (a rerun, e.g. with more --methods, whose files it replaces with the
  same values). Any other file in the way is refused: recycle never replaces a prompt recycled
  from other inputs (or a file of the user's own)."""
  record = os.path.join(output_dir, RECORD)
  in_the_way = [p for p in (*paths, record) if os.path.exists(p)]
  if not in_the_way:
    return dict(inputs)
  try:
    with open(record) as f:
      previous = json.load(f)
  except (OSError, ValueError):
    previous = None
  if isinstance(previous, dict) and all(previous.get(k) == v for k, v in inputs.items()):
    return previous
  why = (f"of another recycle ({RECORD} records other --prompt/--source/--target/--num_words/"
         f"--word_offset)" if isinstance(previous, dict) else "that recycle did not write")
  raise ConfigError(f"--output_dir {output_dir} already holds {os.path.basename(in_the_way[0])} "
                    f"{why}; recycle never replaces it: pass another --output_dir")


RECORD = "recycle.json"


def run(prompt_path: str, source: str, target: str, output_dir: str, methods: Sequence[str],
        num_words: int = recycling.DEFAULT_NUM_WORDS,
        word_offset: int = recycling.DEFAULT_WORD_OFFSET, source_vocabulary=None,
        target_vocabulary=None, say=print) -> dict:
  """Recycles the prompt with each method; returns the recycle.json content."""
  twice = sorted({m for m in methods if list(methods).count(m) > 1})
  if twice:  # (it fitted, printed and wrote each one again)
    raise ConfigError(f"--methods names {twice[0]} twice: name each recycler once")
  unknown = [m for m in methods if m not in recycling.METHODS]
  if unknown or not methods:
    raise ConfigError(f"unknown recycler {unknown[0] if unknown else ''!r}; --methods takes "
                      f"{', '.join(recycling.METHODS)}")
  if not os.path.exists(prompt_path):
    raise ConfigError(f"--prompt {prompt_path} does not exist; pass a trained [P, H] .npy "
                      f"(MODEL_DIR/numpy_checkpoints/checkpoint_<step>/...npy)")
  _check_vocabularies(source_vocabulary, target_vocabulary)
  prompt = _load_matrix(prompt_path, "--prompt", "trained [P, H] prompt")
  source_table = embedding_table(source, "source")
  target_table = embedding_table(target, "target")
  try:
    recycling.check_tables(source_table, target_table, prompt)
    rows = recycling.select_rows(source_table.shape[0], num_words, word_offset)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ConfigError(f"--output_dir {output_dir} is a file; pass a directory (it is created)")
  paths = {method: os.path.join(output_dir, f"{method}.npy") for method in methods}
  inputs = {"rows": [int(rows[0]), int(rows[-1])], "prompt": os.path.abspath(prompt_path),
            "source": _where(source), "target": _where(target)}
  report = _previous(output_dir, list(paths.values()), inputs)
  errors.make_dirs(output_dir, f"--output_dir {output_dir}")
  # Every method is fitted before anything is written: a failing or interrupted fit leaves
  # OUTPUT_DIR as it was (not new .npy files beside an older recycle.json).
  fitted = []
  for method in methods:
    start = time.time()
    fitted.append((method, recycling.recycle(prompt, source_table, target_table, method, rows),
                   time.time() - start))
  npy.save_all({paths[method]: out.prompt for method, out, _ in fitted})  # all or none
  for method, out, seconds in fitted:
    path = paths[method]
    report[method] = {"fit_error": out.fit_error, "path": os.path.abspath(path),
                      "shape": list(out.prompt.shape)}
    say(f"{method:<20} fit error {out.fit_error:.6g}  ({seconds:.1f}s) -> {path}")
  record = os.path.join(output_dir, RECORD)
  with open(record + ".tmp", "w") as f:
    json.dump(report, f, indent=2)
  os.replace(record + ".tmp", record)
  say(f"recycled prompts and fit errors in {os.path.abspath(output_dir)} ({RECORD})")
  return report


def main(argv: List[str]) -> int:
  args = _parser().parse_args(argv)
  run(args.prompt, args.source, args.target, args.output_dir,
      [m.strip() for m in args.methods.split(",") if m.strip()], args.num_words,
      args.word_offset, args.source_vocabulary, args.target_vocabulary,
      say=lambda line: print(line, flush=True))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
