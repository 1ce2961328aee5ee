"""Building blocks of T5, numerically as t5x's `examples/t5/layers.py`.

Every parameter is created through `_param` with t5x's logical axis names (`vocab`, `embed`, `mlp`,
`heads`, `kv`, `joined_kv`, `relpos_buckets`), so `partitioning.py` can map it onto a mesh; the
parameter names are the checkpoint paths t5x writes.
"""
import contextlib
import functools
import inspect
import os
import string
import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

Array = jax.Array
DType = Any
Initializer = Callable[..., Array]
# A key/value prefix for self-attention: ([batch, prefix, heads, kv], [batch, prefix, heads, kv]).
KVPrefix = Tuple[Array, Array]

default_embed_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def constrain(x: Array, names: Sequence[Optional[str]]) -> Array:
  """A logical sharding constraint on an activation (a no-op outside a mesh)."""
  return nn.with_logical_constraint(x, tuple(names))


def at_least_float32(dtype: DType) -> DType:
  """The dtype of statistics and logits: float32 for bfloat16/float32 models, float64 for a
  float64 reference computation (tests derive float32 error bounds from one)."""
  return jnp.promote_types(dtype, jnp.float32)


def _param(module: nn.Module, name: str, init: Initializer, shape: Tuple[int, ...],
           axes: Tuple[str, ...]) -> Array:
  """A float32 parameter that carries its logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


def sums_bfloat16_in_float32(dtype: DType) -> bool:
  """Whether products in `dtype` go through `float32_summed_einsum`: bfloat16 on XLA CPU. XLA CPU
  (YNNPACK) runs a bfloat16 x bfloat16 -> float32 product on the CPU's bfloat16 units (AMX,
  AVX512-BF16): 987-1407 GFLOP/s for 2048^3 on a 2-core Sapphire Rapids-class Xeon, where a
  bfloat16 -> bfloat16 product runs at about its float32 rate (170-190 GFLOP/s, any XLA CPU
  flag; docs/benchmarks.md). GPUs and TPUs already sum bfloat16 products in float32 inside their
  kernels and write the dtype asked for; there the plain product is kept. So is it where this
  XLA CPU cannot run one of the products the path uses (`cpu_runs_float32_summed_products`),
  and where the user asks for the plain products (CPU_PRODUCTS_ENV=plain)."""
  return (jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) and jax.default_backend() == "cpu"
          and not getattr(_accelerator_products, "on", False)
          and cpu_products() == "float32_sums"
          and cpu_runs_float32_summed_products())


# The probe below runs each product alone; inside a whole program XLA CPU may still leave one of
# them, in an operand layout it chose, to a dot it cannot run (UNIMPLEMENTED "BF16 x BF16 = F32"
# in DotThunk when the program runs; seen once here, in a synthetic stack of attention calls,
# never in a model's train, eval or infer step). Then `prompt-jax` says to set this to 'plain'.
CPU_PRODUCTS_ENV = "PROMPT_JAX_CPU_BFLOAT16_PRODUCTS"
_CPU_PRODUCTS = ("float32_sums", "plain")


def cpu_products() -> str:
  """CPU_PRODUCTS_ENV: 'float32_sums' (the default: `sums_bfloat16_in_float32`) or 'plain' (the
  plain bfloat16 products, as before it); ValueError (one line) for another value."""
  value = os.environ.get(CPU_PRODUCTS_ENV, "").strip().lower() or "float32_sums"
  if value not in _CPU_PRODUCTS:
    raise ValueError(f"{CPU_PRODUCTS_ENV}={os.environ[CPU_PRODUCTS_ENV]!r}: use one of "
                     f"{', '.join(_CPU_PRODUCTS)}")
  return value


# Set inside `accelerator_products()`, per thread: `train` traces the prompt's init on the main
# thread while its step is compiled on another (train/state.py CompileAhead).
_accelerator_products = threading.local()


@contextlib.contextmanager
def accelerator_products():
  """Models traced inside (on this thread) use the plain products on every backend, as
  accelerators run them: `prompt-jax plan` compiles on CPU devices the program a GPU or TPU
  would run, and a trace that only needs the parameters (run_setup: their shapes, the prompt's
  init) skips the float32-summed products' custom_vjp, whose tracing is most of a bfloat16
  model's on CPU."""
  before = getattr(_accelerator_products, "on", False)
  _accelerator_products.on = True
  try:
    yield
  finally:
    _accelerator_products.on = before


def _probe_products() -> Tuple[Tuple[str, Tuple[int, ...], Tuple[int, ...]], ...]:
  """(einsum spec, shape, shape) of every float32-summed product the layers use: a dense
  layer's and the attention's two products, each with the products of its gradients."""
  dims = {"b": 2, "l": 3, "i": 8, "o": 4, "q": 5, "k": 3, "h": 2, "d": 8, "c": 4}
  shape = lambda indices: tuple(dims[i] for i in indices)
  products = []
  for spec in ("bli,io->blo",) + tuple(_SUMMED_EINSUM_GRADIENTS):
    for s, _ in ((spec, True),) + _summed_einsum_gradients(spec):
      a, b = s.split("->")[0].split(",")
      products.append((s, shape(a), shape(b)))
  return tuple(products)


@functools.lru_cache(maxsize=None)
def cpu_runs_float32_summed_products(products=None) -> bool:
  """Whether XLA CPU compiles and runs each product (default `_probe_products()`) with bfloat16
  operands summed in float32: a dot it cannot run fails only when it runs (UNIMPLEMENTED, see
  `_SUMMED_EINSUM_GRADIENTS`), so this runs each once on small arrays, once per process; False
  keeps the plain products on a jax version whose XLA CPU rejects one."""
  for spec, a_shape, b_shape in products or _probe_products():
    try:
      with jax.ensure_compile_time_eval():  # runs even when asked while a step is traced
        product = jax.jit(lambda a, b, spec=spec: jnp.einsum(
            spec, a, b, preferred_element_type=jnp.float32)).lower(
                jax.ShapeDtypeStruct(a_shape, jnp.bfloat16),
                jax.ShapeDtypeStruct(b_shape, jnp.bfloat16)).compile()
        jax.block_until_ready(product(np.ones(a_shape, jnp.bfloat16),
                                      np.ones(b_shape, jnp.bfloat16)))
    except Exception:  # pylint: disable=broad-except
      return False
  return True


# The names of the float32-summed products' outputs, for remat policies (models/t5.py): a
# custom_vjp's output is not a dot_general that jax.checkpoint_policies' dot rules would save.
DENSE_PRODUCT = "dense_product"
ATTENTION_PRODUCT = "attention_product"  # the attention's float32_summed_einsum products

