"""Autoregressive decoding with a key/value cache (greedy; the encoder runs once)."""
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def init_cache(model, encoder_input_tokens: Array, max_decode_length: int) -> Mapping[str, Any]:
  """A zero cache [batch, max_decode_length, heads, kv] per decoder self-attention layer."""
  batch = encoder_input_tokens.shape[0]
  dummy = jnp.zeros((batch, max_decode_length), jnp.int32)
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), encoder_input_tokens, dummy, dummy,
                         enable_dropout=False, decode=True)["cache"])
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


@functools.partial(jax.jit, static_argnames=("model", "max_decode_length", "eos_id",
                                             "decoder_start_token_id"))
def greedy_decode(model, params, encoder_input_tokens: Array, max_decode_length: int,
                  eos_id: int = 1, decoder_start_token_id: int = 0) -> Array:
  """Greedy tokens [batch, max_decode_length]; positions after EOS are 0 (padding).

  The loop stops early once every sequence has produced EOS.
  """
  batch = encoder_input_tokens.shape[0]
  encoded = model.apply({"params": params}, encoder_input_tokens, enable_dropout=False,
                        method=model.encode)  # [batch, T', embed]
  cache = init_cache(model, encoder_input_tokens, max_decode_length)

  def cond(state):
    i, _, _, done, _ = state
    return (i < max_decode_length) & ~jnp.all(done)

  def body(state):
    i, token, cache, done, out = state
    logits, mutated = model.apply(
        {"params": params, "cache": cache}, encoded, encoder_input_tokens, token[:, None],
        token[:, None], enable_dropout=False, decode=True, max_decode_length=max_decode_length,
        mutable=["cache"], method=model.decode)  # [batch, 1, vocab]
    next_token = jnp.argmax(logits[:, 0, :], axis=-1).astype(jnp.int32)  # [batch]
    next_token = jnp.where(done, 0, next_token)
    out = lax.dynamic_update_slice(out, next_token[:, None], (0, i))
    return i + 1, next_token, mutated["cache"], done | (next_token == eos_id), out

  start = jnp.full((batch,), decoder_start_token_id, jnp.int32)
  out = jnp.zeros((batch, max_decode_length), jnp.int32)
  state = (jnp.array(0), start, cache, jnp.zeros((batch,), bool), out)
  return lax.while_loop(cond, body, state)[-1]
