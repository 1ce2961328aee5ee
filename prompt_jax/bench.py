"""`prompt-jax bench train_step`: our prompt-tuning step against HF torch / PEFT, in the same run.
(`bench epoch` / `bench eval`: real RTE against HF PEFT, see prompt_jax/bench_rte.py;
`bench ensemble`: N prompts in one batch, see prompt_jax/bench_ensemble.py; `bench startup`:
the wait before the first step, cold and restarted, see prompt_jax/bench_startup.py; `bench
attention`: the fused attention kernels against the einsum path, see prompt_jax/bench_attention.py.)

The reference (`--reference`) is HF PEFT's prompt tuning of a T5: 'torch' writes it out (a
frozen `T5ForConditionalGeneration` fed `inputs_embeds = [prompt; embed(inputs)]`, gradients
only on the prompt), 'peft' runs the `peft` library itself (`get_peft_model` with
PromptTuningConfig); both with transformers' Adafactor at Lester et al.'s settings. Each side
runs in its own subprocess, one after the other (so neither competes for cores and each peak RSS
is its own), on identical shapes and random weights. Reported: seconds per step (median of the
timed steps, after warm-up/compilation), peak resident memory, and the ratios ours / reference.
While a side runs, its progress (steps done, rate, ETA; `side_meter`) is shown on stderr, at
most every 10 s; it is not part of what `--record` appends.

  prompt-jax bench train_step --preset=t5_1_1_small --batch=8 --inputs=512 --targets=8 \
      [--reference=peft]

`--dtype=bfloat16` (train_step, epoch, eval) runs both sides' activations and frozen weights in
bfloat16 (torch: the whole model in bfloat16); the prompt and its optimizer state stay float32.
`--remat=POLICY` (train_step, epoch) runs our side with a remat policy (T5Config.remat_policy);
MFU then counts the FLOPs of the step without remat, since recomputation is not useful work.

Our side runs under the malloc `prompt-jax` runs under (the system's, or jemalloc with
PROMPT_JAX_MALLOC=jemalloc: prompt_jax/host_malloc.py), the reference under the system malloc,
as its users run it; the output says which. Under jemalloc, train_step also times the reference
under it; `--flag_sweep` also times our side under the other allocator.

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
import re
import resource
import shlex
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from prompt_jax import bench_profile, console, errors, host_malloc


def _parser() -> argparse.ArgumentParser:
  p = errors.OneLineParser(prog="prompt-jax bench", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("what",
                 choices=["train_step", "epoch", "eval", "ensemble", "startup", "attention"],
                 help="what to measure")
  p.add_argument("--preset", default="t5_1_1_small", help="T5 preset (models/config.py)")
  p.add_argument("--num_layers", type=int, default=None, help="override encoder/decoder layers")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--inputs", type=int, default=512, help="input length (tokens)")
  p.add_argument("--targets", type=int, default=8, help="target length (tokens)")
  p.add_argument("--prompt_length", type=int, default=100)
  p.add_argument("--steps", type=int, default=5, help="timed steps (after 2 warm-up steps)")
  p.add_argument("--reference", choices=["torch", "peft", "none"], default=None,
                 help="train_step: 'torch' (PEFT's prompt tuning written out on transformers' "
                      "T5, the default) or 'peft' (the peft library); epoch/eval: 'peft' "
                      "(default) or 'none'")
  p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                 help="train_step/epoch/eval: activations and frozen weights of both sides "
                      "(torch: the whole model); the prompt and its optimizer state stay float32")
  from prompt_jax.models.config import REMAT_POLICY_NAMES  # pylint: disable=g-import-not-at-top
  p.add_argument("--remat", choices=list(REMAT_POLICY_NAMES), default="none",
                 help="train_step/epoch: our side's remat policy (T5Config.remat_policy): what "
                      "the backward pass recomputes instead of keeping; the reference keeps all")
  from prompt_jax.models.layers import ATTENTION_IMPLEMENTATIONS  # pylint: disable=g-import-not-at-top
  p.add_argument("--attention", choices=list(ATTENTION_IMPLEMENTATIONS), default="auto",
                 help="train_step/epoch: our side's attention kernel "
                      "(T5Config.attention_implementation)")
  p.add_argument("--padding_as_lengths", choices=["true", "false"], default="true",
                 help="train_step/epoch: T5Config.padding_as_lengths of our side (false: "
                      "jax.nn's kernels get the [batch, heads, T, T] bias, to compare the forms)")
  p.add_argument("--xla_flags", default="", help="extra XLA_FLAGS for our side")
  p.add_argument("--profile", default=None, metavar="DIR",
                 help="train_step: a jax.profiler trace of two of our steps (after the timed "
                      "ones) in DIR; `python -m prompt_jax.bench_profile DIR` sums its kernels")
  p.add_argument("--flag_sweep", action="store_true",
                 help="run our side under each of CPU_FLAG_SETS and compare with the default")
  p.add_argument("--record", default=None, metavar="PATH",
                 help="append the results (with command line, machine, versions) to PATH")
  p.add_argument("--side", choices=["ours", "torch", "peft"], default=None,
                 help=argparse.SUPPRESS)
  # pylint: disable-next=g-import-not-at-top
  from prompt_jax import bench_ensemble, bench_rte, bench_startup
  bench_ensemble.add_arguments(p)
  bench_rte.add_arguments(p)
  bench_startup.add_arguments(p)
  return p


# XLA CPU options explored for the float32 step (issue 11); what each did is in
# docs/benchmarks.md. fast math changes float results (reassociation, no NaN/Inf care): reported,
# never a default.
CPU_FLAG_SETS = (
    ("default", ""),
    ("oneDNN", "--xla_cpu_use_onednn=true"),
    ("XNNPACK", "--xla_cpu_use_xnnpack=true"),
    # XLA CPU (jaxlib 0.10) hands dots and the ops fused around them to YNNPACK; empty = Eigen.
    ("YNNPACK fusions off", "--xla_cpu_experimental_ynn_fusion_type="),
    ("YNNPACK for lone dots only", "--xla_cpu_experimental_ynn_fusion_type=individual_dot"),
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
  overrides = dict(dtype=getattr(jnp, args.dtype), dropout_rate=0.0, remat_policy=args.remat,
                   attention_implementation=args.attention,
                   padding_as_lengths=args.padding_as_lengths == "true")
  if args.num_layers:
    overrides.update(num_encoder_layers=args.num_layers, num_decoder_layers=args.num_layers)
  return get_config(args.preset, **overrides)


def _batch(args, vocab_size: int) -> Dict[str, np.ndarray]:
  """Random tokens, each row ending in EOS; no padding (every position is real)."""
  rng = np.random.RandomState(0)
  enc = rng.randint(2, min(vocab_size, 32000), (args.batch, args.inputs)).astype(np.int32)
  tgt = rng.randint(2, min(vocab_size, 32000), (args.batch, args.targets)).astype(np.int32)
  enc[:, -1] = 1
  tgt[:, -1] = 1
  dec_in = np.concatenate([np.zeros((args.batch, 1), np.int32), tgt[:, :-1]], axis=1)
  return {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in,
          "decoder_target_tokens": tgt, "decoder_loss_weights": (tgt > 0).astype(np.int32)}


RESULT = "BENCH_RESULT "  # a side's stdout line: its figures, as JSON
PROGRESS = "BENCH_PROGRESS "  # a side's stdout line: a progress line for the bench's stderr


def side_meter(label: str, total: int, unit: str = "steps",
               period_s: float = 10.0) -> console.Meter:
  """In a side's process: progress of `total` units of long work, at most every `period_s`
  seconds, to the bench's own process, which shows it while the side runs (`_run_side`)."""
  return console.Meter(label, total, unit, period_s,
                       emit=lambda text: print(PROGRESS + text, flush=True))


