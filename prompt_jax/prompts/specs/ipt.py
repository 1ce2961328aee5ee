"""IPT (Jiang et al. 2022): random / pretrained lookup and encoder IPT. gin: `prompt_jax.ipt_prompt`
(gin/prompts/ipt.gin, ipt_encoder.gin; as the source of per-layer prefixes in prefix_ipt.gin)."""
import dataclasses
from typing import Any, Optional, Sequence

import gin

from prompt_jax.errors import ConfigError
from prompt_jax.prompts import initializers, ipt, seam, tuning
from prompt_jax.prompts.specs import base

MODES = ("lookup", "encoder")


@dataclasses.dataclass(frozen=True)
class IPTSpec(base.MethodSpec):
  mode: str = "lookup"
  table_file: Optional[str] = None
  encoder: str = "textcnn"
  rate: float = 1.0
  widths: Sequence[int] = (3, 4, 5)
  filters: int = 100
  hidden: int = 256
  task_prompt_length: int = 0  # > 0: a prompt-tuning prompt before the IPT prompt
  task_prompt_init: Any = None

  @property
  def ipt_length(self) -> int:
    return self.length - self.task_prompt_length

  @property
  def input_dependent(self) -> bool:
    return True

  @property
  def reads_input_tokens(self) -> bool:
    return self.mode == "lookup"

  @property
  def required_inputs_length(self) -> int:
    return self.ipt_length if self.reads_input_tokens else 0

  @property
  def trainable_regex(self) -> str:
    """The frozen table of encoder IPT must not train: only its network (and task prompt)."""
    if self.mode != "encoder":
      return base.DEFAULT_REGEX
    if self.task_prompt_length:
      return r"encoder/prompt/prompt/(part_0/.*|part_1/text_encoder/.*)"
    return r"encoder/prompt/prompt/text_encoder/.*"

  def check(self, config):
    base.check_length(self.ipt_length)
    if self.mode not in MODES:
      raise ConfigError(f"IPT mode must be one of {MODES}, got {self.mode!r}")
    if self.encoder not in ipt.ENCODERS:
      raise ConfigError(f"IPT_ENCODER must be one of {ipt.ENCODERS}, got {self.encoder!r}")
    if not 0 < self.rate <= 1:
      raise ConfigError(f"IPT sequence utilisation rate must be in (0, 1], got {self.rate}")
    if self.mode == "encoder" and not self.table_file:
      raise ConfigError("encoder IPT needs IPT_TABLE_FILE (a pretrained table; see "
                        "prompt-jax ipt-pretrain)")
    if config is None:
      raise ConfigError("IPT needs the T5 config (vocab_size, emb_dim)")

  def ipt_method(self, backbone):
    """The IPT module's factory alone (without a task prompt)."""
    config = backbone.config
    table, pretrained = initializers.normal_init(0.5), None
    if self.table_file and not backbone.shapes_only:
      table = ipt.table_init(self.table_file, config.vocab_size, config.emb_dim)
      if self.mode == "encoder":
        pretrained = ipt.pretrained_lookup(ipt.load_network(
            self.table_file, encoder=self.encoder, widths=tuple(self.widths),
            filters=self.filters, hidden=self.hidden))
    return base.partial(ipt.IPT, length=self.ipt_length, vocab_size=config.vocab_size,
                        mode=self.mode, table_init=table, encoder=self.encoder, rate=self.rate,
                        widths=tuple(self.widths), filters=self.filters, hidden=self.hidden,
                        pretrained=pretrained)

  def method(self, backbone):
    module = self.ipt_method(backbone)
    if not self.task_prompt_length:
      return module
    task = base.partial(tuning.PromptTuning, length=self.task_prompt_length,
                        init=base.resolve_init(self.task_prompt_init, backbone))
    return base.partial(seam.Concat, methods=(task, module))

  def num_trainable_params(self, config):
    return (ipt.num_trainable_params(self.ipt_length, config.emb_dim, config.vocab_size,
                                     self.mode, self.encoder, tuple(self.widths), self.filters,
                                     self.hidden)
            + self.task_prompt_length * config.emb_dim)


def ipt_trainable_regex(mode: str, task_prompt_length: int = 0) -> str:
  return IPTSpec(length=task_prompt_length + 1, mode=mode,
                 task_prompt_length=task_prompt_length).trainable_regex


@gin.configurable(module="prompt_jax")
def ipt_prompt(length: int = 5, mode: str = "lookup", table_file: Optional[str] = None,
               encoder: str = "textcnn", rate: float = 1.0, widths: Sequence[int] = (3, 4, 5),
               filters: int = 100, hidden: int = 256, task_prompt_length: int = 0,
               task_prompt_init=None, placement="prefix") -> IPTSpec:
  """IPT: random/pretrained table lookup or encoder IPT (see prompts/ipt.py)."""
  return IPTSpec(length=length, placement=placement, mode=mode, table_file=table_file,
                 encoder=encoder, rate=rate, widths=tuple(widths), filters=filters,
                 hidden=hidden, task_prompt_length=task_prompt_length,
                 task_prompt_init=task_prompt_init)
