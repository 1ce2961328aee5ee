"""Multitask prompt tuning, MPT (Wang et al., ICLR 2023; PEFT `MultitaskPromptEmbedding`).

The prompt of task k is the shared prompt P* [P, H] times (Hadamard) a rank-r task matrix:
    P_k = P* ∘ (u_k v_k^T),   u_k [P, r] (`task_cols`), v_k^T [r, H] (`task_rows`).
Trained first on a mixture of source tasks (the task of each example from the batch's
`task_ids`, `PromptContext.task_ids`), then on a target task (one task, num_tasks = 1) from the
source parameters: the average of the source tasks' u, v, one source task's, or the shared
prompt only (PEFT's AVERAGE_SOURCE_TASKS / EXACT_SOURCE_TASK / ONLY_SOURCE_SHARED).
Parameter names follow the checkpoint paths `encoder/prompt/prompt/{prompt,task_cols,task_rows}`;
`peft_state` / `load_source` convert to and from PEFT's names (`prompt_embeddings`,
`prefix_task_cols`, `prefix_task_rows`). Trainable parameters: P·H + num_tasks·(P·r + r·H).
"""
import os
from typing import Callable, Dict, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax import npy
from prompt_jax.errors import ConfigError
from prompt_jax.prompts import initializers
from prompt_jax.prompts.multitask import task_ids_of
from prompt_jax.prompts.seam import Method

Array = jax.Array
SOURCE_INITS = ("average_source_tasks", "exact_source_task", "only_source_shared")
PEFT_NAMES = {"prompt": "prompt_embeddings", "task_cols": "prefix_task_cols",
              "task_rows": "prefix_task_rows"}


def num_trainable_params(length: int, emb_dim: int, num_tasks: int, rank: int) -> int:
  return length * emb_dim + num_tasks * (length * rank + rank * emb_dim)


def task_prompts(prompt: Array, cols: Array, rows: Array) -> Array:
  """prompt [P, H], cols [..., P, r], rows [..., r, H] -> [..., P, H]."""
  return prompt * jnp.matmul(cols, rows)


class MultitaskPrompt(Method):
  """P* ∘ (u_k v_k^T) for each example's task k."""
  length: int
  num_tasks: int = 1
  rank: int = 1
  init: initializers.PromptInit = initializers.uniform_init()
  # () -> {name: array} of the parameters a target run starts from (`target_init`); a closure
  # (modules stay hashable); None: random.
  start: Optional[Callable[[], Mapping[str, np.ndarray]]] = None

  @nn.compact
  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Array:
    del deterministic
    emb_dim = embedded.shape[-1]
    src = self.start() if self.start is not None else {}
    pick = lambda name, default: (default if name not in src
                                  else lambda rng, shape: jnp.asarray(src[name], jnp.float32))
    prompt = self.param("prompt", nn.with_logical_partitioning(
        pick("prompt", self.init), ("prompt", "prompt_embed")), (self.length, emb_dim))
    cols = self.param("task_cols", nn.with_logical_partitioning(
        pick("task_cols", initializers.normal_init(0.02)),
        ("prompt_tasks", "prompt", "prompt_rank")), (self.num_tasks, self.length, self.rank))
    rows = self.param("task_rows", nn.with_logical_partitioning(
        pick("task_rows", initializers.normal_init(0.02)),
        ("prompt_tasks", "prompt_rank", "prompt_embed")), (self.num_tasks, self.rank, emb_dim))
    if self.num_tasks == 1 and (context is None or context.task_ids is None):
      task_ids = jnp.zeros((input_tokens.shape[0],), jnp.int32)  # a target task: no ids needed
    else:
      task_ids = task_ids_of(context, input_tokens.shape[0], self.is_initializing())
    out = task_prompts(prompt, jnp.take(cols, task_ids, axis=0), jnp.take(rows, task_ids, axis=0))
    return out.astype(embedded.dtype)  # [B, P, H]


def target_init(source: Optional[Mapping[str, np.ndarray]], mode: Optional[str],
                task: int, num_tasks: int) -> Dict[str, np.ndarray]:
  """The parameters a target run starts from (PEFT's semantics); {} for random."""
  if source is None or mode is None:
    return {}
  if mode not in SOURCE_INITS:
    raise ConfigError(f"unknown MPT source initialisation {mode!r}; choose one of "
                      f"{list(SOURCE_INITS)}")
  out = {"prompt": np.asarray(source["prompt"])}
  if mode == "only_source_shared":
    return out
  cols, rows = np.asarray(source["task_cols"]), np.asarray(source["task_rows"])
  if mode == "average_source_tasks":
    cols, rows = cols.mean(0, keepdims=True), rows.mean(0, keepdims=True)
  else:
    if not 0 <= task < cols.shape[0]:
      raise ConfigError(f"MPT_SOURCE_TASK={task} is outside the source's {cols.shape[0]} tasks; "
                        f"use 0..{cols.shape[0] - 1}")
    cols, rows = cols[task:task + 1], rows[task:task + 1]
  if num_tasks != 1:
    cols, rows = np.repeat(cols, num_tasks, 0), np.repeat(rows, num_tasks, 0)
  out.update(task_cols=cols, task_rows=rows)
  return out


def peft_state(params: Mapping[str, Array]) -> Dict[str, np.ndarray]:
  """Our trained {prompt, task_cols, task_rows} under PEFT's state-dict names."""
  return {PEFT_NAMES[k]: np.asarray(v, np.float32) for k, v in params.items()}


def load_source(path: str) -> Dict[str, np.ndarray]:
  """Source parameters from a PEFT `adapter_model.safetensors` / .npz (PEFT's names or ours),
  or a prompt_jax `numpy_checkpoints/checkpoint_<step>` directory of a source run."""
  if os.path.isdir(path):
    names = {k: f"encoder.prompt.prompt.{k}.npy" for k in PEFT_NAMES}
    missing = [n for n in names.values() if not os.path.isfile(os.path.join(path, n))]
    if missing:
      raise ConfigError(f"MPT source {path} has no {missing[0]}; point MPT_SOURCE at a source "
                        f"run's numpy_checkpoints/checkpoint_<step> directory")
    return {k: npy.load(os.path.join(path, n), f"MPT source file {os.path.join(path, n)!r}")
            for k, n in names.items()}
  if not os.path.isfile(path):
    raise ConfigError(f"MPT source {path} does not exist; set MPT_SOURCE to a source run's "
                      f"numpy_checkpoints/checkpoint_<step> directory or a .safetensors/.npz")
  raw = npy.load_archive(path, f"MPT source {path!r}", "point MPT_SOURCE at a source run's "
                         "numpy_checkpoints/checkpoint_<step> directory or its PEFT export")
  out = {}
  for ours, peft in PEFT_NAMES.items():
    hits = [v for k, v in raw.items() if k == ours or k.endswith(peft)]
    if hits:
      out[ours] = np.asarray(hits[0], np.float32)
  if "prompt" not in out:
    raise ConfigError(f"MPT source {path} has no shared prompt ('prompt' or "
                      f"'{PEFT_NAMES['prompt']}')")
  return out
