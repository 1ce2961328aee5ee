"""Tiny random HF T5 checkpoints (T5 1.0: relu, tied; T5 1.1: gated-gelu, untied), built once
per session, and the t5x params they must load to (spelled out independently of the loader)."""
import dataclasses
import pathlib
from typing import Dict

import numpy as np
import pytest

from prompt_jax.models.config import T5Config

VOCAB, D_MODEL, D_KV, HEADS, D_FF, LAYERS = 128, 32, 8, 4, 64, 2


@dataclasses.dataclass
class HFModel:
  dir: pathlib.Path  # save_pretrained (model.safetensors)
  bin_dir: pathlib.Path  # the same weights as pytorch_model.bin
  state: Dict[str, np.ndarray]  # torch state dict as numpy
  config: T5Config  # what the loader must infer from config.json


def _config(gated: bool) -> T5Config:
  return T5Config(vocab_size=VOCAB, emb_dim=D_MODEL, num_heads=HEADS, head_dim=D_KV,
                  mlp_dim=D_FF, num_encoder_layers=LAYERS, num_decoder_layers=LAYERS,
                  mlp_activations=("gelu", "linear") if gated else ("relu",),
                  logits_via_embedding=not gated)


def _build(root: pathlib.Path, gated: bool, seed: int) -> HFModel:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(seed)
  hf_config = transformers.T5Config(
      vocab_size=VOCAB, d_model=D_MODEL, d_kv=D_KV, d_ff=D_FF, num_layers=LAYERS,
      num_decoder_layers=LAYERS, num_heads=HEADS,
      feed_forward_proj="gated-gelu" if gated else "relu")
  model = transformers.T5ForConditionalGeneration(hf_config)
  if gated:
    # transformers 5 ties lm_head to shared whatever T5Config says: untie by hand.
    model.lm_head.weight = torch.nn.Parameter(torch.empty(VOCAB, D_MODEL))
    model.config.tie_word_embeddings = False
  with torch.no_grad():
    for param in model.parameters():  # norms included, so every mapping is value-checked.
      param.normal_()
  out = root / ("t5_1_1" if gated else "t5_1_0")
  model.save_pretrained(out)
  bin_dir = root / ((out.name) + "_bin")
  bin_dir.mkdir()
  (bin_dir / "config.json").write_text((out / "config.json").read_text())
  torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
  state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
  return HFModel(dir=out, bin_dir=bin_dir, state=state, config=_config(gated))


def random_hf_t5(*, vocab: int, d_model: int, gated: bool, seed: int, d_kv: int = 8,
                 d_ff: int = 64, num_heads: int = 4, num_layers: int = 2,
                 num_decoder_layers: int = 2):
  """A random HF T5 in eval mode: T5 1.0 (relu, tied) or T5 1.1 (gated gelu, untied), norms
  drawn from [0.5, 1.5) (HF initialises them to 1, which would hide a wrong mapping)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  config = transformers.T5Config(
      vocab_size=vocab, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=num_layers,
      num_decoder_layers=num_decoder_layers, num_heads=num_heads,
      feed_forward_proj="gated-gelu" if gated else "relu", tie_word_embeddings=not gated,
      dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "layer_norm" in name:
        p.uniform_(0.5, 1.5)
  if gated:  # transformers 5 ties by default: untie with a fresh lm_head
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.randn(vocab, d_model) * d_model**-0.5)
  return model


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory) -> Dict[str, HFModel]:
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  root = tmp_path_factory.mktemp("hf")
  return {"t5_1_0": _build(root, gated=False, seed=0), "t5_1_1": _build(root, gated=True, seed=1)}


def expected_from_torch(state: Dict[str, np.ndarray], config: T5Config) -> Dict[str, np.ndarray]:
  """The t5x params of an HF T5 state dict, spelled out independently of the loader."""
  out = {"token_embedder/embedding": state["shared.weight"]}
  names = {"q": "query", "k": "key", "v": "value", "o": "out"}
  mlp = ["wi_0", "wi_1", "wo"] if len(config.mlp_activations) > 1 else ["wi", "wo"]
  for stack in ("encoder", "decoder"):
    out[f"{stack}/relpos_bias/rel_embedding"] = state[
        f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].T
    out[f"{stack}/{stack}_norm/scale"] = state[f"{stack}.final_layer_norm.weight"]
    for i in range(LAYERS):
      hf, t5x = f"{stack}.block.{i}.layer", f"{stack}/layers_{i}"
      self_attn = "attention" if stack == "encoder" else "self_attention"
      norm = "pre_attention_layer_norm" if stack == "encoder" else "pre_self_attention_layer_norm"
      out[f"{t5x}/{norm}/scale"] = state[f"{hf}.0.layer_norm.weight"]
      for h, t in names.items():
        out[f"{t5x}/{self_attn}/{t}/kernel"] = state[f"{hf}.0.SelfAttention.{h}.weight"].T
      ff = 1
      if stack == "decoder":
        ff = 2
        out[f"{t5x}/pre_cross_attention_layer_norm/scale"] = state[f"{hf}.1.layer_norm.weight"]
        for h, t in names.items():
          out[f"{t5x}/encoder_decoder_attention/{t}/kernel"] = state[
              f"{hf}.1.EncDecAttention.{h}.weight"].T
      out[f"{t5x}/pre_mlp_layer_norm/scale"] = state[f"{hf}.{ff}.layer_norm.weight"]
      for name in mlp:
        out[f"{t5x}/mlp/{name}/kernel"] = state[f"{hf}.{ff}.DenseReluDense.{name}.weight"].T
  if not config.logits_via_embedding:
    out["decoder/logits_dense/kernel"] = state["lm_head.weight"].T
  return out
