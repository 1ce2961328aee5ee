"""The tiny T5 1.1 checkpoint that t5x itself wrote (prompt-tuning's test data, Adafactor)."""
import os

import msgpack
import numpy as np
import pytest

from prompt_jax import checkpoints
from prompt_jax.checkpoints import storage
from prompt_jax.checkpoints import t5x_legacy
from prompt_jax.checkpoints import tree
from prompt_jax.models.config import T5Config

# prompt-tuning's configs/test/t5_1_1_tiny.gin; relpos max_distance (8) is not in the shapes.
TINY = T5Config(vocab_size=32128, emb_dim=4, num_heads=2, head_dim=2, mlp_dim=8,
                num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"),
                logits_via_embedding=False, relative_attention_num_buckets=4)


@pytest.fixture
def real_checkpoint(shared_data):
  return shared_data("prompt_tuning_repo", "test_data", "test_t5_1_1_tiny", "checkpoint_3")


def test_loads_with_inferred_config(real_checkpoint, monkeypatch):
  decoded = []
  decode = t5x_legacy._decode_ext
  monkeypatch.setattr(t5x_legacy, "_decode_ext", lambda c, d: decoded.append(c) or decode(c, d))
  opened = []
  open_ = t5x_legacy.ts.open
  monkeypatch.setattr(t5x_legacy.ts, "open", lambda spec, **kw: opened.append(spec) or open_(
      spec, **kw))

  assert checkpoints.detect_format(real_checkpoint.parent) == "t5x_legacy"
  config, params = checkpoints.load(real_checkpoint.parent)  # the model dir: latest step
  assert config == TINY
  flat = tree.flatten(params)
  assert {k: v.shape for k, v in flat.items()} == tree.flatten(tree.expected_shapes(TINY))
  # Only the 14 inline parameters (norm scales, relpos tables) were decoded: none of the
  # Adafactor slots stored inline next to them; and only `target.*` zarr arrays were opened.
  assert len(decoded) == 14
  assert len(opened) == len([d for d in os.listdir(real_checkpoint) if d != "checkpoint"])
  assert all(os.path.basename(s["kvstore"]["path"]).startswith("target.") for s in opened)


def test_values(real_checkpoint, shared_data):
  _, params = checkpoints.load(real_checkpoint, TINY.replace(relative_attention_max_distance=8))
  embedding = np.load(shared_data("prompt_tuning_repo", "test_data",
                                  "tiny_embeddings_32128x4.npy"))
  np.testing.assert_array_equal(params["token_embedder"]["embedding"], embedding)
  with open(real_checkpoint / "checkpoint", "rb") as f:
    raw = msgpack.unpackb(f.read(), raw=False)
  scale = raw["optimizer"]["target"]["encoder"]["encoder_norm"]["scale"]
  np.testing.assert_array_equal(params["encoder"]["encoder_norm"]["scale"],
                                t5x_legacy._decode_ext(scale.code, scale.data))


def test_target_read_without_reading_the_optimizer_state(real_checkpoint):
  kv_file = storage.KvFile({"driver": "file", "path": str(real_checkpoint)}, "checkpoint",
                           read_ahead=4096)
  version, target = t5x_legacy.read_target(kv_file, "checkpoint")
  assert version == 3 and "token_embedder" in target
  size = os.path.getsize(real_checkpoint / "checkpoint")
  assert kv_file.bytes_fetched < size / 10, (kv_file.bytes_fetched, size)


def test_our_writer_mirrors_the_real_layout(real_checkpoint, tmp_path):
  """Saving the real weights reproduces t5x's split into inline arrays and zarr dirs."""
  _, params = checkpoints.load(real_checkpoint)
  ours = checkpoints.save(tmp_path, params, step=3)
  assert sorted(os.listdir(ours)) == sorted(os.listdir(real_checkpoint))

  def inline_paths(ckpt):
    with open(os.path.join(ckpt, "checkpoint"), "rb") as f:
      raw = msgpack.unpackb(f.read(), raw=False)
    flat = tree.flatten(raw["optimizer"]["target"], is_leaf=lambda v: "driver" in v)
    return sorted(k for k, v in flat.items() if isinstance(v, msgpack.ExtType))

  assert inline_paths(ours) == inline_paths(real_checkpoint)
  _, again = checkpoints.load(ours)
  for key, value in tree.flatten(params).items():
    np.testing.assert_array_equal(tree.flatten(again)[key], value, err_msg=key)
