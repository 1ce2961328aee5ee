"""The same weights as HF, t5x legacy and t5x orbax checkpoints load identically; save writes
t5x's layout, atomically; detection finds the latest complete step."""
import json
import os

import msgpack
import numpy as np
import pytest

from prompt_jax import checkpoints
from prompt_jax.checkpoints import storage
from prompt_jax.checkpoints import t5x_legacy
from prompt_jax.checkpoints import tree


def _assert_same(a, b):
  fa, fb = tree.flatten(a), tree.flatten(b)
  assert sorted(fa) == sorted(fb)
  for key in fa:
    assert np.asarray(fa[key]).dtype == np.asarray(fb[key]).dtype, key
    np.testing.assert_array_equal(np.asarray(fa[key]), np.asarray(fb[key]), err_msg=key)


@pytest.mark.parametrize("name", ["t5_1_0", "t5_1_1"])
def test_hf_legacy_and_orbax_load_identical_params(hf_models, tmp_path, name):
  config, params = checkpoints.load(hf_models[name].dir)
  legacy_dir = checkpoints.save(tmp_path / "legacy", params, step=7)
  orbax_dir = checkpoints.save(tmp_path / "orbax", params, step=7, format="t5x_orbax")
  assert legacy_dir == str(tmp_path / "legacy" / "checkpoint_7")
  assert checkpoints.detect_format(legacy_dir) == "t5x_legacy"
  assert checkpoints.detect_format(orbax_dir) == "t5x_orbax"
  assert checkpoints.detect_format(tmp_path / "orbax") == "t5x_orbax"
  for path in (legacy_dir, orbax_dir, tmp_path / "legacy", tmp_path / "orbax"):
    loaded_config, loaded = checkpoints.load(path)
    assert loaded_config == config, path  # inferred from shapes alone
    _assert_same(loaded, params)
    _, loaded = checkpoints.load(path, config)
    _assert_same(loaded, params)


def test_legacy_layout_is_t5xs(hf_models, tmp_path):
  _, params = checkpoints.load(hf_models["t5_1_1"].dir)
  ckpt = checkpoints.save(tmp_path, params, step=3)
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_3"]  # no temporary directory left
  with open(os.path.join(ckpt, "checkpoint"), "rb") as f:
    raw = msgpack.unpackb(f.read(), raw=False)  # ext types left undecoded
  assert list(raw) == ["version", "optimizer"] and raw["version"] == 3
  assert list(raw["optimizer"]) == ["state", "target"]
  assert raw["optimizer"]["state"]["step"].code == 1  # flax ndarray ext, int32 scalar
  flat = tree.flatten(raw["optimizer"]["target"], is_leaf=lambda v: "driver" in v)
  zarr = {k for k, v in flat.items() if isinstance(v, dict)}
  inline = {k for k, v in flat.items() if isinstance(v, msgpack.ExtType)}
  assert inline == {k for k in flat if k.endswith("/scale") or k.endswith("/rel_embedding")}
  assert zarr == set(flat) - inline
  spec = flat["encoder/layers_0/attention/query/kernel"]
  assert spec["driver"] == "zarr" and spec["kvstore"]["driver"] == "file"
  assert spec["kvstore"]["path"].rstrip("/") == "target.encoder.layers_0.attention.query.kernel"
  dirs = sorted(d for d in os.listdir(ckpt) if d != "checkpoint")
  assert dirs == sorted("target." + k.replace("/", ".") for k in zarr)
  with open(os.path.join(ckpt, "target.token_embedder.embedding", ".zarray")) as f:
    zarray = json.load(f)
  assert zarray["compressor"]["id"] == "gzip" and zarray["dtype"] == "<f4"
  assert zarray["shape"] == [128, 32]


def test_choose_chunk_shape_as_t5x():
  assert t5x_legacy.choose_chunk_shape([32128, 4], 16 * 1024 * 1024) == [32128, 4]
  # 10240 -> 5120 -> 2560 (its next divisors), the largest dimension each time.
  assert t5x_legacy.choose_chunk_shape([4096, 10240], 16 * 1024 * 1024) == [4096, 2560]


def test_optimizer_state_is_never_read(hf_models, tmp_path):
  """A legacy checkpoint whose optimizer state is garbage and points at missing arrays."""
  _, params = checkpoints.load(hf_models["t5_1_0"].dir)
  ckpt = checkpoints.save(tmp_path, params, step=1)
  path = os.path.join(ckpt, "checkpoint")
  with open(path, "rb") as f:
    raw = msgpack.unpackb(f.read(), raw=False)
  raw["optimizer"]["state"]["param_states"] = {
      "garbage": msgpack.ExtType(1, b"\xc1not an array"),
      "missing": {"driver": "zarr", "kvstore": {"driver": "file", "path": "state.missing"},
                  "metadata": {"shape": [4]}},
  }
  with open(path, "wb") as f:
    f.write(msgpack.packb(raw))
  _, loaded = checkpoints.load(ckpt)
  _assert_same(loaded, params)


