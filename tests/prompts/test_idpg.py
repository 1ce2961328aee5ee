"""IDPG (dense and PHM generators): training, masks, the reduction to prompt tuning, bad n."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import T5
from prompt_jax.prompts import idpg, initializers, phm, seam, specs
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
  # Instance-dependent: two inputs get different prompts (the encoder passes the method its
  # PromptContext: the frozen encoder's representation for representation='encoder').
  def prompt_of(m, t, e):
    del e
    embedded = m.token_embedder(t)
    return m.encoder.prompt_module.prompt(t, embedded, context=m.encoder.context(t, embedded))
  out = model.apply({"params": after}, *helpers.batch()[:1], jnp.zeros((4, 16)),
                    method=prompt_of)
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


def _multilayer(num_layers=2, placement="prefix", **kw):
  """M-IDPG: the IDPG generator (with a per-layer axis) is the seam's method, layer 0's prompt;
  the parameterless hook adds G_l at the prompt positions before layers l >= 1."""
  cfg = helpers.TINY.replace(num_encoder_layers=num_layers)
  gin_kw = {k: kw.pop(k) for k in ("generator_input",) if k in kw}
  method = functools.partial(idpg.IDPG, length=P, bottleneck=8, num_layers=num_layers, **kw)
  model = T5(cfg, prompt=seam.prompt_factory(method, P, placement),
             layer_prompts=functools.partial(idpg.MultiLayerIDPG, **gin_kw))
  if num_layers == 2:
    return model, helpers.init_prompted(model)
  frozen = helpers.frozen()
  frozen1 = dict(frozen, encoder={k: v for k, v in frozen["encoder"].items() if k != "layers_1"})
  enc, dec_in, tgt = helpers.batch()
  own = jax.jit(lambda rng: nn.meta.unbox(model.init(rng, enc, dec_in, tgt, enable_dropout=False))[
      "params"]["encoder"]["prompt"])(jax.random.PRNGKey(0))
  return model, dict(frozen1, encoder=dict(frozen1["encoder"], prompt=own))


@pytest.mark.parametrize("kw", [dict(version="S"),
                                dict(version="L", layer_type="phm", phm_n=2,
                                     generator_input="previous_layer")])
def test_multilayer_idpg_trains_only_its_generators(kw):
  model, params = _multilayer(**dict(kw))
  assert "layer_prompts" not in params["encoder"]  # the hook has no parameters of its own
  after, _ = helpers.assert_trains_only(model, params, ["encoder/prompt/prompt/"])
  helpers.assert_masks_right(model, after, num_prompt=P)
  n = sum(v.size for v in jax.tree_util.tree_leaves(after["encoder"]["prompt"]))
  assert n == idpg.num_trainable_params_multilayer(P, 16, 8, 2, kw["version"],
                                                   kw.get("layer_type", "dnn"),
                                                   kw.get("phm_n", 1))


def test_multilayer_idpg_version_m_shares_weights_and_b1_not_b2():
  """Version M (the reference's `layerb`): W1, W2, b1 shared, one output bias per layer."""
  _, params = _multilayer(version="M", layer_type="phm", phm_n=2)
  gen = params["encoder"]["prompt"]["prompt"]
  assert gen["wi_blocks"].shape == (2, 8, 4) and gen["wo_blocks"].shape == (2, 4, P * 16 // 2)
  assert gen["wi_bias"].shape == (8,) and gen["phm_rule"].shape == (2, 2, 2)
  assert gen["prompt"].shape == (2, P, 16)  # b2_l for each of the 2 layers
  assert "phm_rule_out" not in gen  # one rule set shared by both generator layers (the paper)
  _, two = _multilayer(version="M", layer_type="phm", phm_n=2, phm_shared_rules=False)
  assert two["encoder"]["prompt"]["prompt"]["phm_rule_out"].shape == (2, 2, 2)
  n = sum(v.size for v in jax.tree_util.tree_leaves(two["encoder"]["prompt"]))
  assert n == idpg.num_trainable_params_multilayer(P, 16, 8, 2, "M", "phm", 2,
                                                   phm_shared_rules=False) == (
      2 * 2 ** 3 + (16 * 8 + 8 * P * 16) // 2 + 8 + 2 * P * 16)


class _AddBeforeLayer(nn.Module):
  """Reference hook: adds a fixed [P, H] `delta` at the prompt positions before layer 1."""
  delta: np.ndarray

  def __call__(self, ctx, deterministic=True):
    if ctx.layer != 1:
      return ctx.x, None
    return idpg.add_at_slots(ctx.x, jnp.broadcast_to(jnp.asarray(self.delta), (
        ctx.x.shape[0],) + self.delta.shape), ctx.prompt_slots), None


def _zero_weights(params):
  gen = dict(params["encoder"]["prompt"]["prompt"])
  for k in ("wi_kernel", "wo_kernel"):
    gen[k] = jnp.zeros_like(gen[k])
  return dict(params, encoder=dict(params["encoder"], prompt={"prompt": gen})), gen


def test_multilayer_idpg_with_zero_weights_is_prompt_tuning_with_its_biases():
  """Version M with W = 0: G_l = b2_l. One layer: exactly prompt tuning with b2_0 (the same
  arithmetic: bitwise equal). Two layers: layer 0 reads b2_0 through the seam and b2_1 is added
  at the prompt positions before layer 1, wherever the placement put them."""
  model1, params1 = _multilayer(num_layers=1, version="M")
  params1, gen1 = _zero_weights(params1)
  pt1 = T5(model1.config, prompt=seam.prompt_factory(functools.partial(PromptTuning, length=P), P))
  p_pt1 = dict(params1, encoder=dict(params1["encoder"], prompt={"prompt": {
      "prompt": gen1["prompt"][0]}}))
  np.testing.assert_array_equal(helpers.logits(model1, params1), helpers.logits(pt1, p_pt1))

  for placement in ("prefix", "suffix"):
    model, params = _multilayer(version="M", placement=placement)
    params, gen = _zero_weights(params)
    pt = T5(helpers.TINY, prompt=seam.prompt_factory(functools.partial(PromptTuning, length=P),
                                                     P, placement),
            layer_prompts=functools.partial(_AddBeforeLayer, delta=np.asarray(gen["prompt"][1])))
    p_pt = dict(params, encoder=dict(params["encoder"], prompt={"prompt": {
        "prompt": gen["prompt"][0]}}))
    # The generator's 0·h + b2_1 is b2_1 exactly and both add it with the same op: bitwise.
    np.testing.assert_array_equal(helpers.logits(model, params), helpers.logits(pt, p_pt))
    # ... and the added bias matters (b2_1 moves the logits).
    no_b1 = dict(gen, prompt=gen["prompt"].at[1].set(0.0))
    moved = helpers.logits(model, dict(params, encoder=dict(params["encoder"], prompt={
        "prompt": no_b1})))
    assert np.abs(np.asarray(moved) - np.asarray(helpers.logits(model, params))).max() > 1e-4


def test_multilayer_idpg_draws_each_layers_output_bias_from_its_initialiser():
  """The per-layer task prompts b2_l come from the spec's initialiser one layer at a time: with
  the sampled vocabulary, every row of every b2_l is a row of the frozen embedding table."""
  table = np.asarray(helpers.frozen()["token_embedder"]["embedding"])
  spec = specs.idpg_multilayer(length=P, bottleneck=8, version="M",
                               prompt_init=initializers.from_sampled_vocab(population_size=64))
  model = T5(helpers.TINY, **spec.model_kwargs(specs.Backbone(helpers.TINY, embedding=table)))
  b2 = np.asarray(helpers.init_prompted(model)["encoder"]["prompt"]["prompt"]["prompt"])
  assert b2.shape == (2, P, 16)
  for row in b2.reshape(-1, 16):
    assert np.any(np.all(table == row, axis=1))
  assert not np.array_equal(b2[0], b2[1])  # one draw per layer
