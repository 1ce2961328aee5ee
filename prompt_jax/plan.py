"""`prompt-jax plan`: will this run fit? The train step compiled ahead of time on a device mesh,
with abstract shapes only (nothing of the model is allocated), and its per-device memory.

  prompt-jax plan --model=models/t5_1_1_xxl.gin --mesh=8x8 --batch=32 --inputs=512 --targets=8

`--mesh=DxM`: D data-parallel x M model-parallel devices. With fewer real devices than D*M the
plan re-runs itself on D*M fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count),
so a laptop can plan a pod: the shardings, the collectives and the buffer sizes are those of the
run, but the figures come from the CPU compiler's buffer assignment (fusion and scheduling
differ per backend): an estimate to within the backend's differences, not a guarantee. On the
CPU the plan compiles with XLA's memory-minimising scheduler (prompt_jax/xla_defaults.py), as
accelerators schedule: with XLA CPU's default, concurrency-optimised one, T5 1.1 base, batch
32 x 612 on one device planned 39.7 GiB of temporaries (19.6 GiB with it; 'full' remat: 37.0
vs 12.1 GiB; docs/benchmarks.md).
Reported per device, from `compiled.memory_analysis()`: arguments (trainable state, frozen
weights, batch), outputs, temporaries (activations, gradients) and their sum less aliased
(donated) buffers.
"""
import argparse
import os
import subprocess
import sys
import time
from typing import Dict, Optional, Sequence

from prompt_jax import errors

_FAKE_DEVICES_ENV = "PROMPT_JAX_PLAN_FAKE_DEVICES"
GIB = 1024 ** 3
# Fake CPU devices plan starts: 4096 fail in XLA's CPU backend ("Multiprocess computations
# aren't implemented"), a million hung with no word.
MAX_FAKE_DEVICES = 2048
_MODEL_EXAMPLES = "models/t5_1_1_base.gin, models/t5_1_1_xxl.gin, models/t5_1_0_large.gin"


def _positive(kind):
  """An argparse type: a `kind` (int, float) greater than 0 (a bad value is one usage line)."""
  def parse(text):
    try:
      value = kind(text)
    except ValueError:
      value = None
    if value is None or not value > 0:
      raise argparse.ArgumentTypeError(f"must be a positive {kind.__name__}, got {text!r}")
    return value
  return parse


def _parser() -> argparse.ArgumentParser:
  from prompt_jax.models.config import REMAT_POLICY_NAMES  # pylint: disable=g-import-not-at-top
  p = errors.OneLineParser(prog="prompt-jax plan", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           hints={"--gin_file": "plan takes the model file as "
                                                "--model=models/<name>.gin (prompt tuning of "
                                                "--prompt_length tokens)"})
  p.add_argument("--model", default="models/t5_1_1_base.gin",
                 help="a models/*.gin file (packaged or a path), e.g. models/t5_1_1_xxl.gin "
                      "(default: %(default)s)")
  p.add_argument("--mesh", default="1x1",
                 help="DATAxMODEL devices, e.g. 8x8 (default: %(default)s)")
  p.add_argument("--batch", type=_positive(int), default=32,
                 help="global batch size (default: %(default)s)")
  p.add_argument("--inputs", type=_positive(int), default=512,
                 help="input length in tokens (default: %(default)s)")
  p.add_argument("--targets", type=_positive(int), default=8,
                 help="target length in tokens (default: %(default)s)")
  p.add_argument("--prompt_length", type=_positive(int), default=100,
                 help="prompt tuning's prompt length (default: %(default)s)")
  p.add_argument("--dtype", default=None,
                 help="activation dtype (default: the --model file's, else bfloat16)")
  p.add_argument("--frozen_dtype", default="auto",
                 help="dtype of the frozen weights (auto: the activation dtype, as FROZEN_DTYPE)")
  p.add_argument("--remat", choices=list(REMAT_POLICY_NAMES), default="none",
                 help="remat policy (T5Config.remat_policy; default: %(default)s)")
  p.add_argument("--optimizer", choices=["adafactor", "adamw"], default="adafactor",
                 help="the optimizer whose state is planned (default: %(default)s)")
  p.add_argument("--budget_gib", type=_positive(float), default=None,
                 help="per-device memory to check against (prints fits / does not fit; "
                      "exit status 1 when it does not fit)")
  return p


def _mesh_shape(text: str):
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    data, model = (int(x) for x in text.lower().split("x"))
    if data < 1 or model < 1:
      raise ValueError
  except ValueError:
    raise ConfigError(f"--mesh={text!r}: give DATAxMODEL device counts, e.g. --mesh=8x8") from None
  return data, model


def _layout(args):
  """(data, model) parallel devices of --mesh, checked against --batch."""
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  data, model = _mesh_shape(args.mesh)
  if args.batch % data:
    raise ConfigError(f"--batch={args.batch} is not divisible by the {data} data-parallel "
                      f"devices")
  return data, model


