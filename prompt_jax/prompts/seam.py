"""The one seam between prompt methods and the frozen model.

A *method* answers "given this batch, what prompt embeddings?":
  method(input_tokens [B, T], embedded [B, T, H], deterministic, context=None)
      -> prompt [B, P, H] (or [P, H])
`context` is the encoder's `models.PromptContext` (raw input, validity, and `representation()`,
the frozen encoder's pooled output); methods that need no more than tokens and embeddings ignore
it. Every method defines `prompt_mask(input_tokens [B, T]) -> [B, P] or None` (None: all P
positions real; IPT masks positions read off padding), touching no parameters.
A *placement* decides where they go:
  place(prompt [B?, P, H], embedded [B, T, H], input_tokens [B, T], prompt_mask=None)
      -> (embedded' [B, T+P, H], mask [B, T+P])
Placements here: prefix (default), after_bos, suffix (after the last real token, before EOS) and
`between_segments(separator)` (between the two segments of a pair task).
`Prompt` joins the two into the module the encoder calls (`T5(config, prompt=...)`).
"""
import functools
from typing import Callable, FrozenSet, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from prompt_jax import partitioning
from prompt_jax.errors import check_integer
from prompt_jax.prompts import visibility as visibility_lib

Array = jax.Array
Placement = Callable[..., Tuple[Array, Array]]
EOS_ID = 1


def insert(prompt: Array, embedded: Array, input_tokens: Array, start: Array,
           prompt_mask: Optional[Array] = None) -> Tuple[Array, Array]:
  """Inserts the prompt into every example at its own position `start` [B].

  Output position j takes input j (j < start), prompt j - start (start <= j < start + P) or
  input j - P (after the prompt): a gather, so it works for per-example positions under jit.
  """
  batch, length = input_tokens.shape
  num_prompt = prompt.shape[-2]
  prompt = partitioning.broadcast_batch(prompt, (batch, num_prompt, prompt.shape[-1])
                                        ).astype(embedded.dtype)  # [B, P, H]
  if prompt_mask is None:
    prompt_mask = jnp.ones((batch, num_prompt), bool)
  start = jnp.clip(jnp.asarray(start, jnp.int32), 0, length)[:, None]  # [B, 1]
  j = jnp.arange(length + num_prompt)[None, :]  # [1, T + P]
  in_prompt = (j >= start) & (j < start + num_prompt)  # [B, T + P]
  src_input = jnp.where(j < start, j, j - num_prompt).clip(0, length - 1)  # [B, T + P]
  src_prompt = (j - start).clip(0, max(num_prompt - 1, 0))  # [B, T + P]
  take = lambda a, idx: jnp.take_along_axis(a, idx[..., None], axis=1)
  if num_prompt:
    values = jnp.where(in_prompt[..., None], take(prompt, src_prompt),
                       take(embedded, src_input))  # [B, T + P, H]
    take2 = lambda a, idx: jnp.take_along_axis(a, idx, axis=1)
    mask = jnp.where(in_prompt, take2(prompt_mask, src_prompt),
                     take2(input_tokens > 0, src_input))  # [B, T + P]
  else:
    values, mask = embedded, input_tokens > 0
  return values, mask


def num_real_tokens(input_tokens: Array) -> Array:
  """[B] index one past the last non-padding token."""
  positions = jnp.arange(input_tokens.shape[1])[None, :]
  return jnp.max(jnp.where(input_tokens > 0, positions + 1, 0), axis=1)


def prefix(prompt, embedded, input_tokens, prompt_mask=None):
  """Prompt tokens before the input (Lester et al.'s default)."""
  batch = embedded.shape[0]
  prompt = partitioning.broadcast_batch(prompt, (batch,) + prompt.shape[-2:]).astype(embedded.dtype)
  if prompt_mask is None:
    prompt_mask = jnp.ones(prompt.shape[:2], bool)
  mask = jnp.concatenate([prompt_mask, input_tokens > 0], axis=1)  # [batch, P + T]
  return jnp.concatenate([prompt, embedded], axis=1), mask  # [batch, P + T, embed]


