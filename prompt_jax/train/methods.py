"""What the trainer does for a prompt method beyond the step, driven by its spec:

  * `RepresentationCache`: methods that read the frozen encoder's pooled representation of the
    raw input (IDPG's M(x), `spec.representation_pooling`) would run the frozen encoder once more
    in every step. The representation of an example depends only on its tokens and the frozen
    weights, so the loop keeps it on the host, keyed by the row's encoder input tokens: one
    jitted frozen-encoder call per batch that has rows it has not seen (the whole batch, one
    shape, no recompilation), i.e. one extra encoder pass per example per run on a static task,
    none in later epochs. The loop adds it to the batch as `prompt_representation` [B, H], which
    the model uses instead of computing it.
  * `auxiliary_loss`: a spec's extra training objective term `fn(params) -> scalar` (wayward
    prompts' gamma * distance to the embedded discrete prompt), added inside the jitted step.
  * `summary_fn`: a spec's `summaries(trainable params) -> {name: scalar}` (e.g. the DPT rank
    probe's rank), jitted, evaluated on device at each stats period only and written with the
    train summaries.
"""
from typing import Any, Callable, Dict, Mapping, Optional

import jax
import numpy as np
from jax.sharding import PartitionSpec

from prompt_jax import partitioning
from prompt_jax.models import T5
from prompt_jax.train.state import PROMPT_REPRESENTATION

PyTree = Any
DEFAULT_MAX_ENTRIES = 1 << 20  # 4 KiB each at H = 1024: 4 GiB of host memory at most


def _any_process(flag: bool) -> bool:
  """True on every process if it is on any (all must make the same jitted calls)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))


class RepresentationCache:
  """Host-side per-example cache of `T5.encoder_representation` (see module docstring)."""

  def __init__(self, model: T5, frozen: PyTree, frozen_shardings: PyTree, mesh,
               max_entries: int = DEFAULT_MAX_ENTRIES):
    self._mesh = mesh
    self._frozen = frozen
    self._data = partitioning.data_sharding(mesh)
    self._fn = jax.jit(
        lambda params, tokens: model.apply({"params": params}, tokens,
                                           method=T5.encoder_representation),
        in_shardings=(frozen_shardings, self._data), out_shardings=self._data)
    self._table: Dict[bytes, np.ndarray] = {}
    self._max_entries = max_entries
    self.encoder_calls = 0  # jitted frozen-encoder calls made (for tests and logs)

  def __len__(self) -> int:
    return len(self._table)

  def _compute(self, tokens: np.ndarray) -> np.ndarray:
    """[b, H] representations of this process's rows (one global jitted call)."""
    global_tokens = jax.make_array_from_process_local_data(self._data, tokens)
    with partitioning.axis_rules(self._mesh):
      out = self._fn(self._frozen, global_tokens)  # [B, H] on `data`
    self.encoder_calls += 1
    if jax.process_count() == 1:
      return np.asarray(out)
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.global_array_to_host_local_array(
        out, self._mesh, PartitionSpec("data")))

  def add_to(self, batch: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """`batch` (this process's rows) + `prompt_representation` [b, H] from the cache."""
    tokens = np.asarray(batch["encoder_input_tokens"])
    keys = [row.tobytes() for row in tokens]
    missing = [i for i, k in enumerate(keys) if k not in self._table]
    fresh = None
    if _any_process(bool(missing)):
      fresh = self._compute(tokens)
      for i in missing:
        if len(self._table) < self._max_entries:
          self._table[keys[i]] = fresh[i]
    rows = [self._table[k] if k in self._table else fresh[i] for i, k in enumerate(keys)]
    out = dict(batch)
    out[PROMPT_REPRESENTATION] = np.stack(rows)  # [b, H]
    return out


def representation_cache(spec, run, max_entries: int = DEFAULT_MAX_ENTRIES
                         ) -> Optional[RepresentationCache]:
  """A cache when the run's method reads the frozen encoder's representation, else None."""
  if spec is None or spec.representation_pooling is None:
    return None
  return RepresentationCache(run.model, run.frozen, run.frozen_shardings, run.mesh, max_entries)


def summary_fn(spec) -> Optional[Callable[[PyTree], Dict[str, float]]]:
  """params -> {name: float} of the spec's summaries (jitted, fetched once), or None."""
  if spec is None:
    return None
  fn = jax.jit(spec.summaries)  # {} for most methods: a call that computes nothing

  def host(params: PyTree) -> Dict[str, float]:
    values = jax.device_get(fn(params))
    return {k: float(v) for k, v in values.items()}
  return host


def auxiliary_loss(spec, config, vocabulary=None) -> Optional[Callable[[PyTree], Any]]:
  """The spec's auxiliary loss `fn(params) -> scalar` for the train step, or None."""
  if spec is None:
    return None
  from prompt_jax.prompts import specs  # pylint: disable=g-import-not-at-top
  return spec.auxiliary_loss(specs.Backbone(config, vocabulary=vocabulary))
