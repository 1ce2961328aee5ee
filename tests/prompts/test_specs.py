"""Method specs and gin files: abstract-shape parameter counts equal each method's formula."""
import dataclasses

import gin
import jax
import numpy as np
import pytest
from flax import traverse_util

import flax.linen as nn
from prompt_jax import cli
from prompt_jax import paths
from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.partitioning import PROMPT_RULES
from prompt_jax.prompts import specs
from tests.prompts import helpers

CFG = helpers.TINY


def _count(spec, config=CFG):
  """What `prompt-jax describe` does: count abstract params under the trainable regex."""
  model = T5(config, **specs.model_kwargs(spec, config))
  enc, dec_in, tgt = helpers.batch()
  boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), enc, dec_in, tgt,
                                            enable_dropout=False))["params"]
  flat = traverse_util.flatten_dict(nn.meta.unbox(boxed), sep="/")
  axes = traverse_util.flatten_dict(nn.get_partition_spec(boxed), sep="/")
  prompt_axes = {name for name, _ in PROMPT_RULES}
  for path, shape in flat.items():
    if "prompt" in path:  # every method parameter has prompt (replicated) logical axes
      assert len(axes[path]) == len(shape.shape), path
      assert set(axes[path]) <= prompt_axes, (path, axes[path])
  return sum(int(np.prod(v.shape)) for k, v in flat.items()
             if trees.is_trainable(k, spec.trainable_regex))


SPECS = {
    "dpt": specs.dpt(length=5, rank=3),
    "residual_shared": specs.residual_prompt(length=5, bottleneck=7),
    "residual_separate": specs.residual_prompt(length=5, bottleneck=7, separate_mlps=True),
    "prefix_direct": specs.deep_prefix(length=3),
    "prefix_reparam": specs.deep_prefix(length=3, hidden=6),
    "prefix_plus_prompt": specs.deep_prefix(length=3, input_prompt=specs.dpt(length=2, rank=1)),
    "idpg_dnn": specs.idpg_prompt(length=4, bottleneck=8),
    "idpg_phm": specs.idpg_prompt(length=4, bottleneck=8, layer_type="phm", phm_n=4),
    "midpg_S": specs.idpg_multilayer(length=3, bottleneck=8, version="S"),
    "midpg_L_phm": specs.idpg_multilayer(length=3, bottleneck=8, version="L", layer_type="phm",
                                         phm_n=2),
    "ipt_lookup": specs.ipt_prompt(length=4),
    "ipt_with_task_prompt": specs.ipt_prompt(length=6, task_prompt_length=2),
    "prefix_plus_ipt": specs.deep_prefix(length=2, input_prompt=specs.ipt_prompt(length=3)),
    "prefix_encoder_and_decoder": specs.deep_prefix(length=2, hidden=5, decoder=True),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_abstract_count_equals_formula(name):
  spec = SPECS[name]
  assert _count(spec) == spec.num_trainable_params(CFG) > 0


def test_encoder_ipt_count_and_regex_exclude_the_frozen_table(tmp_path):
  np.save(tmp_path / "t.npy", np.zeros((CFG.vocab_size, CFG.emb_dim), np.float32))
  spec = specs.ipt_prompt(length=2, mode="encoder", table_file=str(tmp_path / "t.npy"),
                          encoder="mlp", hidden=5)
  assert spec.trainable_regex == r"encoder/prompt/prompt/text_encoder/.*"
  # The paper's MLP: three linear layers, H -> m -> m -> k·H (issue 8 item 4).
  assert _count(spec) == spec.num_trainable_params(CFG) == 16 * 5 + 5 + 5 * 5 + 5 + 5 * 32 + 32


def test_bad_spec_inputs_are_clear_errors():
  with pytest.raises(ConfigError, match="PHM n=3 must divide m=8, H=16"):
    specs.idpg_prompt(length=2, bottleneck=8, layer_type="phm", phm_n=3).factory(config=CFG)
  with pytest.raises(ConfigError, match="residual MLP bottleneck must be > 0, got -1"):
    specs.residual_prompt(length=2, bottleneck=-1).factory()
  with pytest.raises(ConfigError, match="DPT rank r must be > 0, got 0"):
    specs.dpt(length=2, rank=0).factory()
  with pytest.raises(ConfigError, match="encoder IPT needs IPT_TABLE_FILE"):
    specs.ipt_prompt(length=2, mode="encoder").factory(config=CFG)


@pytest.mark.parametrize("spec,rate", [
    (specs.residual_prompt(length=2, bottleneck=4, dropout_rate=1.5), "1.5"),
    (specs.deep_prefix(length=2, hidden=4, dropout_rate=-0.1), "-0.1"),
    (specs.p_tuning(length=2, dropout_rate=1.0), "1.0"),
    (specs.idpg_prompt(length=2, bottleneck=8, dropout_rate="0.1"), "'0.1'")],
    ids=["residual", "prefix", "p_tuning", "idpg"])
def test_a_dropout_rate_outside_zero_to_one_is_one_line(spec, rate):
  """RESIDUAL_DROPOUT=1.5 trained on (flax scales by 1 / (1 - rate))."""
  with pytest.raises(ConfigError, match=rf"^{spec.name}'s dropout rate must be in \[0, 1\) "
                                        rf"\(the share of units dropped\), got {rate}$"):
    spec.check(CFG)
  ok = dataclasses.replace(spec, dropout_rate=0.0)
  ok.check(CFG)  # (0 is no dropout)



METHOD_GIN = ["dpt.gin", "residual.gin", "prefix.gin", "idpg.gin", "ipt.gin", "ipt_encoder.gin",
              "idpg_multilayer.gin"]


@pytest.mark.parametrize("gin_file", METHOD_GIN)
def test_method_gin_files_bind_their_spec(gin_file):
  gin.clear_config()
  cli._register_configurables()  # method files may bind the trainer's optimizer (AdamW)
  try:
    gin.add_config_file_search_path(paths.gin_dir())
    gin.parse_config_files_and_bindings(
        [f"prompts/{gin_file}"],
        ["PROMPT_LENGTH = 4", "TRAINABLE_REGEX = 'encoder/(prompt|layer_prompts)/.*'",
         "prompt_jax.t5_config.preset = 't5_1_1_small'", "IPT_TABLE_FILE = '/unused.npy'"],
        finalize_config=False)
    spec = run_setup.model_spec().prompt
    assert isinstance(spec, specs.MethodSpec) and spec.length == 4
    config = run_setup.t5_config(preset="t5_1_1_small")
    assert spec.num_trainable_params(config) > 0
  finally:
    gin.clear_config()


def test_check_fits_rejects_a_prompt_longer_than_the_inputs_allow():
  specs.check_fits(specs.ipt_prompt(length=8), inputs_length=8)
  with pytest.raises(ConfigError, match="P=9 is larger than the inputs feature length 8"):
    specs.check_fits(specs.ipt_prompt(length=9), inputs_length=8)
  with pytest.raises(ConfigError, match=r"P=100 \+ inputs length 500 exceeds the encoder length"):
    specs.check_fits(specs.dpt(length=100), inputs_length=500, max_encoder_length=512)
  specs.check_fits(specs.deep_prefix(length=100), inputs_length=500, max_encoder_length=512)
