"""Every input-independent method exports (issue 9, item 5): its folded [P, H] prompt, fed to the
frozen model as plain prompt tuning, gives the method's own logits, and is what the PEFT adapter
holds."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.evaluation import export
from prompt_jax.evaluation import peft_export
from prompt_jax.models import get_config
from prompt_jax.prompts import specs
from tests import numerics

CONFIG = get_config("t5_1_1_small", emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                    num_encoder_layers=2, num_decoder_layers=2, vocab_size=64,
                    dtype=jnp.float32)
P = 6
METHODS = {
    "prompt_tuning": specs.prompt_tuning(length=P),
    "dpt": specs.dpt(length=P, rank=3),
    "dpt_rank_probe": specs.dpt_rank_probe(length=P, rank=4),
    "residual": specs.residual_prompt(length=P, bottleneck=8),
    "residual_separate": specs.residual_prompt(length=P, bottleneck=8, separate_mlps=True),
}


def _batch():
  rng = np.random.RandomState(0)
  enc = rng.randint(2, 64, (2, 9))
  enc[1, 5:] = 0
  dec = rng.randint(2, 64, (2, 4))
  return enc, np.concatenate([np.zeros((2, 1), int), dec[:, :-1]], axis=1), dec


@pytest.mark.parametrize("name", sorted(METHODS))
def test_folded_prompt_gives_the_methods_logits_and_is_the_peft_adapter(name, tmp_path):
  spec = METHODS[name]
  model = run_setup.build_model(CONFIG, spec)
  enc, dec_in, tgt = _batch()
  params = trees.unbox(model.init(jax.random.PRNGKey(1), jnp.asarray(enc), jnp.asarray(dec_in),
                                  jnp.asarray(tgt), enable_dropout=False)["params"])
  # Perturb the method's parameters so no factor sits at its initial value (ReLU(s) active).
  params = jax.tree_util.tree_map(
      lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(2), x.shape, x.dtype), params)
  folded = export.fold(spec, CONFIG, params)
  assert list(folded) == ["prompt"] and folded["prompt"].shape == (P, CONFIG.emb_dim)
  plain = specs.prompt_tuning(length=P)
  plain_params = {**params, "encoder": {**{k: v for k, v in params["encoder"].items()},
                                        "prompt": {"prompt": {"prompt": folded["prompt"]}}}}

  def method_logits(dtype):
    return run_setup.build_model(CONFIG.replace(dtype=dtype), spec).apply(
        {"params": numerics.cast(params, dtype)}, enc, dec_in, tgt, enable_dropout=False)

  def folded_logits(dtype):
    return run_setup.build_model(CONFIG.replace(dtype=dtype), plain).apply(
        {"params": numerics.cast(plain_params, dtype)}, enc, dec_in, tgt, enable_dropout=False)

  # The folded prompt (computed once in float32) in place of the method: the bound is the
  # method's own float32 error against its float64 evaluation (tests/numerics.py). The float64
  # variant is not checked: its prompt was rounded to float32 by the fold.
  numerics.check_equivalent(folded_logits, method_logits, check_float64=False,
                            what=f"{name} folded to a plain prompt")

  peft_export.check_representable(spec, CONFIG)
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  peft_export.write_adapter(folded["prompt"], str(tmp_path), CONFIG)
  saved = load_file(str(tmp_path / peft_export.WEIGHTS_NAME))
  np.testing.assert_array_equal(saved["prompt_embeddings"], folded["prompt"])  # a copy


def test_deep_prefix_exports_key_value_arrays_and_its_input_prompt():
  spec = specs.deep_prefix(length=3, hidden=16, input_prompt=specs.prompt_tuning(length=2))
  model = run_setup.build_model(CONFIG, spec)
  enc, dec_in, tgt = _batch()
  params = trees.unbox(model.init(jax.random.PRNGKey(1), jnp.asarray(enc), jnp.asarray(dec_in),
                                  jnp.asarray(tgt), enable_dropout=False)["params"])
  folded = export.fold(spec, CONFIG, params)
  assert sorted(folded) == ["decoder_prefix", "prefix", "prompt"]
  assert folded["prefix"].shape == (2, 2, 3, 32)  # [key/value, L, P, heads * head_dim]
  np.testing.assert_array_equal(folded["prompt"],
                                params["encoder"]["prompt"]["prompt"]["prompt"])
