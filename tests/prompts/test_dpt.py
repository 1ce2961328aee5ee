"""DPT (Xiao et al. 2023): its defaults, initialisations (Gaussian, uniform, SVD of a prompt file),
bad ranks, and the rank probe of its Section 2 (formula, SVD start, TensorBoard count)."""
import functools

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from prompt_jax import cli
from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.prompts import initializers, low_rank, seam, specs
from prompt_jax.train import loop, optimizers
from tests import numerics
from tests.prompts import helpers
from tests.train import common

CFG = helpers.TINY
P = 4


def _backbone():
  table = np.asarray(helpers.frozen()["token_embedder"]["embedding"], np.float32)
  return specs.Backbone(CFG, embedding=table)


def test_dpt_gin_alone_binds_the_papers_setting_and_adamw():
  """dpt.gin (any order with the run file): P = 100, r = 10, Gaussian init, AdamW lr 0.3 with
  weight decay 1e-5 and gradient clipping at 1.0 (the reference code's)."""
  for files in (["runs/prompt_finetune.gin", "prompts/dpt.gin"],
                ["prompts/dpt.gin", "runs/prompt_finetune.gin"]):
    cli.parse_gin(["models/t5_1_1_small.gin"] + files, [], [])
    try:
      from prompt_jax import run_setup  # pylint: disable=g-import-not-at-top
      spec = run_setup.model_spec().prompt
      assert (spec.length, spec.rank, spec.init) == (100, 10, "normal")
      assert gin.query_parameter("prompt_jax.train.optimizer").selector == "prompt_jax.adamw"
      opt = optimizers.adamw()
    finally:
      gin.clear_config()
    assert float(opt.schedule(0)) == pytest.approx(0.3)
    # One AdamW step on a gradient of norm 10 moves each parameter by lr·(clipped-grad Adam
    # step ≈ ±1) + lr·wd·p: clipping does not change Adam's first step direction, so check the
    # update is AdamW's own on the clipped gradient.
    params = {"a": jnp.ones((4,))}
    grads = {"a": jnp.full((4,), 5.0)}
    updates, _ = opt.tx.update(grads, opt.tx.init(params), params)
    ref = optax.adamw(0.3, weight_decay=1e-5)
    ref_updates, _ = ref.update(optax.clip_by_global_norm(1.0).update(grads, None)[0],
                                ref.init(params), params)
    np.testing.assert_array_equal(updates["a"], ref_updates["a"])


@pytest.mark.parametrize("init,scale,closure", [
    ("normal", None, initializers.normal_init(0.5 / np.sqrt(3))),
    ("uniform", None, initializers.symmetric_uniform_init(0.5)),
    ("normal", 0.7, initializers.normal_init(0.7)),
    ("uniform", 0.7, initializers.symmetric_uniform_init(0.7))])
def test_dpt_inits_are_the_named_distributions(init, scale, closure):
  spec = specs.dpt(length=P, rank=2, init=init, scale=scale)
  method = spec.method(_backbone())
  rng = jax.random.PRNGKey(3)
  # The spec hands the module exactly these closures: same key, same values.
  np.testing.assert_array_equal(method.keywords["init_a"](rng, (P, 2)), closure(rng, (P, 2)))
  np.testing.assert_array_equal(method.keywords["init_b"](rng, (2, 16)), closure(rng, (2, 16)))


def test_dpt_gin_default_spread_is_the_reference_codes():
  # XYaoooo/DPT draws A and B from U(-0.5, 0.5): each entry has variance 1/12, so
  # std(A·B) = sqrt(r)/12. dpt.gin's Gaussian must have that variance (stddev 0.5 had 3x the
  # std of A·B). Sample stddev of n draws: relative standard error 1/sqrt(2n); 6 of them allowed.
  cli.parse_gin(["models/t5_1_1_small.gin", "runs/prompt_finetune.gin", "prompts/dpt.gin"], [],
                [])
  try:
    from prompt_jax import run_setup  # pylint: disable=g-import-not-at-top
    spec = run_setup.model_spec().prompt
  finally:
    gin.clear_config()
  assert (spec.init, spec.scale, spec.rank) == ("normal", None, 10)
  rows, cols = 4000, 1024
  keywords = spec.method(_backbone()).keywords
  init_a, init_b = keywords["init_a"], keywords["init_b"]
  for init, shape in ((init_a, (rows, spec.rank)), (init_b, (spec.rank, cols))):
    sample = np.asarray(init(jax.random.PRNGKey(0), shape), np.float64)
    n = sample.size
    np.testing.assert_allclose(sample.std(), np.sqrt(1 / 12), rtol=6 / np.sqrt(2 * n))


def test_dpt_svd_init_from_a_prompt_file_starts_at_that_prompt(tmp_path):
  prompt = np.random.RandomState(5).randn(P, 16).astype(np.float32)
  np.save(tmp_path / "p.npy", prompt)
  spec = specs.dpt(length=P, rank=P, init="svd", prompt_file=str(tmp_path / "p.npy"))
  model = T5(CFG, **spec.model_kwargs(_backbone()))
  params = helpers.init_prompted(model)
  ab = params["encoder"]["prompt"]["prompt"]
  # A, B are float32 factors of the float64 SVD: A·B reproduces the prompt to float32 rounding;
  # the bound is the float32 product's own error against its float64 evaluation (numerics.py).
  numerics.assert_close(prompt, low_rank.fold(ab), low_rank.fold(numerics.cast(ab, np.float64)),
                        what="A·B of the SVD init")
  with pytest.raises(ConfigError, match=r"has shape \(4, 16\), DPT needs \(3, 16\)"):
    specs.dpt(length=3, rank=2, init="svd", prompt_file=str(tmp_path / "p.npy")).model_kwargs(
        _backbone())
  with pytest.raises(ConfigError, match="DPT init 'svd' needs DPT_PROMPT_FILE"):
    specs.dpt(length=P, rank=2, init="svd").factory()


