"""IDPG, instance-dependent prompt generation (Wu et al. 2022), and M-IDPG (prompts in every layer).

One generator serves both (optionally with a per-layer axis):
  r = M(x) [B, H]                                 a sentence representation of the raw input
  G_l(r) = reshape(W2·act(W1·r + b1) + b2_l, [B, P, H])

M(x) (`representation`):
  * "encoder_mean" / "encoder_first": the frozen T5 encoder's output on the raw input, mean-pooled
    or at the first token (IDPG's main sentence encoder is a frozen model's [CLS]; T5 has none).
    Read from `PromptContext.representation()`: one extra frozen-encoder pass, or the trainer's
    per-example cache (`prompt_representation`);
  * "embedding_mean": the mean frozen token embedding over real tokens (IDPG's cheap GloVe
    variant). ("encoder" is kept as another name for "encoder_mean".)
Layers ("dnn" dense, or "phm": PHM layers with n x n x n rules, n dividing m and H). The paper
counts one rule set shared by both generator layers (n³); its reference code (CSerxy/IDPG) has one
per layer (2·n³): `phm_shared_rules` picks. As the reference code: gelu, dropout 0.1 on r and on
the hidden layer; dense weights ~ N(0, 0.02); PHM blocks, rules and b1 ~ N(0, 0.05). b2 is stored
as the task prompt (`.../prompt`): with W1 = W2 = 0 IDPG is prompt tuning with b2 as the prompt.

S-IDPG (`IDPG`, one layer): the seam method; the prompt is G_0(M(x)).
M-IDPG (`IDPG` with num_layers = L as the seam method, plus the parameterless hook
`MultiLayerIDPG`): layer 0's prompt is G_0(M(x)) through the seam; before every later layer l the
hook adds G_l(r_l) to the hidden states at the prompt positions (the reference code adds,
`--middle-prompt-mode`), with r_l = M(x) or, with generator_input='previous_layer', layer l's input
pooled over the real input tokens (the reference reads the [CLS] state, `--middle-previous`).
Versions (the paper's M-IDPG-S/M/L): S shares W1, W2, b1, b2 across layers; M shares W1, W2 and b1
and gives each layer its own output bias b2_l (the reference's `layerb`); L gives each layer its
own W1, W2, b1, b2 (rules stay shared).

Trainable parameters (`encoder/prompt/prompt/...`), n = 1 for dense layers:
  rules·n³ (phm) + a·(H·m + m·P·H)/n + a·m + b·P·H,
  a = L for version L else 1; b = 1 for S-IDPG and version S else L; rules = 1 shared, 2 not.
"""
import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from prompt_jax.models import t5 as t5_lib
from prompt_jax.prompts import initializers, phm
from prompt_jax.prompts.seam import Method

Array = jax.Array
REPRESENTATIONS = ("encoder_mean", "encoder_first", "embedding_mean")
ALIASES = {"encoder": "encoder_mean"}
VERSIONS = ("S", "M", "L")
GENERATOR_INPUTS = ("representation", "previous_layer")


def representation_name(name: str) -> str:
  return ALIASES.get(name, name)


def pooling_of(representation: str) -> Optional[str]:
  """The frozen encoder's pooling a representation reads ('mean', 'first'), or None."""
  name = representation_name(representation)
  return name.split("_")[1] if name.startswith("encoder_") else None


def num_trainable_params(length: int, emb_dim: int, bottleneck: int, layer_type: str = "dnn",
                         phm_n: int = 1, num_layers: int = 1, version: str = "S",
                         phm_shared_rules: bool = True) -> int:
  """S-IDPG (num_layers = 1) and M-IDPG (versions S/M/L); see the module docstring."""
  n = phm_n if layer_type == "phm" else 1
  rules = (1 if phm_shared_rules else 2) * phm_n ** 3 if layer_type == "phm" else 0
  a = num_layers if version == "L" else 1
  b = 1 if version == "S" else num_layers
  return (rules + a * (emb_dim * bottleneck + bottleneck * length * emb_dim) // n
          + a * bottleneck + b * length * emb_dim)


