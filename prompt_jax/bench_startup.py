"""`prompt-jax bench startup`: the wait before training, from a checkpoint, cold and restarted.

What `prompt-jax train` does before its first step, without the data pipeline (the accelerator
image has no TensorFlow): restore the frozen backbone from a t5x checkpoint (`run_setup.prepare`,
sharded, never a whole-model init), initialise the prompt (Lester et al.'s sampled-vocabulary
init), build the optimizer state and the train loop's guarded step
(`train.state.initial_state` / `jit_guarded_train_step`: the program `train` compiles), and run
one step on a synthetic batch of the given shape. Each start is a fresh process, timed by
`train.startup.StartupTimer` from the moment `prompt_jax` is imported, as `train` logs it.

  first start  an empty persistent compilation cache (prompt_jax/compile_cache.py) and an empty
               MODEL_DIR: the prompt is initialised; after its timed steps (not timed) it saves
               a checkpoint of its state to MODEL_DIR as `train` does, and runs one more step
  restart      the same cache and MODEL_DIR: what a restarted (e.g. preempted) run waits. As
               `train`, it restores the state from MODEL_DIR and does not initialise the prompt
               (run_setup.prepare(init_trainable=False)); its first step must give the loss of
               the first start's step after the checkpoint.

Without `--checkpoint` a checkpoint of random weights of the preset's shapes is written first
(t5x's orbax layout, float32 as t5x saves; not timed as part of either start) and removed at the
end. Issue 11's goals on a GPU, T5 1.1 XL: first start <= 60 s, restart <= 15 s.

  prompt-jax bench startup --preset=t5_1_1_xl --batch=16 --inputs=512 --targets=8 \\
      --dtype=bfloat16
"""
import argparse
import os
import shutil
import tempfile
import time
from typing import Callable, Dict, Sequence


def add_arguments(p) -> None:
  p.add_argument("--checkpoint", default=None,
                 help="startup: a T5 checkpoint of --preset's shapes (any format `train` reads); "
                      "default: random weights written to a temporary folder")
  p.add_argument("--cache_min_compile_secs", type=float, default=None,
                 help="startup: cache only programs that took this long to compile (default: "
                      "what `train` uses, jax's 1 s)")
  p.add_argument("--compilation_cache", default=None, help=argparse.SUPPRESS)
  p.add_argument("--startup_model_dir", default=None, help=argparse.SUPPRESS)
  p.add_argument("--startup_phase", choices=["write", "start"], default="start",
                 help=argparse.SUPPRESS)


def _lengths(args) -> Dict[str, int]:
  return {"inputs": args.inputs, "targets": args.targets}


def write_random_checkpoint(args, config) -> Dict[str, float]:
  """Side: random backbone weights of `config`, drawn array by array on the default device
  (models/random_init.py), saved as t5x's orbax `checkpoint_0` under args.checkpoint."""
  import jax  # pylint: disable=g-import-not-at-top
  from prompt_jax import checkpoints, run_setup, trees  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import random_init  # pylint: disable=g-import-not-at-top
  started = time.perf_counter()
  model = run_setup.build_model(config, None)
  inits = random_init.initialisers(model, *run_setup.model_inputs(1, _lengths(args)),
                                   enable_dropout=False)
  params = random_init.fill(inits, jax.random.PRNGKey(0))
  checkpoints.save(args.checkpoint, trees.unflatten(params), step=0, format="orbax")
  return {"write_seconds": time.perf_counter() - started,
          "parameters": float(sum(v.size for v in params.values()))}