def after_bos(prompt, embedded, input_tokens, prompt_mask=None):
  """Prompt tokens after the first input token (the BOS of inputs that have one)."""
  start = jnp.ones(input_tokens.shape[:1], jnp.int32)
  return insert(prompt, embedded, input_tokens, start, prompt_mask)


def suffix(prompt, embedded, input_tokens, prompt_mask=None, eos_id: int = EOS_ID):
  """Prompt tokens after the last real token, before the EOS (after it if there is no EOS)."""
  end = num_real_tokens(input_tokens)  # [B]
  last = jnp.take_along_axis(input_tokens, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0]
  start = jnp.where((last == eos_id) & (end > 0), end - 1, end)
  return insert(prompt, embedded, input_tokens, start, prompt_mask)


def between_segments(separator: Sequence[int], after_separator: bool = True) -> Placement:
  """Prompt tokens between the two segments of a pair task (IDPG's best position for pairs).

  The second segment starts at the first occurrence of the token ids `separator` (e.g. the ids of
  "sentence2:" or "hypothesis:"); the prompt goes right after the separator (or right before it
  with after_separator=False). Examples without the separator get it as a suffix.
  """
  separator = tuple(int(i) for i in separator)
  if not separator:
    raise ValueError("between_segments needs a non-empty separator (token ids)")

  def place(prompt, embedded, input_tokens, prompt_mask=None):
    batch, length = input_tokens.shape
    width = len(separator)
    if width > length:
      return suffix(prompt, embedded, input_tokens, prompt_mask)
    windows = jnp.stack([input_tokens[:, k:length - width + 1 + k] for k in range(width)],
                        axis=-1)  # [B, T - w + 1, w]
    hit = jnp.all(windows == jnp.asarray(separator), axis=-1)  # [B, T - w + 1]
    first = jnp.argmax(hit, axis=1) + (width if after_separator else 0)  # [B]
    end = num_real_tokens(input_tokens)
    last = jnp.take_along_axis(input_tokens, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0]
    fallback = jnp.where(last == EOS_ID, end - 1, end)
    start = jnp.where(jnp.any(hit, axis=1), first, fallback)
    return insert(prompt, embedded, input_tokens, start, prompt_mask)
  return place


def separator_ids(vocabulary, text: str) -> Tuple[int, ...]:
  """Token ids of `text` as it appears inside an input (for `between_segments`)."""
  return tuple(vocabulary.encode(text))


PLACEMENTS = {"prefix": prefix, "after_bos": after_bos, "suffix": suffix}


def get_placement(name_or_fn) -> Placement:
  if callable(name_or_fn):
    return name_or_fn
  if name_or_fn not in PLACEMENTS:
    raise ValueError(f"unknown prompt position {name_or_fn!r}; choose one of "
                     f"{sorted(PLACEMENTS)} or between_segments(separator)")
  return PLACEMENTS[name_or_fn]


def check_prompt_length(prompt_length: int, inputs_length: int,
                        max_encoder_length: Optional[int] = None,
                        reads_input_tokens: bool = False) -> None:
  """Raises one clear ValueError if P does not fit the task's `inputs` feature length.

  The encoder sees inputs_length + P positions; with `max_encoder_length` (e.g. 512 as in the
  prompt-tuning recipes) that sum must fit. Methods that read their prompt off the first P input
  tokens (IPT) need P <= inputs_length.
  """
  check_integer(prompt_length, "prompt length", 0)
  if reads_input_tokens and prompt_length > inputs_length:
    raise ValueError(f"prompt length P={prompt_length} is larger than the inputs feature length "
                     f"{inputs_length} it is read from; use P <= {inputs_length}")
  if max_encoder_length is not None and prompt_length + inputs_length > max_encoder_length:
    raise ValueError(
        f"prompt length P={prompt_length} + inputs length {inputs_length} exceeds the encoder "
        f"length {max_encoder_length}; use inputs length <= {max_encoder_length - prompt_length}"
        f" or P <= {max_encoder_length - inputs_length}")


class Method(nn.Module):
  """Base of prompt methods: all P prompt positions are real unless a method says otherwise."""

  def prompt_mask(self, input_tokens: Array) -> Optional[Array]:
    del input_tokens
    return None


