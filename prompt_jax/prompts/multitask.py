"""Multi-task prompts (google-research/prompt-tuning `extended/multitask_prompts.py`): a prompt
shared by every task combined with one prompt per task.

The task of each example comes from the data, not from a first token: the batch feature
`task_ids` [B] (set per task by a multi-task mixture,
`tasks.multitask.register_multitask_mixture`), which the encoder hands to methods as `PromptContext.task_ids`.

Combinations (shared prompt S, the example's task prompt T_k):
  add              S [P, H] + T_k [P, H]                                 -> [B, P, H]
  concat_length    [S [P, H]; T_k [P_t, H]] along the length             -> [B, P + P_t, H]
  concat_features  [S [P, H_s], T_k [P, H_t]] along features, H_s + H_t = H -> [B, P, H]
  project          S [P, H_s] @ W_k [H_s, H] + b_k [H] (an affine map per task) -> [B, P, H]
Trainable parameters (`encoder/prompt/prompt/{shared_prompt,task_prompts}`): P·H_s for S plus
num_tasks x (P·H | P_t·H | P·H_t | H_s·H + H) for the task prompts. Gradients reach a task's
prompt only from that task's examples (its row is gathered by the example's task id).
"""
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from prompt_jax import partitioning
from prompt_jax.errors import ConfigError
from prompt_jax.prompts import initializers
from prompt_jax.prompts.seam import Method

Array = jax.Array
TASK_INDEX = "task_index"  # the task feature multi-task mixtures set (tasks/multitask.py)
COMBINATIONS = ("add", "concat_length", "concat_features", "project")
NO_TASK_IDS = ("this multi-task prompt needs the task of each example, but the batch has no "
               "`task_ids` feature; train on a mixture registered with "
               "prompt_jax.tasks.multitask.register_multitask_mixture (it sets `task_index` per task)")


def task_ids_of(context, batch: int, is_initializing: bool) -> Array:
  """[B] int32 task ids from the encoder context (zeros while only shapes are initialised)."""
  task_ids = None if context is None else context.task_ids
  if task_ids is None:
    if is_initializing:
      return jnp.zeros((batch,), jnp.int32)
    raise ConfigError(NO_TASK_IDS)
  return task_ids


def task_sizes(combine: str, length: int, emb_dim: int, task_length: Optional[int] = None,
               shared_features: Optional[int] = None):
  """(shared prompt shape, one task's parameter shape, prompt length out)."""
  if combine not in COMBINATIONS:
    raise ValueError(f"unknown multi-task combination {combine!r}; choose one of "
                     f"{list(COMBINATIONS)}")
  h_s = emb_dim if shared_features is None else shared_features
  if combine == "add":
    return (length, emb_dim), (length, emb_dim), length
  if combine == "concat_length":
    p_t = length if task_length is None else task_length
    return (length, emb_dim), (p_t, emb_dim), length + p_t
  if combine == "concat_features":
    return (length, h_s), (length, emb_dim - h_s), length
  return (length, h_s), (h_s + 1, emb_dim), length  # project: kernel rows + the bias row


def num_trainable_params(combine: str, length: int, emb_dim: int, num_tasks: int,
                         task_length: Optional[int] = None,
                         shared_features: Optional[int] = None) -> int:
  shared, task, _ = task_sizes(combine, length, emb_dim, task_length, shared_features)
  return shared[0] * shared[1] + num_tasks * task[0] * task[1]


def combine_prompts(combine: str, shared: Array, tasks: Array) -> Array:
  """shared [P, H_s], tasks [B, a, b] (each example's task parameters) -> [B, P', H]."""
  batch = tasks.shape[0]
  shared_b = partitioning.broadcast_batch(shared, (batch,) + shared.shape)  # [B, P, H_s]
  if combine == "add":
    return shared_b + tasks
  if combine == "concat_length":
    return jnp.concatenate([shared_b, tasks], axis=1)
  if combine == "concat_features":
    return jnp.concatenate([shared_b, tasks], axis=2)
  kernel, bias = tasks[:, :-1, :], tasks[:, -1:, :]  # [B, H_s, H], [B, 1, H]
  return jnp.einsum("ps,bsh->bph", shared, kernel) + bias


class MultiTaskPrompt(Method):
  """Shared + per-task prompts combined by `combine` (see module docstring)."""
  length: int  # P, the shared prompt's length
  num_tasks: int
  combine: str = "add"
  task_length: Optional[int] = None  # P_t (concat_length; default P)
  shared_features: Optional[int] = None  # H_s (concat_features: required; project: default H)
  shared_init: initializers.PromptInit = initializers.uniform_init()
  task_init: initializers.PromptInit = initializers.uniform_init()

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Array:
    del deterministic
    emb_dim = embedded.shape[-1]
    shared_shape, task_shape, _ = task_sizes(self.combine, self.length, emb_dim,
                                             self.task_length, self.shared_features)
    shared = self.param("shared_prompt", nn.with_logical_partitioning(
        self.shared_init, ("prompt", "prompt_embed")), shared_shape)
    if self.combine == "project":  # an affine map: identity kernel, zero bias + noise
      task_init = lambda rng, shp: (jnp.concatenate(
          [jnp.eye(shp[1] - 1, shp[2]), jnp.zeros((1, shp[2]))])[None]
          + 0.01 * jax.random.normal(rng, shp))
    else:
      task_init = self.task_init
    tasks = self.param("task_prompts", nn.with_logical_partitioning(
        task_init, ("prompt_tasks", "prompt", "prompt_embed")),
        (self.num_tasks,) + task_shape)  # [num_tasks, a, b]
    task_ids = task_ids_of(context, input_tokens.shape[0], self.is_initializing())
    picked = jnp.take(tasks, task_ids, axis=0)  # [B, a, b]
    return combine_prompts(self.combine, shared, picked).astype(embedded.dtype)  # [B, P', H]
