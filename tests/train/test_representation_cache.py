"""IDPG's M(x) cache in the trainer (train/methods.py): the frozen encoder runs once per example
per run on a static task (none in later epochs), and training with the cache is training without
it, up to float32 rounding of M(x) (measured here: bitwise equal; bounded as explained below).
A wrong cache row moves the trained generator by ~1 to 3; the bound here is <= 9e-3."""
import gin
import jax.numpy as jnp
import numpy as np
import seqio
import tensorflow as tf

from prompt_jax import cli
from prompt_jax import trees
from prompt_jax.embedded import task as embedded_task
from prompt_jax.models import T5
from prompt_jax.train import loop
from prompt_jax.train import methods
from tests import numerics
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


def _train(tmp_path, name, steps, cache, monkeypatch, runs=None):
  """Trains S-IDPG (idpg.gin: PHM, M(x) = mean-pooled frozen encoder) on the tiny task; returns
  (trainable params, the cache object or None); appends the run (model, frozen...) to `runs`."""
  made = []
  original = methods.representation_cache

  def capture(spec, run, *args, **kwargs):
    if runs is not None:
      runs.append(run)
    made.append(original(spec, run, *args, **kwargs))
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
  runs = []
  with_cache, cache = _train(tmp_path, "cache", steps, True, monkeypatch, runs)
  assert isinstance(cache, methods.RepresentationCache)
  # Epoch 1 (2 batches) computes every example once; epochs 2 and 3 only read the cache.
  assert cache.encoder_calls == 2
  assert len(cache) == NUM_EXAMPLES
  without, none = _train(tmp_path, "no_cache", steps, False, monkeypatch)
  assert none is None
  assert set(with_cache) == set(without) and with_cache
  # The cache computes M(x) = T5.encoder_representation in its own jitted program, the uncached
  # step inside its graph: one function, two programs, so M(x) may differ by float32 rounding,
  # and the trained generators by what that rounding moves them. Bound: M(x)'s relative rounding
  # (2 x numerics.bound of float32 against float64 M(x), over its scale: two programs, each
  # within the bound) times the generator's measured response to a relative change of M(x) of
  # EPS32 (a cached run whose M(x) is scaled by 1 + EPS32); linear at this scale.
  run = runs[0]
  tokens = jnp.asarray(np.stack([np.frombuffer(k, np.int32) for k in cache._table]))  # pylint: disable=protected-access
  represent = lambda m, p: m.apply({"params": p}, tokens, method=T5.encoder_representation)
  rep32 = represent(run.model, run.frozen)
  with numerics.float64():
    rep64 = np.asarray(represent(*numerics.in_float64(run.model, run.frozen)))
  relative = 2 * numerics.bound(rep32, rep64) / float(np.abs(rep64).max())
  compute = methods.RepresentationCache._compute  # pylint: disable=protected-access
  with monkeypatch.context() as m:
    m.setattr(methods.RepresentationCache, "_compute",
              lambda self, t: compute(self, t) * np.float32(1 + numerics.EPS32))
    nudged, _ = _train(tmp_path, "nudged", steps, True, monkeypatch)
  for name in with_cache:
    response = float(np.abs(np.asarray(nudged[name]) - np.asarray(with_cache[name])).max())
    assert response > 0, name  # an ulp of M(x) reaches the generator: the bound is not 0
    distance = float(np.abs(np.asarray(with_cache[name]) - np.asarray(without[name])).max())
    assert distance <= relative / numerics.EPS32 * response, (name, distance, relative, response)
