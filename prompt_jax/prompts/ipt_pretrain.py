"""Pretrains IPT's table and network: embedding [V, H] + a text classifier on labelled JSONL.

IPT's "pretrained" table comes from a classifier trained to predict a text's category (the paper
uses 13 Wikipedia top-level categories); any JSONL with a text and a label field works:

  python -m prompt_jax.prompts.ipt_pretrain --data=wiki_categories.jsonl \\
      --spm=/path/to/spiece.model --vocab_size=32128 --emb_dim=768 --encoder=textcnn \\
      --out=ipt_table.npy

The classifier is the table, the chosen network (`--encoder` textcnn / lstm / mlp, as
`ipt.TextEncoder`) and a linear head over the categories. It writes the table [vocab_size,
emb_dim] as `--out` (.npy, for `prompts/ipt.gin`) and the network without its head beside it
(`<out>.network.npz`, which `prompts/ipt_encoder.gin` loads, trains, and checks against
IPT_ENCODER).
"""
import argparse
import json
import logging
from typing import Callable, Dict, List, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from prompt_jax import trees
from prompt_jax.errors import ConfigError
from prompt_jax.prompts import ipt


def read_jsonl(path: str, text_key: str = "text",
               label_key: str = "label") -> Tuple[List[str], List[str]]:
  texts, labels = [], []
  with open(path) as f:
    for i, line in enumerate(f):
      if not line.strip():
        continue
      row = json.loads(line)
      if text_key not in row or label_key not in row:
        raise ConfigError(f"{path}:{i + 1} lacks {text_key!r} or {label_key!r}")
      texts.append(str(row[text_key]))
      labels.append(str(row[label_key]))
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
             hidden: int = 256, dropout_rate: float = 0.5, seed: int = 0, log_every: int = 100
             ) -> Tuple[np.ndarray, Dict[str, np.ndarray], Dict[str, float]]:
  """Trains the classifier on (tokens [N, T], labels); returns (table [V, H], network params
  {'cnn/conv3_kernel': ...} without the head, metrics)."""
  if encoder not in ipt.ENCODERS:
    raise ConfigError(f"--encoder must be one of {ipt.ENCODERS}, got {encoder!r}")
  if tokens.max() >= vocab_size:
    raise ConfigError(f"token id {int(tokens.max())} >= vocab_size={vocab_size}")
  classes = sorted(set(labels))
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
      logging.info("ipt pretrain step %d loss %.4f", i, last_loss)
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


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO)
  from prompt_jax.vocab import get_vocabulary  # pylint: disable=g-import-not-at-top
  vocab = get_vocabulary(args.spm)
  texts, labels = read_jsonl(args.data, args.text_key, args.label_key)
  tokens = encode_batch(texts, vocab.encode, args.max_length)
  table, network, metrics = pretrain(
      tokens, labels, args.vocab_size, args.emb_dim, steps=args.steps,
      batch_size=args.batch_size, learning_rate=args.learning_rate, encoder=args.encoder,
      filters=args.filters, hidden=args.hidden, seed=args.seed)
  np.save(args.out, table)
  network_file = ipt.save_network(args.out, network, encoder=args.encoder, widths=(3, 4, 5),
                                  filters=args.filters, hidden=args.hidden)
  print(json.dumps(dict(metrics, out=args.out, network=network_file, shape=list(table.shape))))


if __name__ == "__main__":
  main()