class Prompt(nn.Module):
  """A prompt method and its placement, as the encoder's seam module.

  Attributes:
    method: a factory `method(name='prompt')` of the module producing prompt embeddings.
    length: P, the number of prompt positions the method produces.
    placement: where the prompt goes: a name in PLACEMENTS or a placement function.
    visibility: the encoder's attention visibility (`visibility.parse`); None: full.
  """
  method: Callable[..., nn.Module]
  length: int
  placement: object = "prefix"
  visibility: Optional[FrozenSet[str]] = None

  def setup(self):
    self.prompt = self.method(name="prompt")

  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Tuple[Array, Array]:
    prompt = self.prompt(input_tokens, embedded, deterministic=deterministic,
                         context=context)  # [B?, P, H]
    if prompt.shape[-2] != self.length:
      raise ValueError(f"the prompt method produced {prompt.shape[-2]} positions, "
                       f"expected length={self.length}")
    return get_placement(self.placement)(prompt, embedded, input_tokens,
                                         self.prompt.prompt_mask(input_tokens))

  def input_mask(self, input_tokens: Array) -> Array:
    """[B, T + P] mask of the placed sequence, from the tokens alone (no parameters touched)."""
    batch, length = input_tokens.shape
    dummy_prompt = jnp.zeros((batch, self.length, 1), jnp.float32)
    dummy_embedded = jnp.zeros((batch, length, 1), jnp.float32)
    return get_placement(self.placement)(dummy_prompt, dummy_embedded, input_tokens,
                                         self.prompt.prompt_mask(input_tokens))[1]

  def attention_mask(self, input_tokens: Array, valid: Array, dtype=jnp.float32
                     ) -> Optional[Array]:
    """[B, 1, T + P, T + P] encoder self-attention mask of the run's visibility (`valid` [B, T + P]
    from the placement), or None for full visibility (the encoder's usual mask)."""
    if self.visibility is None:
      return None
    return visibility_lib.attention_mask(self.slots(input_tokens), valid, self.visibility, dtype)

  def slots(self, input_tokens: Array) -> Array:
    """[B, T + P] int32: k + 1 at the k-th prompt position, 0 at input positions (from the
    tokens alone), for hooks that act on the prompt positions in every layer (M-IDPG)."""
    batch, length = input_tokens.shape
    ids = jnp.broadcast_to(jnp.arange(1, self.length + 1, dtype=jnp.float32)[None, :, None],
                           (batch, self.length, 1))
    zeros = jnp.zeros((batch, length, 1), jnp.float32)
    placed, _ = get_placement(self.placement)(ids, zeros, input_tokens)
    return placed[..., 0].astype(jnp.int32)


class Concat(Method):
  """Several methods' prompts side by side: e.g. a task prompt followed by an IPT prompt.

  Each `methods[i](name=f'part_{i}')` is a method; the prompt is their concatenation along P.
  """
  methods: Sequence[Callable[..., nn.Module]]

  def setup(self):
    self.parts = [m(name=f"part_{i}") for i, m in enumerate(self.methods)]

  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context=None) -> Array:
    batch = input_tokens.shape[0]
    outs = []
    for part in self.parts:
      p = part(input_tokens, embedded, deterministic=deterministic, context=context)
      outs.append(partitioning.broadcast_batch(p, (batch,) + p.shape[-2:]).astype(embedded.dtype))
    return jnp.concatenate(outs, axis=1)  # [B, sum P_i, H]

  def prompt_mask(self, input_tokens: Array) -> Optional[Array]:
    masks = [part.prompt_mask(input_tokens) for part in self.parts]
    if all(m is None for m in masks):
      return None
    batch = input_tokens.shape[0]
    masks = [jnp.ones((batch, part.length), bool) if m is None else m
             for m, part in zip(masks, self.parts)]
    return jnp.concatenate(masks, axis=1)  # [B, P]


def prompt_factory(method: Callable[..., nn.Module], length: int,
                   placement="prefix", visibility=None) -> Callable[..., nn.Module]:
  """What `T5(config, prompt=...)` takes: `prompt_factory(PromptTuning-factory, P)`."""
  return functools.partial(Prompt, method=method, length=length, placement=placement,
                           visibility=visibility_lib.parse(visibility))