@pytest.mark.parametrize("spec,match", [
    (specs.dpt(length=4, rank=5), r"DPT rank r=5 must be in \[1, min\(P=4, H=16\)=4\]"),
    (specs.dpt_rank_probe(length=20, rank=17),
     r"rank-probe rank k=17 must be in \[1, min\(P=20, H=16\)=16\]"),
])
def test_rank_larger_than_min_p_h_is_a_one_line_error(spec, match):
  with pytest.raises(ConfigError, match=match) as e:
    specs.model_kwargs(spec, CFG)
  assert "\n" not in str(e.value)


def test_rank_error_through_the_cli(capsys):
  code = cli.main(["describe", "--gin_file=models/t5_1_1_small.gin", "--gin_file=prompts/dpt.gin",
                   "--gin.PROMPT_LENGTH=8", "--gin.DPT_RANK=9"])
  gin.clear_config()
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2
  assert err[-1] == ("prompt-jax describe: error: DPT rank r=9 must be in [1, min(P=8, H=512)=8]")


def _probe(rank=P, init=None):
  """A tiny T5 with the rank probe as its prompt."""
  method = functools.partial(low_rank.RankProbe, length=P, rank=rank,
                             prompt_init=init or initializers.normal_init(1.0))
  model = T5(CFG, prompt=seam.prompt_factory(method, P))
  return model, helpers.init_prompted(model)


def test_rank_probe_starts_at_the_svd_of_its_initial_prompt():
  init = initializers.normal_init(1.0)
  keys = []

  def recording(rng, shape):  # the initial prompt, and the key the probe drew for it
    keys.append(rng)
    return init(rng, shape)
  module = low_rank.RankProbe(length=P, rank=P, prompt_init=recording)
  probe = nn.meta.unbox(module.init(jax.random.PRNGKey(0), jnp.ones((1, 2), jnp.int32),
                                    jnp.zeros((1, 2, 16))))["params"]
  assert probe["u"].shape == (P, P) and probe["s"].shape == (P,) and probe["v"].shape == (16, P)
  assert np.all(np.asarray(probe["s"]) > 0)
  assert all(np.array_equal(k, keys[0]) for k in keys)  # U, s, V: one SVD of one prompt
  # Its float32 SVD reconstructs the initial prompt; the bound is numpy's float32 SVD's own
  # reconstruction error (the float64 reference is the prompt itself).
  p0 = np.asarray(init(keys[0], (P, 16)), np.float32)
  u32, s32, vt32 = np.linalg.svd(p0, full_matrices=False)
  numerics.assert_close(low_rank.fold(probe), (u32 * s32) @ vt32, p0.astype(np.float64),
                        what="U·diag(s)·Vᵀ")


def test_rank_probe_prompt_is_u_relu_diag_s_vt():
  model, params = _probe()
  probe = dict(params["encoder"]["prompt"]["prompt"])
  probe["s"] = probe["s"].at[1].set(-2.0)  # a negative entry: ReLU drops that direction
  params = dict(params, encoder=dict(params["encoder"], prompt={"prompt": probe}))
  assert int(low_rank.positive_count(probe)) == P - 1
  u, s, v = (np.asarray(probe[k], np.float64) for k in ("u", "s", "v"))
  formula = lambda dtype: ((u * np.maximum(s, 0)) @ v.T).astype(dtype)

  def ours(dtype):
    embedded = jnp.zeros((1, 2, 16), dtype)
    return model.apply({"params": numerics.cast(params, dtype)}, jnp.ones((1, 2), jnp.int32),
                       embedded, method=lambda m, t, e: m.encoder.prompt_module.prompt(t, e))
  numerics.check_equivalent(ours, formula)  # bound: the formula's own float32 error


def _push_negative_from_step_2():
  """An optimizer that leaves the parameters alone in step 1 and lowers every one by 1e6 in
  step 2 (so every entry of s becomes negative)."""
  def init(params):
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update(grads, state, params=None):
    del params
    shift = jnp.where(state.count >= 1, -1e6, 0.0)
    updates = jax.tree_util.tree_map(lambda g: jnp.full_like(g, shift), grads)
    return updates, optax.ScaleByScheduleState(count=state.count + 1)
  return optimizers.Optimizer(optax.GradientTransformation(init, update),
                              optax.constant_schedule(0.0))


def test_rank_probe_count_is_logged_and_falls_when_s_goes_negative(tmp_path):
  model_dir = str(tmp_path / "probe")
  rest, bindings = cli.split_gin_dot_flags(
      ["--gin_file=prompts/dpt_rank_probe.gin"] + common.flags(
          model_dir, 2, "--gin.PROMPT_LENGTH=6", "--gin.prompt_jax.train.stats_period=1"))
  cli.parse_gin([a.split("=", 1)[1] for a in rest], bindings, [])
  try:
    loop.train(optimizer=_push_negative_from_step_2())
  finally:
    gin.clear_config()
  counts = common.tensorboard_scalars(model_dir, "dpt_rank_probe/positive_singular_values")
  # k = min(P, H) = 6, all s start positive; step 2 pushes every entry below 0.
  assert counts == {1: 6.0, 2: 0.0}
