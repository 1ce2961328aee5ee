"""HF T5 dirs: config.json -> T5Config and every tensor -> its t5x parameter, value by value."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax import checkpoints
from prompt_jax.checkpoints import tree
from tests.checkpoints.hf_models import expected_from_torch


@pytest.mark.parametrize("name", ["t5_1_0", "t5_1_1"])
@pytest.mark.parametrize("variant", ["safetensors", "pytorch_model.bin"])
def test_hf_params_equal_torch_weights(hf_models, name, variant):
  model = hf_models[name]
  path = model.dir if variant == "safetensors" else model.bin_dir
  assert checkpoints.detect_format(path) == "hf"
  config, params = checkpoints.load(path)
  assert config == model.config
  flat = tree.flatten(params)
  expected = expected_from_torch(model.state, model.config)
  assert sorted(flat) == sorted(expected)
  for key, value in expected.items():
    assert flat[key].dtype == np.float32
    np.testing.assert_array_equal(flat[key], value, err_msg=key)


def test_untied_t5_1_1_keeps_a_distinct_lm_head(hf_models):
  model = hf_models["t5_1_1"]
  saved = json.loads((model.dir / "config.json").read_text())
  assert saved["tie_word_embeddings"] is False
  assert not np.array_equal(model.state["lm_head.weight"], model.state["shared.weight"])
  _, params = checkpoints.load(model.dir)
  np.testing.assert_array_equal(params["decoder"]["logits_dense"]["kernel"],
                                model.state["lm_head.weight"].T)


def test_tied_t5_1_0_has_no_logits_dense(hf_models):
  _, params = checkpoints.load(hf_models["t5_1_0"].dir)
  assert "logits_dense" not in params["decoder"]


def test_dtype_and_given_config(hf_models):
  model = hf_models["t5_1_1"]
  config, params = checkpoints.load(model.dir, model.config, dtype=jnp.bfloat16)
  assert config is model.config
  assert params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"].dtype == jnp.bfloat16


def test_config_json_disagreeing_with_config_is_an_error(hf_models):
  model = hf_models["t5_1_1"]
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"config.json has logits_via_embedding=False but the config expects "
                           r"True"):
    checkpoints.load(model.dir, model.config.replace(logits_via_embedding=True))


def test_hf_name_mapping_edge_cases():
  from prompt_jax.checkpoints import hf  # pylint: disable=g-import-not-at-top

  assert hf.t5x_name("encoder.embed_tokens.weight", tied=True) is None
  assert hf.t5x_name("lm_head.weight", tied=True) is None
  assert hf.t5x_name("lm_head.weight", tied=False) == "decoder/logits_dense/kernel"
  # Old HF T5 files carry an unused cross-attention relative table; later blocks have none.
  assert hf.t5x_name("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
                     tied=True) is None
  assert hf.t5x_name("encoder.block.3.layer.0.SelfAttention.relative_attention_bias.weight",
                     tied=True) is None
  assert (hf.t5x_name("decoder.block.5.layer.1.layer_norm.weight", tied=True)
          == "decoder/layers_5/pre_cross_attention_layer_norm/scale")
  assert (hf.t5x_name("decoder.block.5.layer.2.DenseReluDense.wi_1.weight", tied=True)
          == "decoder/layers_5/mlp/wi_1/kernel")
  assert (hf.t5x_name("encoder.block.1.layer.1.DenseReluDense.wo.weight", tied=True)
          == "encoder/layers_1/mlp/wo/kernel")


def test_file_inside_an_hf_dir_resolves_to_it(hf_models):
  assert checkpoints.detect_format(hf_models["t5_1_0"].dir / "model.safetensors") == "hf"


@pytest.mark.parametrize("kind", ["t5_1_1", "t5_1_1_resaved", "mt5"])
def test_t5_1_1_saved_by_transformers_5_gives_hf_logits(tmp_path, kind):
  """transformers >= 5 writes `tie_word_embeddings: true` for every T5 and marks T5 1.1's
  unscaled output projection with `scale_decoder_outputs: false` (saved once as shared.weight
  when tied; a re-saved untied model keeps its own lm_head.weight). For mT5 it writes neither
  flag, and mT5 is never scaled (it was loaded as T5 1.0: logits x d_model^-0.5). Each loads to
  HF's logits, within float32 rounding of a float64 forward pass."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import T5  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  mt5 = kind == "mt5"
  hf_config = (transformers.MT5Config if mt5 else transformers.T5Config)(
      vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
      num_heads=4, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
  model = (transformers.MT5ForConditionalGeneration if mt5
           else transformers.T5ForConditionalGeneration)(hf_config).eval()
  if kind == "t5_1_1_resaved":  # an untied (transformers 4) checkpoint, loaded and saved again
    model.lm_head.weight = torch.nn.Parameter(torch.randn(64, 32))
  model.save_pretrained(tmp_path / "hf")
  saved = json.loads((tmp_path / "hf" / "config.json").read_text())
  # What transformers 5 writes.
  assert saved.get("scale_decoder_outputs") is (None if mt5 else False), saved
  config, params = checkpoints.load(tmp_path / "hf")
  assert not config.logits_via_embedding
  enc = np.array([[5, 6, 7, 8, 1]], np.int32)
  dec_in = np.array([[0, 9, 10]], np.int32)
  ours = np.asarray(T5(config.replace(dtype=jnp.float32)).apply(
      {"params": params}, enc, dec_in, np.array([[9, 10, 1]], np.int32), enable_dropout=False))
  with torch.no_grad():
    ids = dict(input_ids=torch.tensor(enc, dtype=torch.long),
               decoder_input_ids=torch.tensor(dec_in, dtype=torch.long))
    theirs = model(**ids).logits.numpy()
    exact = model.double()(**ids).logits.numpy()
  from tests import numerics  # pylint: disable=g-import-not-at-top
  numerics.assert_close(ours, theirs, exact, what="logits of a transformers-5 T5 1.1")


def test_an_untied_config_without_lm_head_is_a_missing_parameter(hf_models, tmp_path):
  """`tie_word_embeddings: false` (T5 1.1 as transformers 4 writes it) and no lm_head.weight:
  the file is incomplete. The embedding must not stand in for the projection (only a
  transformers 5 file, whose config says the two are tied, saves it once as shared.weight)."""
  import shutil  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  ckpt = shutil.copytree(hf_models["t5_1_1"].dir, tmp_path / "hf")
  assert json.loads((ckpt / "config.json").read_text())["tie_word_embeddings"] is False
  weights = load_file(ckpt / "model.safetensors")
  del weights["lm_head.weight"]
  save_file(weights, str(ckpt / "model.safetensors"))
  with pytest.raises(tree.CheckpointError, match="is missing parameter "
                     "'decoder/logits_dense/kernel'"):
    checkpoints.load(ckpt)
