"""Mesh partitioning: 4 (data) x 2 (model) on 8 fake CPU devices equals one device."""
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from prompt_jax import partitioning
from tests import numerics


def test_sharded_forward_equals_single_device_and_kernels_split_on_model(tmp_path):
  script = pathlib.Path(__file__).with_name("sharded_forward_check.py")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = tmp_path / "logits.npz"
  proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                        env=env, timeout=300)
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
  with pytest.raises(ValueError, match="num_partitions=3 must divide"):
    partitioning.create_mesh(3, devices=[object()] * 8)
