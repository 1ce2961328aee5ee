"""FROZEN_DTYPE='auto' (the default, issue 11): the frozen weights in the activation dtype.

Every use of a frozen weight casts it to the activation dtype first, so holding it in bfloat16
under bfloat16 activations must give bitwise the same step as holding it in float32, in half the
memory; the prompt's vocabulary-sampled init must still read the checkpoint's float32 table.
"""
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from prompt_jax import partitioning, run_setup, trees
from prompt_jax.embedded import embedded_checkpoint_path
from prompt_jax.prompts import initializers, specs
from prompt_jax.train import data as data_lib
from prompt_jax.train import state as state_lib
from tests.train import common

LENGTHS = {"inputs": 32, "targets": 8}
PROMPT = "encoder/prompt/prompt/prompt"


def _batch():
  gin.clear_config()  # no bindings another test left (DatasetConfig is gin-configurable)
  cfg = data_lib.DatasetConfig(mixture_or_task_name="embedded_last_letter",
                               task_feature_lengths=LENGTHS, batch_size=8, shuffle=False,
                               module="prompt_jax.embedded.task")
  return next(data_lib.TrainStream(cfg, 1, (0, 8)))


def _prepare(config, spec, frozen_dtype):
  return run_setup.prepare(config=config, prompt=spec, feature_lengths=LENGTHS,
                           initial_checkpoint_path=embedded_checkpoint_path(),
                           trainable_regex=spec.trainable_regex,
                           mesh=partitioning.create_mesh(1), frozen_dtype=frozen_dtype)


def test_auto_is_the_activation_dtype_but_for_the_float32_output_projection():
  config = common.embedded_tiny_config(dropout_rate=0.0)
  assert not config.logits_via_embedding  # T5 1.1: an untied output projection
  head = {"decoder/logits_dense/kernel": jnp.float32}
  assert run_setup.frozen_dtypes("auto", config.replace(dtype=jnp.bfloat16)) == (
      jnp.bfloat16, head)
  assert run_setup.frozen_dtypes("auto", config.replace(dtype=jnp.float32)) == (
      jnp.float32, head)
  assert run_setup.frozen_dtypes("auto", config.replace(logits_via_embedding=True)) == (
      jnp.dtype(config.dtype).type, {})
  assert run_setup.frozen_dtypes("bfloat16", config) == (jnp.bfloat16, {})
  assert run_setup.model_spec(config).frozen_dtype == "auto"


def test_bfloat16_frozen_weights_give_the_float32_held_step_bitwise():
  config = common.embedded_tiny_config(dropout_rate=0.0).replace(dtype=jnp.bfloat16)
  spec = specs.prompt_tuning(length=4, init=initializers.from_sampled_vocab(population_size=200))
  held32, auto = _prepare(config, spec, "float32"), _prepare(config, spec, "auto")
  frozen32, frozen_auto = trees.flatten(held32.frozen), trees.flatten(auto.frozen)
  assert {v.dtype for v in frozen32.values()} == {jnp.dtype(jnp.float32)}
  head = "decoder/logits_dense/kernel"  # used in float32 (t5x's logits): held in float32
  assert frozen_auto.pop(head).dtype == jnp.float32
  assert {v.dtype for v in frozen_auto.values()} == {jnp.dtype(jnp.bfloat16)}
  assert len(frozen_auto) > 10
  assert run_setup.count_by_dtype(auto.frozen) == (
      f"{run_setup.count(auto.frozen) - frozen32[head].size:,} bfloat16, "
      f"{frozen32[head].size:,} float32")

  # The prompt starts as rows of the checkpoint's float32 table, not of its bfloat16 rounding.
  prompt = np.asarray(trees.flatten(auto.trainable)[PROMPT])
  np.testing.assert_array_equal(prompt, np.asarray(trees.flatten(held32.trainable)[PROMPT]))
  table = np.asarray(frozen32["token_embedder/embedding"])
  assert all(np.any(np.all(table[:200] == row, axis=1)) for row in prompt)
  assert np.any(prompt != prompt.astype(jnp.bfloat16).astype(np.float32)), "no rounding to see"

  batch = _batch()
  tx = optax.sgd(1.0)  # new prompt = prompt - gradient: compares the gradient too
  step = jax.jit(state_lib.make_train_step(auto.model, tx))

  def run(prepared):
    state = state_lib.TrainState(jnp.int32(0), prepared.trainable, tx.init(prepared.trainable))
    args = (state, prepared.frozen, batch, jax.random.PRNGKey(0))
    new, metrics = step(*args)
    return np.asarray(trees.flatten(new.params)[PROMPT]), jax.device_get(metrics)

  new32, metrics32 = run(held32)
  new_auto, metrics_auto = run(auto)
  assert np.any(new32 != prompt), "the step did not change the prompt"
  np.testing.assert_array_equal(new_auto, new32)
  for name, value in metrics32.items():
    np.testing.assert_array_equal(metrics_auto[name], value, err_msg=name)


def test_float32_model_keeps_float32_frozen_weights():
  config = common.embedded_tiny_config(dropout_rate=0.0).replace(dtype=jnp.float32)
  run = _prepare(config, specs.prompt_tuning(length=4), "auto")
  assert {v.dtype for v in trees.flatten(run.frozen).values()} == {jnp.dtype(jnp.float32)}


def test_trained_backbone_weights_start_from_the_float32_checkpoint():
  """Full fine-tuning (or any TRAINABLE_REGEX reaching the backbone) under 'auto': what trains
  is read from the checkpoint in float32, not rounded through bfloat16; the rest is bfloat16."""
  config = common.embedded_tiny_config(dropout_rate=0.0).replace(dtype=jnp.bfloat16)
  spec = specs.prompt_tuning(length=4)
  regex = spec.trainable_regex + "|encoder/layers_0/.*"

  def prepare(frozen_dtype):
    return run_setup.prepare(config=config, prompt=spec, feature_lengths=LENGTHS,
                             initial_checkpoint_path=embedded_checkpoint_path(),
                             trainable_regex=regex, mesh=partitioning.create_mesh(1),
                             frozen_dtype=frozen_dtype)

  held32, auto = prepare("float32"), prepare("auto")
  trained32, trained = trees.flatten(held32.trainable), trees.flatten(auto.trainable)
  assert set(trained) == set(trained32) and len(trained) > 5
  for path, value in trained.items():
    assert value.dtype == jnp.float32, path
    np.testing.assert_array_equal(np.asarray(value), np.asarray(trained32[path]), err_msg=path)
  kernel = np.asarray(trained["encoder/layers_0/mlp/wo/kernel"])
  assert np.any(kernel != kernel.astype(jnp.bfloat16).astype(np.float32)), "no rounding to see"
  assert trees.flatten(auto.frozen)["encoder/layers_1/mlp/wo/kernel"].dtype == jnp.bfloat16
