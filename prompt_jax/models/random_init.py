"""Random parameters for a model, filled array by array (tests, `bench`, runs with no
INITIAL_CHECKPOINT_PATH): never a compiled init of the whole model.

A jitted `model.init` of T5 1.1 base takes ~120 s to compile on a GPU for 0.02 s of work, and
with a constant PRNG key XLA constant-folds the whole init and does not finish. Here the model is
initialised abstractly once (`jax.eval_shape`) while every parameter's initialiser is recorded;
each array is then drawn eagerly (op by op: the few primitives compile once per shape) with its
own key, fold_in(rng, crc32(path)), passed as an argument, and placed by its sharding.
"""
import contextlib
import zlib
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import flax.linen as nn
import jax
import numpy as np

Array = jax.Array
# path -> (init_fn, init_args, init_kwargs), as the module passed them to `param`.
Initialisers = Dict[str, Tuple[Callable, tuple, dict]]


@contextlib.contextmanager
def recording_initialisers():
  """Yields a dict that fills with every parameter's initialiser while a model is initialised
  (abstractly) inside the block."""
  record: Initialisers = {}
  original = nn.Module.param

  def param(module, name, init_fn, *init_args, **init_kwargs):
    path = "/".join(tuple(module.scope.path) + (name,))
    record[path] = (init_fn, init_args, {k: v for k, v in init_kwargs.items() if k != "unbox"})
    return original(module, name, init_fn, *init_args, **init_kwargs)

  nn.Module.param = param
  try:
    yield record
  finally:
    nn.Module.param = original


def initialisers(model: nn.Module, *init_args, **init_kwargs) -> Initialisers:
  """Every parameter's initialiser, from an abstract `model.init(key, *init_args)`."""
  with recording_initialisers() as record:
    jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *init_args, **init_kwargs))
  return record


def path_key(rng: Array, path: str) -> Array:
  """The key of one parameter: independent of the order and number of the others."""
  return jax.random.fold_in(rng, zlib.crc32(path.encode()) & 0x7FFFFFFF)


def fill(inits: Initialisers, rng: Array, keep: Callable[[str], bool] = lambda p: True,
         shardings: Optional[Mapping[str, Any]] = None) -> Dict[str, Array]:
  """path -> array for the kept paths, drawn one by one, placed by `shardings[path]`."""
  out = {}
  for path, (init_fn, args, kwargs) in inits.items():
    if not keep(path):
      continue
    value = nn.meta.unbox(init_fn(path_key(rng, path), *args, **kwargs))  # eager
    sharding = shardings[path] if shardings is not None else None
    if sharding is None:
      out[path] = value
    elif sharding.is_fully_addressable:
      out[path] = jax.device_put(value, sharding)
    else:  # multi-process: every process drew the same value; each places its shards
      host = np.asarray(value)
      out[path] = jax.make_array_from_callback(host.shape, sharding, lambda i, h=host: h[i])
  return out