def _time(step, n: int, label: str = "timed steps") -> List[float]:
  times = []
  meter = side_meter(label, n)
  for i in range(n):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
    meter.update(i + 1)
  return times


def _our_params(model, batch):
  """Random parameters of `model`, filled array by array with keys as arguments: a jitted
  whole-model init with a constant key is what made T5 1.1 base take minutes to start
  (models/random_init.py)."""
  import jax  # pylint: disable=g-import-not-at-top
  from prompt_jax import trees  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import random_init  # pylint: disable=g-import-not-at-top
  inits = random_init.initialisers(
      model, batch["encoder_input_tokens"][:1], batch["decoder_input_tokens"][:1],
      batch["decoder_target_tokens"][:1], enable_dropout=False)
  return trees.unflatten(random_init.fill(inits, jax.random.PRNGKey(0)))


def _our_model(args, config):
  import functools  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import T5  # pylint: disable=g-import-not-at-top
  from prompt_jax.prompts import PromptTuning, prompt_factory  # pylint: disable=g-import-not-at-top
  return T5(config, prompt=prompt_factory(
      functools.partial(PromptTuning, length=args.prompt_length), args.prompt_length))


def _our_train_setup(args, batch):
  """(step(state, batch) -> (state, metrics), {"state": state, "hlo": hlo(state, batch),
  "compile": compile(state, batch)}): our jitted prompt-tuning step (Adafactor as Lester et al.)
  on random frozen weights, the text of its compiled program, and the step compiled ahead for the
  shapes of (state, batch) (what jit would compile at its first call); `batch` gives the shapes
  to init."""
  import jax  # pylint: disable=g-import-not-at-top
  step_fn, state, frozen = _our_step(args, batch)
  rng = jax.random.PRNGKey(1)
  # The program jit builds for the shapes of (st, b), compiled ahead: both uses below.
  compiled = lambda st, b: step_fn.lower(st, frozen, b, rng).compile()

  def compile_for(st, b):
    program = compiled(st, b)
    return lambda st, b: program(st, frozen, b, rng)

  return (lambda st, b: step_fn(st, frozen, b, rng)), {
      "state": state, "hlo": lambda st, b: compiled(st, b).as_text(), "compile": compile_for}


def _our_step(args, batch, abstract: bool = False, **config_changes):
  """(jitted step, train state, frozen weights) of our prompt-tuning step; with `abstract` the
  state and weights are shapes only (jax.eval_shape): nothing is allocated. `config_changes`
  replace T5Config fields of `args`' config."""
  import jax  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import optimizers, state as state_lib  # pylint: disable=g-import-not-at-top
  model = _our_model(args, _config(args).replace(**config_changes))
  tx = optimizers.adafactor().tx

  def state_and_frozen():
    trainable, frozen = _split(args, _our_params(model, batch))
    return state_lib.TrainState(jax.numpy.int32(0), trainable, tx.init(trainable)), frozen

  state, frozen = jax.eval_shape(state_and_frozen) if abstract else state_and_frozen()
  return jax.jit(state_lib.make_train_step(model, tx), donate_argnums=(0,)), state, frozen


