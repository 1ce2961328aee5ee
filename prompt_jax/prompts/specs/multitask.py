"""Multi-task prompts (prompt-tuning `extended/multitask_prompts.py`) and MPT (Wang et al. 2023).

gin: `prompt_jax.multitask_prompt` (gin/prompts/multitask.gin), `prompt_jax.mpt_prompt`
(gin/prompts/mpt.gin). Both read each example's task from the batch's `task_ids` feature
(`tasks.multitask.register_multitask_mixture` sets it); `num_tasks` is the spec's, checked
against the data by `check_task_ids`.
"""
import dataclasses
from typing import Any, Optional

import gin
import numpy as np

from prompt_jax.errors import ConfigError
from prompt_jax.prompts import initializers, mpt, multitask
from prompt_jax.prompts.specs import base


def check_task_ids(task_ids: Optional[np.ndarray], num_tasks: int, weights=None) -> None:
  """One ConfigError if a batch has no task ids, or ids outside [0, num_tasks) (host side, on the
  numpy batch before it goes to the devices; rows with zero loss weight are padding)."""
  if task_ids is None:
    raise ConfigError(multitask.NO_TASK_IDS)
  ids = np.asarray(task_ids).reshape(-1)
  if weights is not None:
    ids = ids[np.asarray(weights).reshape(len(ids), -1).any(axis=1)]
  bad = ids[(ids < 0) | (ids >= num_tasks)]
  if bad.size:
    raise ConfigError(f"the data has task index {int(bad[0])} but the prompt has NUM_TASKS="
                      f"{num_tasks} (indices 0..{num_tasks - 1}); set NUM_TASKS to the number "
                      f"of tasks in the mixture")


def _check_tasks(num_tasks: int) -> None:
  if num_tasks < 1:
    raise ConfigError(f"NUM_TASKS must be >= 1, got {num_tasks}")


@dataclasses.dataclass(frozen=True)
class MultiTaskSpec(base.MethodSpec):
  num_tasks: int = 2
  combine: str = "add"
  task_length: Optional[int] = None
  shared_features: Optional[int] = None
  init: Any = None  # shared prompt's initialiser spec; default uniform [0, 0.5)

  def check_features(self, names):
    if multitask.TASK_INDEX not in names:
      raise ConfigError(multitask.NO_TASK_IDS)

  def check_batch(self, batch):
    check_task_ids(batch.get("task_ids"), self.num_tasks, batch.get("decoder_loss_weights"))

  @property
  def input_positions(self) -> int:
    if self.combine == "concat_length":
      return self.length + (self.length if self.task_length is None else self.task_length)
    return self.length

  @property
  def input_dependent(self) -> bool:
    return True  # the prompt depends on each example's task

  @property
  def no_fixed_prompt(self) -> str:
    return (f"{self.name} has one prompt per task (NUM_TASKS={self.num_tasks}), chosen by each "
            f"example's task")

  def check(self, config):
    super().check(config)
    _check_tasks(self.num_tasks)
    if self.combine not in multitask.COMBINATIONS:
      raise ConfigError(f"MULTITASK_COMBINE={self.combine!r} is not one of "
                        f"{list(multitask.COMBINATIONS)}")
    if self.task_length is not None and self.task_length < 1:
      raise ConfigError(f"MULTITASK_TASK_LENGTH must be >= 1, got {self.task_length}")
    if self.combine == "concat_features":
      if self.shared_features is None:
        raise ConfigError("MULTITASK_COMBINE='concat_features' needs MULTITASK_SHARED_FEATURES "
                          "(H_s; the task prompts get the model width minus H_s)")
      if config is not None and not 0 < self.shared_features < config.emb_dim:
        raise ConfigError(
            f"concat_features: shared features H_s={self.shared_features} + task features "
            f"H_t={config.emb_dim - self.shared_features} must add up to the model width "
            f"{config.emb_dim} with both > 0; use 0 < MULTITASK_SHARED_FEATURES < "
            f"{config.emb_dim}")
    elif self.combine == "project":
      if self.shared_features is not None and self.shared_features < 1:
        raise ConfigError(f"MULTITASK_SHARED_FEATURES must be >= 1, got {self.shared_features}")
    elif self.shared_features is not None and config is not None and (
        self.shared_features != config.emb_dim):
      raise ConfigError(f"MULTITASK_COMBINE={self.combine!r} uses the model width "
                        f"{config.emb_dim} for the shared prompt; set "
                        f"MULTITASK_SHARED_FEATURES=None (got {self.shared_features})")

  def method(self, backbone):
    shared_init = (base.resolve_init(self.init, backbone)
                   if self.combine in ("add", "concat_length") else initializers.uniform_init())
    return base.partial(multitask.MultiTaskPrompt, length=self.length,
                        num_tasks=self.num_tasks, combine=self.combine,
                        task_length=self.task_length, shared_features=self.shared_features,
                        shared_init=shared_init)

  def num_trainable_params(self, config):
    return multitask.num_trainable_params(self.combine, self.length, config.emb_dim,
                                          self.num_tasks, self.task_length,
                                          self.shared_features)


