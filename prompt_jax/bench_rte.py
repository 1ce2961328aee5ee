"""`prompt-jax bench epoch` and `prompt-jax bench eval`: real RTE against HF PEFT, in one run.

Both read SuperGLUE RTE from the official files (`--data_dir`, laid out like ../shared/data) with
the real T5 vocabulary (`--vocab`, or $PROMPT_JAX_SPM_PATH, or <data_dir>/t5_spm/spiece.model)
through our seqio task `super_glue_rte_v102`, so both sides see the same token ids; the frozen
backbone has random weights of the `--preset` shapes on both sides, the prompt is 100 tokens.
Each side runs in its own subprocess, one after the other (bench.py).

  epoch  one epoch of RTE train (2490 examples: 77 steps of batch 32, shuffled with seed 0, the
         same rows in the same order on both sides). Ours: the training pipeline
         (`train.data.TrainStream`, tokenising on the fly) with length bucketing
         (`--buckets`, `prompt_jax.length_buckets`; 0 pads to --inputs), optionally grouped
         by length (`--group=K`, `prompt_jax.group_by_length`: each window of K batches
         sorted longest first, so batches then hold other rows than PEFT's, and the epoch's
         last partial window its longest rows), and our jitted step; the time includes
         compiling one program per bucket shape. PEFT: `peft.get_peft_model`
         (PromptTuningConfig) on transformers' T5 with Adafactor (Lester et al.), the rows
         pre-tokenised (as `datasets.map` would cache them) and padded per batch by HF's
         `DataCollatorForSeq2Seq` (dynamic padding to the longest row).
  eval   RTE validation (277 examples), batch --batch: ours by rank classification of the two
         labels and by greedy decoding of --targets tokens (both through `evaluation.inference`
         with the same bucketing), PEFT by `generate` (greedy, dynamic padding). Both decoders
         emit exactly --targets tokens (EOS suppressed: random weights would otherwise stop at
         different steps on the two sides).

Reported: seconds, real-token share of the processed input+target positions (prompt excluded),
programs compiled, peak RSS, and the ratios. Figures, never assertions.

  prompt-jax bench epoch --data_dir=../shared/data --batch=32
  prompt-jax bench epoch --data_dir=../shared/data --batch=32 --buckets=8 --group=8
  prompt-jax bench eval --data_dir=../shared/data --batch=32
"""
import collections
import itertools
import os
import statistics
import time
from typing import Dict, List

import numpy as np

TASK = "super_glue_rte_v102"


def add_arguments(p) -> None:
  p.add_argument("--data_dir", default=None,
                 help="epoch/eval: folder with super_glue/RTE/*.jsonl (like ../shared/data)")
  p.add_argument("--vocab", default=None,
                 help="epoch/eval: T5 SentencePiece model (default: $PROMPT_JAX_SPM_PATH, "
                      "else <data_dir>/t5_spm/spiece.model)")
  p.add_argument("--buckets", type=int, default=4,
                 help="epoch/eval: our length buckets (prompt_jax.length_buckets; 0: pad to "
                      "--inputs)")
  p.add_argument("--group", type=int, default=0,
                 help="epoch: sort our training examples by length within windows of this many "
                      "batches (prompt_jax.group_by_length; needs --buckets; 0: off)")
  p.add_argument("--max_steps", type=int, default=None,
                 help="epoch: stop after this many steps (eval: batches); default the whole split")


def check_inputs(args) -> None:
  """One-line errors (ValueError) before any side starts: the data and the vocabulary."""
  if not args.data_dir:
    raise ValueError(f"bench {args.what} reads the official RTE files: pass --data_dir=DIR "
                     f"(a folder with super_glue/RTE/train.jsonl and val.jsonl, like "
                     f"../shared/data)")
  for split in ("train.jsonl", "val.jsonl"):
    path = os.path.join(args.data_dir, "super_glue", "RTE", split)
    if not os.path.isfile(path):
      raise ValueError(f"--data_dir {args.data_dir}: {path} is missing; point it at a folder "
                       f"laid out like ../shared/data")
  vocab = vocab_path(args)
  if not os.path.isfile(vocab):
    raise ValueError(f"T5 SentencePiece model {vocab} is missing: pass --vocab=PATH/spiece.model")
  if args.buckets < 0:
    raise ValueError(f"--buckets must be >= 0, got {args.buckets}")
  if args.group < 0 or (args.group and not args.buckets):
    raise ValueError(f"--group={args.group}: pass a number of batches >= 0, and --buckets > 0 "
                     f"with it (grouping saves positions only when batches are cut to buckets)")