def _config(args):
  """The T5Config the --model file binds (`prompt_jax.t5_config`), with plan's dtype and remat.
  Relative paths and `include`s find the packaged gin files as `train` does (layering); what
  else the file binds (a run's or a method's configurables) is skipped: plan needs the model."""
  import tokenize  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  from prompt_jax import layering, run_setup  # pylint: disable=g-import-not-at-top
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  where = f"--model={args.model!r}"
  give = f"give a models/*.gin file, e.g. {_MODEL_EXAMPLES}"
  try:
    search_dirs, _, _ = layering.split_files([args.model], search_paths=())
  except ConfigError as e:  # not found: with a 'did you mean' where one is close
    raise ConfigError(f"{where}: {e}" + ("" if "did you mean" in str(e) else f"; {give}")
                      ) from None
  gin.clear_config()
  for d in search_dirs:
    gin.add_config_file_search_path(d)
  layering.quiet_gin_lookups()
  try:
    try:
      gin.parse_config_files_and_bindings([args.model], [], skip_unknown=True,
                                          finalize_config=False)
    except (IOError, OSError) as e:
      raise ConfigError(f"{where} cannot be read ({layering.first_line(e)}); {give}") from e
    except tokenize.TokenError as e:  # gin says only ('EOF in multi-line statement', (N, 0))
      raise ConfigError(f"{where}: gin: a bracket or string opened is never closed") from e
    except (ValueError, KeyError, SyntaxError) as e:
      raise ConfigError(f"{where}: gin: {layering.first_line(e)}") from e
    if not layering.is_bound(layering.BINDS_A_MODEL):
      raise ConfigError(f"{where} binds no model (no {layering.BINDS_A_MODEL}, as a "
                        f"models/*.gin file binds): {give}")
    # A run file (it includes a model) sets what plan takes from its own flags: its values
    # would not be planned, plan's defaults would, under the run's name.
    run_values = [f"{name} (--{flag})" for name, flag in _RUN_MACROS
                  if layering.is_bound(f"%{name}")]
    if run_values:
      raise ConfigError(f"{where} is a run's file: it sets {', '.join(run_values)}, which plan "
                        f"takes from its flags; give the models/*.gin file it includes and "
                        f"those flags")
    if args.dtype is None:  # (embedded_tiny.gin trains in float32: planned in bfloat16)
      bound = layering.is_bound(_DTYPE)
      args.dtype = str(gin.query_parameter(_DTYPE)) if bound else "bfloat16"
    return run_setup.t5_config(dtype=args.dtype, dropout_rate=0.0, remat_policy=args.remat)
  finally:
    gin.clear_config()


_DTYPE = "prompt_jax.t5_config.dtype"
_RUN_MACROS = (("BATCH_SIZE", "batch"), ("TASK_FEATURE_LENGTHS", "inputs, --targets"),
               ("PROMPT_LENGTH", "prompt_length"))


def plan(args) -> Dict[str, float]:
  """Compiles the train step for `args` on the current devices; returns per-device bytes. The
  model is traced with the products as an accelerator runs them (on CPU, bfloat16 products are
  otherwise summed in float32: models/layers.py)."""
  from prompt_jax.models import layers  # pylint: disable=g-import-not-at-top
  with layers.accelerator_products():
    return _plan(args)


