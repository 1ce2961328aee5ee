"""Device meshes (`data`, `model`) and t5x's logical axis rules, plus replicated prompt axes.

Parameters carry logical axis names (see models/layers.py); the rules below map them onto mesh
axes exactly as t5x's `standard_logical_axis_rules()` does with one parameter- and one
activation-partitioning dimension: batch on `data`; vocab, mlp, heads and joined_kv on `model`;
everything else (embed, kv, length, relpos buckets, and every prompt axis) replicated.
"""
import contextlib
import functools
from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from prompt_jax.errors import ConfigError

LogicalRules = Sequence[Tuple[str, Optional[str]]]

# t5x.partitioning.standard_logical_axis_rules(activation_partitioning_dims=1,
# parameter_partitioning_dims=1).
T5X_STANDARD_RULES: LogicalRules = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("joined_kv", "model"),
    ("relpos_buckets", None),
    ("abspos_buckets", None),
    ("length", None),
    ("layers", None),
    ("stack", None),
    ("mlp_activations", None),
)

# Prompts are small: replicate them everywhere (as google-research/prompt-tuning does).
PROMPT_RULES: LogicalRules = (
    ("prompt", None),
    ("prompt_embed", None),
    ("prompt_layers", None),
    ("prompt_tasks", None),  # multi-task prompts' per-task tables
    ("prompt_rank", None),
    ("prompt_mlp", None),
    ("prompt_vocab", None),  # IPT's [V, H] table
    ("prompt_phm", None),  # PHM's n x n rule matrices (and their count)
    ("prompt_phm_in", None),
    ("prompt_phm_out", None),
    ("prompt_mlp_in", None),  # the input side of a square [m, m] kernel (LSTM recurrence)
    ("prompt_kernel", None),  # TextCNN kernel widths
)


def logical_axis_rules(extra_rules: LogicalRules = ()) -> Tuple[Tuple[str, Optional[str]], ...]:
  """t5x's standard rules + prompt rules; `extra_rules` come first and so take precedence."""
  return tuple(extra_rules) + tuple(T5X_STANDARD_RULES) + tuple(PROMPT_RULES)


def create_mesh(num_partitions: int = 1, devices: Optional[Sequence[Any]] = None,
                model_parallel_submesh: Optional[Tuple[int, ...]] = None) -> Mesh:
  """A (`data`, `model`) mesh with `num_partitions` devices along `model`.

  `model_parallel_submesh` (a device tile, as t5x's flag of that name) fixes the number of model
  partitions to its product and lets `mesh_utils` lay the tile out on the physical topology.
  """
  devices = list(devices) if devices is not None else jax.devices()
  if model_parallel_submesh is not None:
    num_partitions = int(np.prod(model_parallel_submesh))
  if num_partitions < 1 or len(devices) % num_partitions:
    raise ConfigError(
        f"NUM_PARTITIONS={num_partitions} must divide the {len(devices)} devices here; choose "
        f"one of {[d for d in range(1, len(devices) + 1) if len(devices) % d == 0]} "
        f"(--gin.NUM_PARTITIONS=...)")
  shape = (len(devices) // num_partitions, num_partitions)
  try:
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, ("data", "model"))


def check_divisible(shapes: Any, shardings: Any) -> None:
  """Every parameter dimension split over mesh axes is a multiple of their devices (else jax
  refuses to place it, deep in a checkpoint read): a ConfigError naming NUM_PARTITIONS and the
  largest that would fit. `shapes` / `shardings`: {path: array or ShapeDtypeStruct} /
  {path: NamedSharding}."""
  split = []  # (path, shape, size, devices, axes) of each split dimension
  for path, sharding in shardings.items():
    shape = tuple(shapes[path].shape)
    for size, axes in zip(shape, sharding.spec):
      axes = () if axes is None else axes if isinstance(axes, tuple) else (axes,)
      if axes:
        split.append((path, shape, size, int(np.prod([sharding.mesh.shape[a] for a in axes])),
                      axes))
  bad = [s for s in split if s[2] % s[3]]
  if not bad:
    return
  path, shape, size, devices, axes = bad[0]
  mesh = shardings[path].mesh
  partitions = mesh.shape.get("model", 1)
  sizes = [s[2] for s in split if "model" in s[4]]
  fits = [n for n in range(1, mesh.size + 1)
          if mesh.size % n == 0 and all(size % n == 0 for size in sizes)]
  names = ", ".join(f"'{a}'" for a in axes)
  raise Indivisible(partitions, f"{path} {shape} along a dimension of {size} over {devices} "
                    f"devices ({names} mesh axis), which do not divide it", max(fits))