SPM_PATH_ENV = "PROMPT_JAX_SPM_PATH"  # prompt_jax.vocab's (not imported here: seqio loads TF)


def vocab_path(args) -> str:
  return (args.vocab or os.environ.get(SPM_PATH_ENV)
          or os.path.join(args.data_dir, "t5_spm", "spiece.model"))


def _setup_data(args, num_buckets: int, group: int = 0) -> None:
  import gin  # pylint: disable=g-import-not-at-top
  from prompt_jax import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  from prompt_jax.tasks import sources  # pylint: disable=g-import-not-at-top
  os.environ[vocab_lib.SPM_PATH_ENV] = os.path.abspath(vocab_path(args))
  sources.set_data_dir(os.path.abspath(args.data_dir))
  with gin.unlock_config():
    gin.bind_parameter("prompt_jax.length_buckets.num_buckets", num_buckets)
    gin.bind_parameter("prompt_jax.group_by_length.batches", group)


def _lengths(args) -> Dict[str, int]:
  return {"inputs": args.inputs, "targets": args.targets}


def _train_stream(args, num_buckets: int, group: int = 0):
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  _setup_data(args, num_buckets, group)
  cfg = data_lib.DatasetConfig(mixture_or_task_name=TASK, task_feature_lengths=_lengths(args),
                               split="train", batch_size=args.batch, shuffle=True, seed=0)
  return data_lib.TrainStream(cfg, 1, (0, args.batch))


def epoch_steps(args, examples: int) -> int:
  steps = examples // args.batch  # the training stream drops the last partial batch
  return min(steps, args.max_steps) if args.max_steps else steps


def _num_examples(split: str) -> int:
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  return int(data_lib.get_task(TASK).num_input_examples(split))


def _validation_inputs(args) -> np.ndarray:
  """[N, --inputs] encoder tokens of RTE validation (EOS-terminated, 0-padded), the first
  --max_steps batches of them if given; also sets our length buckets for the eval."""
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  _setup_data(args, args.buckets)
  cfg = data_lib.DatasetConfig(mixture_or_task_name=TASK, task_feature_lengths=_lengths(args),
                               split="validation", batch_size=1, shuffle=False)
  rows = [b["encoder_input_tokens"][0] for b in data_lib.numpy_batches(
      data_lib.get_dataset(cfg, num_epochs=1, shard_id=0, num_shards=1))]
  inputs = np.stack(rows).astype(np.int32)
  return inputs[:args.max_steps * args.batch] if args.max_steps else inputs


# ===== epoch =====

def epoch_ours(args, setup) -> Dict[str, float]:
  """One epoch of our training pipeline + step. `setup(example_batch)` -> (step, holder), with
  holder["state"] the train state and holder["compile"](state, batch) the step compiled for a
  batch shape: each new shape (length bucket) is compiled ahead of its first step, so the time
  spent compiling is counted apart from the steps'."""
  import jax  # pylint: disable=g-import-not-at-top
  from prompt_jax import bench  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  stream = _train_stream(args, args.buckets, args.group)
  steps = epoch_steps(args, _num_examples("train"))
  first = next(stream)
  unused_step, holder = setup(first)
  programs = {}  # batch shape -> the step compiled for it
  compiling = 0.0  # seconds spent compiling them
  times = collections.defaultdict(list)  # batch shape -> seconds of each of its steps
  meter = bench.side_meter("epoch", steps)
  start = time.perf_counter()
  # range first: zip stops there without pulling a batch past the epoch from the stream.
  for done, batch in zip(range(1, steps + 1), itertools.chain([first], stream)):
    shape = state_lib.batch_shape(batch)
    if shape not in programs:
      began = time.perf_counter()
      programs[shape] = holder["compile"](holder["state"], batch)
      compiling += time.perf_counter() - began
    began = time.perf_counter()
    holder["state"], metrics = programs[shape](holder["state"], batch)
    jax.block_until_ready(metrics["loss"])
    times[shape].append(time.perf_counter() - began)
    meter.update(done)
  seconds = time.perf_counter() - start
  # A program's first step against the later steps of its shape (median; a shape met once
  # counts as its own typical step): what the first run of each program costs on top.
  first_extra = sum(t[0] - (statistics.median(t[1:]) if len(t) > 1 else t[0])
                    for t in times.values())
  return {"seconds": seconds, "steps": steps, "programs": len(programs),
          "compiling_seconds": compiling, "first_steps_extra_seconds": first_extra,
          "real_tokens": stream.tokens_real, "processed_tokens": stream.tokens_processed}