def matmul_flops(jaxpr) -> float:
  """FLOPs of the matrix products in a (closed) jaxpr: 2 x output size x contracted size per
  dot_general, through nested jaxprs (jit, remat, custom_vjp/jvp; a scan's body times its
  length; a cond's costliest branch). The MFU numerator, as PaLM counts it: the traced program,
  so the same on every backend. XLA's cost analysis is not: on a GPU the compiled matmuls are
  cuBLAS custom calls it does not count (an H100 run read 0.15 of base's 9.3 TFLOP a step), and
  the GPU's cost analysis of the lowered program read 0."""
  import math  # pylint: disable=g-import-not-at-top
  import jax.extend.core as jex  # pylint: disable=g-import-not-at-top

  def inner(value):
    if isinstance(value, jex.ClosedJaxpr):
      return [value.jaxpr]
    if isinstance(value, jex.Jaxpr):
      return [value]
    return []

  def count(j) -> float:
    total = 0.0
    for eqn in j.eqns:
      if eqn.primitive.name == "dot_general":
        (contracting, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        total += (2.0 * math.prod(eqn.outvars[0].aval.shape)
                  * math.prod(lhs[d] for d in contracting))
        continue
      if eqn.primitive.name == "cond":
        total += max(count(b.jaxpr) for b in eqn.params["branches"])
        continue
      subs = []  # jaxprs in the parameters, alone or in tuples (a while's cond and body)
      for value in eqn.params.values():
        for item in (value if isinstance(value, (tuple, list)) else (value,)):
          subs += inner(item)
      times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
      total += times * sum(count(sub) for sub in subs)
    return total

  return count(jaxpr.jaxpr if isinstance(jaxpr, jex.ClosedJaxpr) else jaxpr)


def _step_flops(args, batch, remat: str) -> float:
  """Matmul FLOPs (`matmul_flops`) of our step under `remat`, traced from abstract shapes
  (nothing allocated or compiled) with the einsum attention path, whose matmuls a fused kernel
  does too: the count does not depend on the kernel the device picks."""
  import jax  # pylint: disable=g-import-not-at-top
  step_fn, state, frozen = _our_step(argparse.Namespace(**dict(vars(args), remat=remat)), batch,
                                     abstract=True, attention_implementation="einsum")
  return matmul_flops(jax.make_jaxpr(step_fn)(state, frozen, batch, jax.random.PRNGKey(1)))


def _split(args, params):
  """(trainable, frozen) of `params`: the prompt in float32, frozen weights as `prompt-jax
  train` holds them (`run_setup.frozen_dtypes` 'auto'): in --dtype, except those the model uses
  in float32 (T5 1.1's output projection), which a step would otherwise cast every time."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from prompt_jax import run_setup, trees  # pylint: disable=g-import-not-at-top
  from prompt_jax.prompts import specs  # pylint: disable=g-import-not-at-top
  trainable, frozen = trees.split(params, specs.DEFAULT_REGEX)
  dtype, exceptions = run_setup.frozen_dtypes(run_setup.AUTO, _config(args))
  cast = {}
  for path, x in trees.flatten(frozen).items():  # one array at a time, its original freed, so
    want = exceptions.get(path, dtype)           # the peak is the step's, not f32 + bf16 copies
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != want:
      cast[path] = x.astype(want)
      if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):  # not under eval_shape
        x.delete()
    else:
      cast[path] = x
  return trainable, trees.unflatten(cast)


def _matmul_peak_flops(dtype_name: str) -> float:
  """FLOP/s of one large matmul on the default device, measured here (the MFU denominator):
  bfloat16 8192^3 on accelerators (the issue's 864 TFLOP/s on an H100), 1024^3 in the step's
  dtype on CPU, as the step's layers compute it (bfloat16: summed in float32, layers.py)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import layers  # pylint: disable=g-import-not-at-top
  on_cpu = jax.default_backend() == "cpu"
  n, dtype = (1024, getattr(jnp, dtype_name)) if on_cpu else (8192, jnp.bfloat16)
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  if layers.sums_bfloat16_in_float32(dtype):  # the step's products: bfloat16 summed in float32
    matmul = jax.jit(lambda x, y: layers.float32_summed_einsum("ik,kj->ij", x, y))
  else:
    matmul = jax.jit(lambda x, y: x @ y)
  reps = 10

  def burst():  # dispatched back to back, one wait: a wait per product undercounts the rate
    out = None
    for _ in range(reps):
      out = matmul(a, a)
    jax.block_until_ready(out)

  burst()  # compile and warm up
  return 2.0 * n ** 3 * reps / statistics.median(_time(burst, 3, "matmul peak bursts"))


def _ours(args) -> Dict[str, float]:
  import jax  # pylint: disable=g-import-not-at-top
  batch = _batch(args, _config(args).vocab_size)
  # Useful work (no recomputation) and what the remat program runs, before anything is allocated.
  useful = _step_flops(args, batch, "none")
  run = _step_flops(args, batch, args.remat) if args.remat != "none" else useful
  step, holder = _our_train_setup(args, batch)

  def one():
    holder["state"], metrics = step(holder["state"], batch)
    jax.block_until_ready(metrics["loss"])

  _time(one, 2, "warm-up steps (compiling)")
  seconds = statistics.median(_time(one, args.steps))
  if args.profile:  # after the timing, which the tracing would slow
    with jax.profiler.trace(args.profile):
      _time(one, 2)
    # The compiled program, whose instruction names the trace's kernels carry (bench_profile).
    with open(os.path.join(args.profile, bench_profile.HLO_FILE), "w") as f:
      f.write(holder["hlo"](holder["state"], batch))
  return {"seconds_per_step": seconds,
          "flops_per_step": useful,
          "flops_run": run,
          "matmul_peak_flops": _matmul_peak_flops(args.dtype),
          "attention": attention_form(_config(args))}


def attention_form(config) -> str:
  """The encoder self-attention's kernel under `config` on this backend (no dropout), and
  whether it gets the padding as sequence lengths (`layers.PaddedBias`)."""
  import jax  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import layers  # pylint: disable=g-import-not-at-top
  probe = jax.ShapeDtypeStruct((1, 1, 1, config.head_dim), config.dtype)
  kernel = layers.attention_implementation(config.attention_implementation, probe, probe,
                                           config.dtype, False, config.remat_policy == "attention")
  if kernel not in ("xla", "cudnn"):  # the kernels that take lengths (takes_sequence_lengths)
    return kernel
  form = "lengths" if config.padding_as_lengths else "a [batch, heads, T, T] bias"
  return f"{kernel}, padding as {form}"


def _startup_ours(args) -> Dict[str, float]:
  from prompt_jax import bench_startup  # pylint: disable=g-import-not-at-top
  config = _config(args)
  if args.startup_phase == "write":
    return bench_startup.write_random_checkpoint(args, config)
  return bench_startup.start(args, config, _batch(args, config.vocab_size))


def _attention_ours(args) -> Dict[str, float]:
  from prompt_jax import bench_attention  # pylint: disable=g-import-not-at-top
  return bench_attention.measure(args, _config(args))


def _hf_model(args):
  """transformers' T5 with random weights of the preset's shapes, frozen, in --dtype."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  c = _config(args)
  hf_config = transformers.T5Config(
      vocab_size=c.vocab_size, d_model=c.emb_dim, d_kv=c.head_dim, d_ff=c.mlp_dim,
      num_layers=c.num_encoder_layers, num_decoder_layers=c.num_decoder_layers,
      num_heads=c.num_heads, feed_forward_proj="gated-gelu" if c.is_gated else "relu",
      dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
      tie_word_embeddings=c.logits_via_embedding)  # T5 1.1: unscaled
  model = transformers.T5ForConditionalGeneration(hf_config)
  if not c.logits_via_embedding and model.lm_head.weight is model.shared.weight:
    # transformers >= 5 ties T5 1.1's projection to the embedding; the model has its own.
    model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
  model = model.to(torch_device(), dtype=getattr(torch, args.dtype))
  for p in model.parameters():
    p.requires_grad_(False)
  return model


def torch_device() -> str:
  """Where the torch reference runs: the GPU when there is one (as ours does), else the CPU."""
  import torch  # pylint: disable=g-import-not-at-top
  return "cuda" if torch.cuda.is_available() else "cpu"


def torch_sync() -> None:
  import torch  # pylint: disable=g-import-not-at-top
  if torch.cuda.is_available():
    torch.cuda.synchronize()


def _adafactor(params):
  from transformers.optimization import Adafactor  # pylint: disable=g-import-not-at-top
  return Adafactor(params, lr=0.3, decay_rate=-0.8, scale_parameter=False,
                   relative_step=False, warmup_init=False, weight_decay=1e-5)


def _peft_model(args):
  """(HF PEFT prompt tuning on `_hf_model`, its Adafactor): `peft.get_peft_model` with
  PromptTuningConfig (random init, one transformer submodule: the encoder input)."""
  import peft  # pylint: disable=g-import-not-at-top
  model = peft.get_peft_model(_hf_model(args), peft.PromptTuningConfig(
      task_type="SEQ_2_SEQ_LM", num_virtual_tokens=args.prompt_length,
      num_transformer_submodules=1))
  model.train()
  return model, _adafactor([p for p in model.parameters() if p.requires_grad])


def _torch_batch(args):
  """(the bench batch as torch tensors, labels with padding as -100)."""
  import torch  # pylint: disable=g-import-not-at-top
  batch = {k: torch.tensor(v, dtype=torch.long, device=torch_device())
           for k, v in _batch(args, _config(args).vocab_size).items()}
  targets = batch["decoder_target_tokens"]
  return batch, targets.masked_fill(targets == 0, -100)


def _timed_torch_steps(args, loss_fn, opt) -> Dict[str, float]:
  def one():
    loss_fn().backward()
    opt.step()
    opt.zero_grad()
    torch_sync()

  _time(one, 2, "warm-up steps")
  return {"seconds_per_step": statistics.median(_time(one, args.steps))}


def _peft(args) -> Dict[str, float]:
  """The real `peft` library's prompt-tuning step on the same batch."""
  model, opt = _peft_model(args)
  batch, labels = _torch_batch(args)
  enc = batch["encoder_input_tokens"]
  return _timed_torch_steps(args, lambda: model(
      input_ids=enc, attention_mask=(enc > 0).long(),
      decoder_input_ids=batch["decoder_input_tokens"], labels=labels).loss, opt)


def _torch(args) -> Dict[str, float]:
  """PEFT's prompt tuning written out on transformers' T5 (no `peft` import needed)."""
  import torch  # pylint: disable=g-import-not-at-top
  model = _hf_model(args)
  model.train()
  prompt = torch.nn.Parameter(
      torch.rand(args.prompt_length, _config(args).emb_dim, device=torch_device()) * 0.5)
  opt = _adafactor([prompt])
  batch, labels = _torch_batch(args)
  enc = batch["encoder_input_tokens"]
  mask = torch.cat([torch.ones(args.batch, args.prompt_length, dtype=torch.long,
                               device=enc.device), (enc > 0).long()], dim=1)

  def loss():
    embedded = model.shared(enc)
    inputs = torch.cat([prompt.to(embedded.dtype).unsqueeze(0).expand(args.batch, -1, -1),
                        embedded], dim=1)
    return model(inputs_embeds=inputs, attention_mask=mask,
                 decoder_input_ids=batch["decoder_input_tokens"], labels=labels).loss

  return _timed_torch_steps(args, loss, opt)


def _epoch_ours(args) -> Dict[str, float]:
  from prompt_jax import bench_rte  # pylint: disable=g-import-not-at-top
  return bench_rte.epoch_ours(args, lambda batch: _our_train_setup(args, batch))


def _epoch_peft(args) -> Dict[str, float]:
  from prompt_jax import bench_rte  # pylint: disable=g-import-not-at-top
  return bench_rte.epoch_peft(args, lambda: _peft_model(args))


def _eval_ours(args) -> Dict[str, float]:
  import types  # pylint: disable=g-import-not-at-top
  from prompt_jax import partitioning  # pylint: disable=g-import-not-at-top
  from prompt_jax import bench_rte  # pylint: disable=g-import-not-at-top
  config = _config(args)
  model = _our_model(args, config)
  params = _our_params(model, _batch(args, config.vocab_size))
  trainable, frozen = _split(args, params)
  run = types.SimpleNamespace(model=model, trainable=trainable, frozen=frozen,
                              mesh=partitioning.create_mesh(1))
  return bench_rte.eval_ours(args, run)


def _eval_peft(args) -> Dict[str, float]:
  from prompt_jax import bench_rte  # pylint: disable=g-import-not-at-top
  return bench_rte.eval_peft(args, _peft_model(args)[0])


SIDES = {("train_step", "ours"): _ours, ("train_step", "torch"): _torch,
         ("train_step", "peft"): _peft, ("epoch", "ours"): _epoch_ours,
         ("epoch", "peft"): _epoch_peft, ("eval", "ours"): _eval_ours,
         ("eval", "peft"): _eval_peft, ("startup", "ours"): _startup_ours,
         ("attention", "ours"): _attention_ours}


def _side(args) -> int:
  if args.side == "ours":
    host_malloc.configure_jax()  # as `prompt-jax` does under the allocator the side runs under
  result = SIDES[(args.what, args.side)](args)
  result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  peak = _peak_device_bytes(args.side)
  if peak:
    result["peak_device_mb"] = peak / 2**20
  print(RESULT + json.dumps(result), flush=True)
  return 0


def _peak_device_bytes(side: str) -> float:
  """Peak accelerator memory of this side's process (0 on CPU, where peak RSS says it)."""
  if side == "ours":
    import jax  # pylint: disable=g-import-not-at-top
    if jax.default_backend() == "cpu":
      return 0.0
    return float((jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use", 0))
  import torch  # pylint: disable=g-import-not-at-top
  return float(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else 0.0


def _run_side(side: str, argv: Sequence[str], xla_flags: str = "",
              malloc: Optional[str] = None) -> Dict[str, float]:
  """Runs one side in its own process. `malloc` ('system', 'jemalloc' or 'glibc', prompt_jax/
  host_malloc.py); by default our side runs under the allocator this process runs under, as
  `prompt-jax` would, and a reference side under the system malloc, as its users run it."""
  env = dict(os.environ)
  if malloc is None and side != "ours":
    malloc = "system"
  if malloc == "system":
    env = host_malloc.system_environ(env)
  elif malloc == "glibc":
    env = dict(host_malloc.system_environ(env), **{host_malloc.CHOICE: "glibc"})
  elif malloc == "jemalloc" and not host_malloc.preloaded():
    env = host_malloc.jemalloc_environ(env)
  if xla_flags:
    from prompt_jax import xla_defaults  # pylint: disable=g-import-not-at-top
    env["XLA_FLAGS"] = xla_defaults.merge(env.get("XLA_FLAGS", ""), xla_flags)
  code, results, errors = stream_side(
      [sys.executable, "-m", "prompt_jax.bench", *argv, f"--side={side}"], env,
      lambda text: print(f"  ({side}) {text}", file=sys.stderr, flush=True))
  if code or not results:
    tail = (errors.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"the {side} side of the benchmark failed: {tail}")
  return json.loads(results[-1])


def stream_side(command: Sequence[str], env: Dict[str, str],
                report: Callable[[str], None]) -> Tuple[int, List[str], str]:
  """Runs a side's `command`; (exit code, its RESULT payloads, its stderr). Each PROGRESS line
  goes to `report` as soon as the side prints it; stderr is read on a thread meanwhile (a side
  that fills the pipe would otherwise block)."""
  proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)
  errors: List[str] = []
  reader = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
  reader.start()
  results = []
  try:
    for line in proc.stdout:
      line = line.rstrip("\n")
      if line.startswith(PROGRESS):
        report(line[len(PROGRESS):])
      elif line.startswith(RESULT):
        results.append(line[len(RESULT):])
    code = proc.wait()
  finally:  # interrupted (Ctrl-C, a failed report): no side left running, as subprocess.run
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  reader.join()
  return code, results, "".join(errors)


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = _parser().parse_args(argv)
  _check_shape(args)
  if args.side:
    return _side(args)
  if args.what == "ensemble" and args.dtype != "float32":
    raise errors.ConfigError("bench ensemble runs float32 only; drop --dtype")
  reference = args.reference or (
      "torch" if args.what == "train_step" else "none" if args.what in _NO_REFERENCE else "peft")
  try:  # a bad flag is one line and exit 2 before either side starts (minutes of measuring)
    _check_reference(args.what, reference)
    if args.what in ("epoch", "eval"):
      from prompt_jax import bench_rte  # pylint: disable=g-import-not-at-top
      bench_rte.check_inputs(args)
    _check_outputs(args)
    _check_xla_flags(args.xla_flags)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e
  lines = []

  def say(line: str) -> None:
    lines.append(line)
    print(line, flush=True)

  try:
    {"train_step": _train_step, "epoch": _epoch, "eval": _eval, "startup": _startup,
     "attention": _attention, "ensemble": _ensemble}[args.what](args, argv, reference, say)
  except (RuntimeError, ValueError) as e:
    print(f"prompt-jax bench: error: {e}", file=sys.stderr)
    return 1
  if args.record:
    _record(args.record, argv, lines)
    print(f"recorded in {args.record}")
  return 0


def _ensemble(args, argv, reference, say) -> None:
  """The ensemble batch against one prompt and N sequential runs (bench_ensemble.py)."""
  del argv, reference  # in-process; no library reference (_NO_REFERENCE)
  from prompt_jax import bench_ensemble  # pylint: disable=g-import-not-at-top
  say(f"ensemble ({args.mode}): {args.preset}"
      f"{f' ({args.num_layers} layers)' if args.num_layers else ''}, {args.inputs} inputs "
      f"(+{args.prompt_length} prompt), float32")
  bench_ensemble.run(args, _config(args), say)


def _train_step(args, argv, reference, say) -> None:
  """Our step, the reference's, their ratios, and with --flag_sweep our step per flag set.
  A side that fails raises RuntimeError; a flag set XLA rejects is reported as not run."""
  shape = (f"{args.preset}{f' ({args.num_layers} layers)' if args.num_layers else ''}, batch "
           f"{args.batch} x {args.inputs} inputs (+{args.prompt_length} prompt) x "
           f"{args.targets} targets, {args.dtype}{_our_settings(args)}")
  say(f"train_step: {shape}")
  _say_allocators(reference, say)
  side_argv = argv  # a side ignores --record/--flag_sweep; --xla_flags reach it as XLA_FLAGS
  ours = _run_side("ours", side_argv, args.xla_flags)
  say(f"  prompt_jax (jit, attention {ours['attention']})"
      f"{f' [{args.xla_flags}]' if args.xla_flags else ''}:   "
      f"{ours['seconds_per_step']:.3f} s/step, peak RSS {ours['peak_rss_mb']:.0f} MB"
      f"{_device_memory(ours)}")
  recomputed = (f"; with the recomputation {ours['flops_run'] / 1e12:.3g} TFLOP run"
                if args.remat != "none" else "")
  say(f"  MFU {_mfu(ours):.1%}: the step's {ours['flops_per_step'] / 1e12:.3g} TFLOP (its "
      f"matmuls{' without remat' if recomputed else ''}) per step / the "
      f"{ours['matmul_peak_flops'] / 1e12:.3g} TFLOP/s of one large matmul measured in the "
      f"same run{recomputed}")
  if args.profile:
    say(f"  a trace of two of our steps: {args.profile} (python -m prompt_jax.bench_profile "
        f"{args.profile})")
  ref = None
  if reference != "none":
    ref = _run_side(reference, side_argv)
    say(f"  {_REFERENCE_NAMES[reference]()}: {ref['seconds_per_step']:.3f} s/step, "
        f"peak RSS {ref['peak_rss_mb']:.0f} MB{_device_memory(ref)}")
    say(f"  ratio ours/reference: time {ours['seconds_per_step'] / ref['seconds_per_step']:.2f}"
        f", {_memory_ratio(ours, ref)}")
    # The reference runs the same matmuls (no weight gradients on either side): its MFU bounds
    # what a speed ratio can reach on this machine (1.3x a reference at 77% needs 100%).
    say(f"  reference MFU {_mfu(dict(ours, seconds_per_step=ref['seconds_per_step'])):.1%}: "
        f"the same matmuls in its time, against the same peak")
    if host_malloc.preloaded():  # the reference would gain from jemalloc too: say by how much
      same = _run_side(reference, side_argv, malloc="jemalloc")
      say(f"  the reference under our allocator: {same['seconds_per_step']:.3f} s/step, peak "
          f"RSS {same['peak_rss_mb']:.0f} MB; ratio ours/it: time "
          f"{ours['seconds_per_step'] / same['seconds_per_step']:.2f}, memory "
          f"{ours['peak_rss_mb'] / same['peak_rss_mb']:.2f}")
  if not args.flag_sweep:
    return
  say("  XLA flag sweep (our side; speed = default time / this time"
      f"{f', {reference} = {reference} time / this time' if ref else ''}):")
  rows = [(name, flags, f"{args.xla_flags} {flags}".strip(), None)
          for name, flags in CPU_FLAG_SETS[1:]]
  current = host_malloc.choice(os.environ)  # the allocators not run yet:
  for other in [c for c in host_malloc.CHOICES if c != current]:
    if other != "jemalloc" or host_malloc.find_jemalloc():
      rows.append((f"{other} malloc", f"{host_malloc.CHOICE}={other}", args.xla_flags, other))
  for name, shown, xla_flags, malloc in rows:
    try:
      r = _run_side("ours", side_argv, xla_flags, malloc=malloc)
    except (RuntimeError, ValueError) as e:
      say(f"    {name:28s} {shown}: not run ({str(e).split(': ', 1)[-1][:120]})")
      continue
    vs_ref = (f", {reference} {ref['seconds_per_step'] / r['seconds_per_step']:.2f}x"
              if ref else "")
    say(f"    {name:28s} {shown}: {r['seconds_per_step']:.3f} s/step, speed "
        f"{ours['seconds_per_step'] / r['seconds_per_step']:.2f}x{vs_ref}, "
        f"peak RSS {r['peak_rss_mb']:.0f} MB")


def _startup(args, argv, reference, say) -> None:
  """Time to the first step from a checkpoint, cold and restarted (bench_startup.py)."""
  del reference  # the restart is compared with the first start
  from prompt_jax import bench_startup  # pylint: disable=g-import-not-at-top
  bench_startup.run(args, argv, say, lambda extra: _run_side("ours", [*argv, *extra],
                                                             args.xla_flags))


def _attention(args, argv, reference, say) -> None:
  """The fused attention kernels against the einsum path (bench_attention.py)."""
  del reference  # the einsum path is the reference, in the same process
  from prompt_jax import bench_attention  # pylint: disable=g-import-not-at-top
  bench_attention.report(args, _run_side("ours", argv, args.xla_flags), say)


def _say_allocators(reference: str, say) -> None:
  """Which malloc each side runs under (prompt_jax/host_malloc.py)."""
  ours = host_malloc.describe()
  line = f"  host allocator: ours {ours}"
  if reference != "none":
    line += f", reference {host_malloc.describe(host_malloc.system_environ(os.environ))}"
  say(line)


def _mfu(side) -> float:
  return side["flops_per_step"] / side["seconds_per_step"] / max(side["matmul_peak_flops"], 1.0)


def _memory_ratio(ours, ref) -> str:
  """Peak memory, ours / the reference's: of the accelerator where both sides ran on one (their
  host RSS is then mostly the libraries'), else peak RSS."""
  if ours.get("peak_device_mb") and ref.get("peak_device_mb"):
    return f"device memory {ours['peak_device_mb'] / ref['peak_device_mb']:.2f}"
  return f"memory {ours['peak_rss_mb'] / ref['peak_rss_mb']:.2f}"


def _device_memory(side) -> str:
  peak = side.get("peak_device_mb")
  return f", peak device memory {peak:.0f} MB" if peak else ""


def _version(name: str) -> str:
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return "?"


_REFERENCE_NAMES = {
    "torch": lambda: "HF torch (PEFT-style prompt tuning)",
    "peft": lambda: f"HF PEFT {_version('peft')} (prompt tuning)",
}


# Measurements compared within our own side, not with a library: what each compares.
_NO_REFERENCE = {"startup": "a restart with the first start",
                 "attention": "the kernels with the einsum path",
                 "ensemble": "one batch of N prompts with one prompt and N runs"}


def _check_shape(args) -> None:
  """One ConfigError line (exit 2) for a model or shape no side could run, before either starts
  (an unknown preset or a batch of 0 failed inside a side, after the other had run)."""
  from prompt_jax.errors import did_you_mean  # pylint: disable=g-import-not-at-top
  from prompt_jax.models.config import PRESETS  # pylint: disable=g-import-not-at-top
  if args.preset not in PRESETS:
    raise errors.ConfigError(f"--preset={args.preset} is not a T5 preset (one of "
                             f"{', '.join(sorted(PRESETS))}){did_you_mean(args.preset, PRESETS)}")
  # --prompt_length 0 trains nothing: no backward pass at all, against MFU's forward + backward
  for flag, least in (("batch", 1), ("inputs", 1), ("targets", 1), ("prompt_length", 1),
                      ("steps", 1), ("num_layers", 1)):
    value = getattr(args, flag)
    if value is not None and value < least:
      raise errors.ConfigError(f"--{flag} must be >= {least}, got {value}")


def _check_outputs(args) -> None:
  """--record (a file appended to) and --profile (a directory), checked before the measuring:
  a directory, a missing folder or an unwritable place failed only once the figures were in."""
  if args.record:
    parent = os.path.dirname(os.path.abspath(args.record))
    if os.path.isdir(args.record):
      raise ValueError(f"--record {args.record} is a directory: name the markdown file to append "
                       f"to (e.g. docs/benchmarks.md)")
    if not os.path.isdir(parent):
      raise ValueError(f"--record {args.record}: directory {parent} does not exist; create it "
                       f"first")
    if not os.access(args.record if os.path.exists(args.record) else parent, os.W_OK):
      raise ValueError(f"--record {args.record} is not writable; choose another file")
  profile = getattr(args, "profile", None)
  if profile and os.path.exists(profile) and not os.path.isdir(profile):
    raise ValueError(f"--profile {profile} is a file: name a directory for the trace")


def _check_xla_flags(xla_flags: str) -> None:
  """--xla_flags that XLA rejects, found in a second's start of its backend: our side failed
  with XLA's own fatal log line, exit 1, after the bench had printed its first lines."""
  if not xla_flags:
    return
  from prompt_jax import xla_defaults  # pylint: disable=g-import-not-at-top
  env = dict(os.environ, XLA_FLAGS=xla_defaults.merge(os.environ.get("XLA_FLAGS", ""), xla_flags),
             TF_CPP_MIN_LOG_LEVEL="0")  # XLA's error line on a value (console silences it)
  proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                        capture_output=True, text=True, check=False)
  listed = "this jaxlib's flags are listed by XLA_FLAGS=--help"
  unknown = re.search(r"Unknown flags? in XLA_FLAGS: (.*)", proc.stderr)
  if unknown:
    raise ValueError(f"--xla_flags: XLA has no flag {unknown.group(1).strip()} ({listed})")
  value = re.search(r"Couldn't interpret value (.*) for flag (\S+?)\.?$", proc.stderr, re.M)
  if value:
    raise ValueError(f"--xla_flags: {value.group(1)} is not a value of --{value.group(2)} "
                     f"({listed})")
  if proc.returncode and "Flag parsing failed" in proc.stderr:
    raise ValueError(f"--xla_flags {xla_flags!r}: XLA cannot parse these flags ({listed})")


def _check_reference(what: str, reference: str) -> None:
  """One-line errors for a reference this measurement has not, or whose packages are missing."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  if what in _NO_REFERENCE and reference != "none":
    raise ValueError(f"bench {what} has no library reference (it compares "
                     f"{_NO_REFERENCE[what]}): drop --reference")
  if what in ("epoch", "eval") and reference == "torch":
    raise ValueError(f"bench {what} compares with the peft library: use --reference=peft "
                     f"(the default) or --reference=none")
  needed = {"torch": ("torch", "transformers"), "peft": ("torch", "transformers", "peft"),
            "none": ()}[reference]
  missing = [m for m in needed if importlib.util.find_spec(m) is None]
  if missing:
    raise ValueError(f"--reference={reference} needs {', '.join(missing)}: pip install "
                     f"{' '.join(missing)} (or --reference=none for our side alone)")


def _rte_shape(args, split: str) -> str:
  return (f"RTE {split} (super_glue_rte_v102, official files), {args.preset}"
          f"{f' ({args.num_layers} layers)' if args.num_layers else ''}, batch {args.batch}, "
          f"inputs <= {args.inputs} (+{args.prompt_length} prompt), targets <= {args.targets}, "
          f"{args.dtype}{_our_settings(args) if split == 'train' else ''}, random weights")


def _our_settings(args) -> str:
  """Our side's settings other than the defaults, for the bench's first line."""
  settings = [f"remat '{args.remat}'"] if args.remat != "none" else []
  if args.attention != "auto":
    settings.append(f"attention '{args.attention}'")
  if args.padding_as_lengths != "true":
    settings.append("padding as a [batch, heads, T, T] bias")
  return f", our side with {', '.join(settings)}" if settings else ""


def _padding(args) -> str:
  return f"{args.buckets} length buckets" if args.buckets else f"padded to {args.inputs}"


def _tokens(side) -> str:
  """Real input+target tokens of the processed positions (prompt positions excluded)."""
  return (f"real tokens {side['real_tokens']} of {side['processed_tokens']} processed (share "
          f"{side['real_tokens'] / max(side['processed_tokens'], 1):.2f})")


def _epoch(args, argv, reference, say) -> None:
  say(f"epoch: {_rte_shape(args, 'train')}")
  _say_allocators(reference, say)
  ours = _run_side("ours", argv, args.xla_flags)
  how = _padding(args) + (f", grouped by length in windows of {args.group} batches"
                          if args.group else "")
  steps_alone = ours["seconds"] - ours["compiling_seconds"]
  say(f"  prompt_jax (jit, {how}): {ours['steps']} steps in {ours['seconds']:.1f} s (of which "
      f"{ours['compiling_seconds']:.1f} s compiling {ours['programs']} programs, once per run; "
      f"the steps alone {steps_alone:.1f} s, each program's first step "
      f"{ours['first_steps_extra_seconds']:+.1f} s in all against the later steps of its "
      f"shape), {_tokens(ours)}, peak RSS {ours['peak_rss_mb']:.0f} MB")
  if reference == "none":
    return
  ref = _run_side(reference, argv)
  say(f"  HF PEFT {_version('peft')} (DataCollatorForSeq2Seq, dynamic padding): {ref['steps']} "
      f"steps in {ref['seconds']:.1f} s, {_tokens(ref)}, peak RSS {ref['peak_rss_mb']:.0f} MB")
  say(f"  ratio ours/reference: time {ours['seconds'] / ref['seconds']:.2f} (speed "
      f"{ref['seconds'] / ours['seconds']:.2f}x), memory "
      f"{ours['peak_rss_mb'] / ref['peak_rss_mb']:.2f}; our steps alone (each further epoch of "
      f"a run, its programs compiled): speed {ref['seconds'] / steps_alone:.2f}x")


def _eval(args, argv, reference, say) -> None:
  say(f"eval: {_rte_shape(args, 'validation')}; the decoders emit exactly {args.targets} tokens")
  _say_allocators(reference, say)
  ours = _run_side("ours", argv, args.xla_flags)
  how = _padding(args)
  say(f"  prompt_jax rank classification (2 labels, {how}): {ours['examples']} examples in "
      f"{ours['rank_seconds']:.2f} s")
  say(f"  prompt_jax greedy decoding ({how}): {ours['examples']} examples in "
      f"{ours['greedy_seconds']:.2f} s; peak RSS {ours['peak_rss_mb']:.0f} MB")
  if reference == "none":
    return
  ref = _run_side(reference, argv)
  say(f"  HF PEFT {_version('peft')} generate (greedy, dynamic padding): {ref['examples']} "
      f"examples in {ref['generate_seconds']:.2f} s; peak RSS {ref['peak_rss_mb']:.0f} MB")
  say(f"  speed vs PEFT generate: rank classification "
      f"{ref['generate_seconds'] / ours['rank_seconds']:.2f}x, greedy "
      f"{ref['generate_seconds'] / ours['greedy_seconds']:.2f}x; memory "
      f"{ours['peak_rss_mb'] / ref['peak_rss_mb']:.2f}")


# Environment variables that change what a bench measures (not, e.g., PROMPT_JAX_SPM_PATH).
_RECORDED_ENV = ("XLA_FLAGS", "LD_PRELOAD", "PROMPT_JAX_MALLOC", "PROMPT_JAX_MALLOC_CONF",
                 "PROMPT_JAX_CPU_BFLOAT16_PRODUCTS", "PROMPT_JAX_COMPILATION_CACHE")


def _record(path: str, argv: Sequence[str], lines: Sequence[str]) -> None:
  """Appends the run to a markdown file: command line, machine, versions, then the output."""
  import jax  # pylint: disable=g-import-not-at-top
  # The installed versions, without importing (torch and peft take many seconds).
  installed = {name: _version(name) for name in ("flax", "torch", "transformers", "peft")}
  versions = [f"jax {jax.__version__}"] + [f"{name} {version}" for name, version in
                                          installed.items() if version != "?"]
  machine = (f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}, "
             f"{jax.devices()[0].platform}; {', '.join(versions)}")
  when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  # The environment that changes the figures (XLA flags, our CPU switches, an allocator), as a
  # prefix that pastes back into a shell with the command.
  from prompt_jax import xla_defaults  # pylint: disable=g-import-not-at-top
  shown = dict(os.environ)  # XLA_FLAGS less the defaults every prompt-jax command adds
  shown["XLA_FLAGS"] = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                if f not in xla_defaults.DEFAULTS)
  env = [f"{k}={shlex.quote(shown[k])}" for k in _RECORDED_ENV if shown.get(k)]
  command = shlex.join(["prompt-jax", "bench", *argv])
  block = ["", f"### `{' '.join(env + [command])}`", "",
           f"{when}; {machine}", "", "```", *lines, "```", ""]
  with open(path, "a") as f:
    f.write("\n".join(block))


if __name__ == "__main__":
  sys.exit(main())
