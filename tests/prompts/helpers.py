"""A tiny T5, a learnable toy batch and a tiny optax loop over the prompt parameters only."""
import functools
import re

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from prompt_jax.models import T5, T5Config
from prompt_jax.prompts import specs
from tests import numerics

TINY = T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                num_encoder_layers=2, num_decoder_layers=2, dtype=jnp.float32,
                mlp_activations=("gelu", "linear"), logits_via_embedding=False, dropout_rate=0.0)
PROMPT_REGEX = r"encoder/(prompt|layer_prompts)/.*"


def batch():
  """Inputs end with EOS (1) and are padded (0); the target is 3 + (first token is even)."""
  enc = jnp.array([[5, 6, 7, 8, 1, 0, 0, 0], [10, 9, 1, 0, 0, 0, 0, 0],
                   [12, 13, 14, 1, 0, 0, 0, 0], [21, 22, 23, 24, 25, 1, 0, 0]])
  first = enc[:, 0] % 2 == 0
  tgt = jnp.stack([3 + first.astype(jnp.int32), jnp.ones(4, jnp.int32)], axis=1)  # [4, 2]
  dec_in = jnp.concatenate([jnp.zeros((4, 1), jnp.int32), tgt[:, :1]], axis=1)
  return enc, dec_in, tgt


def flat(tree):
  return traverse_util.flatten_dict(flax.core.unfreeze(tree), sep="/")


def unflat(d):
  return traverse_util.unflatten_dict(dict(d), sep="/")


def init(model, seed=0, enc=None):
  """Unboxed params (jitted: eager init compiles one tiny kernel per initializer and shape)."""
  b_enc, dec_in, tgt = batch()
  enc = b_enc if enc is None else enc
  fn = jax.jit(lambda rng: model.init(rng, enc, dec_in[:enc.shape[0]], tgt[:enc.shape[0]],
                                      enable_dropout=False))
  return nn.meta.unbox(fn(jax.random.PRNGKey(seed)))["params"]


def init_prompted(model, seed=0):
  """A prompted model's params: its method parameters from `model.init`, the rest from the
  cached plain T5 (only the method's initialisers are computed: XLA drops the rest)."""
  enc, dec_in, tgt = batch()

  def method_params(rng):
    params = nn.meta.unbox(model.init(rng, enc, dec_in, tgt, enable_dropout=False))["params"]
    return {k: v for k, v in params["encoder"].items() if k in ("prompt", "layer_prompts")}
  own = jax.jit(method_params)(jax.random.PRNGKey(seed))
  base = frozen()
  return dict(base, encoder=dict(base["encoder"], **own))


@functools.lru_cache(maxsize=None)
def _frozen(seed):
  return init(T5(TINY), seed)


def frozen(seed=0):
  """The plain tiny T5's params (cached across tests)."""
  return _frozen(seed)


class WordVocab:
  """Words -> ids as a tiny vocabulary would: 'a b' -> [5, 6]."""

  def encode(self, text):
    return [5 + " abcdefgh".index(w) for w in text.split()]


def word_backbone():
  """The tiny T5's Backbone with its frozen params and `WordVocab` (what PREFIX_INIT_WORDS
  reads)."""
  params = frozen()
  return specs.Backbone(TINY, embedding=np.asarray(params["token_embedder"]["embedding"]),
                        vocabulary=WordVocab(), params=params)


def with_frozen(params, frozen):
  """`params` of a prompted model with every non-prompt leaf taken from `frozen` (a plain T5)."""
  out = flat(params)
  out.update({k: v for k, v in flat(frozen).items()})
  return unflat(out)


def logits(model, params, enc=None, dec_in=None, tgt=None, dropout_rng=None):
  b_enc, b_dec, b_tgt = batch()
  enc = b_enc if enc is None else enc
  dec_in = b_dec if dec_in is None else dec_in
  tgt = b_tgt if tgt is None else tgt
  # Eager on purpose: eager primitives are compiled once per shape for the whole session, while
  # a jitted forward would compile again for every model.
  rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
  return model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=dropout_rng is not None,
                     rngs=rngs)


