"""IDPG (dense and PHM generators): training, masks, the reduction to prompt tuning, bad n."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import T5
from prompt_jax.prompts import idpg, phm, seam
from prompt_jax.prompts.tuning import PromptTuning
from tests import numerics
from tests.prompts import helpers

P = 3


def _prompted(**kw):
  method = functools.partial(idpg.IDPG, length=P, bottleneck=8, **kw)
  model = T5(helpers.TINY, prompt=seam.prompt_factory(method, P))
  return model, helpers.init_prompted(model)


def test_phm_kernel_is_a_sum_of_kronecker_products():
  rng = np.random.RandomState(0)
  rule, blocks = rng.randn(2, 2, 2), rng.randn(2, 3, 5)
  kernel = lambda dtype: phm.kernel(jnp.asarray(rule, dtype), jnp.asarray(blocks, dtype))
  # numpy's Kronecker sum as the reference; bound from its float32 error (tests/numerics.py).
  numerics.check_equivalent(
      kernel, lambda dtype: sum(np.kron(rule[i].astype(dtype), blocks[i].astype(dtype))
                                for i in range(2)))


@pytest.mark.parametrize("kw", [dict(layer_type="dnn"),
                                dict(layer_type="phm", phm_n=2, representation="encoder")])
def test_idpg_trains_only_its_generator_and_masks_are_right(kw):
  model, params = _prompted(**kw)
  after, _ = helpers.assert_trains_only(model, params, ["encoder/prompt/prompt/"])
  helpers.assert_masks_right(model, after, num_prompt=P)
  n = sum(v.size for v in jax.tree_util.tree_leaves(after["encoder"]["prompt"]))
  assert n == idpg.num_trainable_params(P, 16, 8, kw["layer_type"], kw.get("phm_n", 1))
  # Instance-dependent: two inputs get different prompts.
  out = model.apply({"params": after}, *helpers.batch()[:1], jnp.zeros((4, 16)),
                    method=lambda m, t, e: m.encoder.prompt_module.prompt(
                        t, m.token_embedder(t)))
  assert out.shape == (4, P, 16) and np.abs(np.asarray(out[0] - out[1])).max() > 1e-4


def test_idpg_with_zero_generator_weights_is_prompt_tuning_with_its_bias():
  model, params = _prompted(layer_type="dnn")
  gen = params["encoder"]["prompt"]["prompt"]
  gen["wi_kernel"] = jnp.zeros_like(gen["wi_kernel"])
  gen["wo_kernel"] = jnp.zeros_like(gen["wo_kernel"])
  plain = T5(helpers.TINY, prompt=seam.prompt_factory(functools.partial(PromptTuning, length=P), P))
  p_params = helpers.init_prompted(plain)
  p_params["encoder"]["prompt"]["prompt"]["prompt"] = gen["prompt"]
  # W = 0 makes the generated prompt exactly b2 (0 + b2): the same arithmetic downstream, so
  # the logits are bitwise equal.
  np.testing.assert_array_equal(helpers.logits(model, params), helpers.logits(plain, p_params))


@pytest.mark.parametrize("n,m,match", [(3, 9, "PHM n=3 must divide H=16"),
                                       (4, 6, "PHM n=4 must divide m=6")])
def test_phm_n_must_divide_m_and_h(n, m, match):
  method = functools.partial(idpg.IDPG, length=P, bottleneck=m, layer_type="phm", phm_n=n)
  with pytest.raises(ValueError, match=match):
    helpers.init(T5(helpers.TINY, prompt=seam.prompt_factory(method, P)))


def test_idpg_bottleneck_must_be_positive():
  method = functools.partial(idpg.IDPG, length=P, bottleneck=0)
  with pytest.raises(ValueError, match="IDPG bottleneck m must be > 0, got 0"):
    helpers.init(T5(helpers.TINY, prompt=seam.prompt_factory(method, P)))


def _multilayer(**kw):
  hook = functools.partial(idpg.MultiLayerIDPG, length=P, num_layers=2, bottleneck=8, **kw)
  model = T5(helpers.TINY, prompt=seam.prompt_factory(
      functools.partial(idpg.Placeholder, length=P), P), layer_prompts=hook)
  return model, helpers.init_prompted(model)


@pytest.mark.parametrize("kw", [dict(version="S"),
                                dict(version="L", layer_type="phm", phm_n=2,
                                     generator_input="previous_layer")])
def test_multilayer_idpg_trains_only_its_generators(kw):
  model, params = _multilayer(**kw)
  assert "prompt" not in params["encoder"]  # the placeholder has no parameters
  after, _ = helpers.assert_trains_only(model, params, ["encoder/layer_prompts/"])
  helpers.assert_masks_right(model, after, num_prompt=P)
  n = sum(v.size for v in jax.tree_util.tree_leaves(after["encoder"]["layer_prompts"]))
  assert n == idpg.num_trainable_params_multilayer(P, 16, 8, 2, kw["version"],
                                                   kw.get("layer_type", "dnn"),
                                                   kw.get("phm_n", 1))


def test_multilayer_idpg_with_zero_weights_sets_its_biases_in_every_layer():
  """Version M with W = 0 sets the prompt positions to b2_l before layer l: with one layer that
  is exactly prompt tuning with b2_0 as the prompt."""
  _, params = _multilayer(version="M")
  hook = params["encoder"]["layer_prompts"]
  hook["wi_kernel"] = jnp.zeros_like(hook["wi_kernel"])
  hook["wo_kernel"] = jnp.zeros_like(hook["wo_kernel"])
  one = helpers.TINY.replace(num_encoder_layers=1)
  frozen = helpers.frozen()
  frozen1 = dict(frozen, encoder={k: v for k, v in frozen["encoder"].items() if k != "layers_1"})
  m1 = T5(one, prompt=seam.prompt_factory(functools.partial(idpg.Placeholder, length=P), P),
          layer_prompts=functools.partial(idpg.MultiLayerIDPG, length=P, num_layers=1,
                                          bottleneck=8, version="M"))
  pt = T5(one, prompt=seam.prompt_factory(functools.partial(PromptTuning, length=P), P))
  one_layer_hook = dict(hook, wi_bias=hook["wi_bias"][:1], prompt=hook["prompt"][:1])
  p1 = dict(frozen1, encoder=dict(frozen1["encoder"], layer_prompts=one_layer_hook))
  p_pt = dict(frozen1, encoder=dict(frozen1["encoder"], prompt={"prompt": {
      "prompt": hook["prompt"][0]}}))
  # The hook overwrites the placeholder positions inside the layer loop (another program than
  # prompt tuning's): bound derived from float32's own error (tests/numerics.py).
  helpers.check_same_logits(m1, p1, pt, p_pt)