# The einsum attention's two products and, for each, the products giving dA and dB: (spec,
# whether the cotangent is the first operand). The operand order matters: XLA CPU (jax 0.10.2)
# leaves 'bqhd,bhqk->bkhd' with bfloat16 operands and float32 sums to a dot it cannot run
# (UNIMPLEMENTED: "BF16 x BF16 = F32" in DotThunk), at every shape tried, and runs
# 'bhqk,bqhd->bkhd' (the same product, operands swapped).
_SUMMED_EINSUM_GRADIENTS = {
    "bqhd,bkhd->bhqk": (("bhqk,bkhd->bqhd", True), ("bhqk,bqhd->bkhd", True)),
    "bhqk,bkhd->bqhd": (("bqhd,bkhd->bhqk", True), ("bhqk,bqhd->bkhd", False)),
    # The same products on `_chunked_attention`'s [pairs, length, kv] chunks.
    "cqd,ckd->cqk": (("cqk,ckd->cqd", True), ("cqk,cqd->ckd", True)),
    "cqk,ckd->cqd": (("cqd,ckd->cqk", True), ("cqk,cqd->ckd", False)),
}


def _summed_einsum_gradients(spec: str) -> Tuple[Tuple[str, bool], Tuple[str, bool]]:
  """For 'A,B->C': the products giving dA and dB as (spec, cotangent first): the attention's
  from `_SUMMED_EINSUM_GRADIENTS`, else dA = 'C,B->A' (g, b) and dB = 'A,C->B' (a, g)."""
  if spec in _SUMMED_EINSUM_GRADIENTS:
    return _SUMMED_EINSUM_GRADIENTS[spec]
  (sa, sb), sc = spec.split("->")[0].split(","), spec.split("->")[1]
  return (f"{sc},{sb}->{sa}", True), (f"{sa},{sc}->{sb}", False)


def dense_spec(x_ndim: int, kernel_ndim: int, n: int) -> str:
  """The einsum spec of x [..., in] . kernel [in, out]: the `n` trailing dims of x contracted
  with the `n` leading dims of kernel (e.g. 'abc,cd->abd')."""
  batch = string.ascii_letters[:x_ndim - n]
  contracted = string.ascii_letters[x_ndim - n:x_ndim]
  out = string.ascii_letters[x_ndim:x_ndim + kernel_ndim - n]
  return f"{batch}{contracted},{contracted}{out}->{batch}{out}"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def float32_summed_einsum(spec: str, a: Array, b: Array) -> Array:
  """jnp.einsum(spec, a, b) of two arrays of one dtype ('A,B->C', every index of A and of B in C
  or in the other operand), in that dtype, summed in float32 (`sums_bfloat16_in_float32`): the
  dense layers' products (`dense_spec`) and the einsum attention's. Its backward products are
  summed in float32 too: JAX's own transpose of a float32-output product would multiply a
  float32 cotangent by the bfloat16 operand, which XLA CPU computes at its float32 rate. dA and
  dB are computed only for an operand that is differentiated (a frozen kernel gets no
  product)."""
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def _summed_einsum_fwd(spec, a, b):
  # symbolic_zeros: a and b come as CustomVJPPrimal, `.perturbed` if differentiated. The
  # residuals are what the wanted gradients read: dA needs b, dB needs a (so a frozen kernel's
  # product keeps no input alive: remat need not recompute it).
  residuals = (b.value if a.perturbed else None, a.value if b.perturbed else None)
  return float32_summed_einsum(spec, a.value, b.value), residuals


def _summed_einsum_bwd(spec, residuals, g):
  b, a = residuals
  if isinstance(g, jax.custom_derivatives.SymbolicZero):
    return None, None
  (da_spec, da_g_first), (db_spec, db_g_first) = _summed_einsum_gradients(spec)
  da = db = None  # only what is differentiated: no product for frozen weights
  if b is not None:
    da = float32_summed_einsum(da_spec, *((g, b) if da_g_first else (b, g)))
  if a is not None:
    db = float32_summed_einsum(db_spec, *((g, a) if db_g_first else (a, g)))
  return da, db


float32_summed_einsum.defvjp(_summed_einsum_fwd, _summed_einsum_bwd, symbolic_zeros=True)


class LayerNorm(nn.Module):
  """T5's RMS layer norm: no mean subtraction, no bias, statistics in (at least) float32."""
  epsilon: float = 1e-6
  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, at_least_float32(self.dtype))
    mean2 = jnp.mean(lax.square(x), axis=-1, keepdims=True)  # [batch, length, 1]
    y = jnp.asarray(x * lax.rsqrt(mean2 + self.epsilon), self.dtype)
    scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",))
    return y * jnp.asarray(scale, self.dtype)


class DenseGeneral(nn.Module):
  """A dense layer whose kernel is stored 2-D ([prod(in), prod(out)]) as in t5x checkpoints."""
  features: Tuple[int, ...]
  axis: Tuple[int, ...] = (-1,)
  kernel_axes: Tuple[str, ...] = ()
  dtype: DType = jnp.float32
  kernel_init: Initializer = default_kernel_init

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    features = tuple(self.features)
    axis = tuple(a % inputs.ndim for a in self.axis)
    in_shape = tuple(inputs.shape[a] for a in axis)
    kernel = _param(self, "kernel", self.kernel_init,
                    (int(np.prod(in_shape)), int(np.prod(features))), self.kernel_axes)
    kernel = jnp.reshape(jnp.asarray(kernel, self.dtype), in_shape + features)
    inputs = jnp.asarray(inputs, self.dtype)
    if sums_bfloat16_in_float32(self.dtype):  # contracted dims last (the layers' are already)
      inputs = jnp.moveaxis(inputs, axis, tuple(range(inputs.ndim - len(axis), inputs.ndim)))
      spec = dense_spec(inputs.ndim, kernel.ndim, len(axis))
      return checkpoint_name(float32_summed_einsum(spec, inputs, kernel), DENSE_PRODUCT)
    contract = (axis, tuple(range(len(axis))))
    return lax.dot_general(inputs, kernel, (contract, ((), ())))


class Embed(nn.Module):
  """The token embedding table [vocab, embed]; `attend` gives tied output logits."""
  num_embeddings: int
  features: int
  dtype: DType = jnp.float32
  embedding_init: Initializer = default_embed_init

  def setup(self):
    self.embedding = _param(self, "embedding", self.embedding_init,
                            (self.num_embeddings, self.features), ("vocab", "embed"))

  def __call__(self, inputs: Array) -> Array:
    # [batch, length] -> [batch, length, embed]
    return jnp.take(jnp.asarray(self.embedding, self.dtype), inputs, axis=0)

  def attend(self, query: Array) -> Array:
    # [batch, length, embed] x [vocab, embed] -> [batch, length, vocab]
    embedding = jnp.asarray(self.embedding, self.dtype)
    if sums_bfloat16_in_float32(self.dtype) and query.dtype == embedding.dtype:
      return checkpoint_name(
          float32_summed_einsum(dense_spec(query.ndim, 2, 1), query, embedding.T), DENSE_PRODUCT)
    return jnp.dot(query, embedding.T)


def _activation(name: str) -> Callable[[Array], Array]:
  if name == "linear":
    return lambda x: x
  if name == "gelu":
    return functools.partial(nn.gelu, approximate=True)  # T5 1.1 (HF "gelu_new")
  return getattr(nn, name)


