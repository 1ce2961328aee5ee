"""Lazily readable checkpoint arrays and their materialization (host numpy or sharded jax.Array).

A `LazyArray` knows its shape and reads any rectangular slice of itself on demand. Restoring
with shardings calls `jax.make_array_from_callback`, so each process reads only the slices its
own devices hold and no host ever materializes the whole model.
"""
import dataclasses
from typing import Callable, Dict, Mapping, Optional, Tuple

import jax
import numpy as np

Index = Tuple[slice, ...]


@dataclasses.dataclass
class LazyArray:
  """An array in a checkpoint: `read(index)` returns `array[index]` as numpy."""
  shape: Tuple[int, ...]
  dtype: np.dtype
  read: Callable[[Index], np.ndarray]

  def full(self) -> np.ndarray:
    return self.read(tuple(slice(None) for _ in self.shape))

  def transposed(self) -> "LazyArray":
    """The 2-D transpose, reading transposed slices (torch Linear [out, in] -> [in, out])."""
    assert len(self.shape) == 2, self.shape

    def read(index: Index) -> np.ndarray:
      rows, cols = (tuple(index) + (slice(None),) * 2)[:2]
      return self.read((cols, rows)).T

    return LazyArray(shape=self.shape[::-1], dtype=self.dtype, read=read)


def from_numpy(array: np.ndarray) -> LazyArray:
  return LazyArray(shape=tuple(array.shape), dtype=array.dtype, read=lambda index: array[index])


def _index_key(index: Index):
  return tuple((s.start, s.stop, s.step) if isinstance(s, slice) else s for s in index)


def materialize(arrays: Mapping[str, LazyArray], dtype,
                shardings: Optional[Mapping[str, jax.sharding.Sharding]] = None
                ) -> Dict[str, object]:
  """Reads every array: numpy of `dtype`, or jax.Arrays placed with `shardings[name]`."""
  dtype = np.dtype(dtype)
  out = {}
  for name, lazy in arrays.items():
    if shardings is None:
      out[name] = np.asarray(lazy.full(), dtype=dtype)
      continue
    cache = {}  # replicated shards ask for the same slice once per device: read it once.

    def callback(index: Index, lazy=lazy, cache=cache):
      key = _index_key(index)
      if key not in cache:
        cache[key] = np.asarray(lazy.read(index), dtype=dtype)
      return cache[key]

    out[name] = jax.make_array_from_callback(lazy.shape, shardings[name], callback, dtype=dtype)
  return out
