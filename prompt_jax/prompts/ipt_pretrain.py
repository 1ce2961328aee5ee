"""Pretrains IPT's table and network: embedding [V, H] + a text classifier on labelled JSONL.

IPT's "pretrained" table comes from a classifier trained to predict a text's category (the paper
uses 13 Wikipedia top-level categories); any JSONL with a text and a label field works:

  prompt-jax ipt-pretrain --data=wiki_categories.jsonl \\
      --spm=/path/to/spiece.model --vocab_size=32128 --emb_dim=768 --encoder=textcnn \\
      --out=ipt_table.npy

The classifier is the table, the chosen network (`--encoder` textcnn / lstm / mlp, as
`ipt.TextEncoder`) and a linear head over the categories. It writes the table [vocab_size,
emb_dim] as `--out` (.npy, for `prompts/ipt.gin`) and the network without its head beside it
(`<out>.network.npz`, which `prompts/ipt_encoder.gin` loads, trains, and checks against
IPT_ENCODER).

A bad input (a missing or malformed --data, a missing --spm, a bad flag) is one line
`prompt-jax ipt-pretrain: error: ...` and exit 2 before anything is written; a failure while
training is one line and exit 1 (--verbose adds the traceback). The table and the network are
written whole or not at all (each to a temporary file, then renamed).
"""
import argparse
import contextlib
import json
import logging
import os
import sys
from typing import Callable, Dict, List, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from prompt_jax import console
from prompt_jax import errors
from prompt_jax import paths
from prompt_jax import trees
from prompt_jax.errors import ConfigError, RunError
from prompt_jax.prompts import ipt


def read_jsonl(path: str, text_key: str = "text",
               label_key: str = "label") -> Tuple[List[str], List[str]]:
  texts, labels = [], []
  if not os.path.isfile(path):
    raise ConfigError(f"--data {path} is not a file; pass a JSONL file with one "
                      f'{{"{text_key}": ..., "{label_key}": ...}} object per line')
  try:
    with open(path, encoding="utf-8") as f:
      for i, line in enumerate(f):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except ValueError as e:
          raise ConfigError(f"{path}:{i + 1} is not JSON ({e}); --data takes one JSON object "
                            f"per line") from e
        if not isinstance(row, dict) or text_key not in row or label_key not in row:
          raise ConfigError(f"{path}:{i + 1} lacks {text_key!r} or {label_key!r} (--text_key / "
                            f"--label_key name the fields)")
        texts.append(str(row[text_key]))
        labels.append(str(row[label_key]))
  except UnicodeDecodeError as e:
    raise ConfigError(f"--data {path} is not UTF-8 text ({e.reason}); pass a JSONL file") from e
  except OSError as e:
    raise ConfigError(f"--data {path} cannot be read: {e.strerror or e}") from e
  if not texts:
    raise ConfigError(f"{path} has no examples")
  return texts, labels


def encode_batch(texts: Sequence[str], encode: Callable[[str], Sequence[int]],
                 max_length: int) -> np.ndarray:
  """[N, max_length] int32 token ids, truncated and padded with 0."""
  out = np.zeros((len(texts), max_length), np.int32)
  for i, text in enumerate(texts):
    ids = list(encode(text))[:max_length]
    out[i, :len(ids)] = ids
  return out


class Classifier(nn.Module):
  """Embedding [V, H] -> network (`ipt.TextEncoder`: TextCNN, LSTM or MLP) -> logits [B, C]."""
  vocab_size: int
  emb_dim: int
  num_classes: int
  widths: Tuple[int, ...] = (3, 4, 5)
  filters: int = 100
  dropout_rate: float = 0.5
  encoder: str = "textcnn"
  hidden: int = 256

  @nn.compact
  def __call__(self, tokens, deterministic=True):
    table = self.param("table", nn.initializers.normal(0.5), (self.vocab_size, self.emb_dim))
    rows = jnp.take(table, tokens, axis=0)  # [B, T, H]
    return ipt.TextEncoder(self.num_classes, self.encoder, tuple(self.widths), self.filters,
                           self.hidden, self.dropout_rate, name="text_encoder")(
                               rows, tokens > 0, deterministic=deterministic)  # [B, C]