@jax.custom_vjp
def gated_gelu(gate: Array, linear: Array) -> Array:
  """gelu(gate) * linear (tanh GELU, T5 1.1's gated MLP) whose backward pass keeps only its
  two inputs, the outputs of the `wi_0`/`wi_1` matmuls: it recomputes gelu(gate) and gelu'(gate)
  from `gate`. Differentiating the expression keeps five more [batch, length, mlp] arrays (the
  tanh, its pieces, gelu(gate)), the largest a layer keeps after the attention scores. T5 1.1
  small, batch 8 x 612, float32 on CPU: the compiled train step's temporary memory 1721 -> 1367
  MB, peak RSS about 2750 -> 2400 MB, time within the machine's noise (docs/benchmarks.md).

  Both passes compute in (at least) float32 and round once, to the inputs' dtype: a bfloat16
  expression rounds after every operation, and XLA CPU converts each of those roundings
  separately (bfloat16, batch 32 x 328 x 1024 on CPU: forward 14.3 -> 4.7 ms)."""
  out = _gelu(gate) * linear.astype(at_least_float32(linear.dtype))
  return out.astype(jnp.result_type(gate, linear))


def _gelu(gate: Array) -> Array:
  """jax.nn.gelu(gate, approximate=True) in at least float32: 0.5 x (1 + tanh(c (x + 0.044715
  x^3))), c = sqrt(2 / pi)."""
  x = gate.astype(at_least_float32(gate.dtype))
  c = np.sqrt(2 / np.pi).astype(x.dtype)
  k = np.asarray(0.044715, x.dtype)
  return x * (0.5 * (1 + jnp.tanh(c * (x + k * x ** 3))))  # jax.nn.gelu's order of operations


def _gated_gelu_fwd(gate: Array, linear: Array):
  return gated_gelu(gate, linear), (gate, linear)


def _gated_gelu_bwd(residuals, g: Array):
  # The barrier keeps XLA from merging the recomputation below with the forward pass's own tanh
  # (common-subexpression elimination), which would keep that array alive until here after all.
  gate, linear = lax.optimization_barrier(residuals)
  wide = at_least_float32(gate.dtype)
  x, y, g = gate.astype(wide), linear.astype(wide), g.astype(wide)
  c = np.sqrt(2 / np.pi).astype(wide)
  k = np.asarray(0.044715, wide)
  u = c * (x + k * x ** 3)
  t = jnp.tanh(u)
  d_gelu = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * k * x * x)
  # gelu(x) as x / (1 + exp(-2u)), the same function as 0.5 x (1 + tanh(u)): written with tanh
  # too, XLA CPU computes the tanh once into a float32 array that both gradients read (a
  # fusion of its own), instead of within each gradient's fusion (bfloat16, batch 32 x 328 x
  # 1024: 19.1 -> 10.7 ms).
  gelu = x / (1 + jnp.exp(-2 * u))
  return (g * y * d_gelu).astype(gate.dtype), (g * gelu).astype(linear.dtype)


gated_gelu.defvjp(_gated_gelu_fwd, _gated_gelu_bwd)


class MlpBlock(nn.Module):
  """Feed-forward block: `wi` (one activation) or gated `wi_0`, `wi_1`, then `wo`."""
  intermediate_dim: int
  activations: Tuple[str, ...] = ("relu",)
  dropout_rate: float = 0.1
  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool = True) -> Array:
    projected = []
    for idx in range(len(self.activations)):
      name = "wi" if len(self.activations) == 1 else f"wi_{idx}"
      projected.append(DenseGeneral((self.intermediate_dim,), kernel_axes=("embed", "mlp"),
                                    dtype=self.dtype, name=name)(inputs))  # [batch, length, mlp]
    if tuple(self.activations) == ("gelu", "linear"):  # T5 1.1's gated GELU
      hidden = gated_gelu(*projected)
    else:
      hidden = None
      for act, x in zip(self.activations, projected):
        x = _activation(act)(x)
        hidden = x if hidden is None else hidden * x
    hidden = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(hidden, deterministic=deterministic)
    hidden = constrain(hidden, ("batch", "length", "mlp"))
    return DenseGeneral((inputs.shape[-1],), kernel_axes=("mlp", "embed"), dtype=self.dtype,
                        name="wo")(hidden)  # [batch, length, embed]


def relative_position_bucket(relative_position: np.ndarray, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
  """T5's bucketing of key-minus-query distances (exact for small, log-spaced for large)."""
  ret = 0
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int32) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  val_if_large = max_exact + (
      np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps) /
      np.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(np.int32)
  val_if_large = np.minimum(val_if_large, num_buckets - 1)
  return ret + np.where(is_small, n, val_if_large)


class RelativePositionBiases(nn.Module):
  """One table [heads, buckets] per stack; returns biases [1, heads, q_len, k_len]."""
  num_buckets: int
  max_distance: int
  num_heads: int
  dtype: DType = jnp.float32
  embedding_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")

  @nn.compact
  def __call__(self, qlen: int, klen: int, bidirectional: bool = True) -> Array:
    # The bucket of each relative position k - q, -(qlen - 1) .. klen - 1, in numpy as t5x
    # computes them (the same float32 logs, so the same bucket boundaries); the [q, k] layout
    # is then indexed on the device. A [q, k] numpy constant took O(q * k) host memory and
    # program size (`plan` of 16k inputs peaked at 6.9 GB on a 329K-parameter model).
    relative = np.arange(-(qlen - 1), klen, dtype=np.int32)  # [q + k - 1]
    buckets = relative_position_bucket(relative, bidirectional, self.num_buckets,
                                       self.max_distance)  # [q + k - 1]
    table = _param(self, "rel_embedding", self.embedding_init,
                   (self.num_heads, self.num_buckets), ("heads", "relpos_buckets"))
    table = jnp.asarray(table, self.dtype)
    # Gathers, not t5x's one-hot contraction (a TPU choice): identical values, and on CPU the
    # prompt-tuning step of T5 1.1 small (2 layers, 8 x 512) ran 9% faster with 12% less memory.
    per_distance = jnp.take(table, jnp.asarray(buckets), axis=1)  # [heads, q + k - 1]
    offset = (jnp.arange(klen, dtype=jnp.int32)[None, :]
              - jnp.arange(qlen, dtype=jnp.int32)[:, None] + (qlen - 1))  # [q, k]: k - q + q - 1
    values = jnp.take(per_distance, offset, axis=1)  # [heads, q, k]
    return values[None, ...]  # [1, heads, q, k]


def make_attention_mask(query_input: Array, key_input: Array,
                        pairwise_fn: Callable = jnp.multiply, dtype: DType = jnp.float32) -> Array:
  """[batch, q] x [batch, k] -> [batch, 1, q, k]."""
  mask = pairwise_fn(jnp.expand_dims(query_input, -1), jnp.expand_dims(key_input, -2))
  return jnp.expand_dims(mask, -3).astype(dtype)


