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


def test_missing_zarr_array_names_parameter(hf_models, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  _, params = checkpoints.load(hf_models["t5_1_0"].dir)
  ckpt = checkpoints.save(tmp_path, params, step=1)
  shutil.rmtree(os.path.join(ckpt, "target.decoder.layers_1.mlp.wo.kernel"))
  _raises(r"cannot open the zarr array of 'decoder/layers_1/mlp/wo/kernel'", checkpoints.load,
          ckpt)
