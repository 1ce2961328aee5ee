"""Per-layer prompts (issue 16 item 6): layer l's input at the prompt positions is layer l's
prompt (replace) or the previous layer's output plus it (add), for every placement; the count."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.models import T5, T5Config
from prompt_jax.prompts import specs
from tests.prompts import helpers

CFG = helpers.TINY.replace(num_encoder_layers=3)  # layers 1 and 2 get their own prompts
P = 3


def _setup(mode, placement):
  spec = specs.per_layer_prompt(length=P, mode=mode, placement=placement)
  model = T5(CFG, **specs.model_kwargs(spec, CFG))
  enc, dec_in, tgt = helpers.batch()
  params = jax.jit(lambda rng: nn.meta.unbox(
      model.init(rng, enc, dec_in, tgt, enable_dropout=False))["params"])(jax.random.PRNGKey(1))
  if mode == "add":  # zeros at init: give the deltas values so the test can see them
    lp = params["encoder"]["layer_prompts"]["prompt"]
    params["encoder"]["layer_prompts"]["prompt"] = lp + jax.random.normal(
        jax.random.PRNGKey(2), lp.shape)
  return spec, model, params


def _captured(model, params):
  """(hook outputs x'_l [B, T', H] for l = 0..L-1, layer outputs, prompt slots [B, T'])."""
  enc, dec_in, tgt = helpers.batch()
  wanted = lambda mdl, name: name == "__call__" and mdl.path[-1:] in (
      ("layer_prompts",),) + tuple((f"layers_{i}",) for i in range(CFG.num_encoder_layers))
  _, state = model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False,
                         capture_intermediates=wanted, mutable=["intermediates"])
  enc_state = state["intermediates"]["encoder"]
  hooked = [out[0] for out in enc_state["layer_prompts"]["__call__"]]
  layer_out = [enc_state[f"layers_{i}"]["__call__"][0] for i in range(CFG.num_encoder_layers)]
  slots = model.apply({"params": params}, enc,
                      method=lambda m, t: m.encoder.prompt_module.slots(t))
  return hooked, layer_out, np.asarray(slots)


@pytest.mark.parametrize("placement", ["prefix", "suffix"])
def test_replace_puts_each_layers_prompt_at_the_prompt_positions(placement):
  spec, model, params = _setup("replace", placement)
  hooked, layer_out, slots = _captured(model, params)
  prompts = np.asarray(params["encoder"]["layer_prompts"]["prompt"])  # [L-1, P, H]
  assert prompts.shape == (CFG.num_encoder_layers - 1, P, CFG.emb_dim)
  at = slots > 0
  assert at.sum() == 4 * P
  for layer in range(1, CFG.num_encoder_layers):
    x = np.asarray(hooked[layer])
    # Exactly that layer's prompt (the same program: a select), row k at the k-th position.
    np.testing.assert_array_equal(x[at], prompts[layer - 1][slots[at] - 1])
    # Elsewhere the previous layer's output, untouched.
    np.testing.assert_array_equal(x[~at], np.asarray(layer_out[layer - 1])[~at])
  # Layer 0 reads the input-level prompt (prompt tuning's), not a per-layer variable.
  x0 = np.asarray(hooked[0])
  np.testing.assert_array_equal(x0[at], np.asarray(params["encoder"]["prompt"]["prompt"][
      "prompt"])[slots[at] - 1])
  assert spec.num_trainable_params(CFG) == CFG.num_encoder_layers * P * CFG.emb_dim


def test_add_perturbs_the_hidden_states_at_the_prompt_positions():
  _, model, params = _setup("add", "prefix")
  hooked, layer_out, slots = _captured(model, params)
  prompts = np.asarray(params["encoder"]["layer_prompts"]["prompt"])
  at = slots > 0
  for layer in range(1, CFG.num_encoder_layers):
    prev = np.asarray(layer_out[layer - 1])
    np.testing.assert_array_equal(np.asarray(hooked[layer])[at],
                                  prev[at] + prompts[layer - 1][slots[at] - 1])
    np.testing.assert_array_equal(np.asarray(hooked[layer])[~at], prev[~at])


def test_zero_add_deltas_are_plain_prompt_tuning():
  """`add` starts at zero deltas: the model is prompt tuning with the same input prompt."""
  spec = specs.per_layer_prompt(length=P, mode="add")
  model = T5(CFG, **specs.model_kwargs(spec, CFG))
  enc, dec_in, tgt = helpers.batch()
  params = nn.meta.unbox(
      model.init(jax.random.PRNGKey(1), enc, dec_in, tgt, enable_dropout=False))["params"]
  assert not np.asarray(params["encoder"]["layer_prompts"]["prompt"]).any()
  plain = T5(CFG, **specs.model_kwargs(specs.prompt_tuning(length=P), CFG))
  plain_params = dict(params, encoder={k: v for k, v in params["encoder"].items()
                                       if k != "layer_prompts"})
  np.testing.assert_array_equal(
      model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False),
      plain.apply({"params": plain_params}, enc, dec_in, tgt, enable_dropout=False))


def test_bad_mode_and_count_on_t5_small_shapes():
  with pytest.raises(ConfigError, match="PER_LAYER_MODE='sum' is not one of"):
    specs.per_layer_prompt(mode="sum").check(CFG)
  small = T5Config(num_encoder_layers=8, emb_dim=512)
  assert specs.per_layer_prompt(length=10).num_trainable_params(small) == 8 * 10 * 512
  with pytest.raises(ConfigError, match="one prompt per encoder layer"):
    specs.per_layer_prompt(length=10).fold({}, small)
