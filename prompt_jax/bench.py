"""`prompt-jax bench train_step`: our prompt-tuning step against HF torch, in the same run.
(`prompt-jax bench ensemble`: N prompts in one batch, see prompt_jax/bench_ensemble.py.)

The reference is what HF PEFT's prompt tuning does with a T5: a frozen
`T5ForConditionalGeneration` fed `inputs_embeds = [prompt; embed(inputs)]`, gradients only on the
prompt, transformers' Adafactor with Lester et al.'s settings. Each side runs in its own
subprocess, one after the other (so neither competes for cores and each peak RSS is its own),
on identical shapes and random weights. Reported: seconds per step (median of the timed steps,
after warm-up/compilation), peak resident memory, and the ratios ours / reference.

  prompt-jax bench train_step --preset=t5_1_1_small --batch=8 --inputs=512 --targets=8

`--xla_flags=...` runs our side under extra XLA flags; `--flag_sweep` runs it once per entry of
CPU_FLAG_SETS (XLA CPU options worth knowing about) and prints each against the default;
`--record=docs/benchmarks.md` appends what was printed, with the command line, machine and
versions.
"""
import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="prompt-jax bench", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("what", choices=["train_step", "ensemble"], help="what to measure")
  p.add_argument("--preset", default="t5_1_1_small", help="T5 preset (models/config.py)")
  p.add_argument("--num_layers", type=int, default=None, help="override encoder/decoder layers")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--inputs", type=int, default=512, help="input length (tokens)")
  p.add_argument("--targets", type=int, default=8, help="target length (tokens)")
  p.add_argument("--prompt_length", type=int, default=100)
  p.add_argument("--steps", type=int, default=5, help="timed steps (after 2 warm-up steps)")
  p.add_argument("--reference", choices=["torch", "none"], default="torch")
  p.add_argument("--xla_flags", default="", help="extra XLA_FLAGS for our side")
  p.add_argument("--flag_sweep", action="store_true",
                 help="run our side under each of CPU_FLAG_SETS and compare with the default")
  p.add_argument("--record", default=None, metavar="PATH",
                 help="append the results (with command line, machine, versions) to PATH")
  p.add_argument("--side", choices=["ours", "torch"], default=None, help=argparse.SUPPRESS)
  from prompt_jax import bench_ensemble  # pylint: disable=g-import-not-at-top
  bench_ensemble.add_arguments(p)
  return p


# XLA CPU options explored for the float32 step (issue 11); what each did is in
# docs/benchmarks.md. fast math changes float results (reassociation, no NaN/Inf care): reported,
# never a default.
CPU_FLAG_SETS = (
    ("default", ""),
    ("oneDNN", "--xla_cpu_use_onednn=true"),
    ("XNNPACK", "--xla_cpu_use_xnnpack=true"),
    ("no multi-threaded Eigen", "--xla_cpu_multi_thread_eigen=false"),
    ("legacy (non-thunk) runtime", "--xla_cpu_use_thunk_runtime=false"),
    ("fast math", "--xla_cpu_enable_fast_math=true"),
    ("vector width 512", "--xla_cpu_prefer_vector_width=512"),
    # XLA's default; prompt-jax sets the memory-minimising one (prompt_jax/xla_defaults.py).
    ("concurrency-optimised scheduler", "--xla_cpu_enable_concurrency_optimized_scheduler=true"),
)


def _config(args):
  from prompt_jax.models import get_config  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  overrides = dict(dtype=jnp.float32, dropout_rate=0.0)
  if args.num_layers:
    overrides.update(num_encoder_layers=args.num_layers, num_decoder_layers=args.num_layers)
  return get_config(args.preset, **overrides)


def _batch(args, vocab_size: int) -> Dict[str, np.ndarray]:
  """Random tokens; each row ends in EOS and the last quarter of rows is half padding."""
  rng = np.random.RandomState(0)
  enc = rng.randint(2, min(vocab_size, 32000), (args.batch, args.inputs)).astype(np.int32)
  tgt = rng.randint(2, min(vocab_size, 32000), (args.batch, args.targets)).astype(np.int32)
  enc[:, -1] = 1
  tgt[:, -1] = 1
  dec_in = np.concatenate([np.zeros((args.batch, 1), np.int32), tgt[:, :-1]], axis=1)
  return {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in,
          "decoder_target_tokens": tgt, "decoder_loss_weights": (tgt > 0).astype(np.int32)}


