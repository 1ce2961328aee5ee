"""`prompt-jax bench attention`: the fused attention kernels against the einsum reference, on the
device the bench runs on (issue 11: "the fused-attention path equals the reference einsum path
... on GPU in the bench").

One encoder self-attention of the preset's shape (`--batch` rows of `--inputs` + `--prompt_length`
positions, the preset's heads and head size) with T5's additive bias: a random relative-position
bias [1, heads, q, k] plus a padding mask (the last quarter of the rows half padding, at the end
of the input as T5's feature converter pads). Each kernel `models.layers.dot_product_attention` can pick here runs in `--dtype`:
'einsum' (the reference path), 'chunked' (the einsum path a few (batch, head) pairs at a time),
'xla' (jax.nn's XLA path), 'cudnn' (GPU, bfloat16) and 'pallas'
(TPU); 'xla+lengths' and 'cudnn+lengths' are jax.nn's kernels given the padding as sequence
lengths and only the [1, heads, q, k] relative-position bias, instead of one [batch, heads, q, k]
bias (less to read): the form the encoder uses with jax.nn's kernels (`layers.PaddedBias`;
'auto' on GPU). Reported per kernel: the largest error of the output and of the gradients with
respect to q, k and v against a float64 einsum computation of the same inputs (the output on
real query rows only: a fully masked padding row sits under a -1e10 bias that float32 cannot
resolve, so it gets no cotangent either), that error over the einsum path's own in the same
dtype (the reference's rounding is the yardstick), and the seconds of the forward and of
forward + backward. The bias is not differentiated, as in prompt tuning: cuDNN's backward pass
then computes no bias gradient (`layers._cudnn_attention`).

  prompt-jax bench attention --preset=t5_1_1_base --batch=32 --inputs=512 --dtype=bfloat16
"""
import statistics
from typing import Any, Dict, List