def test_latest_complete_step_and_checkpoint_file_paths(hf_models, tmp_path):
  _, params = checkpoints.load(hf_models["t5_1_0"].dir)
  newer = tree.unflatten({k: v + 1 for k, v in tree.flatten(params).items()})
  checkpoints.save(tmp_path, params, step=2)
  checkpoints.save(tmp_path, newer, step=10)
  os.makedirs(tmp_path / "checkpoint_20")  # incomplete: no msgpack file
  os.makedirs(tmp_path / "checkpoint_30.tmp-123")  # an interrupted save
  _, loaded = checkpoints.load(tmp_path)
  _assert_same(loaded, newer)
  _, loaded = checkpoints.load(tmp_path / "checkpoint_2" / "checkpoint")
  _assert_same(loaded, params)
  with pytest.raises(checkpoints.CheckpointError, match="checkpoint_10 already exists"):
    checkpoints.save(tmp_path, params, step=10)


def test_orbax_save_of_an_earlier_step_is_refused_not_skipped(hf_models, tmp_path):
  """orbax's manager skips (returns False for) a step at or below the latest in the directory,
  a t5x legacy checkpoint_<N> included: the save returned a path that was never written."""
  _, params = checkpoints.load(hf_models["t5_1_0"].dir)
  checkpoints.save(tmp_path / "orbax", params, step=500, format="t5x_orbax")
  checkpoints.save(tmp_path / "mixed", params, step=300)  # legacy msgpack
  for d, latest in (("orbax", 500), ("mixed", 300)):
    with pytest.raises(checkpoints.CheckpointError,
                       match=f"already holds checkpoint_{latest}; orbax saves only later steps"):
      checkpoints.save(tmp_path / d, params, step=100, format="t5x_orbax")
    assert sorted(os.listdir(tmp_path / d)) == [f"checkpoint_{latest}"]
  after = checkpoints.save(tmp_path / "orbax", params, step=501, format="t5x_orbax")
  assert os.path.isdir(after)


def test_failed_save_leaves_nothing(hf_models, tmp_path, monkeypatch):
  _, params = checkpoints.load(hf_models["t5_1_0"].dir)
  calls = []

  def failing(name, array, gcs):
    calls.append(name)
    if len(calls) == 3:
      raise OSError("disk full")
    return original(name, array, gcs)

  original = t5x_legacy._relative_spec
  monkeypatch.setattr(t5x_legacy, "_relative_spec", failing)
  with pytest.raises(OSError, match="disk full"):
    checkpoints.save(tmp_path, params, step=4)
  assert os.listdir(tmp_path) == []


def test_gcs_code_path_through_a_kvstore(tmp_path, hf_models):
  """gs:// reads go through tensorstore kvstores: drive the same code with the file driver."""
  _, params = checkpoints.load(hf_models["t5_1_0"].dir)
  ckpt = checkpoints.save(tmp_path, params, step=1)
  with open(os.path.join(ckpt, "checkpoint"), "rb") as f:
    version, local = t5x_legacy.read_target(f, "local")
  kv_file = storage.KvFile({"driver": "file", "path": ckpt}, "checkpoint", read_ahead=256)
  version_kv, remote = t5x_legacy.read_target(kv_file, "kvstore")
  assert version == version_kv == 3
  _assert_same(local, remote)
  spec = t5x_legacy.absolute_spec(
      {"driver": "zarr", "kvstore": {"driver": "gfile", "path": "target.a.kernel/"},
       "metadata": {"shape": [2, 2], "chunks": [2, 2], "compressor": {"id": "gzip"}}},
      "gs://my-bucket/models/t5/checkpoint_5")
  assert spec["kvstore"] == {"driver": "gcs", "bucket": "my-bucket",
                             "path": "models/t5/checkpoint_5/target.a.kernel"}
  assert spec["metadata"] == {"shape": [2, 2]}
  assert storage.kvstore_spec("gs://b") == {"driver": "gcs", "bucket": "b", "path": ""}


@pytest.mark.parametrize("use_ocdbt", [False, True], ids=["t5x_zarr_dirs", "ocdbt"])
def test_orbax_variants(hf_models, tmp_path, use_ocdbt):
  from prompt_jax.checkpoints import orbax_format  # pylint: disable=g-import-not-at-top

  config, params = checkpoints.load(hf_models["t5_1_1"].dir)
  ckpt = orbax_format.write_checkpoint(str(tmp_path), params, 5, use_ocdbt=use_ocdbt)
  state_dir = os.listdir(os.path.join(ckpt, "state"))
  assert ("target.token_embedder.embedding" in state_dir) != use_ocdbt
  assert "_METADATA" in state_dir
  for path in (ckpt, os.path.join(ckpt, "state")):
    loaded_config, loaded = checkpoints.load(path)
    assert loaded_config == config
    _assert_same(loaded, params)