def make_causal_mask(x: Array, dtype: DType = jnp.float32) -> Array:
  idxs = jnp.broadcast_to(jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape)
  return make_attention_mask(idxs, idxs, jnp.greater_equal, dtype=dtype)


def combine_masks(*masks: Optional[Array], dtype: DType = jnp.float32) -> Optional[Array]:
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  mask = masks[0]
  for other in masks[1:]:
    mask = jnp.logical_and(mask, other)
  return mask.astype(dtype)


def attention_bias(mask: Optional[Array], bias: Optional[Array],
                   dtype: DType = jnp.float32) -> Optional[Array]:
  """The additive attention bias: 0 where `mask` [batch, 1, q, k] is set, -1e10 where not, plus
  `bias` (T5's relative-position bias [1, heads, q, k]); None if both are None. The stacks
  compute it once for all their layers (it depends on neither the layer nor its inputs)."""
  masked = None
  if mask is not None:
    masked = lax.select(mask > 0, jnp.zeros(mask.shape, dtype),
                        jnp.full(mask.shape, -1e10).astype(dtype))
  return combine_biases(masked, bias)


class PaddedBias(NamedTuple):
  """An attention bias whose mask is padding alone, with each row's padding at its end: T5's
  relative-position bias [1, heads, q, k] (or None) and each row's number of real queries and
  keys [batch] int32. jax.nn's kernels take this form as it is ('xla', and cuDNN's fused
  attention, where it is the kernel's sequence lengths: no [batch, heads, q, k] bias is built, and
  the backward pass writes the bias gradient at [1, heads, q, k]); every other implementation
  expands it (`dense`). Either way the outputs at padded query rows are 0 (they are never read: a
  padded position is masked wherever it is a key, and it has no loss)."""
  bias: Optional[Array]  # [1, heads, q, k]
  query_lengths: Array  # [batch] int32
  key_lengths: Array  # [batch] int32

  def query_valid(self, q_len: int) -> Array:
    return jnp.arange(q_len)[None, :] < self.query_lengths[:, None]  # [batch, q]

  def dense(self, q_len: int, k_len: int, dtype: DType) -> Array:
    """[batch, heads|1, q, k]: the same bias as `attention_bias` of the equivalent mask."""
    key_valid = jnp.arange(k_len)[None, :] < self.key_lengths[:, None]  # [batch, k]
    mask = make_attention_mask(self.query_valid(q_len), key_valid, dtype=dtype)
    return attention_bias(mask, self.bias, dtype)


AttentionBias = Union[Array, PaddedBias]


def trailing_lengths(valid: Array) -> Tuple[Array, Array]:
  """(lengths [batch] int32, trailing [batch] bool) of a validity mask [batch, length]: each row's
  number of real positions and whether they are its first ones (its padding at the end, as
  seqio pads). `PaddedBias` describes only rows where `trailing` holds."""
  lengths = jnp.sum(valid, axis=-1, dtype=jnp.int32)  # [batch]
  positions = jnp.arange(valid.shape[-1])[None, :]
  trailing = jnp.all((valid > 0) == (positions < lengths[:, None]), axis=-1)  # [batch]
  return lengths, trailing


def combine_biases(*biases: Optional[Array]) -> Optional[Array]:
  biases = [b for b in biases if b is not None]
  if not biases:
    return None
  out = biases[0]
  for other in biases[1:]:
    out = out + other
  return out


class MultiHeadDotProductAttention(nn.Module):
  """T5 attention: no 1/sqrt(d) on the logits (folded into the query init), optional KV cache.

  `kv_prefix` prepends per-example keys/values (deep prompts); they are always attended and get
  no relative position bias.
  """
  num_heads: int
  head_dim: int
  dtype: DType = jnp.float32
  dropout_rate: float = 0.0
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
  float32_logits: bool = False
  implementation: str = "auto"  # see dot_product_attention
  recompute_weights: bool = False  # see dot_product_attention

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array, mask: Optional[Array] = None,
               bias: Optional[AttentionBias] = None, *, kv_prefix: Optional[KVPrefix] = None,
               decode: bool = False, deterministic: bool = True) -> Array:
    """`bias`: T5's relative-position bias [1, heads, q, k] or the stack's combined bias
    [batch|1, heads, q, k], or a `PaddedBias` (then `mask` must be None: it holds the mask)."""
    features = (self.num_heads, self.head_dim)
    # numpy, not jnp: the initialiser may run outside this trace (run_setup.random_backbone);
    # float64 sqrt rounded to float32 equals float32's correctly rounded sqrt.
    depth_scaling = np.float32(np.sqrt(self.head_dim))
    query_init = lambda *args: self.kernel_init(*args) / depth_scaling
    dense = functools.partial(DenseGeneral, features=features, axis=(-1,),
                              kernel_axes=("embed", "joined_kv"), dtype=self.dtype)
    query = dense(kernel_init=query_init, name="query")(inputs_q)  # [batch, q, heads, kv]
    key = dense(kernel_init=self.kernel_init, name="key")(inputs_kv)  # [batch, k, heads, kv]
    value = dense(kernel_init=self.kernel_init, name="value")(inputs_kv)  # [batch, k, heads, kv]
    query = constrain(query, ("batch", "length", "heads", "kv"))
    key = constrain(key, ("batch", "length", "heads", "kv"))
    value = constrain(value, ("batch", "length", "heads", "kv"))

    if decode:
      key, value, mask, bias = self._update_cache(key, value, mask, bias)

    padded = bias if isinstance(bias, PaddedBias) else None
    if padded is not None and (mask is not None or decode):
      raise ValueError("a PaddedBias holds the whole mask: pass mask=None, and no decode cache")
    if kv_prefix is not None:
      k_prefix, v_prefix = kv_prefix  # [batch, prefix, heads, kv]
      batch, prefix = k_prefix.shape[:2]
      key = jnp.concatenate([jnp.asarray(k_prefix, self.dtype), key], axis=1)
      value = jnp.concatenate([jnp.asarray(v_prefix, self.dtype), value], axis=1)
      if mask is not None:
        ones = jnp.ones(mask.shape[:-1] + (prefix,), mask.dtype)  # [batch, 1, q, prefix]
        mask = jnp.concatenate([ones, mask], axis=-1)
      relative = padded.bias if padded is not None else bias
      if relative is not None:
        zeros = jnp.zeros(relative.shape[:-1] + (prefix,), relative.dtype)  # [1|b, heads, q, P]
        relative = jnp.concatenate([zeros, relative], axis=-1)
      if padded is not None:  # the prefix keys come first and are always real: still trailing
        bias = padded._replace(bias=relative, key_lengths=padded.key_lengths + prefix)
      else:
        bias = relative

    dropout_rng = None
    if not deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    if not isinstance(bias, PaddedBias):
      bias = attention_bias(mask, bias, self.dtype)
    x = dot_product_attention(query, key, value, bias=bias,
                              dropout_rng=dropout_rng,
                              dropout_rate=self.dropout_rate, deterministic=deterministic,
                              dtype=self.dtype, float32_logits=self.float32_logits,
                              implementation=self.implementation,
                              recompute_weights=self.recompute_weights)
    # [batch, q, heads, kv] -> [batch, q, embed]
    return DenseGeneral(features=(inputs_q.shape[-1],), axis=(-2, -1),
                        kernel_axes=("joined_kv", "embed"), kernel_init=self.kernel_init,
                        dtype=self.dtype, name="out")(x)

  def _update_cache(self, key: Array, value: Array, mask: Optional[Array],
                    bias: Optional[Array]):
    """Writes one step's key/value into the cache; returns the whole cache and step masks."""
    is_initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
    if not is_initialized:  # init builds a [batch, max_length, heads, kv] cache
      return key, value, mask, bias
    batch, length = cached_key.value.shape[:2]
    if key.shape[1] != 1:
      raise ValueError(f"autoregressive decoding takes one token a step, got {key.shape[1]}")
    cur_index = cache_index.value
    zero = jnp.array(0, dtype=jnp.int32)
    key = lax.dynamic_update_slice(cached_key.value, key, (zero, cur_index, zero, zero))
    value = lax.dynamic_update_slice(cached_value.value, value, (zero, cur_index, zero, zero))
    cached_key.value, cached_value.value = key, value
    cache_index.value = cur_index + 1
    # Attend only to the filled part of the cache.
    step_mask = jnp.broadcast_to(jnp.arange(length) <= cur_index, (batch, 1, 1, length))
    mask = combine_masks(mask, step_mask, dtype=jnp.float32)
    if bias is not None:  # the full [1, heads, length, length] bias: take row cur_index
      bias = lax.dynamic_slice_in_dim(bias, cur_index, 1, axis=-2)  # [1, heads, 1, length]
    return key, value, mask, bias


