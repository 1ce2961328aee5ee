"""Attention visibility (issue 16, acceptance 3 and the unknown-name bad input)."""
import functools

import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.models import layers
from prompt_jax.prompts import seam, specs, visibility
from prompt_jax.prompts.tuning import PromptTuning
from tests import numerics
from tests.prompts import helpers

CFG = helpers.TINY
P = 3
PLACEMENTS = {"prefix": "prefix", "after_bos": "after_bos", "suffix": "suffix",
              "between": seam.between_segments([7])}


def _model(allowed=None, placement="prefix"):
  method = functools.partial(PromptTuning, length=P)
  return T5(CFG, prompt=seam.prompt_factory(method, P, placement, visibility=allowed))


def _params():
  model = _model()
  return helpers.perturbed(helpers.init_prompted(model), scale=1.0)


def _encode(model, params, enc, dtype=jnp.float32):
  model = model.clone(config=model.config.replace(dtype=dtype))
  return np.asarray(model.apply({"params": numerics.cast(params, dtype)}, enc,
                                enable_dropout=False, method=T5.encode))


def _slots(model, params, enc):
  return np.asarray(model.apply({"params": params}, enc,
                                method=lambda m, t: m.encoder.prompt_module.slots(t)))


def test_parse_names_and_unknown_name():
  assert visibility.parse(None) is None
  assert visibility.parse(["input->prompt", "prompt->input", "prompt->prompt"]) is None  # full
  assert visibility.parse("input->input, input->prompt") == {"input->prompt"}
  # the more specific causal one wins over plain prompt->prompt (as the reference)
  assert visibility.parse(["prompt->prompt", "prompt->prompt;causal"]) == {
      "prompt->prompt;causal"}
  with pytest.raises(ValueError, match="unknown attention visibility 'prompt->inputs'"):
    visibility.parse(["prompt->inputs"])
  spec = specs.prompt_tuning(length=P)
  import dataclasses  # pylint: disable=g-import-not-at-top
  bad = dataclasses.replace(spec, visibility="input->prompt,promt->prompt")
  with pytest.raises(ConfigError, match=r"unknown attention visibility 'promt->prompt'; "
                                        r"choose from input->prompt"):
    bad.check(None)
  with pytest.raises(ConfigError, match="unknown attention visibility"):
    bad.factory(config=CFG)


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_full_visibility_mask_is_todays_mask_for_every_placement(placement):
  """The full set builds exactly the mask the encoder builds without a visibility setting."""
  model = _model(None, PLACEMENTS[placement])
  params = _params()
  enc, _, _ = helpers.batch()
  slots = _slots(model, params, enc)
  valid = np.asarray(model.apply({"params": params}, enc, method=T5.encoder_input_mask))
  full = visibility.attention_mask(jnp.asarray(slots), jnp.asarray(valid),
                                   frozenset({"input->prompt", "prompt->input", "prompt->prompt"}))
  np.testing.assert_array_equal(np.asarray(full),
                                np.asarray(layers.make_attention_mask(valid, valid)))


def test_full_visibility_outputs_equal_todays_exactly():
  params = _params()
  enc, dec_in, tgt = helpers.batch()
  today = helpers.logits(_model(None), params)
  full = helpers.logits(_model(["input->prompt", "prompt->input", "prompt->prompt"]), params)
  np.testing.assert_array_equal(np.asarray(full), np.asarray(today))
  # and a restricted visibility does change them (the test above can fail)
  other = helpers.logits(_model(["input->prompt"]), params)
  assert np.abs(np.asarray(other) - np.asarray(today)).max() > 1e-3


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("prompt_prompt", ["prompt->prompt", "prompt->prompt;causal", None])
def test_prompt_input_off_prompt_positions_ignore_the_input(placement, prompt_prompt):
  allowed = ["input->prompt"] + ([prompt_prompt] if prompt_prompt else [])
  model = _model(allowed, PLACEMENTS[placement])
  params = _params()
  enc, _, _ = helpers.batch()
  enc = np.asarray(enc)
  # Another input of the same lengths (and the same separator position for `between`).
  rng = np.random.RandomState(5)
  other = np.where(enc > 1, rng.randint(8, CFG.vocab_size, enc.shape), enc)
  other = np.where(enc == 7, 7, np.where(other == 7, 9, other))  # the separator stays put
  slots = _slots(model, params, enc)
  np.testing.assert_array_equal(slots, _slots(model, params, other))
  a, b = _encode(model, params, enc), _encode(model, params, other)
  in_prompt = slots > 0
  assert in_prompt.sum() == enc.shape[0] * P
  # Masked keys get exactly zero weight: the prompt rows are the same program on the same values.
  np.testing.assert_array_equal(a[in_prompt], b[in_prompt])
  assert np.abs(a[~in_prompt] - b[~in_prompt]).max() > 1e-3  # the input positions did change
  # With prompt->input on, the prompt positions do read the input.
  full = _model(None, PLACEMENTS[placement])
  fa, fb = _encode(full, params, enc), _encode(full, params, other)
  assert np.abs(fa[in_prompt] - fb[in_prompt]).max() > 1e-3


def test_causal_and_self_only_masks():
  slots = jnp.asarray([[1, 2, 3, 0, 0], [0, 1, 2, 3, 0]])
  valid = jnp.asarray([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
  causal = np.asarray(visibility.attention_mask(slots, valid, {"prompt->prompt;causal"}))[:, 0]
  # example 1: prompt at positions 1..3 (after BOS): slot k sees slots <= k, not the input
  np.testing.assert_array_equal(causal[1, 1:4, 1:4], np.tril(np.ones((3, 3))))
  assert causal[1, 1:4, [0, 4]].sum() == 0
  # inputs see only inputs (input->prompt off), padding nothing
  np.testing.assert_array_equal(causal[0, 3], [0, 0, 0, 1, 0])
  assert causal[0, 4].sum() == 0 and causal[0, :, 4].sum() == 0
  alone = np.asarray(visibility.attention_mask(slots, valid, frozenset()))[:, 0]
  np.testing.assert_array_equal(alone[0, :3, :3], np.eye(3))  # a prompt token sees itself only


def test_input_prompt_off_equals_the_model_without_a_prompt_at_input_positions():
  model = _model(["prompt->input", "prompt->prompt"])  # the prompt is not visible to the input
  params = _params()
  plain = T5(CFG)
  enc, _, _ = helpers.batch()
  valid = np.asarray(enc) > 0

  def prompted(dtype):
    return _encode(model, params, enc, dtype)[:, P:][valid]

  def reference(dtype):
    return _encode(plain, helpers.frozen(), enc, dtype)[valid]
  # Different programs (T + P vs T positions): bound derived from the reference's float32 error
  # against float64 (tests/numerics.py).
  numerics.check_equivalent(prompted, reference)
  # ... while with full visibility the input positions do read the prompt
  full = _encode(_model(None), params, enc)[:, P:][valid]
  assert np.abs(full - reference(jnp.float32)).max() > 1e-3


def test_cli_describe_rejects_an_unknown_visibility(capsys):
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  code = cli.main(["describe", "--gin_file=models/t5_1_1_small.gin",
                   "--gin_file=prompts/visibility.gin", "--gin_file=runs/prompt_finetune.gin",
                   "--gin.PROMPT_VISIBILITY='input->prompt,prompt->inputs'"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2
  assert len(err) == 1 and "unknown attention visibility 'prompt->inputs'" in err[0], err
