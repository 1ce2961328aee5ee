"""Parity with the reference: HF transformers' torch T5 (random weights) vs our Flax T5.

The HF model is saved with `save_pretrained` and read back through `checkpoints.load`, so this
tests the loader's name mapping and the model's numerics together.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402

from prompt_jax import checkpoints  # noqa: E402
from prompt_jax.models import T5  # noqa: E402
from prompt_jax.models.decoding import greedy_decode  # noqa: E402
from tests import numerics  # noqa: E402
from tests.checkpoints import hf_models  # noqa: E402

VOCAB, D_MODEL = 160, 32


def _hf_t5(gated: bool, seed: int):
  """A random T5 1.0 (relu, tied) or T5 1.1 (gated gelu, untied) in HF form."""
  return hf_models.random_hf_t5(vocab=VOCAB, d_model=D_MODEL, gated=gated, seed=seed,
                                num_layers=3)


def _batch(seed: int):
  rng = np.random.RandomState(seed)
  batch, enc_len, dec_len = 3, 40, 24  # > 16 positions: exercises the log-spaced buckets
  enc = rng.randint(2, VOCAB, (batch, enc_len))
  enc[1, 25:] = 0
  enc[2, 7:] = 0
  tgt = rng.randint(2, VOCAB, (batch, dec_len))
  tgt[0, 20:] = 0
  tgt[2, 5:] = 0
  dec_in = np.concatenate([np.zeros((batch, 1), int), tgt[:, :-1]], axis=1)
  dec_in[tgt == 0] = 0
  return enc, dec_in, tgt


@pytest.mark.parametrize("gated", [False, True], ids=["t5_1_0", "t5_1_1"])
def test_logits_and_greedy_match_hf(tmp_path, gated):
  hf = _hf_t5(gated, seed=1 + gated)
  hf.save_pretrained(tmp_path)
  config, params = checkpoints.load(str(tmp_path))
  assert config.logits_via_embedding == (not gated)
  assert config.mlp_activations == (("gelu", "linear") if gated else ("relu",))
  config = config.replace(dtype=jnp.float32)
  model = T5(config)

  enc, dec_in, tgt = _batch(seed=3)
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
             decoder_input_ids=torch.tensor(dec_in),
             decoder_attention_mask=torch.tensor(tgt > 0)).logits.numpy()
  ours = np.asarray(model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False))
  assert ours.shape == (3, 24, VOCAB)
  with numerics.float64():
    ours64 = np.asarray(T5(config.replace(dtype=jnp.float64)).apply(
        {"params": numerics.cast(params, np.float64)}, enc, dec_in, tgt, enable_dropout=False))
  valid = tgt > 0  # HF computes padded target positions differently; they carry no loss
  # HF's float32 logits must be as close to the exact (float64) function as float32 allows:
  # bound derived from our float32 error against our float64 evaluation (tests/numerics.py).
  # (HF in double is no float64 reference: its T5LayerNorm computes the variance in float32.)
  numerics.assert_close(ref[valid], ours[valid], ours64[valid], what="HF torch logits")

  with torch.no_grad():
    hf_tokens = hf.generate(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                            max_new_tokens=20, do_sample=False, num_beams=1).numpy()[:, 1:]
  our_tokens = np.asarray(greedy_decode(model, params, jnp.asarray(enc), 20))
  hf_tokens = np.pad(hf_tokens, ((0, 0), (0, 20 - hf_tokens.shape[1])))  # HF stops at EOS
  # Another library's decoding loop: rows equal but for float32 near-ties (tests/numerics.py).
  ties = numerics.greedy_near_ties(model, params, jnp.asarray(enc), 20)
  numerics.assert_same_choices([str(r.tolist()) for r in our_tokens],
                               [str(r.tolist()) for r in hf_tokens], ties,
                               what="greedy tokens vs HF generate", max_near_tie_share=0.5)


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_relative_position_buckets_match_hf(bidirectional):
  from prompt_jax.models.layers import relative_position_bucket  # pylint: disable=g-import-not-at-top
  from transformers.models.t5.modeling_t5 import T5Attention  # pylint: disable=g-import-not-at-top
  distances = np.arange(-600, 600)[None, :]
  ours = relative_position_bucket(distances, bidirectional, 32, 128)
  ref = T5Attention._relative_position_bucket(  # pylint: disable=protected-access
      torch.tensor(distances), bidirectional=bidirectional, num_buckets=32,
      max_distance=128).numpy()
  np.testing.assert_array_equal(ours, ref)