ATTENTION_IMPLEMENTATIONS = ("auto", "einsum", "chunked", "xla", "cudnn", "pallas")


def attention_implementation(requested: str, query: Array, key: Array, dtype: DType,
                             dropout: bool, recompute_weights: bool = False) -> str:
  """The kernel for this call: 'einsum' (reference), 'xla' or 'cudnn' (jax.nn's fused
  attention), 'pallas' (JAX's Pallas TPU flash attention, `_pallas_attention`). The fused
  kernels have no attention dropout and no float64; cuDNN needs bfloat16/float16 and head_dim a
  multiple of 8, at most 128. 'pallas' needs a TPU, or TPU interpret mode on CPU (tests): asked
  for elsewhere it raises rather than silently running another kernel.

  'chunked' (`_chunked_attention`) is the einsum path run a few (batch, head) pairs at a time,
  each chunk's scores held about the size of a core's cache; it takes attention dropout.

  'auto' is cuDNN where it applies; with `recompute_weights` (the 'attention' remat policy) in
  float32 on a CPU, 'chunked' (`chunked_pays`); else the einsum path: jax.nn's 'xla'
  implementation is the same computation written differently, and on XLA CPU the float32 train
  step of T5 1.1 small (batch 8, this 2-core machine, runs interleaved) took 2.19 s with einsum
  against 2.38-2.44 s with it at 256 inputs, 5.12-5.62 s against 5.26-6.43 s at 512; the einsum
  path also keeps one array of attention scores per layer for the backward pass (`softmax`
  below): 4.85 s at 512, peak RSS 2816 MB against 2763 MB with 'xla' (docs/benchmarks.md).
  'auto' never picks 'pallas': it is opt-in until measured on a TPU (only its numerics are
  tested, in interpret mode)."""
  if requested not in ATTENTION_IMPLEMENTATIONS:
    raise ValueError(f"attention_implementation must be one of {ATTENTION_IMPLEMENTATIONS}, "
                     f"got {requested!r}")
  if requested == "pallas" and jax.default_backend() != "tpu" and not _tpu_interpret_mode():
    raise ValueError(f"attention_implementation='pallas' needs a TPU (the backend is "
                     f"{jax.default_backend()!r} and Pallas TPU interpret mode is not forced)")
  if requested == "einsum" or jnp.dtype(dtype) == jnp.float64:
    return "einsum"
  if requested == "chunked" or (requested == "auto" and recompute_weights
                                and chunked_pays(dtype)):
    return "chunked"
  if dropout:  # jax.nn's kernels and Pallas have no attention dropout
    return "einsum"
  if requested != "auto":
    return requested
  head_dim = query.shape[-1]
  cudnn_ok = (jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
              and query.dtype == key.dtype == jnp.dtype(dtype)
              and head_dim % 8 == 0 and head_dim <= 128)
  return "cudnn" if cudnn_ok else "einsum"


def chunked_pays(dtype: DType) -> bool:
  """Whether 'auto' runs attention whose weights the backward pass recomputes (the 'attention'
  remat policy) as 'chunked' rather than the einsum path under jax.checkpoint: in float32 on a
  CPU backend with one device (its chunks are a `lax.map` over batch x heads, which a mesh that
  shards the batch would gather). T5 1.1 small's float32 train step on a 2-core Xeon (glibc's
  malloc kept, separate runs alternating, docs/benchmarks.md), remat 'attention': batch 8 x 612
  2.69-3.01 s at 1710 MB against 2.93-3.15 s at 1955 MB; batch 32 x 228 3.55-3.73 s at 2150 MB
  against 3.66-3.83 s at 2295 MB. Without that policy the einsum path keeps the weights and is
  faster (2.64-2.77 against 2.75-2.87 s at 612, for 2168 against 1709 MB); in bfloat16
  'chunked' was slower at every length tried (its small products cost more per call)."""
  return (jnp.dtype(dtype) == jnp.float32 and jax.default_backend() == "cpu"
          and jax.device_count() == 1)


def takes_sequence_lengths(requested: str, dtype: DType, head_dim: int) -> bool:
  """Whether `attention_implementation(requested, ...)` picks one of jax.nn's kernels ('xla',
  'cudnn'), which take a `PaddedBias` as sequence lengths, for attention without dropout in
  `dtype` with `head_dim`: the stacks then build a PaddedBias instead of the [batch, heads, q, k]
  bias (which they build once for all layers for every other kernel)."""
  probe = jax.ShapeDtypeStruct((1, 1, 1, head_dim), jnp.dtype(dtype))
  return attention_implementation(requested, probe, probe, dtype, False) in ("xla", "cudnn")


