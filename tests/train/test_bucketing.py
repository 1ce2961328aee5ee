"""Length bucketing (issue 11, acceptance 4): batches cut to a few fixed lengths train exactly as
the batches padded to TASK_FEATURE_LENGTHS do.

The cut removes trailing padding only; the model adds the prompt's positions after it. Padding
keys are masked (-1e10 bias: exp underflows to exactly 0) and relative position biases depend
on distances only, so the step is the same function on the same real tokens; what may differ is
float32 rounding (XLA blocks matmuls of other shapes differently). The bound is derived
(tests/numerics.py): the bucketed float32 step must be within 8x the padded float32 step's own
distance to the padded step run in float64.
"""
import re

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from prompt_jax import partitioning, run_setup, trees
from prompt_jax.embedded import embedded_checkpoint_path
from prompt_jax.prompts import specs
from prompt_jax.train import data as data_lib
from prompt_jax.train import state as state_lib
from tests import numerics
from tests.train import common

LENGTHS = {"inputs": 32, "targets": 8}


def test_bucket_lengths_and_trim():
  assert data_lib.bucket_lengths(512, 4) == (128, 256, 384, 512)
  assert data_lib.bucket_lengths(30, 4, multiple=8) == (8, 16, 24, 30)
  assert data_lib.bucket_lengths(8, 4, multiple=8) == (8,)
  batch = {"encoder_input_tokens": np.array([[5, 6, 1, 0, 0, 0, 0, 0], [5, 1, 0, 0, 0, 0, 0, 0]]),
           "decoder_input_tokens": np.array([[0, 3, 0, 0], [0, 0, 0, 0]]),
           "decoder_target_tokens": np.array([[3, 1, 0, 0], [1, 0, 0, 0]]),
           "decoder_loss_weights": np.array([[1, 1, 0, 0], [1, 0, 0, 0]])}
  out = data_lib.trim_to_buckets(batch, {"inputs": (4, 8), "targets": (2, 4)})
  assert out["encoder_input_tokens"].shape == (2, 4)
  assert all(out[k].shape == (2, 2) for k in ("decoder_input_tokens", "decoder_target_tokens",
                                              "decoder_loss_weights"))
  np.testing.assert_array_equal(out["encoder_input_tokens"], batch["encoder_input_tokens"][:, :4])
  # A row that needs the full length keeps the full length.
  full = dict(batch, encoder_input_tokens=np.array([[5] * 8, [1] + [0] * 7]))
  assert data_lib.trim_to_buckets(full, {"inputs": (4, 8), "targets": (2, 4)})[
      "encoder_input_tokens"].shape == (2, 8)


def _stream(num_buckets):
  # DatasetConfig is gin-configurable: bindings another test left (an in-process `cli.main`
  # leaves its run's, e.g. split = 'validation') would change it.
  gin.clear_config()
  cfg = data_lib.DatasetConfig(mixture_or_task_name="embedded_last_letter",
                               task_feature_lengths=LENGTHS, batch_size=8, shuffle=False,
                               module="prompt_jax.embedded.task")
  with gin.unlock_config():
    gin.bind_parameter("prompt_jax.length_buckets.num_buckets", num_buckets)
  try:
    return data_lib.TrainStream(cfg, 1, (0, 8))
  finally:
    gin.clear_config()


def test_bucketed_steps_equal_the_padded_steps():
  padded_stream, bucketed_stream = _stream(0), _stream(4)
  assert bucketed_stream.buckets == {"inputs": (8, 16, 24, 32), "targets": (8,)}
  config = common.embedded_tiny_config(dtype="float32", dropout_rate=0.0)  # no dropout
  spec = specs.prompt_tuning(length=4, placement="suffix")  # the prompt inside the sequence
  run = run_setup.prepare(config=config, prompt=spec, feature_lengths=LENGTHS,
                          initial_checkpoint_path=embedded_checkpoint_path(),
                          trainable_regex=spec.trainable_regex, mesh=partitioning.create_mesh(1))
  tx = optax.sgd(1.0)  # new prompt = prompt - gradient: compares the gradient too

  def step(batch, dtype):
    cfg = config.replace(dtype=dtype)
    model = run_setup.build_model(cfg, spec, params=None)
    trainable, frozen = (numerics.cast(t, dtype) for t in (run.trainable, run.frozen))
    state = state_lib.TrainState(jnp.int32(0), trainable, tx.init(trainable))
    new, metrics = jax.jit(state_lib.make_train_step(model, tx))(
        state, frozen, batch, jax.random.PRNGKey(0))
    prompt = trees.flatten(new.params)["encoder/prompt/prompt/prompt"]
    return {"prompt": np.asarray(prompt), **{k: np.asarray(v) for k, v in metrics.items()}}

  shares = []
  for _ in range(3):
    padded, bucketed = next(padded_stream), next(bucketed_stream)
    for k in padded:  # the same rows, cut after their last real token
      cut = bucketed[k].shape[1]
      np.testing.assert_array_equal(padded[k][:, :cut], bucketed[k])
      assert not np.any(padded[k][:, cut:]), k
    assert bucketed["encoder_input_tokens"].shape[1] < LENGTHS["inputs"], "nothing was cut"
    ref32 = step(padded, jnp.float32)
    var32 = step(bucketed, jnp.float32)
    with numerics.float64():
      ref64 = step(numerics.cast(padded, np.int32), jnp.float64)
    for k in ref32:
      numerics.assert_close(var32[k], ref32[k], ref64[k], what=f"bucketed {k}")
      # The 1e-5 (relative to the value's scale), implied here by the derived bound.
      assert np.abs(var32[k] - ref32[k]).max() <= 1e-5 * max(1.0, np.abs(ref32[k]).max()), k
    shares.append(np.count_nonzero(padded["encoder_input_tokens"])
                  / bucketed["encoder_input_tokens"].size)
  # Processed-token accounting: the padded stream processes every position.
  assert padded_stream.tokens_processed == 3 * 8 * (LENGTHS["inputs"] + LENGTHS["targets"])
  assert bucketed_stream.tokens_real == padded_stream.tokens_real
  assert bucketed_stream.tokens_processed < padded_stream.tokens_processed
  print(f"real-token share: padded {padded_stream.tokens_real / padded_stream.tokens_processed:.2f}"
        f", bucketed {bucketed_stream.tokens_real / bucketed_stream.tokens_processed:.2f}")


def test_bucketing_is_off_by_default():
  assert _stream(0).buckets is None
  cfg = data_lib.DatasetConfig(mixture_or_task_name="embedded_last_letter",
                               task_feature_lengths=LENGTHS, batch_size=8, shuffle=False,
                               module="prompt_jax.embedded.task")
  gin.clear_config()
  assert data_lib.TrainStream(cfg, 1, (0, 8)).buckets is None


@pytest.mark.parametrize("value,message", [
    (2.5, "num_buckets must be an integer, got 2.5"),  # a TypeError inside the pipeline, exit 1
    ("4", "num_buckets must be an integer, got '4'"),
    (-1, "num_buckets must be >= 0 (0: off), got -1")])
def test_a_bucket_count_that_is_not_a_count_is_one_line(value, message):
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match=f"^prompt_jax.length_buckets.{re.escape(message)}\\n"):
    _stream(value)