def logits_fn(model, params, **kw):
  """dtype -> logits of `model` computing in dtype with `params` cast to it: one side of
  `numerics.check_equivalent` (the float64 side runs inside `numerics.float64()`)."""
  return lambda dtype: logits(model.clone(config=model.config.replace(dtype=dtype)),
                              numerics.cast(params, dtype), **kw)


def check_same_logits(model, params, ref_model, ref_params, *, check_float64=True, **kw):
  """Two (model, params) compute the same function on the toy batch (or `enc=`...): the bound is
  derived from the reference's own float32 error against float64 (tests/numerics.py)."""
  numerics.check_equivalent(logits_fn(model, params, **kw), logits_fn(ref_model, ref_params, **kw),
                            check_float64=check_float64)


def loss(model, params, dropout_rng=None):
  _, _, tgt = batch()
  out = logits(model, params, dropout_rng=dropout_rng)
  ce = optax.softmax_cross_entropy_with_integer_labels(out, tgt)  # [B, S]
  return jnp.sum(ce * (tgt > 0)) / jnp.sum(tgt > 0)


def train(model, params, regex=PROMPT_REGEX, steps=6, learning_rate=0.05, dropout=False):
  """A few Adam steps on the toy batch over the parameters matching `regex` only.

  Returns (params after, [loss before each step..., final loss], trainable paths)."""
  leaves = flat(params)
  trainable = {k: v for k, v in leaves.items() if re.fullmatch(regex, k)}
  frozen = {k: v for k, v in leaves.items() if k not in trainable}
  tx = optax.adam(learning_rate)
  opt_state = tx.init(trainable)

  def objective(tr, rng):
    return loss(model, unflat({**frozen, **tr}), rng if dropout else None)

  @jax.jit
  def step(tr, opt_state, rng):
    value, grads = jax.value_and_grad(objective)(tr, rng)
    updates, opt_state = tx.update(grads, opt_state, tr)
    return optax.apply_updates(tr, updates), opt_state, value

  losses = []
  for i in range(steps):
    trainable, opt_state, value = step(trainable, opt_state, jax.random.PRNGKey(i))
    losses.append(float(value))
  losses.append(float(loss(model, unflat({**frozen, **trainable}))))
  return unflat({**frozen, **trainable}), losses, sorted(trainable)


def assert_trains_only(model, params, expected_prefixes, regex=PROMPT_REGEX, **kw):
  """Acceptance 1: only the method's parameters change, every one of them, and the loss falls."""
  before = flat(params)
  after_params, losses, paths = train(model, params, regex, **kw)
  after = flat(after_params)
  assert paths, "the method has no trainable parameters"
  assert all(any(p.startswith(e) for e in expected_prefixes) for p in paths), paths
  for k in before:
    changed = not np.array_equal(np.asarray(before[k]), np.asarray(after[k]))
    if k in paths:
      assert changed or before[k].size == 0, f"trainable {k} did not change"
    else:
      assert not changed, f"frozen {k} changed"
  assert losses[-1] < losses[0] - 1e-3, losses
  return after_params, losses


def assert_masks_right(model, params, num_prompt=None):
  """Acceptance 1 (masks): padding is not attended (extra padding leaves logits unchanged) and
  prompt positions are (the encoder mask counts them)."""
  enc, dec_in, tgt = batch()
  padded = jnp.pad(enc, ((0, 0), (0, 4)))  # other shapes: bound derived from float32's error
  numerics.check_equivalent(logits_fn(model, params, enc=padded), logits_fn(model, params))
  if num_prompt is not None:
    mask = model.apply({"params": params}, enc, method=T5.encoder_input_mask)
    np.testing.assert_array_equal(np.asarray(mask).sum(1),
                                  np.asarray((enc > 0).sum(1)) + num_prompt)


def perturbed(params, regex=PROMPT_REGEX, scale=0.5, seed=1):
  """params with every method parameter moved by noise (the prompt is attended iff logits move)."""
  leaves = flat(params)
  rng = np.random.RandomState(seed)
  return unflat({k: (v + scale * rng.randn(*v.shape).astype(np.float32)
                     if re.fullmatch(regex, k) else v) for k, v in leaves.items()})