def _time(step, n: int) -> List[float]:
  times = []
  for _ in range(n):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
  return times


def _ours(args) -> Dict[str, float]:
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import T5, random_init  # pylint: disable=g-import-not-at-top
  from prompt_jax.prompts import PromptTuning, prompt_factory  # pylint: disable=g-import-not-at-top
  from prompt_jax import trees  # pylint: disable=g-import-not-at-top
  from prompt_jax.prompts import specs  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import optimizers, state as state_lib  # pylint: disable=g-import-not-at-top

  config = _config(args)
  model = T5(config, prompt=prompt_factory(
      functools.partial(PromptTuning, length=args.prompt_length), args.prompt_length))
  batch = _batch(args, config.vocab_size)
  # Filled array by array with keys as arguments: a jitted whole-model init with a constant key
  # is what made T5 1.1 base take minutes to start (models/random_init.py).
  inits = random_init.initialisers(
      model, batch["encoder_input_tokens"][:1], batch["decoder_input_tokens"][:1],
      batch["decoder_target_tokens"][:1], enable_dropout=False)
  params = trees.unflatten(random_init.fill(inits, jax.random.PRNGKey(0)))
  trainable, frozen = trees.split(params, specs.DEFAULT_REGEX)
  tx = optimizers.adafactor().tx
  state = state_lib.TrainState(jax.numpy.int32(0), trainable, tx.init(trainable))
  step_fn = jax.jit(state_lib.make_train_step(model, tx), donate_argnums=(0,))
  rng = jax.random.PRNGKey(1)
  holder = {"state": state}

  def one():
    holder["state"], metrics = step_fn(holder["state"], frozen, batch, rng)
    jax.block_until_ready(metrics["loss"])

  _time(one, 2)  # compile + warm-up
  return {"seconds_per_step": statistics.median(_time(one, args.steps))}


