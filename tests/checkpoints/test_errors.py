"""Bad inputs raise one clear, one-line CheckpointError naming the path or parameter."""
import os

import pytest

from prompt_jax import checkpoints
from prompt_jax.checkpoints import tree


def _raises(match, fn, *args, **kwargs):
  with pytest.raises(checkpoints.CheckpointError, match=match) as info:
    fn(*args, **kwargs)
  assert "\n" not in str(info.value)
  return str(info.value)


def test_unknown_format_names_path_and_formats(tmp_path):
  (tmp_path / "weights.npz").write_bytes(b"not a checkpoint")
  message = _raises(r"no T5 checkpoint at", checkpoints.load, tmp_path)
  assert str(tmp_path) in message
  for looked_for in ("t5x legacy", "t5x orbax", "checkpoint_<step>", "Hugging Face",
                     "config.json", "model.safetensors", "pytorch_model.bin"):
    assert looked_for in message
  _raises(r"no T5 checkpoint at .*weights.npz", checkpoints.detect_format,
          tmp_path / "weights.npz")
  _raises(rf"checkpoint path {tmp_path}/nowhere does not exist", checkpoints.load,
          tmp_path / "nowhere")


def test_shape_mismatch_names_parameter_shapes_and_path(hf_models):
  model = hf_models["t5_1_1"]
  message = _raises(r"parameter 'encoder/layers_0/mlp/wi_0/kernel' has shape \(32, 64\) but "
                    r"the config expects \(32, 128\)", checkpoints.load, model.dir,
                    model.config.replace(mlp_dim=128))
  assert str(model.dir) in message
  _raises(r"'token_embedder/embedding' has shape \(128, 32\) but the config expects "
          r"\(256, 32\)", checkpoints.load, model.dir, model.config.replace(vocab_size=256))


def test_missing_parameter_is_named(hf_models, tmp_path):
  model = hf_models["t5_1_1"]
  _, params = checkpoints.load(model.dir)
  flat = tree.flatten(params)
  del flat["encoder/layers_1/mlp/wi_0/kernel"]
  ckpt = checkpoints.save(tmp_path, tree.unflatten(flat), step=1)
  for config in (model.config, None):  # given, or inferred from the remaining shapes
    message = _raises(r"is missing parameter 'encoder/layers_1/mlp/wi_0/kernel'",
                      checkpoints.load, ckpt, config)
    assert ckpt in message
  _raises(r"missing parameter 'encoder/layers_2/pre_attention_layer_norm/scale' \(and \d+ "
          r"more\)", checkpoints.load, model.dir, model.config.replace(num_encoder_layers=4))


def test_extra_layers_are_named(hf_models):
  model = hf_models["t5_1_0"]
  _raises(r"has parameter 'encoder/layers_1/.*' .*that the config does not expect \(config has "
          r"num_encoder_layers=1\)", checkpoints.load, model.dir,
          model.config.replace(num_encoder_layers=1))


def test_truncated_msgpack(hf_models, tmp_path):
  _, params = checkpoints.load(hf_models["t5_1_0"].dir)
  ckpt = checkpoints.save(tmp_path, params, step=1)
  path = os.path.join(ckpt, "checkpoint")
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2])
  _raises(r"checkpoint is truncated", checkpoints.load, ckpt)


def test_a_mesh_tensorflow_checkpoint_dir_is_named(tmp_path):
  """The original T5 release (gs://t5-data/pretrained_models/base/): TensorFlow's text
  `checkpoint` state file beside model.ckpt-* files. It was read as a t5x msgpack ("expected a
  map, found type byte 0x6d")."""
  (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-999900"\n'
                                       'all_model_checkpoint_paths: "model.ckpt-999900"\n')
  (tmp_path / "model.ckpt-999900.index").write_bytes(b"\0" * 16)
  _raises(r"is a TensorFlow checkpoint \(the original Mesh TensorFlow T5 release\), not t5x: "
          r"use its t5x conversion", checkpoints.load, tmp_path)


