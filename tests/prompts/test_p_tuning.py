"""P-tuning against HF PEFT's PromptEncoder (issue 16, acceptance 2): on an HF T5 and a prompt_jax
T5 from the same random weights, the same trainable count, and with PEFT's encoder weights copied
in, the same prompt embeddings and logits; training and folding through the seam."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import T5
from prompt_jax.prompts import p_tuning, seam, specs
from prompt_jax.prompts.tuning import PromptTuning
from tests import numerics
from tests.prompts import helpers

P, M = 5, 12
CONFIGS = {"mlp": dict(encoder="mlp", hidden=M), "lstm": dict(encoder="lstm", hidden=M),
           "lstm_3_layers": dict(encoder="lstm", hidden=M, num_layers=3)}


def _module(cfg, **kw):
  return functools.partial(p_tuning.PTuningPrompt, length=P, **cfg, **kw)


def _model(cfg, config=helpers.TINY):
  return T5(config, prompt=seam.prompt_factory(_module(cfg), P))


def _count(tree) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_count_formula_training_and_fold(name):
  cfg = CONFIGS[name]
  model = _model(cfg)
  params = helpers.init_prompted(model)
  prompt_params = params["encoder"]["prompt"]["prompt"]
  spec = specs.p_tuning(length=P, **cfg)
  assert _count(prompt_params) == spec.num_trainable_params(helpers.TINY)
  after, _ = helpers.assert_trains_only(model, params, ["encoder/prompt/prompt/"])
  # fold: plain prompt tuning with the folded [P, H] prompt computes the same function
  folded = spec.fold(after, helpers.TINY)["prompt"]
  assert folded.shape == (P, helpers.TINY.emb_dim)
  plain = T5(helpers.TINY, prompt=seam.prompt_factory(
      functools.partial(PromptTuning, length=P), P))
  plain_params = dict(after, encoder=dict(after["encoder"],
                                          prompt={"prompt": {"prompt": folded}}))
  # The same float32 prompt values enter the same encoder: the same program on the same values.
  np.testing.assert_array_equal(np.asarray(helpers.logits(plain, plain_params)),
                                np.asarray(helpers.logits(model, after)))


def test_bad_encoder_is_one_config_error():
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match="unknown P-tuning encoder 'gru'"):
    specs.p_tuning(length=P, encoder="gru").factory(config=helpers.TINY)


# ----- against PEFT -----

def _peft_model(hf, cfg):
  import peft  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  config = peft.PromptEncoderConfig(
      task_type="SEQ_2_SEQ_LM", num_virtual_tokens=P, num_transformer_submodules=1,
      encoder_reparameterization_type=cfg["encoder"].upper(), encoder_hidden_size=cfg["hidden"],
      encoder_num_layers=cfg.get("num_layers", 2), encoder_dropout=0.0)
  model = peft.get_peft_model(hf, config).eval()
  torch.manual_seed(7)
  with torch.no_grad():  # PEFT's encoder away from its init, so every copied weight matters
    for p in model.prompt_encoder["default"].parameters():
      p.add_(0.3 * torch.randn_like(p))
  return model


def _copy_peft_weights(encoder, cfg):
  """PEFT PromptEncoder state -> our `encoder/prompt/prompt` params (kernels transposed)."""
  s = {k: v.detach().numpy().astype(np.float32) for k, v in encoder.state_dict().items()}
  out = {"embedding": s["embedding.weight"]}
  dense = lambda i: {"kernel": s[f"mlp_head.{i}.weight"].T, "bias": s[f"mlp_head.{i}.bias"]}
  if cfg["encoder"] == "mlp":
    out.update(mlp_0=dense(0), mlp_1=dense(2), mlp_2=dense(4))
    return out
  for layer in range(cfg.get("num_layers", 2)):
    for ours, theirs in (("fwd", ""), ("bwd", "_reverse")):
      t = lambda n: s[f"lstm_head.{n}_l{layer}{theirs}"]  # pylint: disable=cell-var-from-loop
      out[f"lstm_{layer}_{ours}"] = {"wi": t("weight_ih").T, "wh": t("weight_hh").T,
                                     "bi": t("bias_ih"), "bh": t("bias_hh")}
  out.update(head_0=dense(0), head_1=dense(2))
  return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_peft_prompt_encoder(tmp_path, name):
  torch = pytest.importorskip("torch")
  pytest.importorskip("peft")
  pytest.importorskip("transformers")
  from prompt_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from tests.models.test_hf_parity import _batch, _hf_t5  # pylint: disable=g-import-not-at-top
  cfg = CONFIGS[name]
  hf = _hf_t5(gated=True, seed=4)
  hf.save_pretrained(tmp_path)
  config, backbone = checkpoints.load(str(tmp_path))
  config = config.replace(dtype=jnp.float32)
  peft_model = _peft_model(hf, cfg)

  # Acceptance 2: the same trainable-parameter count for the same configuration.
  peft_trainable, _ = peft_model.get_nb_trainable_parameters()
  spec = specs.p_tuning(length=P, **cfg)
  assert spec.num_trainable_params(config) == peft_trainable
  ours = _copy_peft_weights(peft_model.prompt_encoder["default"], cfg)
  assert _count(ours) == peft_trainable

  # The same prompt embeddings (PEFT's float32 vs our float32 / float64 evaluations).
  with torch.no_grad():
    peft_prompt = peft_model.get_prompt(batch_size=1)[0].numpy()  # [P, H]

  def prompt(dtype):
    return np.asarray(p_tuning.fold(numerics.cast(ours, dtype), P, config.emb_dim, cfg["hidden"],
                                    cfg["encoder"], cfg.get("num_layers", 2)))
  ours32 = prompt(np.float32)
  with numerics.float64():
    ours64 = prompt(np.float64)
  # Bound derived from our float32 error against our float64 evaluation (tests/numerics.py).
  numerics.assert_close(peft_prompt, ours32, ours64, what="PEFT prompt embeddings")
  assert np.abs(peft_prompt - ours32).max() <= 1e-5  # the 1e-5 holds as well

  # The same logits: PEFT's prompted HF T5 vs our T5 with the copied encoder.
  enc, dec_in, tgt = _batch(seed=3)
  with torch.no_grad():
    ref = peft_model(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                     decoder_input_ids=torch.tensor(dec_in),
                     decoder_attention_mask=torch.tensor(tgt > 0)).logits.numpy()
  model = _model(cfg, config)
  params = dict(backbone, encoder=dict(backbone["encoder"], prompt={"prompt": ours}))

  def logits(dtype):
    m = model.clone(config=config.replace(dtype=dtype))
    return np.asarray(m.apply({"params": numerics.cast(params, dtype)}, enc, dec_in, tgt,
                              enable_dropout=False))
  ours32 = logits(jnp.float32)
  with numerics.float64():
    ours64 = logits(jnp.float64)
  valid = tgt > 0  # HF computes padded target positions differently; they carry no loss
  numerics.assert_close(ref[valid], ours32[valid], ours64[valid], what="PEFT logits")
