"""expected_shapes, config inference and validation; and agreement with the Flax model."""
import jax
import numpy as np
import pytest

from prompt_jax.checkpoints import tree
from prompt_jax.checkpoints.tree import CheckpointError
from prompt_jax.models.config import T5Config, get_config

TINY_1_0 = T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=4, mlp_dim=24,
                    num_encoder_layers=2, num_decoder_layers=3)
TINY_1_1 = TINY_1_0.replace(mlp_activations=("gelu", "linear"), logits_via_embedding=False)


def test_expected_shapes_t5_1_1_base():
  config = get_config("t5_1_1_base")
  flat = tree.flatten(tree.expected_shapes(config))
  assert flat["token_embedder/embedding"] == (32128, 768)
  assert flat["encoder/relpos_bias/rel_embedding"] == (12, 32)
  assert flat["encoder/layers_11/attention/query/kernel"] == (768, 768)
  assert flat["encoder/layers_0/attention/out/kernel"] == (768, 768)
  assert flat["encoder/layers_0/mlp/wi_0/kernel"] == (768, 2048)
  assert flat["encoder/layers_0/mlp/wi_1/kernel"] == (768, 2048)
  assert flat["encoder/layers_0/mlp/wo/kernel"] == (2048, 768)
  assert flat["decoder/layers_11/encoder_decoder_attention/key/kernel"] == (768, 768)
  assert flat["decoder/layers_0/pre_cross_attention_layer_norm/scale"] == (768,)
  assert flat["decoder/decoder_norm/scale"] == (768,)
  assert flat["decoder/logits_dense/kernel"] == (768, 32128)
  # 12 encoder layers x 9 + 12 decoder layers x 14 + embedding, 2 relpos, 2 norms, logits.
  assert len(flat) == 12 * 9 + 12 * 14 + 6


def test_expected_shapes_t5_1_0_small():
  flat = tree.flatten(tree.expected_shapes(get_config("t5_1_0_small")))
  assert flat["encoder/layers_5/mlp/wi/kernel"] == (512, 2048)
  assert "encoder/layers_0/mlp/wi_0/kernel" not in flat
  assert "decoder/logits_dense/kernel" not in flat
  assert flat["decoder/layers_0/self_attention/query/kernel"] == (512, 512)


@pytest.mark.parametrize("config", [TINY_1_0, TINY_1_1], ids=["t5_1_0", "t5_1_1"])
def test_infer_config_inverts_expected_shapes(config):
  shapes = tree.flatten(tree.expected_shapes(config))
  assert tree.infer_config(shapes, "ckpt") == config


def test_validate_reports_first_missing_shape_and_unexpected():
  shapes = tree.flatten(tree.expected_shapes(TINY_1_1))
  del shapes["encoder/layers_1/mlp/wi_0/kernel"]
  with pytest.raises(CheckpointError, match=r"ckpt is missing parameter "
                     r"'encoder/layers_1/mlp/wi_0/kernel'.*\(16, 24\)"):
    tree.validate(shapes, TINY_1_1, "ckpt")
  shapes = tree.flatten(tree.expected_shapes(TINY_1_1))
  with pytest.raises(CheckpointError, match=r"'token_embedder/embedding' has shape \(64, 16\) "
                     r"but the config expects \(99, 16\)"):
    tree.validate(shapes, TINY_1_1.replace(vocab_size=99), "ckpt")
  with pytest.raises(CheckpointError, match=r"'decoder/layers_2/.*num_decoder_layers=2"):
    tree.validate(shapes, TINY_1_1.replace(num_decoder_layers=2), "ckpt")
  # Parameters outside the backbone (a prompt saved alongside) are ignored.
  shapes["encoder/prompt/prompt"] = (5, 16)
  assert "encoder/prompt/prompt" not in tree.validate(shapes, TINY_1_1, "ckpt")


def test_resolve_shardings_forms():
  device = jax.devices()[0]
  single = jax.sharding.SingleDeviceSharding(device)
  names = ["a/b", "c"]
  assert tree.resolve_shardings(single, names) == {"a/b": single, "c": single}
  assert tree.resolve_shardings(lambda n: single, names) == {"a/b": single, "c": single}
  assert tree.resolve_shardings({"a": {"b": single}, "c": single}, names)["a/b"] is single
  with pytest.raises(CheckpointError, match="no entry for parameter 'c'"):
    tree.resolve_shardings({"a": {"b": single}}, names)


def _model_param_shapes(config):
  """Parameter shapes of `prompt_jax.models.T5(config).init`, without computing anything."""
  try:
    from prompt_jax import models  # pylint: disable=g-import-not-at-top
    model_cls = models.T5
  except Exception as e:  # pylint: disable=broad-except
    pytest.skip(f"prompt_jax.models.T5 does not import yet: {e}")
  from flax.core import meta  # pylint: disable=g-import-not-at-top

  tokens = np.ones((2, 6), np.int32)
  model = model_cls(config)
  variables = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), tokens, tokens, tokens))
  return jax.tree_util.tree_map(lambda x: tuple(x.shape), meta.unbox(variables["params"]))


@pytest.mark.parametrize("config", [TINY_1_0, TINY_1_1], ids=["t5_1_0", "t5_1_1"])
def test_expected_shapes_equal_model_init(config):
  assert _model_param_shapes(config) == tree.expected_shapes(config)
