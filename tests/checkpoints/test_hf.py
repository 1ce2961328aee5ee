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