def pretrain(tokens: np.ndarray, labels: Sequence[str], vocab_size: int, emb_dim: int, *,
             steps: int = 1000, batch_size: int = 64, learning_rate: float = 1e-3,
             encoder: str = "textcnn", widths: Tuple[int, ...] = (3, 4, 5), filters: int = 100,
             hidden: int = 256, dropout_rate: float = 0.5, seed: int = 0, log_every: int = 100,
             log: Callable[[str], None] = logging.info
             ) -> Tuple[np.ndarray, Dict[str, np.ndarray], Dict[str, float]]:
  """Trains the classifier on (tokens [N, T], labels); returns (table [V, H], network params
  {'cnn/conv3_kernel': ...} without the head, metrics). Every `log_every` steps `log` gets the
  loss (the CLI prints it)."""
  if encoder not in ipt.ENCODERS:
    raise ConfigError(f"--encoder must be one of {ipt.ENCODERS}, got {encoder!r}")
  if tokens.max() >= vocab_size:
    raise ConfigError(f"the tokenizer gives token id {int(tokens.max())}, beyond the table's "
                      f"--vocab_size={vocab_size} rows: give the --vocab_size of the model the "
                      f"table is for (its embedding rows, e.g. 32128 for T5) and the --spm that "
                      f"model uses")
  classes = sorted(set(labels))
  if len(classes) < 2:  # the loss is 0 from the start: the table would learn nothing
    raise ConfigError(f"the data has one label ({classes[0]!r} for all {len(labels)} examples): "
                      f"the classifier learns nothing; give examples of at least two labels")
  y = np.array([classes.index(label) for label in labels], np.int32)
  model = Classifier(vocab_size, emb_dim, len(classes), tuple(widths), filters, dropout_rate,
                     encoder, hidden)
  rng = jax.random.PRNGKey(seed)
  params = nn.meta.unbox(jax.jit(model.init)(rng, tokens[:1]))["params"]
  tx = optax.adam(learning_rate)
  opt_state = tx.init(params)

  def loss_fn(p, x, t, drop_rng):
    logits = model.apply({"params": p}, x, deterministic=False, rngs={"dropout": drop_rng})
    return optax.softmax_cross_entropy_with_integer_labels(logits, t).mean()

  @jax.jit
  def step(p, o, x, t, drop_rng):
    value, grads = jax.value_and_grad(loss_fn)(p, x, t, drop_rng)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o, value

  @jax.jit
  def accuracy(p, x, t):
    return (model.apply({"params": p}, x).argmax(-1) == t).mean()

  data_rng = np.random.RandomState(seed)
  first_loss = last_loss = None
  for i in range(steps):
    idx = data_rng.choice(len(y), min(batch_size, len(y)), replace=False)
    params, opt_state, value = step(params, opt_state, tokens[idx], y[idx],
                                    jax.random.fold_in(rng, i))
    last_loss = float(value)
    first_loss = last_loss if first_loss is None else first_loss
    if log_every and i % log_every == 0:
      log(f"ipt-pretrain: step {i}/{steps} loss {last_loss:.4f}")
  metrics = {"first_loss": first_loss, "last_loss": last_loss,
             "train_accuracy": float(accuracy(params, tokens, y)), "num_classes": len(classes)}
  network = {k: np.asarray(v, np.float32)
             for k, v in trees.flatten(jax.device_get(params["text_encoder"])).items()
             if not k.startswith("out_")}
  return np.asarray(params["table"], np.float32), network, metrics


def pretrain_table(tokens: np.ndarray, labels: Sequence[str], vocab_size: int, emb_dim: int,
                   **kwargs) -> Tuple[np.ndarray, Dict[str, float]]:
  """`pretrain` returning (table [V, H], metrics) only."""
  table, _, metrics = pretrain(tokens, labels, vocab_size, emb_dim, **kwargs)
  return table, metrics


def _parser() -> argparse.ArgumentParser:
  parser = errors.OneLineParser(prog="prompt-jax ipt-pretrain",
                   description=__doc__.split("\n")[0])
  parser.add_argument("--data", required=True, help="JSONL with a text and a label per line")
  parser.add_argument("--out", required=True, help="where to write the [V, H] table (.npy)")
  parser.add_argument("--spm", default=None, help="SentencePiece model (default: T5's)")
  parser.add_argument("--vocab_size", type=int, default=32128)
  parser.add_argument("--emb_dim", type=int, required=True)
  parser.add_argument("--text_key", default="text")
  parser.add_argument("--label_key", default="label")
  parser.add_argument("--max_length", type=int, default=256)
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--learning_rate", type=float, default=1e-3)
  parser.add_argument("--filters", type=int, default=100)
  parser.add_argument("--encoder", default="textcnn", choices=ipt.ENCODERS,
                      help="the network trained with the table (encoder IPT keeps it)")
  parser.add_argument("--hidden", type=int, default=256, help="LSTM / MLP hidden size")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--verbose", action="store_true",
                      help="print the traceback of an error (one line without it)")
  return parser