def _tpu_interpret_mode() -> bool:
  """Whether Pallas TPU kernels traced here run in TPU interpret mode (on CPU): inside
  `jax.experimental.pallas.tpu.force_tpu_interpret_mode()` or after `set_tpu_interpret_mode()`.
  JAX has no public getter for it; both set the state that `pallas_call` itself reads when it
  is traced, `jax._src.config.pallas_tpu_interpret_mode_context_manager`, to a TPU
  `InterpretParams` (GPU interpret mode sets it to another class). Reading that state keeps this
  check and the kernel in agreement, where a switch of our own could disagree with it. Should a
  JAX release move it, this answers False and 'pallas' off TPU raises: the safe side. The
  backward pass's kernels are traced when the gradient is taken: jax.grad (or the jit around
  it) must run in the mode too, not only the forward call."""
  try:
    from jax._src import config as jax_config  # pylint: disable=g-import-not-at-top
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
    params = jax_config.pallas_tpu_interpret_mode_context_manager.value
  except (ImportError, AttributeError):
    return False
  return isinstance(params, pltpu.InterpretParams)


@jax.custom_vjp
def softmax(x: Array) -> Array:
  """jax.nn.softmax over the last axis whose backward pass keeps only its output y: the gradient
  is y * (g - sum(g * y)), the formula of jax.nn.softmax's own jvp, but differentiating that jvp
  keeps exp(x - max) besides y, which the attention's value matmul keeps anyway: two arrays of
  the attention scores' size [batch, heads, q, k] per layer instead of one, the largest arrays a
  layer keeps. T5 1.1 small, batch 8 x 612, float32 on CPU: the train step's peak RSS went from
  3301 MB to 2816 MB and its time from 5.12 s to 4.85 s (docs/benchmarks.md).

  Both passes compute in (at least) float32 and round once, to x's dtype, as `gated_gelu`: in
  bfloat16, T5 1.1 small's train step on CPU (batch 32 x 328, both programs alternating in one
  process) 2.476 -> 2.349 s, batch 8 x 612 1.214 -> 1.189 s."""
  return jax.nn.softmax(x.astype(at_least_float32(x.dtype))).astype(x.dtype)


def _softmax_fwd(x: Array):
  y = softmax(x)
  return y, y


def _softmax_bwd(y: Array, g: Array):
  wide = at_least_float32(y.dtype)
  y32, g32 = y.astype(wide), g.astype(wide)
  return ((y32 * (g32 - jnp.sum(g32 * y32, axis=-1, keepdims=True))).astype(y.dtype),)


softmax.defvjp(_softmax_fwd, _softmax_bwd)


def dot_product_attention(query: Array, key: Array, value: Array,
                          bias: Optional[AttentionBias] = None,
                          dropout_rng: Optional[Array] = None, dropout_rate: float = 0.0,
                          deterministic: bool = True, dtype: DType = jnp.float32,
                          float32_logits: bool = False, implementation: str = "einsum",
                          recompute_weights: bool = False) -> Array:
  """Softmax(q k^T + bias) v with T5's dropout on the weights (shared across query positions).

  `bias` [batch|1, heads|1, q, k] is additive and already holds whatever masking the caller
  wants (-1e10 at hidden positions) and T5's relative-position bias: the kernels take it as
  given. `implementation` (see `attention_implementation`): 'einsum' is the reference below;
  'xla'/'cudnn' call `jax.nn.dot_product_attention` (scale 1: T5 folds 1/sqrt(d) into the query
  init), which on GPU is cuDNN's fused attention with the bias (whose gradient it computes only
  when the bias is differentiated: `_cudnn_attention`); 'pallas' is JAX's TPU flash
  attention kernel (`_pallas_attention`); 'chunked' is the einsum path a few (batch, head) pairs
  at a time (`_chunked_attention`), with dropout.

  `recompute_weights` (the 'attention' remat policy; einsum path): the backward pass keeps
  only query, key, value and bias and recomputes the scores and weights from them instead of
  keeping the weights [batch, heads, q, k], the largest array a layer keeps (the fused kernels,
  'pallas' and 'chunked' included, keep no weights: it is ignored for them; 'auto' takes
  'chunked' for it on a CPU in float32, `chunked_pays`).

  `bias` may be a `PaddedBias` (padding at the end of each row, as lengths): jax.nn's kernels
  take it as sequence lengths, the others its `dense` form; padded query rows come out 0.
  """
  dropout = not deterministic and dropout_rate > 0.0
  impl = attention_implementation(implementation, query, key, dtype, dropout, recompute_weights)
  padded = bias if isinstance(bias, PaddedBias) else None
  if padded is not None and impl not in ("xla", "cudnn"):
    bias = padded.dense(query.shape[1], key.shape[1], dtype)  # [batch, heads, q, k]
  if impl in ("xla", "cudnn"):
    # cuDNN (and XLA's path) keep the softmax in float32 internally, as float32_logits asks.
    q, k, v = (jnp.asarray(x, dtype) for x in (query, key, value))
    fused = _cudnn_attention if impl == "cudnn" else functools.partial(_jax_nn_attention,
                                                                       implementation=impl)
    if padded is None:
      b = None if bias is None else jnp.asarray(bias, dtype)
      return fused(q, k, v, b, None, None)
    b = None if padded.bias is None else jnp.asarray(padded.bias, dtype)
    # A row of padding alone (length 0: a batch's filler example without a prompt) is given
    # one position: with none, a kernel's softmax over no key may be 0/0, and NaN in a padded
    # row would reach the loss through 0 x NaN. Its outputs are zeroed below all the same.
    at_least_one = lambda n: jnp.maximum(n, 1).astype(jnp.int32)  # [batch]
    out = fused(q, k, v, b, at_least_one(padded.query_lengths),
                at_least_one(padded.key_lengths))
  elif impl == "pallas":
    out = _pallas_attention(query, key, value, bias, dtype)
  else:
    keep = None
    if dropout:  # T5's: one draw per key, shared across query positions
      batch, k_len, heads = key.shape[0], key.shape[1], query.shape[2]
      keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, (batch, heads, 1, k_len))
    attend = functools.partial(_attend, keep_prob=1.0 - dropout_rate, dtype=dtype,
                               float32_logits=float32_logits)
    if impl == "chunked":
      out = _chunked_attention(attend, query, key, value, bias, keep)
    else:
      if recompute_weights:
        attend = jax.checkpoint(attend)  # keeps its inputs (the dropout draw among them)
      out = attend(query, key, value, bias, keep)
  if padded is None:
    return out
  valid = padded.query_valid(query.shape[1])[:, :, None, None]  # [batch, q, 1, 1]
  return jnp.where(valid, out, jnp.zeros((), out.dtype))  # [batch, q, heads, kv]


def _jax_nn_attention(query: Array, key: Array, value: Array, bias: Optional[Array],
                      query_lengths: Optional[Array], key_lengths: Optional[Array],
                      implementation: str, bias_gradient: bool = True) -> Array:
  """jax.nn.dot_product_attention (scale 1) with optional sequence lengths [batch]. With
  `bias_gradient=False` and 'cudnn', the kernel's backward pass is traced without the bias
  gradient (`_cudnn_without_bias_gradient`): the bias then gets a zero cotangent."""
  call = functools.partial(jax.nn.dot_product_attention, query, key, value, bias=bias, scale=1.0,
                           query_seq_lengths=query_lengths, key_value_seq_lengths=key_lengths,
                           implementation=implementation)
  if implementation != "cudnn" or bias is None:
    return call()
  with _cudnn_without_bias_gradient(not bias_gradient):
    return call()