def kernels(dtype) -> List[str]:
  """The kernels `dot_product_attention` can run here in `dtype` (the reference first)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  names = ["einsum", "chunked", "xla", "xla+lengths"]
  backend = jax.default_backend()
  if backend == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    names += ["cudnn", "cudnn+lengths"]
  if backend == "tpu":
    names.append("pallas")
  return names


def _inputs(args, config):
  """float64 host arrays: q, k, v [batch, length, heads, kv], the bias [batch, heads, q, k] (the
  relative-position bias [1, heads, q, k] plus -1e10 where masked), the relative-position bias
  alone, the real-row mask [batch, q]; the output cotangent [batch, q, heads, kv] (0 on padded
  rows)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  batch, length = args.batch, args.inputs + args.prompt_length
  heads, kv = config.num_heads, config.head_dim
  q, k, v, cotangent = (rng.standard_normal((batch, length, heads, kv)) for _ in range(4))
  q /= np.sqrt(kv)  # T5 folds 1/sqrt(d) into the query
  real = np.ones((batch, length), bool)  # [batch, prompt + inputs]
  real[batch - batch // 4:, length - args.inputs // 2:] = False
  relative = rng.standard_normal((1, heads, length, length))
  bias = relative + np.where(real[:, None, :] & real[:, :, None], 0.0, -1e10)[:, None]
  cotangent *= real[:, :, None, None]  # a padded query row's output feeds no loss
  return q, k, v, bias, relative, real, cotangent


def _time(fn, n: int) -> float:
  """Median seconds of `fn` (to its results being ready) over n runs, after one to compile."""
  import jax  # pylint: disable=g-import-not-at-top
  from prompt_jax import bench  # pylint: disable=g-import-not-at-top
  run = lambda: jax.block_until_ready(fn())
  run()  # compile
  return statistics.median(bench._time(run, n))  # pylint: disable=protected-access


def measure(args, config) -> Dict[str, Any]:
  """Side: every kernel's errors and seconds (see the module doc), flat for BENCH_RESULT; a
  kernel that fails has '<kernel>/failed': its error's first line instead."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import layers  # pylint: disable=g-import-not-at-top
  q, k, v, bias, relative, real, cotangent = _inputs(args, config)
  lengths = real.sum(axis=1).astype(np.int32)  # [batch]: the padding is at the end

  def attention(impl, dtype):
    """impl(q, k, v, bias) -> [batch, q, heads, kv]. 'K+lengths': jax.nn's kernel K given the
    padding as sequence lengths and only the [1, heads, q, k] relative-position bias, as the
    encoder gives it (`layers.PaddedBias`)."""
    if not impl.endswith("+lengths"):
      return lambda q, k, v, b: layers.dot_product_attention(q, k, v, bias=b, dtype=dtype,
                                                             implementation=impl)
    n = jnp.asarray(lengths)
    return lambda q, k, v, b: layers.dot_product_attention(
        q, k, v, bias=layers.PaddedBias(b, n, n), dtype=dtype,
        implementation=impl.split("+")[0])

  def fwd_bwd(impl, dtype):
    attend = attention(impl, dtype)

    def loss(q, k, v, bias, cotangent):
      out = attend(q, k, v, bias)
      return jnp.sum(out.astype(cotangent.dtype) * cotangent), out
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))
    forward = jax.jit(lambda *a: loss(*a)[1])
    return forward, grad

  def run(impl, dtype):
    forward, grad = fwd_bwd(impl, dtype)
    b = relative if impl.endswith("+lengths") else bias
    arrays = [jnp.asarray(x, dtype) for x in (q, k, v, b)] + [jnp.asarray(cotangent,
                                                                          jnp.float32)]
    (dq, dk, dv), out = grad(*arrays)
    values = {"out": out, "dq": dq, "dk": dk, "dv": dv}
    host = {name: np.asarray(x).astype(np.float64) for name, x in values.items()}
    return host, forward, grad, arrays

  with jax.enable_x64(True):  # only the reference: the kernels run as in training
    reference, _, _, _ = run("einsum", jnp.float64)
  dtype = getattr(jnp, args.dtype)
  rows = real[:, :, None, None]  # [batch, q, 1, 1]: query rows that are real positions

  def errors(host):
    # The output on real query rows; the gradients everywhere (padded rows get no cotangent).
    return {name: float(np.max(np.abs(value - reference[name])
                               * (rows if name == "out" else 1.0)))
            for name, value in host.items()}

  result: Dict[str, Any] = {}
  base = None
  for impl in kernels(dtype):
    try:
      host, forward, grad, arrays = run(impl, dtype)
      seconds = (_time(lambda f=forward, a=arrays: f(*a), args.steps),
                 _time(lambda g=grad, a=arrays: g(*a), args.steps))
    except Exception as e:  # pylint: disable=broad-except
      # A kernel this device or jax version rejects (say cuDNN with this bias shape) is
      # reported, and the others still run.
      first_line = (str(e).splitlines() or [""])[0]
      result[f"{impl}/failed"] = f"{type(e).__name__}: {first_line[:200]}"
      continue
    err = errors(host)
    if base is None:
      base = err
    for name, e in err.items():
      result[f"{impl}/{name}_error"] = e
      result[f"{impl}/{name}_vs_einsum"] = e / max(base[name], np.finfo(np.float64).tiny)
    result[f"{impl}/forward_seconds"], result[f"{impl}/train_seconds"] = seconds
  return result


def report(args, side: Dict[str, Any], say) -> None:
  """The parent's lines from the side's flat result."""
  impls = [k.split("/")[0] for k in side if k.endswith(("/forward_seconds", "/failed"))]
  say(f"attention: {args.preset}, batch {args.batch} x {args.inputs} inputs (+"
      f"{args.prompt_length} prompt), {args.dtype}; errors: largest |kernel - float64 einsum| "
      f"(x the einsum path's own error in {args.dtype})")
  base = side["einsum/forward_seconds"], side["einsum/train_seconds"]
  for impl in impls:
    if f"{impl}/failed" in side:
      say(f"  {impl:13s} not run: {side[f'{impl}/failed']}")
      continue
    errs = ", ".join(f"{name} {side[f'{impl}/{name}_error']:.2e} "
                     f"(x{side[f'{impl}/{name}_vs_einsum']:.2f})"
                     for name in ("out", "dq", "dk", "dv"))
    say(f"  {impl:13s} {errs}; forward {side[f'{impl}/forward_seconds'] * 1e3:.2f} ms, "
        f"forward+backward {side[f'{impl}/train_seconds'] * 1e3:.2f} ms (speed vs einsum "
        f"{base[1] / side[f'{impl}/train_seconds']:.2f}x)")