@dataclasses.dataclass(frozen=True)
class MPTSpec(base.MethodSpec):
  num_tasks: int = 1
  rank: int = 1
  init: Any = None  # the shared prompt's initialiser spec (random / text), without a source
  source: Optional[str] = None  # a source run's prompt (see prompts.mpt.load_source)
  source_init: Optional[str] = None  # one of mpt.SOURCE_INITS
  source_task: int = 0

  @property
  def input_dependent(self) -> bool:
    return self.num_tasks > 1

  @property
  def no_fixed_prompt(self) -> str:
    return (f"{self.name} has one prompt per task (NUM_TASKS={self.num_tasks}), chosen by each "
            f"example's task")

  def check_features(self, names):
    if self.num_tasks > 1 and multitask.TASK_INDEX not in names:
      raise ConfigError(multitask.NO_TASK_IDS)

  def check_batch(self, batch):
    if self.num_tasks > 1 or "task_ids" in batch:
      check_task_ids(batch.get("task_ids"), self.num_tasks, batch.get("decoder_loss_weights"))

  def check(self, config):
    super().check(config)
    _check_tasks(self.num_tasks)
    if self.rank < 1:
      raise ConfigError(f"MPT_RANK must be >= 1, got {self.rank}")
    if (self.source is None) != (self.source_init is None):
      raise ConfigError("MPT target initialisation needs both MPT_SOURCE (a source run's "
                        "prompt) and MPT_SOURCE_INIT (one of "
                        f"{list(mpt.SOURCE_INITS)}), or neither")
    if self.source_init is not None and self.source_init not in mpt.SOURCE_INITS:
      raise ConfigError(f"MPT_SOURCE_INIT={self.source_init!r} is not one of "
                        f"{list(mpt.SOURCE_INITS)}")

  def method(self, backbone):
    start = None
    if self.source is not None and not backbone.shapes_only:
      params = mpt.target_init(mpt.load_source(self.source), self.source_init,
                               self.source_task, self.num_tasks)
      expected = {"prompt": (self.length, backbone.config.emb_dim),
                  "task_cols": (self.num_tasks, self.length, self.rank),
                  "task_rows": (self.num_tasks, self.rank, backbone.config.emb_dim)}
      for name, value in params.items():
        if tuple(value.shape) != expected[name]:
          raise ConfigError(f"MPT source {self.source}: {name} has shape {tuple(value.shape)}, "
                            f"this run needs {expected[name]} (PROMPT_LENGTH, MPT_RANK and "
                            f"the model must match the source run's)")
      start = lambda: params
    return base.partial(mpt.MultitaskPrompt, length=self.length, num_tasks=self.num_tasks,
                        rank=self.rank, init=base.resolve_init(self.init, backbone),
                        start=start)

  def num_trainable_params(self, config):
    return mpt.num_trainable_params(self.length, config.emb_dim, self.num_tasks, self.rank)

  def fold(self, params, config):
    if self.num_tasks > 1:
      return super().fold(params, config)
    p = base.input_prompt(params)
    return {"prompt": np.asarray(mpt.task_prompts(p["prompt"], p["task_cols"][0],
                                                  p["task_rows"][0]))}  # [P, H]


@gin.configurable(module="prompt_jax")
def multitask_prompt(length: int = 100, num_tasks: int = 2, combine: str = "add",
                     task_length: Optional[int] = None, shared_features: Optional[int] = None,
                     init=None, placement="prefix") -> MultiTaskSpec:
  """A shared prompt plus one prompt per task, combined by add / concat_length /
  concat_features / project."""
  return MultiTaskSpec(length=length, placement=placement, num_tasks=num_tasks, combine=combine,
                       task_length=task_length, shared_features=shared_features, init=init)


@gin.configurable(module="prompt_jax")
def mpt_prompt(length: int = 100, num_tasks: int = 1, rank: int = 1, init=None,
               source: Optional[str] = None, source_init: Optional[str] = None,
               source_task: int = 0, placement="prefix") -> MPTSpec:
  """MPT: shared prompt ∘ (u_k v_k^T) per task; target runs start from a source run."""
  return MPTSpec(length=length, placement=placement, num_tasks=num_tasks, rank=rank, init=init,
                 source=source, source_init=source_init, source_task=source_task)