# jax's cuDNN attention asks the kernel for the bias gradient whenever there is a bias (its
# `variadic_args` (has_bias, has_dbias) in jax 0.10-0.11: `fused_attention_stablehlo.
# dot_product_attention` sets has_dbias for any bias it is given), and the backward custom call
# computes it whether anyone reads it or not. In prompt tuning, T5's relative-position bias is
# frozen: on an H200 (T5 1.1 base, batch 32 x 612, bfloat16, jax 0.11.2) cuDNN's bias-gradient
# kernel took 2.3 of the step's 34.5 ms of device time (`cudnn::fusion::fmha_dbias`), with a
# separate dQ product beside it (`cudnn::fusion::matmul_dq`, 2.2 ms; docs/benchmarks.md). While
# such a call is traced, jax's module global `_dot_product_attention` (the custom_vjp the public
# function calls) is replaced by one that asks for no bias gradient; the lock keeps a trace on
# another thread (the train step compiled ahead, run_setup) from seeing the switch. A jax
# without that global, or whose function has no `variadic_args`, is left alone: the gradient is
# computed as before, never wrong.
_CUDNN_TRACE_LOCK = threading.Lock()


@contextlib.contextmanager
def _cudnn_without_bias_gradient(switch_off: bool):
  with _CUDNN_TRACE_LOCK:
    try:
      # pylint: disable-next=g-import-not-at-top
      from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention
      original = cudnn_attention._dot_product_attention  # pylint: disable=protected-access
      signature = inspect.signature(original)
    except (ImportError, AttributeError, TypeError, ValueError):
      switch_off = False
    if not switch_off or "variadic_args" not in signature.parameters:
      yield
      return

    def without_bias_gradient(*args, **kwargs):
      bound = signature.bind(*args, **kwargs)
      has_bias = bound.arguments["variadic_args"][0]
      bound.arguments["variadic_args"] = (has_bias, False)
      return original(*bound.args, **bound.kwargs)

    # pylint: disable-next=protected-access
    cudnn_attention._dot_product_attention = without_bias_gradient
    try:
      yield
    finally:
      cudnn_attention._dot_product_attention = original  # pylint: disable=protected-access


@jax.custom_vjp
def _cudnn_attention(query: Array, key: Array, value: Array, bias: Optional[Array],
                     query_lengths: Optional[Array], key_lengths: Optional[Array]) -> Array:
  """cuDNN's fused attention (`_jax_nn_attention`) whose backward pass computes the bias
  gradient only when the bias is being differentiated: a custom_vjp with symbolic zeros, whose
  forward rule learns whether the bias is perturbed (it is not when it comes from frozen
  weights alone, as T5's relative-position bias in prompt tuning; it is in full fine-tuning)."""
  return _jax_nn_attention(query, key, value, bias, query_lengths, key_lengths, "cudnn")


def _cudnn_attention_fwd(query, key, value, bias, query_lengths, key_lengths):
  # Every argument is a CustomVJPPrimal (value, perturbed), or None.
  lengths = tuple(None if n is None else n.value for n in (query_lengths, key_lengths))
  q, k, v = query.value, key.value, value.value
  if bias is None or not bias.perturbed:
    b = None if bias is None else bias.value
    out, pullback = jax.vjp(
        lambda q, k, v: _jax_nn_attention(q, k, v, b, *lengths, "cudnn", bias_gradient=False),
        q, k, v)
  else:
    out, pullback = jax.vjp(
        lambda q, k, v, b: _jax_nn_attention(q, k, v, b, *lengths, "cudnn"), q, k, v, bias.value)
  return out, pullback  # jax.vjp's pullback is a pytree of its residuals


def _cudnn_attention_bwd(pullback, cotangent):
  if isinstance(cotangent, jax.custom_derivatives.SymbolicZero):
    cotangent = jnp.zeros(cotangent.shape, cotangent.dtype)
  grads = tuple(pullback(cotangent))  # (dq, dk, dv[, dbias])
  return grads + (None,) * (6 - len(grads))  # no bias gradient where it was not perturbed


_cudnn_attention.defvjp(_cudnn_attention_fwd, _cudnn_attention_bwd, symbolic_zeros=True)


def _attend(query: Array, key: Array, value: Array, bias: Optional[Array],
            keep: Optional[Array], keep_prob: float, dtype: DType, float32_logits: bool,
            specs: Tuple[str, str] = ("bqhd,bkhd->bhqk", "bhqk,bkhd->bqhd")) -> Array:
  """The einsum path: softmax(q k^T + bias) v for query [batch, q, heads, kv], key and value
  [batch, k, heads, kv], `bias` [batch|1, heads|1, q, k]; `keep` [batch|1, heads|1, 1, k] (bool,
  or None: no dropout) keeps weights, scaled by 1 / keep_prob. -> [batch, q, heads, kv].
  `specs` (the scores' and the output's products) give other layouts of the same computation
  (`_chunked_attention`'s [pairs, length, kv])."""
  if float32_logits:
    query = query.astype(at_least_float32(query.dtype))
    key = key.astype(at_least_float32(key.dtype))
  logits = _attention_product(specs[0], query, key)  # [batch, heads, q, k]
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  weights = softmax(logits).astype(dtype)  # [batch, heads, q, k]
  if keep is not None:
    weights = weights * (keep.astype(dtype) / jnp.asarray(keep_prob, dtype))
  return _attention_product(specs[1], weights, value.astype(dtype))  # [batch, q, heads, kv]


# The attention scores (float32) one chunk of `_chunked_attention` holds, at most: about a
# core's L2 cache. One self-attention's forward + backward alone, T5 1.1 small's heads, batch
# 8 x 612, float32, a 2-core Xeon with 2 MB of L2 per core, glibc's malloc kept: 2 (batch,
# head) pairs a chunk (3 MB of scores) 81-84 ms, 3 pairs 82-84, 6 pairs 82-85, 12 pairs 94-97,
# 1 pair 157-160; the einsum path 107-111 ms (docs/benchmarks.md). Budgets of 2-16 MB were
# within 10% of each other at 164-328 positions.
CHUNK_BYTES = 4 << 20


def chunk_pairs(batch: int, heads: int, q_len: int, k_len: int,
                budget: Optional[int] = None) -> int:
  """How many (batch, head) pairs one chunk of `_chunked_attention` takes: the most whose
  float32 scores [pairs, q, k] fit `budget` bytes (at least 2, when there are 2: one pair alone
  is a product without a batch dimension, which XLA CPU ran 1.9x slower), among the divisors of
  `heads` (a chunk within one batch row) and `heads` x the divisors of `batch` (whole rows)."""
  budget = CHUNK_BYTES if budget is None else budget
  sizes = sorted({d for d in range(1, heads + 1) if heads % d == 0}
                 | {heads * m for m in range(1, batch + 1) if batch % m == 0})
  fits = [s for s in sizes if s * q_len * k_len * 4 <= budget]
  size = fits[-1] if fits else 1
  return sizes[1] if size == 1 and len(sizes) > 1 else size


