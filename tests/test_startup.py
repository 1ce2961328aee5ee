"""Start-up (issue 11, acceptance 3): a run from a checkpoint compiles no whole-model init.

Every program XLA compiles while `run_setup.prepare` builds a run is dumped as StableHLO
(jax's public `jax_dump_ir_to`). A program that draws random numbers (threefry) is an init;
none may produce a backbone parameter (those come from the checkpoint), and none may be as large
as the jitted whole-model init. The random-backbone path (no checkpoint) fills the backbone
array by array: no compiled program holds more than one initialiser's worth of random draws.
"""
import glob
import os
import re

import jax
import numpy as np
import pytest

from prompt_jax import checkpoints, partitioning, run_setup, trees
from prompt_jax.embedded import embedded_checkpoint_path
from prompt_jax.errors import ConfigError
from prompt_jax.prompts import initializers, specs
from tests.train import common
from tests.train.common import cli_subprocess

LENGTHS = {"inputs": 16, "targets": 4}


def _spec():
  # Sampled-vocabulary init: the initialiser closes over the frozen embedding table [V, H].
  return specs.prompt_tuning(length=8, init=initializers.from_sampled_vocab(population_size=200))


def _result_shapes(text):
  """Shapes of the outputs of a dumped module's main function."""
  sig = re.search(r"func\.func public @main\((.*?)\) -> \((.*?)\) \{", text, re.S)
  results = sig.group(2) if sig else ""
  return [tuple(int(d) for d in m.split("x")[:-1]) for m in re.findall(r"tensor<([^>]*)>",
                                                                          results)]


def _compiled(tmp_path, fn):
  dump = str(tmp_path / "ir")
  old = jax.config.values["jax_dump_ir_to"]
  jax.config.update("jax_dump_ir_to", dump)
  try:
    out = fn()
  finally:
    jax.config.update("jax_dump_ir_to", old)
  return out, {os.path.basename(p): open(p).read()
               for p in glob.glob(os.path.join(dump, "*.mlir"))}


def _draws(text):
  """Random-bit generations in a dumped module (code lines, not location metadata)."""
  return sum(line.count("threefry2x32") for line in text.splitlines()
             if not line.startswith("#loc"))


def _whole_init_size(tmp_path, config, spec):
  """(size, draws) of the jitted whole-model init, dumped the same way (the reference)."""
  model = run_setup.build_model(config, spec)
  inputs = run_setup.model_inputs(1, LENGTHS)
  with partitioning.axis_rules(partitioning.create_mesh(1)):
    init = jax.jit(lambda k: model.init(k, *inputs, enable_dropout=False))
    _, programs = _compiled(tmp_path / "whole", lambda: init.lower(jax.random.PRNGKey(0))
                            .compile())
  text = max(programs.values(), key=len)
  return len(text), _draws(text)


def test_prepare_from_a_checkpoint_compiles_no_whole_model_init(tmp_path):
  config, spec = common.embedded_tiny_config(), _spec()
  run, programs = _compiled(tmp_path, lambda: run_setup.prepare(
      config=config, prompt=spec, feature_lengths=LENGTHS,
      initial_checkpoint_path=embedded_checkpoint_path(),
      trainable_regex=spec.trainable_regex, mesh=partitioning.create_mesh(1)))
  backbone = {tuple(v.shape) for v in trees.flatten(run.frozen).values() if v.ndim == 2}
  whole_size, _ = _whole_init_size(tmp_path, config, spec)
  inits = {name: text for name, text in programs.items() if _draws(text)}
  assert inits, "the prompt must be initialised by a compiled program"
  assert programs, "nothing compiled: the dump did not work"
  for name, text in inits.items():
    shapes = set(_result_shapes(text))
    assert not shapes & backbone, f"{name} initialises backbone-shaped arrays {shapes & backbone}"
    # The whole-model init is ~6x the prompt's (108 kB vs 18 kB of StableHLO on this model).
    assert len(text) < whole_size / 3, (name, len(text), whole_size)
    # The frozen embedding table the sampled-vocabulary init reads is an argument, not a
    # constant folded into the program (for T5 1.1 base that literal would be 98 MB).
    assert "dense<" not in text or len(text) < 100_000, name
  # The prompt still starts as rows of the frozen embedding table (the init ran, right input).
  prompt = np.asarray(trees.flatten(run.trainable)["encoder/prompt/prompt/prompt"])
  table = np.asarray(trees.flatten(run.frozen)["token_embedder/embedding"])
  assert all(np.any(np.all(table[:200] == row, axis=1)) for row in prompt)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prompt_init_values_are_those_of_the_model_init(tmp_path, dtype):
  """Initialising the prompt on its own gives exactly what the whole model's init gives it (in
  bfloat16 on CPU the prompt's init is traced with the plain products, the whole model's init
  here with the float32-summed ones: models/layers.py)."""
  config, spec = common.embedded_tiny_config(dtype=dtype), _spec()
  run = run_setup.prepare(config=config, prompt=spec, feature_lengths=LENGTHS,
                          initial_checkpoint_path=embedded_checkpoint_path(),
                          trainable_regex=spec.trainable_regex, mesh=partitioning.create_mesh(1),
                          random_seed=3)
  loaded = trees.unflatten({k: v for k, v in trees.flatten(run.frozen).items()})
  # The table the prompt is drawn from is the checkpoint's float32 one, not its bfloat16 rounding.
  table = checkpoints.load_array(embedded_checkpoint_path(), "token_embedder/embedding")
  model = run_setup.build_model(config, spec, table, None, params=loaded)
  rng = jax.random.fold_in(jax.random.PRNGKey(3), 0)
  with partitioning.axis_rules(partitioning.create_mesh(1)):
    whole = trees.flatten(trees.unbox(model.init(rng, *run_setup.model_inputs(1, LENGTHS),
                                                 enable_dropout=False)["params"]))
  np.testing.assert_array_equal(np.asarray(trees.flatten(run.trainable)[
      "encoder/prompt/prompt/prompt"]), np.asarray(whole["encoder/prompt/prompt/prompt"]))


