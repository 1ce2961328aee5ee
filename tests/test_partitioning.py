"""Mesh partitioning: 4 (data) x 2 (model) on 8 fake CPU devices equals one device."""
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from prompt_jax import partitioning
from tests import numerics


# 'xla': jax.nn's kernel, given the encoder's padding as sequence lengths (layers.PaddedBias),
# with the heads split on 'model'.
@pytest.mark.parametrize("attention", ["auto", "xla"])
def test_sharded_forward_equals_single_device_and_kernels_split_on_model(tmp_path, attention):
  script = pathlib.Path(__file__).with_name("sharded_forward_check.py")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = tmp_path / "logits.npz"
  proc = subprocess.run([sys.executable, str(script), str(out), attention], capture_output=True,
                        text=True, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["devices"] == 8 and result["mesh"] == {"data": 4, "model": 2}
  logits = np.load(out)
  # Model-parallel contractions sum in another order: bounded by the single-device float32
  # error against float64 (tests/numerics.py).
  numerics.assert_close(logits["sharded"], logits["single"], logits["single64"],
                        what="4 x 2 mesh logits")
  assert result["wi_0"] == ["None", "model"]  # ('embed', 'mlp')
  assert result["wo"] == ["model", "None"]  # ('mlp', 'embed')
  assert result["query"] == ["None", "model"]  # ('embed', 'joined_kv')
  assert result["out"] == ["model", "None"]  # ('joined_kv', 'embed')
  assert result["embedding"] == ["model", "None"]  # ('vocab', 'embed')
  assert result["norm"] == ["None"]  # replicated
  assert result["logits"][0] == "data"  # batch on 'data'
  assert result["wi_0_shard_shape"] == [32, 32]  # mlp 64 split in two


def test_single_device_mesh_and_rules():
  mesh = partitioning.create_mesh(1)
  assert dict(mesh.shape) == {"data": jax.device_count(), "model": 1}
  rules = dict(partitioning.logical_axis_rules())
  assert rules["batch"] == "data" and rules["mlp"] == "model" and rules["prompt"] is None
  with pytest.raises(ValueError, match="NUM_PARTITIONS=3 must divide"):
    partitioning.create_mesh(3, devices=[object()] * 8)


BROADCAST_BATCH = """
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from prompt_jax import partitioning
mesh = partitioning.create_mesh(2)  # 4 (data) x 2 (model)
rng = np.random.default_rng(0)
prompt = jnp.asarray(rng.standard_normal((3, 16)), jnp.float32)  # [P, H]
# Cotangents of very different scales per row, so the summation order shows in the last bits.
x = (rng.standard_normal((8, 3, 16)) * np.exp(4 * rng.standard_normal((8, 1, 1)))).astype(
    np.float32)
xs = jax.device_put(x, NamedSharding(mesh, P("data")))
loss = lambda b: lambda p, x: jnp.sum(b(p, (8, 3, 16)) * x)  # gradient wrt p: x summed over B
with partitioning.axis_rules(mesh):
  grad = jax.jit(jax.grad(loss(partitioning.broadcast_batch)))
  ours = np.asarray(grad(prompt, xs))
  compiled = grad.lower(prompt, xs).compile().as_text()
  forward = np.asarray(jax.jit(partitioning.broadcast_batch, static_argnums=1)(prompt, (8, 3, 16)))
  shards = partitioning.batch_shards()
outside = partitioning.batch_shards()
partial = x.reshape(4, 2, 3, 16).sum(1)  # each data shard's own rows
in_shard_order = ((partial[0] + partial[1]) + partial[2]) + partial[3]
print(json.dumps({
    "exact": ours.tobytes() == in_shard_order.tobytes(),
    "differs_from_one_sum": ours.tobytes() != x.sum(0).tobytes(),
    "forward": forward.tobytes() == np.broadcast_to(np.asarray(prompt), (8, 3, 16)).tobytes(),
    "all_gather": "all-gather" in compiled, "all_reduce": "all-reduce" in compiled,
    "shards": [list(shards[0]), shards[1]], "outside": [list(outside[0]), outside[1]]}))
"""


def test_broadcast_batch_sums_the_gradient_in_shard_order(tmp_path):
  """The gradient of a prompt broadcast over a data-parallel batch is each data shard's own sum,
  added in shard order after an exact all-gather: the float32 operations are fixed by the number
  of data shards alone, not by how devices are spread over processes (the multi-process
  equality itself: tests/train/test_distributed.py)."""
  proc = subprocess.run([sys.executable, "-c", BROADCAST_BATCH], capture_output=True, text=True,
                        timeout=300, cwd=pathlib.Path(__file__).resolve().parents[1])
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["exact"] and result["forward"]
  # The data are chosen so that one sum over all 8 rows rounds differently: the check above
  # tells the shard order from any other.
  assert result["differs_from_one_sum"]
  assert result["all_gather"] and not result["all_reduce"]
  assert result["shards"] == [["data"], 4] and result["outside"] == [[], 1]


def test_check_divisible_names_the_parameter_and_the_largest_fitting_count():
  """A split dimension that the mesh axis does not divide is a ConfigError naming
  NUM_PARTITIONS and the largest count every split dimension allows (jax's own error came from
  deep in the checkpoint read, blamed on INITIAL_CHECKPOINT_PATH)."""
  import types  # pylint: disable=g-import-not-at-top
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  mesh = types.SimpleNamespace(shape={"data": 1, "model": 8}, size=8)
  sharded = lambda *spec: types.SimpleNamespace(mesh=mesh, spec=PartitionSpec(*spec))
  shapes = {"a": jax.ShapeDtypeStruct((16, 24), jnp.float32),
            "b": jax.ShapeDtypeStruct((12, 6), jnp.float32)}
  partitioning.check_divisible(shapes, {"a": sharded(None, "model"), "b": sharded()})
  with pytest.raises(ConfigError, match=r"NUM_PARTITIONS=8 splits b \(12, 6\) along a dimension "
                                        r"of 12 over 8 devices \('model' mesh axis\), which do "
                                        r"not divide it; the largest NUM_PARTITIONS this model "
                                        r"fits is 4"):
    partitioning.check_divisible(shapes, {"a": sharded(None, "model"), "b": sharded("model")})