def _pair_rows(x: Array, start: Array, size: int, heads: int) -> Array:
  """x [batch|1, heads|1, ...]: the rows of (batch, head) pairs start ... start + size - 1 (in
  batch-major order) as [size|1, ...], for a chunk of `chunk_pairs` (a broadcast dimension
  stays broadcast where the chunk lies within one batch row)."""
  if size <= heads:  # `size` heads of one batch row
    row = lax.dynamic_index_in_dim(x, start // heads if x.shape[0] > 1 else 0, 0,
                                   keepdims=False)  # [heads|1, ...]
    if row.shape[0] > 1:
      row = lax.dynamic_slice_in_dim(row, start % heads, size, 0)
    return row  # [size|1, ...]
  rows = size // heads  # whole batch rows
  part = lax.dynamic_slice_in_dim(x, start // heads, rows, 0) if x.shape[0] > 1 else x
  part = jnp.broadcast_to(part, (rows, heads) + x.shape[2:])
  return part.reshape((size,) + x.shape[2:])


def _chunked_attention(attend: Callable[..., Array], query: Array, key: Array, value: Array,
                       bias: Optional[Array], keep: Optional[Array]) -> Array:
  """`attend` (the einsum path, `_attend`) run one chunk of (batch, head) pairs at a time
  (`lax.map`), each chunk under `jax.checkpoint`: its scores and weights [pairs, q, k] stay about
  the size of a core's cache (`chunk_pairs`) instead of [batch, heads, q, k] arrays in memory,
  and the backward pass keeps only the chunk's inputs and recomputes its weights (the layers
  keep no attention weights). The same arithmetic as the einsum path on each pair, the same
  dropout draw (`keep`, drawn whole by the caller); bias and dropout gradients as autodiff
  gives them. query [batch, q, heads, kv], key/value [batch, k, heads, kv], bias [batch|1,
  heads|1, q, k] (the stacks give it the dense bias they build once for all layers: each chunk
  building its rows from a `PaddedBias` instead made the train step at 8 x 612 1.06x slower,
  docs/benchmarks.md), keep [batch, heads, 1, k] -> [batch, q, heads, kv]."""
  batch, q_len, heads, _ = query.shape
  k_len = key.shape[1]
  size = chunk_pairs(batch, heads, q_len, k_len)
  count = batch * heads // size

  def chunks(x):  # [batch, length, heads, kv] -> [count, size, length, kv]
    x = x.transpose(0, 2, 1, 3)  # [batch, heads, length, kv]
    return x.reshape((count, size) + x.shape[2:])

  def one(args):
    i, q, k, v = args  # [size, length, kv]
    start = i * size
    b = None if bias is None else _pair_rows(bias, start, size, heads)  # [size|1, q, k]
    kp = None if keep is None else _pair_rows(keep, start, size, heads)  # [size, 1, k]
    return attend(q, k, v, b, kp, specs=("cqd,ckd->cqk", "cqk,ckd->cqd"))  # [size, q, kv]

  out = lax.map(jax.checkpoint(one, prevent_cse=False),
                (jnp.arange(count), chunks(query), chunks(key), chunks(value)))
  out = out.reshape((batch, heads) + out.shape[2:])  # [batch, heads, q, kv]
  return out.transpose(0, 2, 1, 3)  # [batch, q, heads, kv]


def _attention_product(spec: str, a: Array, b: Array) -> Array:
  """The einsum path's two products: summed in float32 for bfloat16 on XLA CPU (named for the
  'dots' remat policy, which saves them), else jnp.einsum."""
  if a.dtype == b.dtype and sums_bfloat16_in_float32(a.dtype):
    return checkpoint_name(float32_summed_einsum(spec, a, b), ATTENTION_PRODUCT)
  return jnp.einsum(spec, a, b)


# The Pallas TPU kernel's block size along both lengths (its default, BlockSizes.get_default):
# `_pallas_attention` pads the lengths to a multiple of it, so every block divides them.
PALLAS_BLOCK = 128


def _pallas_attention(query: Array, key: Array, value: Array, bias: Optional[Array],
                      dtype: DType) -> Array:
  """softmax(q k^T + bias) v by `jax.experimental.pallas.ops.tpu.flash_attention` (scale 1; it
  keeps the scores in float32), for query/key/value [batch, length, heads, kv].

  The kernel's blocks must divide the lengths, so both are padded up to a multiple of
  PALLAS_BLOCK with every block PALLAS_BLOCK (short ones too: a decoding step's one query runs a
  128-row block; simple, and not measured). Padded keys get the kernel's own mask value
  (-0.7 x float32's max), far below the caller's -1e10: they get weight exactly 0 even in a
  query row the caller masks entirely (T5's padding positions), which then averages the real
  keys as the einsum path does. Padded query rows are sliced off. The kernel takes the full
  bias [batch, heads, q, k] and differentiates it with q, k, v."""
  # Imported here: the kernel module pulls in Pallas' TPU backend, which `import layers` must
  # neither pay for nor depend on.
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu import flash_attention as fa
  batch, q_len, heads, _ = query.shape
  k_len = key.shape[1]
  q_pad, k_pad = -q_len % PALLAS_BLOCK, -k_len % PALLAS_BLOCK

  def heads_first(x, pad):  # [batch, length, heads, kv] -> [batch, heads, padded length, kv]
    return jnp.pad(jnp.swapaxes(jnp.asarray(x, dtype), 1, 2), ((0, 0), (0, 0), (0, pad), (0, 0)))

  q, k, v = heads_first(query, q_pad), heads_first(key, k_pad), heads_first(value, k_pad)
  b = jnp.zeros((), dtype) if bias is None else jnp.asarray(bias, dtype)
  b = jnp.broadcast_to(b, (batch, heads, q_len, k_len))  # [batch, heads, q, k]
  b = jnp.pad(b, ((0, 0), (0, 0), (0, 0), (0, k_pad)), constant_values=fa.DEFAULT_MASK_VALUE)
  b = jnp.pad(b, ((0, 0), (0, 0), (0, q_pad), (0, 0)))  # [batch, heads, padded q, padded k]
  n = PALLAS_BLOCK
  blocks = fa.BlockSizes(block_q=n, block_k_major=n, block_k=n, block_b=1, block_q_major_dkv=n,
                         block_k_major_dkv=n, block_k_dkv=n, block_q_dkv=n, block_k_major_dq=n,
                         block_k_dq=n, block_q_dq=n)
  out = fa.flash_attention(q, k, v, b, sm_scale=1.0, block_sizes=blocks)  # [b, h, padded q, kv]
  return jnp.swapaxes(out[:, :, :q_len], 1, 2).astype(dtype)  # [batch, q, heads, kv]