@contextlib.contextmanager
def _stderr_discarded():
  """fd 2 on /dev/null (C++ logging); a Python error raised inside still shows, after it."""
  sys.stderr.flush()
  saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def _out_path(out: str) -> str:
  """The table's path (np.save's: `.npy` appended when missing), checked before training."""
  path = out if out.endswith(".npy") else out + ".npy"
  parent = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(out) or os.path.isdir(path):
    raise ConfigError(f"--out {out} is a directory; pass a file path such as {out}/table.npy")
  for existing in (path, ipt.network_path(path)):  # a table trained before is never replaced
    if os.path.exists(existing):
      raise ConfigError(f"--out {out}: {existing} already exists: ipt-pretrain never replaces a "
                        f"trained table; choose another --out or remove it first")
  existing_dir = paths.nearest_existing(parent)  # (created once the table is trained)
  if not os.path.isdir(existing_dir):
    raise ConfigError(f"--out {out}: {existing_dir} is a file, not a directory")
  try:
    paths.probe_writable(existing_dir)
  except OSError as e:
    raise ConfigError(f"--out {out}: directory {existing_dir} is not writable "
                      f"({e.strerror})") from None
  return path


def _save(out: str, table: np.ndarray, network: Dict[str, np.ndarray], **meta) -> str:
  """Writes the table at `out` and its network beside it, each whole or not at all."""
  tmp = f"{out[:-len('.npy')]}.tmp{os.getpid()}.npy"
  tmp_network = ipt.network_path(tmp)
  errors.make_dirs(os.path.dirname(os.path.abspath(out)), f"--out {out}")
  try:
    with open(tmp, "wb") as f:
      np.save(f, table)
    ipt.save_network(tmp, network, **meta)
    network_file = ipt.network_path(out)
    os.replace(tmp_network, network_file)
    os.replace(tmp, out)
  except OSError as e:
    raise RunError(f"writing --out {out} failed ({e.strerror or e}); no partial file was "
                   f"left: free space or pick another --out and rerun") from e
  finally:
    for path in (tmp, tmp_network):
      if os.path.exists(path):
        os.remove(path)
  return network_file


def main(argv=None) -> None:
  """`prompt-jax ipt-pretrain`: pretrains and writes the table and network; raises ConfigError
  on a bad input (the CLI prints it as one line)."""
  args = _parser().parse_args(argv)
  for flag in ("vocab_size", "emb_dim", "max_length", "steps", "batch_size", "filters",
               "hidden"):
    if vars(args)[flag] <= 0:
      raise ConfigError(f"--{flag} must be positive, got {vars(args)[flag]}")
  out = _out_path(args.out)
  texts, labels = read_jsonl(args.data, args.text_key, args.label_key)
  # The vocabulary imports TensorFlow (seqio). jaxlib (imported with this package) fixed the C++
  # log level before console.quiet could lower it, so TensorFlow's import and device set-up
  # notices (cuInit on a machine without a GPU) go to a discarded fd 2 here.
  if not args.verbose:
    with _stderr_discarded():
      console.import_tensorflow()
  with console.quiet(enabled=not args.verbose):
    from prompt_jax.vocab import get_vocabulary  # pylint: disable=g-import-not-at-top
    from prompt_jax.vocab import check_readable  # pylint: disable=g-import-not-at-top
    try:
      vocab = get_vocabulary(args.spm)
    except FileNotFoundError as e:
      raise ConfigError(f"--spm: {str(e).splitlines()[0]}") from e
    check_readable(vocab, f"--spm {args.spm}" if args.spm else "T5's vocabulary")
    tokens = encode_batch(texts, vocab.encode, args.max_length)
    table, network, metrics = pretrain(
        tokens, labels, args.vocab_size, args.emb_dim, steps=args.steps,
        batch_size=args.batch_size, learning_rate=args.learning_rate, encoder=args.encoder,
        filters=args.filters, hidden=args.hidden, seed=args.seed,
        log=lambda line: print(line, flush=True))
    network_file = _save(out, table, network, encoder=args.encoder, widths=(3, 4, 5),
                         filters=args.filters, hidden=args.hidden)
  print(json.dumps(dict(metrics, out=out, network=network_file, shape=list(table.shape))))


if __name__ == "__main__":  # the CLI's subcommand (one-line errors, exit codes) runs it
  print("prompt-jax ipt-pretrain: error: run this as `prompt-jax ipt-pretrain` (or "
        "`python -m prompt_jax ipt-pretrain`)", file=sys.stderr)
  sys.exit(2)