def test_missing_zarr_array_names_parameter(hf_models, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  _, params = checkpoints.load(hf_models["t5_1_0"].dir)
  ckpt = checkpoints.save(tmp_path, params, step=1)
  shutil.rmtree(os.path.join(ckpt, "target.decoder.layers_1.mlp.wo.kernel"))
  _raises(r"cannot open the zarr array of 'decoder/layers_1/mlp/wo/kernel'", checkpoints.load,
          ckpt)


def _hf_copy(model_dir, tmp_path, name="hf"):
  """A copy of an HF dir (its config.json and weights) to damage."""
  import shutil  # pylint: disable=g-import-not-at-top
  return shutil.copytree(model_dir, tmp_path / name)


def test_hf_config_json_lacking_fields_names_them(hf_models, tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  ckpt = _hf_copy(hf_models["t5_1_0"].dir, tmp_path)
  config = json.loads((ckpt / "config.json").read_text())
  del config["d_model"], config["num_heads"]
  (ckpt / "config.json").write_text(json.dumps(config))
  message = _raises(r"config.json lacks required field\(s\) d_model, num_heads \(a T5 "
                    r"config.json has vocab_size, d_model, .*\); use the model's own config.json",
                    checkpoints.load, ckpt)
  assert message.startswith(f"{ckpt}/config.json ")
  (ckpt / "config.json").write_text('{"d_model": 32,')
  _raises(rf"{ckpt}/config.json is not valid JSON \(.*\); download it again", checkpoints.load,
          ckpt)


_DAMAGES = {
    "half": lambda data: data[:len(data) // 2],
    "all_but_the_end": lambda data: data[:-10],
    "first_100_bytes": lambda data: data[:100],
    "empty": lambda data: b"",
    "html": lambda data: b"<html><body>502 Bad Gateway</body></html>\n" * 4,
    "lfs_pointer": lambda data: b"version https://git-lfs.github.com/spec/v1\noid sha256:0\n",
}


@pytest.mark.parametrize("damage", sorted(_DAMAGES))
def test_damaged_pytorch_model_bin_is_one_line_without_torch_advice(hf_models, tmp_path, damage):
  ckpt = _hf_copy(hf_models["t5_1_0"].bin_dir, tmp_path)
  weights = ckpt / "pytorch_model.bin"
  weights.write_bytes(_DAMAGES[damage](weights.read_bytes()))
  if damage == "lfs_pointer":
    message = _raises(r"pytorch_model.bin is a Git LFS pointer, not the weights; fetch them "
                      r"with `git lfs pull`", checkpoints.load, ckpt)
  else:
    message = _raises(r"pytorch_model.bin is not a readable PyTorch checkpoint \(.*truncated or "
                      r"damaged download\?\); download it again", checkpoints.load, ckpt)
  assert message.startswith(str(weights)) and "weights_only=False" not in message


@pytest.mark.parametrize("damage", sorted(_DAMAGES))
def test_damaged_model_safetensors_is_one_line(hf_models, tmp_path, damage):
  ckpt = _hf_copy(hf_models["t5_1_0"].dir, tmp_path)
  weights = ckpt / "model.safetensors"
  weights.write_bytes(_DAMAGES[damage](weights.read_bytes()))
  expect = ("is a Git LFS pointer" if damage == "lfs_pointer"
            else r"is not a readable safetensors file \(.*truncated or damaged download\?\); "
                 r"download it again")
  message = _raises(expect, checkpoints.load, ckpt)  # at open, not when a tensor is read
  assert message.startswith(str(weights))


def test_a_safetensors_entry_shorter_than_its_shape_is_one_line(hf_models, tmp_path):
  """A header entry whose byte range is smaller than shape x dtype (it read the next tensor's
  bytes as its own values, silently)."""
  import json  # pylint: disable=g-import-not-at-top
  ckpt = _hf_copy(hf_models["t5_1_0"].dir, tmp_path)
  weights = ckpt / "model.safetensors"
  data = weights.read_bytes()
  size = int.from_bytes(data[:8], "little")
  header = json.loads(data[8:8 + size])
  name = "decoder.final_layer_norm.weight"
  begin = header[name]["data_offsets"][0]
  header[name]["data_offsets"] = [begin, begin + 4]
  text = json.dumps(header).encode()
  text += b" " * (-len(text) % 8)
  weights.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size:])
  _raises(rf"tensor {name} spans 4 bytes, its shape \[32\] and dtype F32 need 128",
          checkpoints.load, ckpt)


def test_hf_index_naming_a_missing_shard(hf_models, tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  ckpt = _hf_copy(hf_models["t5_1_0"].dir, tmp_path)
  (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00002.safetensors")
  weight_map = {"shared.weight": "model-00001-of-00002.safetensors",
                "lm_head.weight": "model-00002-of-00002.safetensors"}
  (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  _raises(r"model.safetensors.index.json names shard 'model-00002-of-00002.safetensors', "
          r"which is not in ", checkpoints.load, ckpt)
  (ckpt / "model.safetensors.index.json").write_text("[]")
  _raises(r"index.json holds a JSON list, not an object", checkpoints.load, ckpt)


def test_train_from_a_truncated_pytorch_model_bin_is_one_line_exit_2(hf_models, tmp_path):
  import contextlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  from tests.train import common  # pylint: disable=g-import-not-at-top
  ckpt = _hf_copy(hf_models["t5_1_0"].bin_dir, tmp_path)
  weights = ckpt / "pytorch_model.bin"
  weights.write_bytes(weights.read_bytes()[:1000])
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = cli.main(["train", *common.flags(str(tmp_path / "run"), 1,
                                            f"--gin.INITIAL_CHECKPOINT_PATH='{ckpt}'")])
  lines = [l for l in err.getvalue().splitlines() if l.startswith("prompt-jax train: error:")]
  assert code == 2, err.getvalue()
  assert len(lines) == 1 and lines[0].endswith(
      f"{weights} is not a readable PyTorch checkpoint (torch.load(weights_only=True) failed: "
      f"truncated or damaged download?); download it again")
  assert "Traceback" not in err.getvalue()


def test_hf_config_json_with_another_layer_norm_epsilon_is_refused(hf_models, tmp_path):
  """Our layer norms use T5's 1e-6: a config.json saying otherwise would give other outputs."""
  import json  # pylint: disable=g-import-not-at-top
  ckpt = _hf_copy(hf_models["t5_1_0"].dir, tmp_path)
  config = json.loads((ckpt / "config.json").read_text())
  assert config["layer_norm_epsilon"] == 1e-6
  config["layer_norm_epsilon"] = 1e-5
  (ckpt / "config.json").write_text(json.dumps(config))
  _raises(r"config.json has layer_norm_epsilon=1e-05; prompt_jax's T5 layer norms use T5's "
          r"1e-06", checkpoints.load, ckpt)
