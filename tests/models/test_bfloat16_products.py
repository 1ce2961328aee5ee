"""bfloat16 products on XLA CPU summed in float32 (`layers.float32_summed_einsum`): XLA CPU runs a
bfloat16 x bfloat16 -> float32 product on the CPU's bfloat16 units and a bfloat16 -> bfloat16
one at its float32 rate, so the dense layers ask for float32 sums, in the backward pass too."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.models import layers
from tests import numerics

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not layers.cpu_runs_float32_summed_products(),
    reason="the XLA CPU path, where this XLA CPU runs its products")


def _bf16(key, shape, scale=1.0):
  return (jax.random.normal(key, shape) * scale).astype(jnp.bfloat16)


def _bound(a, b, a_dims, b_dims, ref):
  """One rounding to bfloat16 (half its eps, relative) after a float32 sum of K products
  (at most K float32 roundings of the running sum: K * EPS32 * sum|a||b|), elementwise."""
  k = int(np.prod([a.shape[d] for d in a_dims]))
  abs_sum = np.tensordot(np.abs(a), np.abs(b), (a_dims, b_dims))
  return numerics.EPS_BF16 / 2 * np.abs(ref) + k * numerics.EPS32 * abs_sum


def test_products_and_their_gradients_are_one_bfloat16_rounding_of_the_exact_sum():
  """Forward, dx and dkernel against float64 products of the same bfloat16 values: each element
  within one bfloat16 rounding plus the float32 sum's worst case (the plain bfloat16 product
  meets the same bound on XLA CPU: the numbers are as accurate as before, only faster). Fails
  for a backward product over the wrong dims or with a cotangent left out."""
  kx, kk, kg = jax.random.split(jax.random.PRNGKey(0), 3)
  x, kernel = _bf16(kx, (4, 64, 256)), _bf16(kk, (256, 128), 1 / 16)
  g = _bf16(kg, (4, 64, 128))
  spec = layers.dense_spec(x.ndim, kernel.ndim, 1)  # 'abc,cd->abd'
  out, vjp = jax.vjp(lambda x, k: layers.float32_summed_einsum(spec, x, k), x, kernel)
  dx, dkernel = vjp(g)
  assert out.dtype == dx.dtype == dkernel.dtype == jnp.bfloat16
  x64, k64, g64 = (np.asarray(v, np.float64) for v in (x, kernel, g))
  for got, a, b, dims in [(out, x64, k64, ((2,), (0,))),
                          (dx, g64, k64, ((2,), (1,))),
                          (dkernel, x64, g64, ((0, 1), (0, 1)))]:
    ref = np.tensordot(a, b, dims)
    err = np.abs(np.asarray(got, np.float64) - ref)
    assert np.all(err <= _bound(a, b, *dims, ref)), (dims, float(err.max()))


@pytest.mark.parametrize("spec,a_shape,b_shape", [
    ("bqhd,bkhd->bhqk", (2, 48, 3, 64), (2, 40, 3, 64)),  # the scores
    ("bhqk,bkhd->bqhd", (2, 3, 48, 40), (2, 40, 3, 64)),  # weights x values
])
def test_attention_products_and_their_gradients_within_one_bfloat16_rounding(spec, a_shape,
                                                                              b_shape):
  """float32_summed_einsum (the einsum attention's products) and its two gradients, as above;
  dA and dB come from einsums of the spec's indices rearranged, so a wrong rearrangement fails
  (or does not run)."""
  ka, kb, kg = jax.random.split(jax.random.PRNGKey(2), 3)
  a, b = _bf16(ka, a_shape), _bf16(kb, b_shape, 1 / 8)
  out, vjp = jax.vjp(lambda a, b: layers.float32_summed_einsum(spec, a, b), a, b)
  g = _bf16(kg, out.shape)
  da, db = vjp(g)
  assert out.dtype == da.dtype == db.dtype == jnp.bfloat16
  assert da.shape == a.shape and db.shape == b.shape
  a64, b64, g64 = (np.asarray(v, np.float64) for v in (a, b, g))
  (sa, sb), sc = spec.split("->")[0].split(","), spec.split("->")[1]
  for got, (x, sx), (y, sy), sz in [(out, (a64, sa), (b64, sb), sc),
                                    (da, (g64, sc), (b64, sb), sa),
                                    (db, (a64, sa), (g64, sc), sb)]:
    ref = np.einsum(f"{sx},{sy}->{sz}", x, y)
    summed = "".join(sorted(set(sx) & set(sy) - set(sz)))
    k = int(np.prod([x.shape[sx.index(c)] for c in summed]))
    bound = (numerics.EPS_BF16 / 2 * np.abs(ref)
             + k * numerics.EPS32 * np.einsum(f"{sx},{sy}->{sz}", np.abs(x), np.abs(y)))
    err = np.abs(np.asarray(got, np.float64) - ref)
    assert np.all(err <= bound), (sz, float(err.max()))


def test_dense_layers_use_it_for_bfloat16_and_differentiate_only_what_is_asked():
  """DenseGeneral in bfloat16 on CPU gives float32_summed_einsum's numbers (its contracted dims
  moved last), float32 keeps the plain product; the gradient with respect to the input alone
  has one product (dx), with respect to both two."""
  kx, kk = jax.random.split(jax.random.PRNGKey(1))
  x = _bf16(kx, (2, 8, 4, 16))  # [batch, length, heads, kv]: the output projection's form
  dense = layers.DenseGeneral(features=(32,), axis=(-2, -1), dtype=jnp.bfloat16)
  params = dense.init(kk, x)
  kernel = params["params"]["kernel"].value  # [heads * kv, embed], float32
  got = dense.apply(params, x)
  want = layers.float32_summed_einsum("abc,cd->abd", x.reshape(2, 8, 64),
                                      kernel.astype(jnp.bfloat16))
  assert got.dtype == jnp.bfloat16 and np.array_equal(np.asarray(got), np.asarray(want))
  assert layers.sums_bfloat16_in_float32(jnp.bfloat16)
  assert not layers.sums_bfloat16_in_float32(jnp.float32)

  def dot_generals(jaxpr):  # through nested jaxprs (jnp.einsum's jit, the custom_vjp call)
    count = 0
    for eqn in jaxpr.eqns:
      count += str(eqn.primitive) == "dot_general"
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if isinstance(sub, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
            count += dot_generals(getattr(sub, "jaxpr", sub))
    return count

  def products(argnums):
    loss = lambda p, x: jnp.sum(dense.apply(p, x).astype(jnp.float32))
    return dot_generals(jax.make_jaxpr(jax.grad(loss, argnums=argnums))(params, x).jaxpr)

  # The forward product, then dx alone or dx and dkernel.
  assert products(1) == 2 and products((0, 1)) == 3


def test_a_product_xla_cpu_cannot_run_keeps_the_plain_products():
  """The probe behind sums_bfloat16_in_float32: a float32-summed product this XLA CPU rejects
  when it runs (jax 0.10.2: 'bqhd,bhqk->bkhd', UNIMPLEMENTED in DotThunk) makes it say no, so a
  jax version that rejects one of ours trains on the plain products instead of failing."""
  rejected = (("bqhd,bhqk->bkhd", (2, 5, 2, 8), (2, 2, 5, 3)),)
  if layers.cpu_runs_float32_summed_products(rejected):
    pytest.skip("this XLA CPU runs the product jax 0.10.2's rejects")
  assert not layers.cpu_runs_float32_summed_products(rejected + layers._probe_products())


def test_plan_compiles_the_products_an_accelerator_runs(monkeypatch):
  """`prompt-jax plan` estimates a GPU's or TPU's memory from a CPU compile: inside
  layers.accelerator_products() the step keeps the plain products (fails if plan's compile
  reaches the CPU-only path)."""
  from prompt_jax import plan  # pylint: disable=g-import-not-at-top

  def cpu_only(*unused_args):
    raise AssertionError("the CPU path was traced")

  monkeypatch.setattr(layers, "float32_summed_einsum", cpu_only)
  args = plan._parser().parse_args([
      "--model=models/embedded_tiny.gin", "--batch=2", "--inputs=16", "--targets=4",
      "--prompt_length=4", "--dtype=bfloat16"])
  assert plan.plan(args)["total"] > 0
  dense = layers.DenseGeneral(features=(4,), dtype=jnp.bfloat16)
  x = jnp.ones((2, 8), jnp.bfloat16)
  with layers.accelerator_products():
    params = jax.eval_shape(dense.init, jax.random.PRNGKey(0), x)
  with pytest.raises(AssertionError, match="the CPU path was traced"):
    jax.eval_shape(dense.apply, params, x)  # outside: the CPU path


def test_traces_for_the_parameters_skip_the_cpu_path_on_their_thread_only(monkeypatch):
  """run_setup's abstract init (the run's layout) and the prompt's init trace the model with the
  plain products (the same parameters: tests/test_startup.py compares the values; the
  float32-summed products' custom_vjp is most of a bfloat16 trace on CPU). The switch is per
  thread: `train` compiles its step on another thread meanwhile, which must keep the CPU path."""
  import threading  # pylint: disable=g-import-not-at-top
  from prompt_jax import partitioning, run_setup  # pylint: disable=g-import-not-at-top
  from prompt_jax.embedded import embedded_checkpoint_path  # pylint: disable=g-import-not-at-top
  from prompt_jax.prompts import initializers, specs  # pylint: disable=g-import-not-at-top
  from tests.train import common  # pylint: disable=g-import-not-at-top

  real = layers.float32_summed_einsum
  traced = []
  monkeypatch.setattr(layers, "float32_summed_einsum",
                      lambda *a: (traced.append(a[0]), real(*a))[1])
  config = common.embedded_tiny_config(dtype=jnp.bfloat16)
  spec = specs.prompt_tuning(length=4, init=initializers.from_sampled_vocab(population_size=50))
  lengths = {"inputs": 16, "targets": 4}
  model = run_setup.build_model(config, spec)
  run_setup.abstract_variables(model, lengths)
  run = run_setup.prepare(config=config, prompt=spec, feature_lengths=lengths,
                          initial_checkpoint_path=embedded_checkpoint_path(),
                          trainable_regex=spec.trainable_regex,
                          mesh=partitioning.create_mesh(1))
  assert run.trainable and not traced
  jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                    *run_setup.model_inputs(1, lengths)))
  assert traced  # outside them: the CPU path
  seen = []
  with layers.accelerator_products():
    worker = threading.Thread(target=lambda: seen.append(
        layers.sums_bfloat16_in_float32(jnp.bfloat16)))
    worker.start()
    worker.join()
    assert not layers.sums_bfloat16_in_float32(jnp.bfloat16)
  assert seen == [True]


def test_plain_products_when_the_user_asks(monkeypatch):
  """PROMPT_JAX_CPU_BFLOAT16_PRODUCTS=plain: the layers keep the plain bfloat16 products (what
  `prompt-jax` tells a user whose program XLA CPU refuses to run); another value is an error."""
  x = _bf16(jax.random.PRNGKey(2), (2, 8))
  dense = layers.DenseGeneral(features=(4,), dtype=jnp.bfloat16)
  params = dense.init(jax.random.PRNGKey(3), x)
  kernel = params["params"]["kernel"].value.astype(jnp.bfloat16)
  monkeypatch.setenv(layers.CPU_PRODUCTS_ENV, "plain")
  assert not layers.sums_bfloat16_in_float32(jnp.bfloat16)
  jaxpr = str(jax.make_jaxpr(dense.apply)(params, x))
  assert "dot_general" in jaxpr and "preferred_element_type=float32" not in jaxpr
  np.testing.assert_array_equal(np.asarray(dense.apply(params, x), np.float32),
                                np.asarray(jnp.dot(x, kernel), np.float32))
  monkeypatch.setenv(layers.CPU_PRODUCTS_ENV, "fast")
  with pytest.raises(ValueError, match="PROMPT_JAX_CPU_BFLOAT16_PRODUCTS='fast': use one of"):
    layers.sums_bfloat16_in_float32(jnp.bfloat16)
  monkeypatch.delenv(layers.CPU_PRODUCTS_ENV)
  assert layers.sums_bfloat16_in_float32(jnp.bfloat16)


def test_the_cli_says_what_to_do_when_xla_cpu_refuses_a_product(capsys):
  """XLA CPU's run-time refusal of a float32-summed product (the product jax 0.10.2 rejects,
  raised from a step) is one line naming the setting that avoids it, exit 1."""
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  a, b = np.ones((2, 5, 2, 8), jnp.bfloat16), np.ones((2, 2, 5, 3), jnp.bfloat16)
  try:
    try:
      jax.block_until_ready(jax.jit(lambda a, b: jnp.einsum(
          "bqhd,bhqk->bkhd", a, b, preferred_element_type=jnp.float32))(a, b))
    except Exception as refused:  # pylint: disable=broad-except
      raise RuntimeError("the train step failed") from refused
    pytest.skip("this XLA CPU runs the product jax 0.10.2's rejects")
  except RuntimeError as e:
    error = e
  assert cli._error("train", error, verbose=False) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "PROMPT_JAX_CPU_BFLOAT16_PRODUCTS=plain" in err[0], err
