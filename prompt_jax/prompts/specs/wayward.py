"""Wayward prompts (Khashabi et al. 2022). gin: `prompt_jax.wayward_prompt`."""
import dataclasses

import gin

from prompt_jax.errors import ConfigError
from prompt_jax.prompts import wayward
from prompt_jax.prompts.specs import tuning


@dataclasses.dataclass(frozen=True)
class WaywardSpec(tuning.PromptTuningSpec):
  """Plain prompt tuning (same module, count and fold) + gamma * distance to `text`'s embeddings."""
  text: str = ""
  gamma: float = 0.01

  def check(self, config):
    super().check(config)
    if not self.text:
      raise ConfigError("wayward prompts need the discrete prompt: set WAYWARD_TEXT")
    if self.gamma < 0:
      raise ConfigError(f"WAYWARD_GAMMA must be >= 0, got {self.gamma}")

  def token_ids(self, vocabulary):
    ids = list(vocabulary.encode(self.text))
    if len(ids) != self.length:
      raise ConfigError(f"the wayward discrete prompt {self.text!r} has {len(ids)} tokens but "
                        f"PROMPT_LENGTH={self.length}; set PROMPT_LENGTH={len(ids)}")
    return ids

  def auxiliary_loss(self, backbone):
    self.check(backbone.config)
    if backbone.vocabulary is None:
      raise ConfigError("wayward prompts need the task's vocabulary to embed WAYWARD_TEXT")
    return wayward.regulariser(self.token_ids(backbone.vocabulary), self.gamma)


@gin.configurable(module="prompt_jax")
def wayward_prompt(length: int = gin.REQUIRED, text: str = gin.REQUIRED, gamma: float = 0.01,
                   init=None, placement="prefix") -> WaywardSpec:
  """Prompt tuning regularised towards the embedded discrete prompt `text` (weight gamma)."""
  return WaywardSpec(length=length, placement=placement, init=init, text=text, gamma=gamma)
