"""Per-layer prompts (google-research/prompt-tuning `extended/train/per_layer.py`; Qin & Eisner
2021's deep perturbation with `add`).

Layer 0 reads the input-level prompt (plain prompt tuning, [P, H], placed by the seam); before
every later encoder layer l = 1..L-1 the hidden states at the P prompt positions are replaced by
(`replace`) or added to (`add`) that layer's own prompt [P, H]. Unlike prefix tuning, the prompt
then goes through the layer's frozen Q/K/V projections like a real token. The hook finds the
prompt positions from `LayerContext.prompt_slots`, so every placement works.
Trainable: `encoder/prompt/prompt/prompt` [P, H] + `encoder/layer_prompts/prompt` [L-1, P, H]
= L·P·H.
"""
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from prompt_jax.prompts import initializers

Array = jax.Array
MODES = ("replace", "add")


def num_trainable_params(length: int, num_layers: int, emb_dim: int) -> int:
  return num_layers * length * emb_dim


class PerLayerPrompt(nn.Module):
  """Per-layer hook `h(ctx: LayerContext, deterministic) -> (x', None)`."""
  length: int
  num_layers: int  # L, the encoder's layers (layer 0 takes the input-level prompt)
  mode: str = "replace"
  # Layers 1..L-1's prompts; None: uniform [0, 0.5) for `replace`, zeros for `add` (the deltas
  # start at 0: step 0 is plain prompt tuning).
  init: Optional[initializers.PromptInit] = None

  @nn.compact
  def __call__(self, ctx, deterministic: bool = True):
    del deterministic
    if self.mode not in MODES:
      raise ValueError(f"per-layer prompt mode must be one of {MODES}, got {self.mode!r}")
    x = ctx.x  # [B, T', H]
    init = self.init or (initializers.uniform_init() if self.mode == "replace"
                         else nn.initializers.zeros)
    prompts = self.param("prompt", nn.with_logical_partitioning(
        init, ("prompt_layers", "prompt", "prompt_embed")),
        (max(self.num_layers - 1, 0), self.length, x.shape[-1]))  # [L-1, P, H]
    if ctx.layer == 0 or ctx.prompt_slots is None:
      return x, None
    slots = ctx.prompt_slots  # [B, T'] k + 1 at the k-th prompt position
    here = jnp.take(prompts[ctx.layer - 1], jnp.maximum(slots - 1, 0), axis=0)  # [B, T', H]
    at_prompt = (slots > 0)[..., None]
    if self.mode == "replace":
      x = jnp.where(at_prompt, here.astype(x.dtype), x)
    else:
      x = x + jnp.where(at_prompt, here, 0).astype(x.dtype)
    return x, None
