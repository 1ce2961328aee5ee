"""Attention visibility between prompt and input positions in the encoder (google-research/
prompt-tuning `prompt_tuning/extended/masks.py`).

What may attend to what is a set of names (query -> key):
  input->prompt           input positions see the prompt
  prompt->input           prompt positions see the input
  prompt->prompt          prompt positions see each other
  prompt->prompt;causal   prompt positions see the prompt positions up to their own slot
input->input is always on. A prompt position that may see no other prompt position still sees
itself (as the reference: a softmax needs one key). The default is full visibility (every name):
the encoder then builds today's mask (`Prompt.attention_mask` returns None).

Unlike the reference, positions come from the placement (`Prompt.slots`: the k-th prompt position
holds k + 1), so the mask works for every placement (prefix, after BOS, suffix, between segments)
and the causal order is the prompt's own order. The reference forces input->prompt on; here it can
be off (the input positions then compute exactly what they compute without a prompt).
"""
from typing import FrozenSet, Iterable, Optional, Union

import jax
import jax.numpy as jnp

Array = jax.Array
INPUT_PROMPT = "input->prompt"
PROMPT_INPUT = "prompt->input"
PROMPT_PROMPT = "prompt->prompt"
PROMPT_PROMPT_CAUSAL = "prompt->prompt;causal"
INPUT_INPUT = "input->input"
NAMES = (INPUT_PROMPT, PROMPT_INPUT, PROMPT_PROMPT, PROMPT_PROMPT_CAUSAL)
FULL = frozenset({INPUT_PROMPT, PROMPT_INPUT, PROMPT_PROMPT})


def parse(allowed: Optional[Union[str, Iterable[str]]]) -> Optional[FrozenSet[str]]:
  """A visibility set from names (a list, or one string of comma-separated names); None (or
  the full set) -> None (full visibility, today's mask). Raises ValueError on an unknown name."""
  if allowed is None:
    return None
  if isinstance(allowed, str):
    allowed = [a for a in allowed.split(",")]
  names = {a.strip().replace(" ", "") for a in allowed if a.strip()}
  unknown = sorted(names - set(NAMES) - {INPUT_INPUT})
  if unknown:
    raise ValueError(f"unknown attention visibility {unknown[0]!r}; choose from "
                     f"{', '.join(NAMES)} (input->input is always on)")
  names.discard(INPUT_INPUT)
  if PROMPT_PROMPT_CAUSAL in names:  # the more specific one wins, as the reference
    names.discard(PROMPT_PROMPT)
  names = frozenset(names)
  return None if names == FULL else names


def attention_mask(slots: Array, valid: Array, allowed: FrozenSet[str],
                   dtype=jnp.float32) -> Array:
  """[B, 1, T', T'] encoder mask from slots [B, T'] (k + 1 at the k-th prompt position, 0 at
  input positions) and the validity of each position `valid` [B, T']."""
  is_prompt = slots > 0  # [B, T']
  q_prompt, k_prompt = is_prompt[:, :, None], is_prompt[:, None, :]  # [B, T', 1], [B, 1, T']
  q_input, k_input = ~q_prompt, ~k_prompt
  see = q_input & k_input  # input->input
  if INPUT_PROMPT in allowed:
    see = see | (q_input & k_prompt)
  if PROMPT_INPUT in allowed:
    see = see | (q_prompt & k_input)
  if PROMPT_PROMPT in allowed:
    see = see | (q_prompt & k_prompt)
  elif PROMPT_PROMPT_CAUSAL in allowed:
    see = see | (q_prompt & k_prompt & (slots[:, None, :] <= slots[:, :, None]))
  else:
    see = see | (q_prompt & k_prompt & (slots[:, None, :] == slots[:, :, None]))  # itself
  see = see & valid[:, :, None] & valid[:, None, :]  # [B, T', T']
  return see[:, None].astype(dtype)  # [B, 1, T', T']
