"""T5Config and the presets of T5 1.0 and T5 1.1 (the LM-adapted "lm100k" checkpoints share 1.1's)."""
import dataclasses
from typing import Any, Tuple

import jax.numpy as jnp


REMAT_POLICY_NAMES = ("none", "attention", "minimal", "dots", "full")


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyper-parameters of a T5 encoder-decoder, named as in t5x's `examples/t5/network.py`."""
  vocab_size: int = 32128
  dtype: Any = jnp.bfloat16  # activation dtype; parameters are float32 (or as loaded)
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  # ('relu',) for T5 1.0; ('gelu', 'linear') -- gated gelu -- for T5 1.1.
  mlp_activations: Tuple[str, ...] = ("relu",)
  dropout_rate: float = 0.1
  # T5 1.0 ties the output projection to the token embedding; T5 1.1 has `logits_dense`.
  logits_via_embedding: bool = True
  # Attention logits in float32 even when activations are bfloat16 (t5x's option; off there).
  float32_attention_logits: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  # Remat policy for layers (models/t5.py REMAT_POLICIES, t5x scalable_t5's names): 'none' (save
  # every activation the backward pass needs), 'attention' (save everything but the attention
  # weights [batch, heads, q, k]: the backward pass recomputes scores and softmax from the saved
  # queries, keys and the stack's bias; einsum and chunked attention, the latter by 'auto' on
  # CPU in float32), 'minimal' (save the outputs of
  # the projections, matmuls without batch dimensions; recompute attention scores, norms and
  # activations), 'dots' (save every matmul output, attention scores included), 'full' (save
  # only each layer's input and recompute the layer in the backward pass).
  remat_policy: str = "none"
  # Attention kernel (layers.dot_product_attention): 'auto' (cuDNN fused attention on GPU for
  # bfloat16/float16; 'chunked' on CPU in float32 under remat_policy='attention'; the einsum
  # path elsewhere: faster on XLA CPU than jax.nn's XLA path), 'cudnn', 'xla'
  # (jax.nn.dot_product_attention's XLA path), 'pallas' (JAX's Pallas TPU flash attention;
  # needs a TPU or Pallas TPU interpret mode; opt-in until measured on a TPU), 'chunked' (the
  # einsum path a few (batch, head) pairs at a time, each chunk's scores about a CPU core's
  # cache, the weights recomputed in the backward pass: keeps no [batch, heads, q, k] array per
  # layer), or 'einsum' (the plain reference formulation; the fused kernels fall back to it
  # with attention dropout, and every kernel in float64).
  attention_implementation: str = "auto"
  # With jax.nn's kernels ('auto' on GPU), the encoder gives them its padding as sequence lengths
  # and the relative-position bias as [1, heads, T, T] instead of one [batch, heads, T, T] bias
  # (layers.PaddedBias; Encoder.self_attention_bias says when): this assumes each row's padding
  # is at its end, as seqio pads, and a row padded otherwise comes out NaN. False: always the
  # [batch, heads, T, T] bias (inputs padded elsewhere, or to compare the two forms).
  padding_as_lengths: bool = True

  def __post_init__(self):
    rate = self.dropout_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
      raise ValueError(f"dropout_rate (DROPOUT_RATE) must be a number in [0, 1), got {rate!r}")
    if self.remat_policy not in REMAT_POLICY_NAMES:
      raise ValueError(f"remat_policy must be one of {', '.join(REMAT_POLICY_NAMES)}, "
                       f"got {self.remat_policy!r}")

  def replace(self, **changes) -> "T5Config":
    return dataclasses.replace(self, **changes)

  @property
  def is_gated(self) -> bool:
    return len(self.mlp_activations) > 1


def _t5_1_0(emb_dim, num_heads, num_layers, head_dim, mlp_dim) -> T5Config:
  return T5Config(emb_dim=emb_dim, num_heads=num_heads, num_encoder_layers=num_layers,
                  num_decoder_layers=num_layers, head_dim=head_dim, mlp_dim=mlp_dim,
                  mlp_activations=("relu",), logits_via_embedding=True)


def _t5_1_1(emb_dim, num_heads, num_layers, head_dim, mlp_dim) -> T5Config:
  return T5Config(emb_dim=emb_dim, num_heads=num_heads, num_encoder_layers=num_layers,
                  num_decoder_layers=num_layers, head_dim=head_dim, mlp_dim=mlp_dim,
                  mlp_activations=("gelu", "linear"), logits_via_embedding=False)


PRESETS = {
    # T5 1.0 (Raffel et al. 2020), as t5x's gin/t5_{size}.gin.
    "t5_1_0_small": _t5_1_0(512, 8, 6, 64, 2048),
    "t5_1_0_base": _t5_1_0(768, 12, 12, 64, 3072),
    "t5_1_0_large": _t5_1_0(1024, 16, 24, 64, 4096),
    "t5_1_0_3b": _t5_1_0(1024, 32, 24, 128, 16384),
    "t5_1_0_11b": _t5_1_0(1024, 128, 24, 128, 65536),
    # T5 1.1 and the LM-adapted T5 1.1 (lm100k), as t5x's gin/t5_1_1_{size}.gin.
    "t5_1_1_small": _t5_1_1(512, 6, 8, 64, 1024),
    "t5_1_1_base": _t5_1_1(768, 12, 12, 64, 2048),
    "t5_1_1_large": _t5_1_1(1024, 16, 24, 64, 2816),
    "t5_1_1_xl": _t5_1_1(2048, 32, 24, 64, 5120),
    "t5_1_1_xxl": _t5_1_1(4096, 64, 24, 64, 10240),
    # prompt-jax's own: the embedded default's tiny T5 1.1 (64-d, 2+2 layers, a byte vocabulary
    # of 260 ids), pretrained by launch/pretrain_embedded.py (gin/models/embedded_tiny.gin). A
    # preset of its own, so that a models/*.gin file named after the embedded default gives
    # that model, not its preset under the tiny model's sizes.
    "embedded_tiny": _t5_1_1(64, 4, 2, 16, 256).replace(vocab_size=260),
}


def get_config(name: str, **overrides) -> T5Config:
  """A preset by name (e.g. 't5_1_1_base'), with field overrides."""
  if name not in PRESETS:
    raise ValueError(f"unknown T5 preset {name!r}; choose one of {sorted(PRESETS)}")
  return PRESETS[name].replace(**overrides)
