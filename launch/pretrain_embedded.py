"""Pretrains the tiny T5 of the embedded default and writes it to prompt_jax/embedded/checkpoint.

  python launch/pretrain_embedded.py [--steps 3000] [--out prompt_jax/embedded/checkpoint]

The model (gin/models/embedded_tiny.gin) learns "<instruction>: <letters>" -> letter for every
instruction of prompt_jax/embedded/task.py, so a prompt has something to steer. Full training
with prompt_jax's own train step (TRAINABLE_REGEX='.*'), AdamW; ~2-4 minutes on 2 CPU cores.
The result is saved in t5x's legacy layout with `prompt_jax.checkpoints.save`.
"""
import argparse
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from prompt_jax import checkpoints
from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.embedded import task as task_lib
from prompt_jax.models import T5
from prompt_jax.train import state as state_lib

EMBEDDED_MODEL = dict(vocab_size=task_lib.MODEL_VOCAB_SIZE, dropout_rate=0.0, dtype="float32")
INPUT_LENGTH, TARGET_LENGTH = 20, 4


def embedded_config():
  return run_setup.t5_config(preset="embedded_tiny", **EMBEDDED_MODEL)


def encode(texts, length):
  out = np.zeros((len(texts), length), np.int32)
  for i, t in enumerate(texts):
    ids = list(task_lib.VOCABULARY.encode(t))[:length - 1] + [1]
    out[i, :len(ids)] = ids
  return out


def batches(batch_size: int, seed: int):
  """Endless mixed-instruction batches of fresh random strings."""
  rng = np.random.default_rng(seed)
  names = sorted(task_lib.INSTRUCTIONS)
  while True:
    inputs, targets = [], []
    for _ in range(batch_size):
      name = names[int(rng.integers(len(names)))]
      letters = task_lib.random_letters(rng)
      inputs.append(f"{name}: {letters}")
      targets.append(task_lib.INSTRUCTIONS[name](letters))
    tgt = encode(targets, TARGET_LENGTH)
    yield {"encoder_input_tokens": encode(inputs, INPUT_LENGTH),
           "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))),
           "decoder_target_tokens": tgt}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--learning_rate", type=float, default=2e-3)
  parser.add_argument("--out", default=os.path.join(
      os.path.dirname(__file__), "..", "prompt_jax", "embedded", "checkpoint"))
  args = parser.parse_args()

  config = embedded_config()
  model = T5(config)
  data = batches(args.batch_size, seed=0)
  first = next(data)
  params = trees.unbox(model.init(jax.random.PRNGKey(0), first["encoder_input_tokens"],
                                      first["decoder_input_tokens"],
                                      first["decoder_target_tokens"],
                                      enable_dropout=False)["params"])
  tx = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, args.learning_rate, 200, args.steps),
                   weight_decay=1e-4)
  state = state_lib.TrainState(jnp.int32(0), params, tx.init(params))
  step = jax.jit(state_lib.make_train_step(model, tx, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS"))
  rng = jax.random.PRNGKey(1)
  start = time.time()
  for i in range(args.steps):
    state, metrics = step(state, {}, next(data), rng)
    if (i + 1) % 250 == 0:
      m = jax.device_get(metrics)
      print(f"step {i + 1} loss {m['loss']:.4f} sequence_accuracy {m['sequence_accuracy']:.3f} "
            f"({time.time() - start:.0f}s)", flush=True)
  out = os.path.abspath(args.out)
  if os.path.isdir(out):
    shutil.rmtree(out)
  path = checkpoints.save(out, jax.device_get(state.params), step=args.steps)
  print("saved", path)


if __name__ == "__main__":
  main()
