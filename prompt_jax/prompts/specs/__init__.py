"""Method specs: the one spec type (`base.MethodSpec`) and each method's spec + gin registration.

  base      MethodSpec, Backbone, model_kwargs, check_fits, resolve_placement, DEFAULT_REGEX
  tuning    prompt_tuning (Lester et al.)      dpt       dpt, dpt_rank_probe (Xiao et al.)
  residual  residual_prompt                    prefix    deep_prefix (+ IPT source)
  idpg      idpg_prompt, idpg_multilayer       ipt       ipt_prompt
  p_tuning  p_tuning (Liu et al.; PEFT)        wayward   wayward_prompt (Khashabi et al.)
  multitask multitask_prompt, mpt_prompt (MPT)  per_layer per_layer_prompt
"""
from prompt_jax.prompts.specs.base import (DEFAULT_REGEX, Backbone, MethodSpec, check_fits,
                                           model_kwargs, resolve_placement)
from prompt_jax.prompts.specs.dpt import DPTSpec, RankProbeSpec, dpt, dpt_rank_probe
from prompt_jax.prompts.specs.idpg import IDPGSpec, idpg_multilayer, idpg_prompt
from prompt_jax.prompts.specs.ipt import IPTSpec, ipt_prompt, ipt_trainable_regex
from prompt_jax.prompts.specs.p_tuning import PTuningSpec, p_tuning
from prompt_jax.prompts.specs.multitask import (MPTSpec, MultiTaskSpec, mpt_prompt,
                                                multitask_prompt)
from prompt_jax.prompts.specs.per_layer import PerLayerSpec, per_layer_prompt
from prompt_jax.prompts.specs.prefix import DeepPrefixSpec, deep_prefix
from prompt_jax.prompts.specs.residual import ResidualSpec, residual_prompt
from prompt_jax.prompts.specs.tuning import PromptTuningSpec, from_prompt_file, prompt_tuning
from prompt_jax.prompts.specs.wayward import WaywardSpec, wayward_prompt

# Older name of the M-IDPG spec (one IDPGSpec with multilayer=True now serves both).
MultiLayerIDPGSpec = IDPGSpec