def start(args, config, batch) -> Dict[str, float]:
  """Side: one start as `train` makes it, to the end of its first step (see the module doc)."""
  import jax  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from prompt_jax import compile_cache, partitioning, run_setup
  from prompt_jax.prompts import initializers, specs
  from prompt_jax.train import checkpointing, guards, optimizers, startup, state as state_lib
  # pylint: enable=g-import-not-at-top
  timer = startup.StartupTimer()  # from prompt_jax's import, as `train` counts
  import prompt_jax  # pylint: disable=g-import-not-at-top
  imports_seconds = time.monotonic() - prompt_jax.STARTED  # the clock StartupTimer reads
  backend_started = time.perf_counter()
  jax.devices()  # the backend's start: on a GPU, CUDA and its libraries
  backend_seconds = time.perf_counter() - backend_started
  # The bench's own cache (empty at the first start): a user's JAX_COMPILATION_CACHE_DIR, which
  # `train` would honour, must not warm the first start.
  jax.config.update("jax_compilation_cache_dir", None)
  compile_cache.enable(args.compilation_cache, min_compile_secs=args.cache_min_compile_secs)
  mesh = partitioning.create_mesh(1)
  spec = specs.prompt_tuning(length=args.prompt_length,
                             init=initializers.from_sampled_vocab())
  tx = optimizers.adafactor().tx
  # As `train`: the step is compiled on a background thread while the checkpoint is read.
  planned = run_setup.layout(config=config, prompt=spec, feature_lengths=_lengths(args),
                             trainable_regex=spec.trainable_regex, mesh=mesh)
  run_setup.check_sources(config, None, args.checkpoint)  # fails before compiling
  step, ahead = state_lib.step_compiled_ahead(
      run_setup.step_model(config, spec), tx, planned.trainable, planned.frozen, mesh,
      {k: (v.shape, v.dtype) for k, v in batch.items()})
  restore_started = time.perf_counter()
  resuming = bool(checkpointing.steps(args.startup_model_dir))
  run = run_setup.prepare(config=config, prompt=spec, feature_lengths=_lengths(args),
                          initial_checkpoint_path=args.checkpoint,
                          trainable_regex=spec.trainable_regex, mesh=mesh, planned=planned,
                          init_trainable=not resuming)
  # As `train` (train/loop.py): the state from MODEL_DIR's newest checkpoint, else a fresh one.
  mngr = checkpointing.manager(args.startup_model_dir, period=1, keep=None)
  run, state, _ = checkpointing.resume_or_initialise(mngr, args.startup_model_dir, run, tx, mesh)
  jax.block_until_ready((state, run.frozen))
  restore_seconds = time.perf_counter() - restore_started
  ahead.wait()
  replicated = partitioning.replicated(mesh)
  device_batch = jax.device_put(batch, partitioning.data_sharding(mesh))
  rng = jax.device_put(jax.random.PRNGKey(1), replicated)
  first_bad = guards.initial_flag(replicated)
  with partitioning.axis_rules(mesh):
    state, metrics, first_bad = step(state, run.frozen, device_batch, rng, first_bad)
  jax.block_until_ready(metrics)
  timer.first_step_done()
  first_loss = float(metrics["loss"])
  step_started = time.perf_counter()
  with partitioning.axis_rules(mesh):
    state, metrics, first_bad = step(state, run.frozen, device_batch, rng, first_bad)
  jax.block_until_ready(metrics)
  step_seconds = time.perf_counter() - step_started
  next_loss = None
  if not resuming:  # the first start leaves a checkpoint for the restart, then one more step
    checkpointing.save(mngr, int(jax.device_get(state.step)), state, data_position=0,
                       force=True)
    with partitioning.axis_rules(mesh):
      state, metrics, first_bad = step(state, run.frozen, device_batch, rng, first_bad)
    next_loss = float(metrics["loss"])
  mngr.close()
  return {"seconds_to_first_step": timer.seconds_to_first_step,
          "imports_seconds": imports_seconds, "backend_seconds": backend_seconds,
          "restore_seconds": restore_seconds, "compile_seconds": timer.compile_seconds,
          "cache_hits": float(timer.cache_hits), "cache_writes": float(timer.cache_writes),
          "step_seconds": step_seconds, "resumed": float(resuming),
          "first_loss": first_loss, "next_loss": next_loss}


def run(args, argv: Sequence[str], say: Callable[[str], None],
        run_side: Callable[[Sequence[str]], Dict[str, float]]) -> None:
  """The parent: writes the checkpoint if none is given, then a first start and a restart, each
  in its own process; `run_side(extra_argv)` runs our side with argv + extra_argv."""
  shape = (f"{args.preset}{f' ({args.num_layers} layers)' if args.num_layers else ''}, batch "
           f"{args.batch} x {args.inputs} inputs (+{args.prompt_length} prompt) x "
           f"{args.targets} targets, {args.dtype}")
  scratch = tempfile.mkdtemp(prefix="prompt_jax_bench_startup_")
  try:
    checkpoint = args.checkpoint
    if checkpoint:
      say(f"startup: {shape}, from {checkpoint}")
    else:
      checkpoint = os.path.join(scratch, "checkpoint")
      written = run_side([f"--checkpoint={checkpoint}", "--startup_phase=write"])
      say(f"startup: {shape}, from a t5x orbax checkpoint of random weights "
          f"({written['parameters'] / 1e6:.0f}M parameters, written in "
          f"{written['write_seconds']:.1f} s, not counted)")
    extra = [f"--checkpoint={checkpoint}",
             f"--compilation_cache={os.path.join(scratch, 'compilation_cache')}",
             f"--startup_model_dir={os.path.join(scratch, 'model_dir')}"]
    first = run_side(extra)
    say(f"  first start (empty compilation cache, prompt initialised): {_line(first)}")
    again = run_side(extra)
    say(f"  restart (the same cache, state resumed from MODEL_DIR):   {_line(again)}")
    ratio = again["seconds_to_first_step"] / first["seconds_to_first_step"]
    same = ("equal" if again["resumed"] and again["first_loss"] == first["next_loss"]
            else "DIFFERENT")
    say(f"  ratio restart/first start: {ratio:.2f}; a step once started: "
        f"{first['step_seconds']:.3f} s; the loss after the checkpoint, first start vs "
        f"restart: {same} ({first['next_loss']!r}, {again['first_loss']!r})")
    say("  goals (issue 11, a GPU, T5 1.1 XL): first start <= 60 s, restart <= 15 s")
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def _line(side: Dict[str, float]) -> str:
  return (f"first step {side['seconds_to_first_step']:.1f} s after start (imports "
          f"{side['imports_seconds']:.1f} s, backend start {side['backend_seconds']:.1f} s, "
          f"{'restore and state resume' if side['resumed'] else 'restore and prompt init'} "
          f"{side['restore_seconds']:.1f} s, compiling or loading XLA programs "
          f"{side['compile_seconds']:.1f} s; cache {side['cache_hits']:.0f} loaded, "
          f"{side['cache_writes']:.0f} written)")