def num_trainable_params_multilayer(length: int, emb_dim: int, bottleneck: int, num_layers: int,
                                    version: str = "M", layer_type: str = "dnn",
                                    phm_n: int = 1, phm_shared_rules: bool = True) -> int:
  return num_trainable_params(length, emb_dim, bottleneck, layer_type, phm_n, num_layers,
                              version, phm_shared_rules)


def _per_layer(init, rng, shape):
  """[L, ...] from L draws of `init` for shape[1:], one key per layer."""
  return jnp.stack([init(jax.random.fold_in(rng, i), tuple(shape[1:])) for i in range(shape[0])])


def masked_mean(x: Array, valid: Array) -> Array:
  """[B, T, H], [B, T] -> [B, H] mean over valid positions."""
  return t5_lib.pool(x, valid, "mean")


def check(*, length: int, emb_dim: int, bottleneck: int, layer_type: str, phm_n: int,
          representation: str, version: str = "S", generator_input: str = "representation",
          num_layers: int = 1) -> None:
  """One clear ValueError for a bad generator configuration."""
  if length < 1:
    raise ValueError(f"IDPG prompt length must be >= 1, got {length}")
  if bottleneck <= 0:
    raise ValueError(f"IDPG bottleneck m must be > 0, got {bottleneck}")
  if layer_type not in ("dnn", "phm"):
    raise ValueError(f"IDPG layer_type must be 'dnn' or 'phm', got {layer_type!r}")
  if representation_name(representation) not in REPRESENTATIONS:
    raise ValueError(f"IDPG representation must be one of {REPRESENTATIONS}, "
                     f"got {representation!r}")
  if version not in VERSIONS:
    raise ValueError(f"M-IDPG version must be one of {VERSIONS}, got {version!r}")
  if generator_input not in GENERATOR_INPUTS:
    raise ValueError(f"M-IDPG generator_input must be one of {GENERATOR_INPUTS}, "
                     f"got {generator_input!r}")
  if num_layers < 1:
    raise ValueError(f"IDPG needs >= 1 layer, got {num_layers}")
  if layer_type == "phm":
    phm.check_divides(phm_n, m=bottleneck, H=emb_dim)