def _plan(args) -> Dict[str, float]:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from prompt_jax import partitioning, run_setup  # pylint: disable=g-import-not-at-top
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from prompt_jax.prompts import specs  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import optimizers, state as state_lib  # pylint: disable=g-import-not-at-top

  data, model_parallel = _layout(args)
  if jax.device_count() < data * model_parallel:
    raise ConfigError(f"--mesh={args.mesh} needs {data * model_parallel} devices, "
                      f"{jax.device_count()} found")
  config = _config(args)
  mesh = partitioning.create_mesh(model_parallel, jax.devices()[:data * model_parallel])
  lengths = {"inputs": args.inputs, "targets": args.targets}
  spec = specs.prompt_tuning(length=args.prompt_length)
  # The program `train` compiles: its guarded step for the run's layout, with its shardings.
  try:
    planned = run_setup.layout(config=config, prompt=spec, feature_lengths=lengths,
                               trainable_regex=spec.trainable_regex, mesh=mesh,
                               frozen_dtype=args.frozen_dtype)
  except partitioning.Indivisible as e:  # in plan's flags, not train's NUM_PARTITIONS
    devices = data * model_parallel
    raise ConfigError(f"--mesh={args.mesh} splits {e.detail}; on {devices} devices the largest "
                      f"model axis this model fits is {e.largest} "
                      f"(--mesh={devices // e.largest}x{e.largest})") from None
  trainable, frozen = planned.trainable, planned.frozen
  tx = (optimizers.adafactor() if args.optimizer == "adafactor" else optimizers.adamw()).tx
  state = state_lib.abstract_state(trainable, state_lib.shardings_of(trainable), tx, mesh)
  step = state_lib.jit_guarded_train_step(
      run_setup.step_model(config, spec), tx, state_lib.shardings_of(state),
      state_lib.shardings_of(frozen), mesh)
  batch_shapes = {name: ((args.batch, lengths[length]), jnp.int32)
                  for name, length in (("encoder_input_tokens", "inputs"),
                                       ("decoder_input_tokens", "targets"),
                                       ("decoder_target_tokens", "targets"),
                                       ("decoder_loss_weights", "targets"))}
  start = time.perf_counter()
  with partitioning.axis_rules(mesh):
    compiled = step.lower(*state_lib.abstract_step_args(state, frozen, batch_shapes,
                                                        mesh)).compile()
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  out = {name: float(getattr(memory, f"{name}_size_in_bytes", 0) or 0)
         for name in ("argument", "output", "temp", "alias", "generated_code")}
  out["total"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
  out["compile_seconds"] = seconds
  out["params_trainable"] = float(run_setup.count(trainable))
  out["params_frozen"] = float(run_setup.count(frozen))
  return out


def _size(num_bytes: float) -> str:
  return (f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB / 10
          else f"{num_bytes / 1024 ** 2:.2f} MiB")


def _report(args, result: Dict[str, float]) -> bool:
  """Prints the plan; False when it does not fit --budget_gib."""
  data, model_parallel = _mesh_shape(args.mesh)
  frozen = (f"auto ({args.dtype})" if args.frozen_dtype == "auto"
            else args.frozen_dtype)
  print(f"plan: {args.model}, mesh {data}x{model_parallel} (data x model), batch {args.batch} x "
        f"{args.inputs} inputs (+{args.prompt_length} prompt) x {args.targets} targets, "
        f"{args.dtype} activations, {frozen} frozen weights, remat {args.remat}, "
        f"{args.optimizer}")
  print(f"  parameters: {result['params_frozen']:,.0f} frozen, "
        f"{result['params_trainable']:,.0f} trainable; compiled in "
        f"{result['compile_seconds']:.1f} s")
  print("  per device: " + ", ".join(f"{name} {_size(result[name])}" for name in
                                     ("argument", "output", "temp", "alias")))
  line = (f"  per-device peak (arguments + outputs + temporaries - aliased): "
          f"{_size(result['total'])}")
  fits = True
  if args.budget_gib is not None:
    fits = result["total"] <= args.budget_gib * GIB
    line += f" -> {'fits' if fits else 'does NOT fit'} in {args.budget_gib:g} GiB"
  print(line)
  if os.environ.get(_FAKE_DEVICES_ENV):
    print("  (from the XLA CPU compiler's buffer assignment on fake devices: an estimate)")
  return fits


def main(argv: Optional[Sequence[str]] = None, verbose: bool = False) -> int:
  """`prompt-jax plan` (run by the CLI, whose one error path prints a ConfigError as one line)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  from prompt_jax import xla_defaults  # pylint: disable=g-import-not-at-top
  xla_defaults.apply()  # the memory-minimising CPU scheduler, before jax starts (as the CLI)
  args = _parser().parse_args(argv)
  data, model_parallel = _layout(args)
  _config(args)  # the file binds a model: said here, before any fake devices are started
  needed = data * model_parallel
  if needed > MAX_FAKE_DEVICES and not os.environ.get(_FAKE_DEVICES_ENV):
    from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
    raise ConfigError(f"--mesh={args.mesh} is {needed} devices; plan fakes at most "
                      f"{MAX_FAKE_DEVICES} CPU devices (XLA's CPU backend takes no more): plan "
                      f"a slice of it with the same per-device shapes, e.g. --mesh="
                      f"{max(1, data * MAX_FAKE_DEVICES // needed)}x{model_parallel} and "
                      f"--batch scaled alike")
  if not os.environ.get(_FAKE_DEVICES_ENV):
    import jax  # pylint: disable=g-import-not-at-top
    if jax.device_count() < needed:
      # Fake CPU devices must be set before jax starts: plan again in a fresh process.
      env = dict(os.environ, JAX_PLATFORMS="cpu", **{_FAKE_DEVICES_ENV: str(needed)})
      env["XLA_FLAGS"] = xla_defaults.merge(
          env["XLA_FLAGS"], f"--xla_force_host_platform_device_count={needed}")
      print(f"plan: {jax.device_count()} {jax.default_backend()} device(s) here; planning on "
            f"{needed} fake CPU devices", flush=True)
      # Through the CLI, so the child's imports are as quiet as this process's were.
      child = [sys.executable, "-m", "prompt_jax.cli", "plan", *argv]
      return subprocess.run(child + (["--verbose"] if verbose else []), env=env,
                            check=False).returncode
  return 0 if _report(args, plan(args)) else 1


if __name__ == "__main__":  # as `prompt-jax plan`, through the CLI's one error path
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  sys.exit(cli.main(["plan", *sys.argv[1:]]))