def _torch(args) -> Dict[str, float]:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers.optimization import Adafactor  # pylint: disable=g-import-not-at-top

  c = _config(args)
  hf_config = transformers.T5Config(
      vocab_size=c.vocab_size, d_model=c.emb_dim, d_kv=c.head_dim, d_ff=c.mlp_dim,
      num_layers=c.num_encoder_layers, num_decoder_layers=c.num_decoder_layers,
      num_heads=c.num_heads, feed_forward_proj="gated-gelu" if c.is_gated else "relu",
      dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  model = transformers.T5ForConditionalGeneration(hf_config)
  model.train()
  for p in model.parameters():
    p.requires_grad_(False)
  prompt = torch.nn.Parameter(torch.rand(args.prompt_length, c.emb_dim) * 0.5)
  opt = Adafactor([prompt], lr=0.3, decay_rate=-0.8, scale_parameter=False,
                  relative_step=False, warmup_init=False, weight_decay=1e-5)
  batch = {k: torch.tensor(v, dtype=torch.long) for k, v in _batch(args, c.vocab_size).items()}
  enc = batch["encoder_input_tokens"]
  mask = torch.cat([torch.ones(args.batch, args.prompt_length, dtype=torch.long),
                    (enc > 0).long()], dim=1)
  labels = batch["decoder_target_tokens"].masked_fill(batch["decoder_target_tokens"] == 0, -100)

  def one():
    embedded = model.shared(enc)
    inputs = torch.cat([prompt.unsqueeze(0).expand(args.batch, -1, -1), embedded], dim=1)
    loss = model(inputs_embeds=inputs, attention_mask=mask,
                 decoder_input_ids=batch["decoder_input_tokens"], labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad()

  _time(one, 2)
  return {"seconds_per_step": statistics.median(_time(one, args.steps))}


def _side(args) -> int:
  result = (_ours if args.side == "ours" else _torch)(args)
  result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print("BENCH_RESULT " + json.dumps(result), flush=True)
  return 0


def _run_side(side: str, argv: Sequence[str], xla_flags: str = "") -> Dict[str, float]:
  env = dict(os.environ)
  if xla_flags:
    from prompt_jax import xla_defaults  # pylint: disable=g-import-not-at-top
    env["XLA_FLAGS"] = xla_defaults.merge(env.get("XLA_FLAGS", ""), xla_flags)
  proc = subprocess.run([sys.executable, "-m", "prompt_jax.bench", *argv, f"--side={side}"],
                        capture_output=True, text=True, check=False, env=env)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("BENCH_RESULT ")]
  if proc.returncode or not lines:
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"the {side} side of the benchmark failed: {tail}")
  return json.loads(lines[-1][len("BENCH_RESULT "):])


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = _parser().parse_args(argv)
  if args.side:
    return _side(args)
  if args.what == "ensemble":
    from prompt_jax import bench_ensemble  # pylint: disable=g-import-not-at-top
    print(f"ensemble ({args.mode}): {args.preset}"
          f"{f' ({args.num_layers} layers)' if args.num_layers else ''}, {args.inputs} inputs "
          f"(+{args.prompt_length} prompt), float32", flush=True)
    try:
      return bench_ensemble.run(args, _config(args))
    except ValueError as e:
      print(f"prompt-jax bench: error: {e}", file=sys.stderr)
      return 1
  shape = (f"{args.preset}{f' ({args.num_layers} layers)' if args.num_layers else ''}, batch "
           f"{args.batch} x {args.inputs} inputs (+{args.prompt_length} prompt) x "
           f"{args.targets} targets, float32")
  lines = []

  def say(line: str) -> None:
    lines.append(line)
    print(line, flush=True)

  say(f"train_step: {shape}")
  side_argv = argv  # a side ignores --record/--flag_sweep; --xla_flags reach it as XLA_FLAGS
  try:
    ours = _run_side("ours", side_argv, args.xla_flags)
    say(f"  prompt_jax (jit){f' [{args.xla_flags}]' if args.xla_flags else ''}:   "
        f"{ours['seconds_per_step']:.3f} s/step, peak RSS {ours['peak_rss_mb']:.0f} MB")
    ref = None
    if args.reference == "torch":
      ref = _run_side("torch", side_argv)
      say(f"  HF torch (PEFT-style prompt tuning): {ref['seconds_per_step']:.3f} s/step, "
          f"peak RSS {ref['peak_rss_mb']:.0f} MB")
      say(f"  ratio ours/reference: time {ours['seconds_per_step'] / ref['seconds_per_step']:.2f}"
          f", memory {ours['peak_rss_mb'] / ref['peak_rss_mb']:.2f}")
  except RuntimeError as e:
    print(f"prompt-jax bench: error: {e}", file=sys.stderr)
    return 1
  if args.flag_sweep:
    say("  XLA flag sweep (our side; speed = default time / this time"
        f"{', torch = torch time / this time' if ref else ''}):")
    for name, flags in CPU_FLAG_SETS[1:]:
      try:
        r = _run_side("ours", side_argv, f"{args.xla_flags} {flags}".strip())
      except RuntimeError as e:
        say(f"    {name:28s} {flags}: not run ({str(e).split(': ', 1)[-1][:120]})")
        continue
      vs_torch = (f", torch {ref['seconds_per_step'] / r['seconds_per_step']:.2f}x"
                  if ref else "")
      say(f"    {name:28s} {flags}: {r['seconds_per_step']:.3f} s/step, speed "
          f"{ours['seconds_per_step'] / r['seconds_per_step']:.2f}x{vs_torch}, "
          f"peak RSS {r['peak_rss_mb']:.0f} MB")
  if args.record:
    _record(args.record, argv, lines)
    print(f"recorded in {args.record}")
  return 0


def _record(path: str, argv: Sequence[str], lines: Sequence[str]) -> None:
  """Appends the run to a markdown file: command line, machine, versions, then the output."""
  import jax  # pylint: disable=g-import-not-at-top
  versions = [f"jax {jax.__version__}"]
  for name in ("flax", "torch", "transformers"):
    try:
      versions.append(f"{name} {__import__(name).__version__}")
    except ImportError:
      pass
  machine = (f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}, "
             f"{jax.devices()[0].platform}; {', '.join(versions)}")
  when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  block = ["", f"### `prompt-jax bench {' '.join(argv)}`", "",
           f"{when}; {machine}", "", "```", *lines, "```", ""]
  with open(path, "a") as f:
    f.write("\n".join(block))


if __name__ == "__main__":
  sys.exit(main())
