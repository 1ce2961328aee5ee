"""The encoder's padding as sequence lengths (`layers.PaddedBias`): what jax.nn's kernels (cuDNN
on GPU) take instead of a [batch, heads, T, T] bias. It must give the dense bias's results on real
positions for every prompt method whose padding stays at the end, fall back to the dense bias
where it does not (a prompt that masks its own positions, a visibility mask), and turn a row whose
padding is not at the end into NaN rather than attend to its padding.

On CPU jax.nn's 'xla' kernel takes the lengths (cuDNN needs a GPU: `prompt-jax bench attention`
compares it there). Bounds are derived (tests/numerics.py) from the einsum path's own float32
error against float64.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import T5, layers
from prompt_jax.prompts import PromptTuning, ipt, seam, specs
from tests import numerics
from tests.prompts import helpers

CFG = helpers.TINY
P = 3


def _inputs(dtype, valid):
  rng = np.random.RandomState(0)
  batch, length = valid.shape
  q, k, v = (rng.randn(batch, length, 3, 8) for _ in range(3))  # [batch, length, heads, kv]
  relpos = rng.randn(1, 3, length, length)  # [1, heads, q, k]
  return [numerics.cast(x, dtype) for x in (q, k, v, relpos)]


def test_lengths_form_equals_the_dense_bias_and_zeroes_padded_rows():
  valid = np.array([[1] * 7, [1] * 4 + [0] * 3, [1] + [0] * 6])
  lengths, trailing = layers.trailing_lengths(jnp.asarray(valid))
  np.testing.assert_array_equal(lengths, [7, 4, 1])
  assert bool(jnp.all(trailing))

  def dense(dtype):
    q, k, v, relpos = _inputs(dtype, valid)
    mask = layers.make_attention_mask(valid, valid, dtype=dtype)
    return layers.dot_product_attention(q, k, v, layers.attention_bias(mask, relpos, dtype),
                                         dtype=dtype, implementation="einsum")

  def padded(impl, dtype):
    q, k, v, relpos = _inputs(dtype, valid)
    bias = layers.PaddedBias(relpos, lengths, lengths)
    return layers.dot_product_attention(q, k, v, bias, dtype=dtype, implementation=impl)

  real = np.broadcast_to(valid.astype(bool)[:, :, None, None], (3, 7, 3, 8))
  for impl in ("xla", "einsum"):  # jax.nn's kernel with lengths; einsum with `dense()`
    numerics.check_equivalent(functools.partial(padded, impl), dense, where=real,
                              check_float64=False, what=f"PaddedBias through {impl!r}")
    out = np.asarray(padded(impl, jnp.float32))
    assert np.all(out[~real] == 0)  # padded query rows are 0
  # The dense form is the stack's usual bias, bitwise.
  q, k, v, relpos = _inputs(jnp.float32, valid)
  mask = layers.make_attention_mask(valid, valid, dtype=jnp.float32)
  np.testing.assert_array_equal(layers.PaddedBias(relpos, lengths, lengths).dense(7, 7, jnp.float32),
                                layers.attention_bias(mask, relpos, jnp.float32))


def test_trailing_lengths_flags_rows_with_padding_before_a_real_position():
  valid = jnp.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0]])
  lengths, trailing = layers.trailing_lengths(valid)
  np.testing.assert_array_equal(lengths, [2, 2, 3, 0])
  np.testing.assert_array_equal(trailing, [True, False, False, True])


def test_which_kernels_take_lengths():
  assert layers.takes_sequence_lengths("xla", jnp.float32, 8)
  assert layers.takes_sequence_lengths("cudnn", jnp.bfloat16, 64)
  assert not layers.takes_sequence_lengths("einsum", jnp.float32, 8)
  on_gpu = jax.default_backend() == "gpu"
  assert layers.takes_sequence_lengths("auto", jnp.bfloat16, 64) == on_gpu
  assert not layers.takes_sequence_lengths("auto", jnp.float32, 64)  # cuDNN needs bf16/fp16
  with numerics.float64():
    assert not layers.takes_sequence_lengths("xla", jnp.float64, 8)  # float64: einsum


def _backbone():
  frozen = helpers.frozen()
  return specs.Backbone(CFG, embedding=np.asarray(frozen["token_embedder"]["embedding"]),
                        vocabulary=None, params=frozen)


def _prompt(method, placement="prefix", visibility=None, length=P):
  return dict(prompt=seam.prompt_factory(method, length, placement, visibility))


CASES = {  # name: (model kwargs, whether the encoder's self-attention takes lengths)
    "prompt tuning, prefix": (lambda: _prompt(functools.partial(PromptTuning, length=P)), True),
    "prompt tuning, suffix": (
        lambda: _prompt(functools.partial(PromptTuning, length=P), "suffix"), True),
    "deep prefix (key/value prefixes in each layer)": (
        lambda: specs.deep_prefix(length=P, decoder=False).model_kwargs(_backbone()), True),
    "no prompt": (lambda: {}, True),
    # IPT's lookup masks the prompt positions read off padding: holes, so the dense bias.
    "IPT lookup (masked prompt positions)": (
        lambda: _prompt(functools.partial(ipt.IPT, length=5, vocab_size=CFG.vocab_size),
                        length=5), False),
    "prompt tuning, visibility mask": (
        lambda: _prompt(functools.partial(PromptTuning, length=P), visibility="input->prompt,"
                        "prompt->prompt"), False),
}


def _record_forms(monkeypatch):
  """A list that gets, for each attention call, whether its bias was a PaddedBias."""
  forms = []
  original = layers.dot_product_attention

  def spy(query, key, value, bias=None, *args, **kw):
    forms.append(isinstance(bias, layers.PaddedBias))
    return original(query, key, value, bias, *args, **kw)
  monkeypatch.setattr(layers, "dot_product_attention", spy)
  return forms


@pytest.mark.parametrize("case", list(CASES))
def test_model_with_lengths_equals_the_einsum_path(case, monkeypatch):
  make_kwargs, takes_lengths = CASES[case]
  kwargs = make_kwargs()
  model = T5(CFG, **kwargs)
  params = helpers.init_prompted(model) if kwargs else helpers.frozen()
  forms = _record_forms(monkeypatch)
  fused = model.clone(config=CFG.replace(attention_implementation="xla"))
  helpers.logits(fused, params)
  assert sum(forms) == (CFG.num_encoder_layers if takes_lengths else 0), forms
  forms.clear()
  helpers.logits(model.clone(config=CFG.replace(attention_implementation="einsum")), params)
  assert not any(forms)  # the einsum path keeps the stack's one dense bias
  helpers.check_same_logits(fused, params, model.clone(config=CFG.replace(
      attention_implementation="einsum")), params, check_float64=False)


def test_padding_inside_a_row_is_nan_with_lengths_not_attended():
  """A row whose padding is not at its end (never produced by seqio's converters) gives NaN
  logits with the lengths form, and the other rows are unchanged; the einsum path attends it as
  a mask and stays finite."""
  model = T5(CFG, **_prompt(functools.partial(PromptTuning, length=P)))
  params = helpers.init_prompted(model)
  enc, _, _ = helpers.batch()
  enc = enc.at[1, 1].set(0)  # [10, 0, 1, 0, ...]: padding before the EOS
  fused = helpers.logits(model.clone(config=CFG.replace(attention_implementation="xla")), params,
                         enc=enc)
  reference = helpers.logits(model.clone(config=CFG.replace(attention_implementation="einsum")),
                             params, enc=enc)
  assert np.all(np.isnan(np.asarray(fused[1])))
  assert np.all(np.isfinite(np.asarray(reference)))
  others = np.broadcast_to(np.array([True, False, True, True])[:, None, None], fused.shape)
  numerics.check_equivalent(
      helpers.logits_fn(model.clone(config=CFG.replace(attention_implementation="xla")), params,
                        enc=enc),
      helpers.logits_fn(model.clone(config=CFG.replace(attention_implementation="einsum")),
                        params, enc=enc), where=others, check_float64=False,
      what="the other rows' logits")


def test_padding_as_lengths_false_keeps_the_dense_bias(monkeypatch):
  forms = _record_forms(monkeypatch)
  config = CFG.replace(attention_implementation="xla", padding_as_lengths=False)
  helpers.logits(T5(config), helpers.frozen())
  assert forms and not any(forms)


def test_filler_rows_stay_finite_with_the_prompt_after_their_first_position():
  """Eval feeds rows of padding alone (a process's missing batches, a last partial batch);
  'after_bos' puts the prompt after such a row's first (padding) position, which is not
  trailing padding, yet the row is never read: it must not be NaN, or a batch's summed metrics
  would be NaN through 0 x NaN. The other rows equal the einsum path's."""
  model = T5(CFG, **_prompt(functools.partial(PromptTuning, length=P), "after_bos"))
  params = helpers.init_prompted(model)
  enc, _, _ = helpers.batch()
  enc = enc.at[2].set(0)  # a filler row
  fused = model.clone(config=CFG.replace(attention_implementation="xla"))
  assert np.all(np.isfinite(np.asarray(helpers.logits(fused, params, enc=enc))))
  real = np.broadcast_to(np.array([True, True, False, True])[:, None, None],
                         helpers.logits(fused, params, enc=enc).shape)
  numerics.check_equivalent(
      helpers.logits_fn(fused, params, enc=enc),
      helpers.logits_fn(model.clone(config=CFG.replace(attention_implementation="einsum")),
                        params, enc=enc), where=real, check_float64=False,
      what="logits beside a filler row")