class Indivisible(ConfigError):
  """check_divisible's refusal: `detail` names the array split, `largest` the largest model
  axis (NUM_PARTITIONS) the model fits; a command with its own flags words it in them."""

  def __init__(self, partitions: int, detail: str, largest: int):
    super().__init__(f"NUM_PARTITIONS={partitions} splits {detail}; the largest NUM_PARTITIONS "
                     f"this model fits is {largest}")
    self.detail, self.largest = detail, largest


def logical_specs(boxed_variables: Any) -> Any:
  """Logical PartitionSpecs of an (abstract) boxed variable tree from `Module.init`."""
  return nn.get_partition_spec(boxed_variables)


def logical_to_sharding(specs: Any, mesh: Mesh, rules: Optional[LogicalRules] = None) -> Any:
  """Logical PartitionSpecs -> NamedShardings on `mesh`."""
  return nn.logical_to_mesh_sharding(specs, mesh, list(rules or logical_axis_rules()))


def data_sharding(mesh: Mesh) -> NamedSharding:
  """Batch dimension split over `data`, the rest replicated."""
  return NamedSharding(mesh, PartitionSpec("data"))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def to_host(x: Any) -> np.ndarray:
  """The whole value of `x` on every process: an array split over devices of other processes
  (rows over `data` across hosts, a parameter over a `model` axis that spans processes) is
  all-gathered first, where `jax.device_get` refuses it."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


@contextlib.contextmanager
def axis_rules(mesh: Mesh, rules: Optional[LogicalRules] = None):
  """Context in which activations' logical constraints resolve to `mesh` axes (and in which
  `broadcast_batch` knows how many data shards the batch has)."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules or logical_axis_rules())):
    yield


def batch_shards() -> Tuple[Tuple[str, ...], int]:
  """(mesh axes of the logical 'batch' axis, their total size) in the current `axis_rules`
  context; ((), 1) outside one (e.g. under t5x's own partitioner)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return (), 1
  axes = nn.logical_to_mesh_axes(("batch",))[0]
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  axes = tuple(a for a in axes if a in mesh.shape)
  return axes, int(np.prod([mesh.shape[a] for a in axes], dtype=np.int64))


def broadcast_batch(x: jax.Array, shape: Sequence[int]) -> jax.Array:
  """`jnp.broadcast_to(x, shape)` for one value per batch, shape = [B, *S] and x [*S] or [1, *S],
  with a backward pass that does not depend on the process topology (any other x: as
  jnp.broadcast_to).

  The gradient of a broadcast sums the cotangent over the batch. Under data parallelism XLA does
  that as one all-reduce, whose summation order is that of the collective's implementation: in
  one process XLA adds the devices' partial sums in rank order, across processes gloo/NCCL add
  them around a ring, so 2 processes x 2 devices and 1 process x 4 devices train prompts that
  differ in the last bits (tests/train/test_distributed.py). Here each data shard sums its own
  rows, the D partial sums [D, *S] are all-gathered (exact) and added in shard order: the same
  float32 operations on every topology with D data shards, so the gradient of a prompt shared by
  the batch is bitwise topology-independent. The cost: an all-gather of D prompt-sized arrays
  instead of an all-reduce of one.
  """
  shape = tuple(int(d) for d in shape)
  axes, shards = batch_shards()
  if (x.shape not in (shape[1:], (1,) + shape[1:]) or shards == 1 or shape[0] % shards):
    return jnp.broadcast_to(x, shape)
  return _ordered_broadcast(x.reshape(shape[1:]), shape, axes, shards)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _ordered_broadcast(x, shape, axes, shards):
  return jnp.broadcast_to(x, shape)


def _ordered_broadcast_fwd(x, shape, axes, shards):
  return jnp.broadcast_to(x, shape), None


def _ordered_broadcast_bwd(shape, axes, shards, _, ct):
  unconstrained = (PartitionSpec.UNCONSTRAINED,) * (len(shape) - 1)
  ct = ct.reshape((shards, shape[0] // shards) + shape[1:])  # [D, B/D, *S]
  partial = jax.lax.with_sharding_constraint(
      ct.sum(axis=1), PartitionSpec(axes, *unconstrained))  # [D, *S]: each shard its own rows
  partial = jax.lax.with_sharding_constraint(partial, PartitionSpec(None, *unconstrained))
  total = functools.reduce(lambda a, b: a + b, [partial[i] for i in range(shards)])  # [*S]
  return (total,)


_ordered_broadcast.defvjp(_ordered_broadcast_fwd, _ordered_broadcast_bwd)
