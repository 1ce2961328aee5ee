"""Sharded restore onto a 4 (data) x 2 (model) mesh of 8 forced host devices, in a subprocess
(XLA_FLAGS must be set before jax starts; the suite itself runs with one device)."""
import os
import subprocess
import sys
import textwrap

from prompt_jax import checkpoints

_SCRIPT = textwrap.dedent("""
    import sys
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from prompt_jax import checkpoints
    from prompt_jax.checkpoints import tree

    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))

    def sharding_of(path):
      if path == "token_embedder/embedding":
        return NamedSharding(mesh, P("model", None))  # vocab on model
      if path.endswith("/out/kernel") or path.endswith("/wo/kernel"):
        return NamedSharding(mesh, P("model", None))  # [heads*kv | mlp, embed]
      if path.endswith("/kernel"):
        return NamedSharding(mesh, P(None, "model"))  # [embed, heads*kv | mlp | vocab]
      return NamedSharding(mesh, P())  # norms, relpos tables: replicated

    for path in sys.argv[1:]:
      config, host = checkpoints.load(path)
      shardings = tree.unflatten({k: sharding_of(k) for k in tree.flatten(host)})
      for arg in (sharding_of, shardings):
        _, sharded = checkpoints.load(path, config, shardings=arg)
        flat_host, flat = tree.flatten(host), tree.flatten(sharded)
        assert sorted(flat) == sorted(flat_host)
        for name, array in flat.items():
          assert isinstance(array, jax.Array), name
          assert array.sharding == sharding_of(name), (name, array.sharding)
          assert array.dtype == np.float32
          np.testing.assert_array_equal(np.asarray(array), flat_host[name], err_msg=name)
        kernel = flat["encoder/layers_0/mlp/wi_0/kernel"]
        assert {s.data.shape for s in kernel.addressable_shards} == {(32, 32)}
        assert len(kernel.addressable_shards) == 8
      print("sharded ok", checkpoints.detect_format(path))
""")


def test_sharded_restore_on_8_devices(hf_models, tmp_path):
  hf_dir = hf_models["t5_1_1"].dir
  _, params = checkpoints.load(hf_dir)
  legacy = checkpoints.save(tmp_path / "legacy", params, step=1)
  orbax = checkpoints.save(tmp_path / "orbax", params, step=1, format="t5x_orbax")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _SCRIPT, str(hf_dir), legacy, orbax],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split("\n")[:3] == [
      "sharded ok hf", "sharded ok t5x_legacy", "sharded ok t5x_orbax"]