def epoch_peft(args, model_and_optimizer) -> Dict[str, float]:
  """One epoch of HF PEFT on the same rows, padded per batch by DataCollatorForSeq2Seq."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  stream = _train_stream(args, 0)
  steps = epoch_steps(args, _num_examples("train"))
  rows: List[List[Dict[str, List[int]]]] = []
  for _ in range(steps):  # pre-tokenised rows without padding, as `datasets.map` caches them
    b = next(stream)
    rows.append([{"input_ids": [int(t) for t in enc if t], "labels": [int(t) for t in tgt if t]}
                 for enc, tgt in zip(b["encoder_input_tokens"], b["decoder_target_tokens"])])
  # The collator only pads (pad id 0, labels -100): the ids come from the seqio task above.
  collator = transformers.DataCollatorForSeq2Seq(
      transformers.T5Tokenizer(vocab_file=vocab_path(args)), padding="longest",
      label_pad_token_id=-100, return_tensors="pt")
  from prompt_jax import bench  # pylint: disable=g-import-not-at-top
  model, opt = model_and_optimizer()
  real = processed = 0
  meter = bench.side_meter("epoch", len(rows))
  start = time.perf_counter()
  for done, batch_rows in enumerate(rows, 1):
    batch = {k: v.to(bench.torch_device()) for k, v in collator(batch_rows).items()}
    real += int(torch.count_nonzero(batch["input_ids"]) + torch.count_nonzero(
        batch["labels"] >= 0))
    processed += batch["input_ids"].numel() + batch["labels"].numel()
    loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    meter.update(done)  # (on a GPU the token counts above waited for the previous step)
  bench.torch_sync()
  seconds = time.perf_counter() - start
  return {"seconds": seconds, "steps": len(rows), "real_tokens": real,
          "processed_tokens": processed}


# ===== eval =====

def _label_ids(args) -> np.ndarray:
  from prompt_jax import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  from prompt_jax.tasks import registration  # pylint: disable=g-import-not-at-top
  return inference.label_tokens(list(registration.label_set(TASK)), vocab_lib.get_vocabulary())


def eval_ours(args, run) -> Dict[str, float]:
  """Rank classification and greedy decoding of RTE validation through evaluation.inference."""
  from prompt_jax import bench  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  inputs = _validation_inputs(args)
  label_ids = _label_ids(args)
  out = {"examples": int(inputs.shape[0])}
  meter = bench.side_meter("eval", 4, "passes")
  # Each timed once after one untimed pass (compiles every bucket program on the way).
  for i, (name, fn) in enumerate((("rank_seconds", lambda: inference.label_scores(
      run, inputs, label_ids, batch_size=args.batch)),
                                  ("greedy_seconds", lambda: inference.decode_rows(
                                      run, inputs, batch_size=args.batch,
                                      max_decode_length=args.targets, eos_id=-1)[0]))):
    fn()
    meter.update(2 * i + 1)
    start = time.perf_counter()
    fn()
    out[name] = time.perf_counter() - start
    meter.update(2 * i + 2)
  return out


def eval_peft(args, model) -> Dict[str, float]:
  """PEFT `generate` (greedy, exactly --targets new tokens) on RTE validation."""
  import torch  # pylint: disable=g-import-not-at-top
  from prompt_jax import bench  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  inputs = _validation_inputs(args)
  model.eval()

  def run():
    with torch.no_grad():
      for begin in range(0, inputs.shape[0], args.batch):
        rows = inputs[begin:begin + args.batch]
        width = data_lib.used_length(rows)  # dynamic padding: to the longest row
        ids = torch.tensor(rows[:, :width], dtype=torch.long, device=bench.torch_device())
        model.generate(input_ids=ids, attention_mask=(ids > 0).long(), do_sample=False,
                       num_beams=1, max_new_tokens=args.targets, min_new_tokens=args.targets)
    bench.torch_sync()

  meter = bench.side_meter("eval", 2, "passes")
  run()  # warm-up, as ours
  meter.update(1)
  start = time.perf_counter()
  run()
  return {"examples": int(inputs.shape[0]), "generate_seconds": time.perf_counter() - start}