class IDPG(Method):
  """The generator: `__call__` is the seam method (layer 0's [B, P, H] prompt from M(x));
  `generate(r, layer)` is G_layer(r), which the M-IDPG hook calls for the other layers (calling
  it again reuses the same parameters)."""
  length: int
  bottleneck: int = 256
  layer_type: str = "dnn"  # or "phm"
  phm_n: int = 16
  phm_shared_rules: bool = True
  activation: str = "gelu"
  dropout_rate: float = 0.1
  representation: str = "encoder_mean"
  num_layers: int = 1  # > 1: M-IDPG (a per-layer axis on what `version` does not share)
  version: str = "S"
  prompt_init: initializers.PromptInit = initializers.uniform_init()
  kernel_init: Optional[initializers.PromptInit] = None  # default: the reference code's

  def represent(self, context: Optional[t5_lib.PromptContext], input_tokens: Array,
                embedded: Array) -> Array:
    """M(x) [B, H] (float32 or wider, no gradient)."""
    if pooling_of(self.representation) is not None:
      if context is None:
        raise ValueError(f"IDPG representation {self.representation!r} reads the frozen "
                         "encoder: call it through the encoder (it passes the context)")
      r = context.representation()
    else:
      r = masked_mean(embedded, input_tokens > 0)
    return jax.lax.stop_gradient(r.astype(jnp.promote_types(r.dtype, jnp.float32)))

  @nn.compact
  def generate(self, r: Array, layer: int = 0, deterministic: bool = True) -> Array:
    """G_layer(r): [B, H] -> [B, P, H]."""
    h_dim, m, length, n = r.shape[-1], self.bottleneck, self.length, self.phm_n
    check(length=length, emb_dim=h_dim, bottleneck=m, layer_type=self.layer_type, phm_n=n,
          representation=self.representation, version=self.version, num_layers=self.num_layers)
    per_w, per_b = self.version == "L", self.version != "S"

    def param(name, init, shape, axes, per_layer=False):
      if per_layer:  # one draw of `init` per layer (initialisers like the sampled vocabulary
        # read the shape as [P, H])
        shape, axes = (self.num_layers,) + tuple(shape), ("prompt_layers",) + tuple(axes)
        init = functools.partial(_per_layer, init)
      value = self.param(name, nn.with_logical_partitioning(init, axes), shape)
      return value[layer] if per_layer else value

    if self.layer_type == "dnn":
      init = self.kernel_init or nn.initializers.normal(0.02)
      w1 = param("wi_kernel", init, (h_dim, m), ("prompt_embed", "prompt_mlp"), per_w)
      w2 = param("wo_kernel", init, (m, length * h_dim), ("prompt_mlp", "prompt_embed"), per_w)
      bias_init = nn.initializers.zeros
    else:
      init = self.kernel_init or nn.initializers.normal(0.05)
      rule_axes = ("prompt_phm", "prompt_phm_in", "prompt_phm_out")
      rule_in = param("phm_rule", nn.initializers.normal(0.05), (n, n, n), rule_axes)
      rule_out = rule_in if self.phm_shared_rules else param(
          "phm_rule_out", nn.initializers.normal(0.05), (n, n, n), rule_axes)
      w1 = phm.kernel(rule_in, param("wi_blocks", init, (n, h_dim // n, m // n),
                                     ("prompt_phm", "prompt_embed", "prompt_mlp"), per_w))
      w2 = phm.kernel(rule_out, param("wo_blocks", init, (n, m // n, length * h_dim // n),
                                      ("prompt_phm", "prompt_mlp", "prompt_embed"), per_w))
      bias_init = nn.initializers.normal(0.05)
    b1 = param("wi_bias", bias_init, (m,), ("prompt_mlp",), per_w)  # [m]
    b2 = param("prompt", self.prompt_init, (length, h_dim), ("prompt", "prompt_embed"),
               per_b)  # [P, H], the task prompt
    drop = nn.Dropout(self.dropout_rate)
    r = drop(r, deterministic=deterministic)
    hidden = getattr(nn, self.activation)(r @ w1 + b1)  # [B, m]
    out = drop(hidden, deterministic=deterministic) @ w2  # [B, P·H]
    return out.reshape(-1, length, h_dim) + b2  # [B, P, H]

  def __call__(self, input_tokens: Array, embedded: Array, deterministic: bool = True,
               context: Optional[t5_lib.PromptContext] = None) -> Array:
    return self.generate(self.represent(context, input_tokens, embedded), 0, deterministic)


def add_at_slots(x: Array, prompt: Array, slots: Array) -> Array:
  """x [B, T', H] + prompt [B, P, H] at the prompt positions (`slots` [B, T'], k + 1 at the
  k-th prompt position, 0 elsewhere)."""
  idx = jnp.maximum(slots - 1, 0)[..., None]  # [B, T', 1]
  gathered = jnp.take_along_axis(prompt.astype(x.dtype), idx, axis=1)  # [B, T', H]
  return x + jnp.where((slots > 0)[..., None], gathered, jnp.zeros_like(gathered))


class MultiLayerIDPG(nn.Module):
  """M-IDPG's per-layer hook (no parameters of its own): before layer l >= 1 it adds
  G_l(r_l) of the seam's `IDPG` generator (`ctx.prompt_method`) at the prompt positions."""
  generator_input: str = "representation"  # or "previous_layer"
  pooling: str = "mean"  # how 'previous_layer' pools layer l's input over the real tokens

  def __call__(self, ctx: t5_lib.LayerContext, deterministic: bool = True):
    x = ctx.x
    if ctx.layer == 0:  # layer 0's prompt came in through the seam
      return x, None
    generator = ctx.prompt_method
    if generator is None or ctx.prompt_slots is None:
      raise ValueError("M-IDPG's hook needs its IDPG generator as the encoder's prompt method")
    if self.generator_input == "previous_layer":
      real_input = ctx.valid & (ctx.prompt_slots == 0)  # [B, T'] input tokens, not the prompt
      r = t5_lib.pool(x, real_input, self.pooling)  # [B, H]
    else:
      inputs = ctx.inputs
      r = generator.represent(inputs, inputs.input_tokens, inputs.embedded)
    prompt = generator.generate(r, ctx.layer, deterministic)  # [B, P, H]
    return add_at_slots(x, prompt, ctx.prompt_slots), None
