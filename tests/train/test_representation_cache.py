"""IDPG's M(x) cache in the trainer (train/methods.py): the frozen encoder runs once per example
per run on a static task (none in later epochs), and training with the cache is training without
it."""
import gin
import numpy as np
import seqio
import tensorflow as tf

from prompt_jax import cli
from prompt_jax import trees
from prompt_jax.embedded import task as embedded_task
from prompt_jax.train import loop
from prompt_jax.train import methods
from tests.train import common

TASK = "idpg_cache_tiny"
NUM_EXAMPLES = 16  # 2 batches of 8: one epoch every 2 steps


def _register():
  if TASK in seqio.TaskRegistry.names():
    return
  pairs = embedded_task.examples("train")[:NUM_EXAMPLES]

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices(
        {"inputs": [p[0] for p in pairs], "targets": [p[1] for p in pairs]})
  features = {k: seqio.Feature(embedded_task.VOCABULARY, add_eos=True)
              for k in ("inputs", "targets")}
  seqio.TaskRegistry.add(
      TASK, source=seqio.FunctionDataSource(dataset_fn, splits=("train", "validation")),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
      output_features=features)


_register()


def _train(tmp_path, name, steps, cache, monkeypatch):
  """Trains S-IDPG (idpg.gin: PHM, M(x) = mean-pooled frozen encoder) on the tiny task; returns
  (trainable params, the cache object or None)."""
  made = []
  original = methods.representation_cache

  def capture(*args, **kwargs):
    made.append(original(*args, **kwargs))
    return made[-1]
  monkeypatch.setattr(methods, "representation_cache", capture)
  model_dir = str(tmp_path / name)
  rest, bindings = cli.split_gin_dot_flags(
      ["--gin_file=prompts/idpg.gin"] + common.flags(
          model_dir, steps, f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'", "--gin.IDPG_BOTTLENECK=16",
          "--gin.CHECKPOINT_PERIOD=100", "--gin.prompt_jax.train.eval_before_training=False",
          f"--gin.prompt_jax.train.cache_representations={cache}"))
  cli.parse_gin([a.split("=", 1)[1] for a in rest], bindings, [])
  try:
    _, _, state = loop.train(return_state=True)
  finally:
    gin.clear_config()
  return trees.flatten(state.params), (made[0] if made else None)




def test_cache_runs_the_encoder_once_per_example_and_training_is_unchanged(tmp_path,
                                                                          monkeypatch):
  steps = 6  # 3 epochs of the 16-example task
  with_cache, cache = _train(tmp_path, "cache", steps, True, monkeypatch)
  assert isinstance(cache, methods.RepresentationCache)
  # Epoch 1 (2 batches) computes every example once; epochs 2 and 3 only read the cache.
  assert cache.encoder_calls == 2
  assert len(cache) == NUM_EXAMPLES
  without, none = _train(tmp_path, "no_cache", steps, False, monkeypatch)
  assert none is None
  assert set(with_cache) == set(without) and with_cache
  # The cached representation is the frozen encoder's output computed by the same function
  # (T5.encoder_representation) on the same inputs: the trained generator is bitwise the same.
  for name in with_cache:
    np.testing.assert_array_equal(np.asarray(with_cache[name]), np.asarray(without[name]),
                                  err_msg=name)