def test_prepare_for_a_resume_defers_the_prompt_init(tmp_path):
  """`init_trainable=False` (a run that resumes, eval of a checkpoint): the prompt's init is not
  compiled (its initialiser's errors still come); the prompt is a placed shape until
  `initialise_deferred`, which gives exactly the values of an undeferred `prepare`."""
  config, spec = common.embedded_tiny_config(), _spec()
  mesh = partitioning.create_mesh(1)
  kwargs = dict(config=config, prompt=spec, feature_lengths=LENGTHS,
                initial_checkpoint_path=embedded_checkpoint_path(),
                trainable_regex=spec.trainable_regex, mesh=mesh, random_seed=5)
  direct = run_setup.prepare(**kwargs)
  deferred, programs = _compiled(tmp_path, lambda: run_setup.prepare(init_trainable=False,
                                                                     **kwargs))
  assert not any(_draws(text) for text in programs.values()), sorted(programs)
  name = "encoder/prompt/prompt/prompt"
  assert deferred.deferred == (name,)
  placed = trees.flatten(deferred.trainable)[name]
  want = trees.flatten(direct.trainable)[name]
  assert isinstance(placed, jax.ShapeDtypeStruct)
  assert (placed.shape, placed.dtype, placed.sharding) == (want.shape, want.dtype, want.sharding)
  for a, b in zip(jax.tree_util.tree_leaves(direct.frozen),
                  jax.tree_util.tree_leaves(deferred.frozen)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The deferred init's checks still hold: a prompt file of another shape is the same error.
  bad = tmp_path / "bad.npy"
  np.save(bad, np.zeros((3, config.emb_dim), np.float32))
  wrong = dict(kwargs, prompt=specs.prompt_tuning(length=8, init=initializers.from_file(str(bad))))
  for init_trainable in (True, False):
    with pytest.raises(ConfigError, match=r"PROMPT_FILE .* has shape \(3, 64\), the parameter "
                                          r"needs \(8, 64\)"):
      run_setup.prepare(init_trainable=init_trainable, **wrong)
  run_setup.initialise_deferred(deferred)
  assert deferred.deferred == ()
  got = trees.flatten(deferred.trainable)[name]
  assert got.sharding == want.sharding and got.dtype == want.dtype
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_random_backbone_is_filled_per_array_with_the_model_initialisers(tmp_path):
  config, spec = common.embedded_tiny_config(), _spec()
  run, programs = _compiled(tmp_path, lambda: run_setup.prepare(
      config=config, prompt=spec, feature_lengths=LENGTHS, initial_checkpoint_path=None,
      trainable_regex=spec.trainable_regex, mesh=partitioning.create_mesh(1)))
  whole_size, _ = _whole_init_size(tmp_path, config, spec)
  for name, text in programs.items():
    assert len(text) < whole_size / 3, (name, len(text), whole_size)
    if _draws(text) and "prompt" not in text:  # a backbone init: one array per program
      assert len(_result_shapes(text)) == 1, (name, _result_shapes(text))
  frozen = trees.flatten(run.frozen)
  assert set(frozen) == run_setup.backbone_paths(config)
  # The model's own initialisers: layer norms ones; the embedding N(0, 1); the query kernel
  # variance-scaling(1, fan_in) / sqrt(head_dim): std 1/sqrt(emb * head_dim).
  np.testing.assert_array_equal(np.asarray(frozen["encoder/encoder_norm/scale"]), 1.0)
  emb = np.asarray(frozen["token_embedder/embedding"])
  assert abs(emb.std() - 1.0) < 0.05, emb.std()  # 16640 N(0,1) draws: std error ~0.006
  q = np.asarray(frozen["encoder/layers_0/attention/query/kernel"])
  expected = 1.0 / np.sqrt(config.emb_dim * config.head_dim)
  assert abs(q.std() / expected - 1.0) < 0.1, (q.std(), expected)  # 1024 draws: ~2.2% error
  # Distinct arrays get distinct keys; the same seed gives the same backbone.
  k = np.asarray(frozen["encoder/layers_0/attention/key/kernel"])
  v = np.asarray(frozen["encoder/layers_0/attention/value/kernel"])
  assert not np.allclose(k, v)
  again = run_setup.prepare(config=config, prompt=spec, feature_lengths=LENGTHS,
                            initial_checkpoint_path=None, trainable_regex=spec.trainable_regex,
                            mesh=partitioning.create_mesh(1))
  for path, value in trees.flatten(again.frozen).items():
    np.testing.assert_array_equal(np.asarray(value), np.asarray(frozen[path]), err_msg=path)


def test_compilation_cache_is_used_across_processes(tmp_path):
  """Two processes with one cache directory: the second reads what the first wrote."""
  import subprocess, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  code = (
      "import jax, jax.numpy as jnp\n"
      "from prompt_jax import compile_cache\n"
      f"print('DIR', compile_cache.enable({str(tmp_path / 'cache')!r}, min_compile_secs=0))\n"
      "f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())\n"
      "print('VALUE', float(f(jnp.ones((64, 32)))))\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
  assert first.returncode == 0, first.stderr[-2000:]
  written = set(os.listdir(tmp_path / "cache"))
  assert written, "nothing written to the compilation cache"
  second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(env, JAX_LOG_COMPILES="1"), timeout=300)
  assert second.returncode == 0, second.stderr[-2000:]
  assert set(os.listdir(tmp_path / "cache")) == written  # a hit writes nothing new
  assert "Persistent compilation cache hit" in second.stderr, second.stderr[-3000:]
  assert first.stdout.split("VALUE")[1] == second.stdout.split("VALUE")[1]


def test_compilation_cache_can_be_turned_off():
  """In a fresh process: in the suite's own process an earlier in-process command has already
  turned the cache on (this test used to skip itself there, so CI never ran it)."""
  code = ("import jax\nfrom prompt_jax import compile_cache\n"
          "print('RESULT', compile_cache.enable(), jax.config.jax_compilation_cache_dir)\n")
  results = {}
  for value in ("off", "0", ""):
    proc = cli_subprocess([], python_code=code, timeout=300,
                          env={"PROMPT_JAX_COMPILATION_CACHE": value,
                               "JAX_COMPILATION_CACHE_DIR": None})
    assert proc.returncode == 0, proc.stdout[-2000:]
    results[value] = proc.stdout.split("RESULT")[1].splitlines()[0].split()
  assert all(r == ["None", "None"] for r in results.values()), results


_FIRST_STEP = re.compile(r"first step done ([0-9.]+) s after start \(([0-9.]+) s compiling or "
                         r"loading XLA programs; persistent compilation cache: (\d+) loaded, "
                         r"(\d+) written\)")


def test_train_reports_its_time_to_first_step_and_a_second_run_loads_the_compiled_programs(
    tmp_path):
  """`train` logs (and writes to TensorBoard) the seconds from the start of the command to its
  first step and what the persistent compilation cache served. A second run of the same
  configuration compiles nothing: every program the first one wrote is loaded."""
  from tests.train.common import flags, tensorboard_scalars  # pylint: disable=g-import-not-at-top
  env = {"PROMPT_JAX_COMPILATION_CACHE": str(tmp_path / "cache"),
         "JAX_COMPILATION_CACHE_DIR": None,
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}  # the tiny model compiles in < 1 s
  runs = []
  for name in ("first", "second"):
    model_dir = tmp_path / name
    proc = cli_subprocess(["train", *flags(str(model_dir), 2)], env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    found = _FIRST_STEP.findall(proc.stdout)
    assert len(found) == 1, proc.stdout[-3000:]  # once, for the first step only
    seconds, compiling, loaded, written = (float(x) for x in found[0])
    assert 0 < compiling < seconds, found
    # The log rounds to 0.1 s (up to 0.05 off); TensorBoard stores float32 (6e-8 relative).
    assert tensorboard_scalars(str(model_dir), "timing/seconds_to_first_step") == {
        1: pytest.approx(seconds, abs=0.05 + 1e-7 * seconds)}
    assert set(tensorboard_scalars(str(model_dir), "timing/compilation_seconds")) == {1}
    runs.append((loaded, written))
  (loaded_1, written_1), (loaded_2, written_2) = runs
  assert loaded_1 == 0 and written_1 > 0  # an empty cache: everything compiled and written
  assert written_2 == 0 and loaded_2 == written_1, runs
