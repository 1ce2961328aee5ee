"""Prompt tuning (Lester et al. 2021): one learned [P, H] prompt, the project's default method.

gin: `prompt_jax.prompt_tuning` (PROMPT_LENGTH from the run file, the initialiser from
gin/prompts/{uniform,from_sampled_vocab,from_class_labels,from_file}.gin).
"""
import dataclasses
from typing import Any, Callable, Optional

import gin

from prompt_jax.prompts import initializers, tuning
from prompt_jax.prompts.specs import base


@dataclasses.dataclass(frozen=True)
class PromptTuningSpec(base.MethodSpec):
  init: Any = None  # an initialiser spec (prompts.initializers); default uniform [0, 0.5)

  def method(self, backbone):
    return base.partial(tuning.PromptTuning, length=self.length,
                        init=base.resolve_init(self.init, backbone))

  def num_trainable_params(self, config):
    return self.length * config.emb_dim

  def fold(self, params, config):
    return {"prompt": base.input_prompt(params)["prompt"]}  # [P, H]


@gin.configurable(module="prompt_jax")
def prompt_tuning(length: int = 100, init: Optional[Callable] = None,
                  placement: str = "prefix") -> PromptTuningSpec:
  """Lester et al.'s prompt tuning: one learned [length, emb_dim] prompt (prefix by default)."""
  return PromptTuningSpec(length=length, placement=placement, init=init)


def from_prompt_file(spec: base.MethodSpec, path: str) -> PromptTuningSpec:
  """Plain prompt tuning at `spec`'s length and placement, its prompt read from a [P, H] .npy
  (e.g. a trained prompt, or a DPT / residual prompt folded for inference)."""
  return PromptTuningSpec(length=spec.input_positions, placement=spec.placement,
                          init=initializers.from_file(path))
