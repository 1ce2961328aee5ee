"""`prompt-jax bench ensemble`: N prompts in one batch against one prompt and N sequential runs.

All in one process on one copy of random frozen weights, the same shapes on every side, after
compilation (median of the timed repeats). Reported, as ratios of this one run (never asserted as
times):
  ensemble       E examples x N prompts in one bank batch (`prompts.bank`: each example's
                 embedding computed once, prompts of different lengths padded and masked)
  one prompt     the same E * N rows (distinct examples) under one prompt, by the plain
                 single-prompt model (`T5(prompt=PromptTuning)`): the per-row cost to match
  sequential     N single-prompt evaluations of the E examples, one after the other (what one
                 run per prompt does, minus reloading the model each time)
  mixed          a batch of B rows whose examples name 4 different prompts (4 tasks) against
                 the same B rows under one prompt, by the single-prompt model
  memory         peak RSS, and the bytes of the frozen weights (held once) and the prompt table
Work per row: rank classification of C labels (`--mode=score`, the encoder once per row) or
greedy decoding (`--mode=greedy`).

  prompt-jax bench ensemble --preset=t5_1_1_small --examples=16 --prompts=5 --inputs=128
"""
import functools
import resource
import statistics
import time
from typing import Callable, List

import numpy as np


def add_arguments(p) -> None:
  p.add_argument("--examples", type=int, default=16, help="ensemble: examples per batch (E)")
  p.add_argument("--prompts", type=int, default=5, help="ensemble: prompts N")
  p.add_argument("--mode", choices=["score", "greedy"], default="score",
                 help="ensemble: rank classification of 2 labels, or greedy decoding")


def _median_seconds(fn: Callable[[], object], steps: int) -> float:
  import jax  # pylint: disable=g-import-not-at-top
  jax.block_until_ready(fn())  # compile + warm-up
  times: List[float] = []
  for _ in range(steps):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def run(args, config, say=print) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from prompt_jax import trees  # pylint: disable=g-import-not-at-top
  from prompt_jax.models import T5, decoding, random_init  # pylint: disable=g-import-not-at-top
  from prompt_jax.prompts import PromptTuning, prompt_factory  # pylint: disable=g-import-not-at-top
  from prompt_jax.prompts import bank as bank_lib  # pylint: disable=g-import-not-at-top

  e, n, t, p = args.examples, args.prompts, args.inputs, args.prompt_length
  rng = np.random.RandomState(0)
  vocab = min(config.vocab_size, 32000)

  def tokens(rows):
    x = rng.randint(2, vocab, (rows, t)).astype(np.int32)
    x[:, -1] = 1
    x[rows * 3 // 4:, t // 2:] = 0  # the last quarter of rows is half padding
    x[rows * 3 // 4:, t // 2 - 1] = 1
    return jnp.asarray(x)

  plain = T5(config)
  dummy = jnp.ones((1, 8), jnp.int32)
  # Filled array by array, the key an argument: never a jitted whole-model init (with a constant
  # key XLA constant-folds it and T5 1.1 base does not start; models/random_init.py).
  frozen = trees.unflatten(random_init.fill(random_init.initialisers(
      plain, dummy, dummy[:, :4], dummy[:, :4], enable_dropout=False), jax.random.PRNGKey(0)))
  # N prompts of lengths P, P - 1, ... (padded to P in the bank); the single-prompt model uses P.
  lengths = [max(1, p - i) for i in range(n)]
  entries = [bank_lib.BankEntry(f"p{i}", 0.5 * rng.randn(l, config.emb_dim).astype(np.float32))
             for i, l in enumerate(lengths)]
  table = bank_lib.build_table(entries)
  dev = bank_lib.device_bank(table)
  single = T5(config, prompt=prompt_factory(functools.partial(PromptTuning, length=p), p))
  single_params = [dict(frozen, encoder=dict(frozen["encoder"], prompt={"prompt": {
      "prompt": jnp.asarray(entries[0].prompt if i == 0 else
                            0.5 * rng.randn(p, config.emb_dim).astype(np.float32))}}))
                   for i in range(n)]
  labels = jnp.asarray(np.array([[3, 1, 0], [4, 5, 1]], np.int32))
  length = args.targets

  def bank_fn(x, row_prompt, bank=dev, layout=table.layout):
    if args.mode == "score":
      return bank_lib.score(plain, frozen, x, bank, row_prompt, layout, labels)
    return bank_lib.greedy(plain, frozen, x, bank, row_prompt, layout, length)

  def single_fn(x, params):
    if args.mode == "score":
      return decoding.score_targets(single, params, x, labels)
    return decoding.greedy_decode(single, params, x, length)

  examples, rows = tokens(e), tokens(e * n)
  ensemble_rows = jnp.asarray(np.tile(np.arange(n, dtype=np.int32), (e, 1)))  # [E, N]
  t_ens = _median_seconds(lambda: bank_fn(examples, ensemble_rows), args.steps)
  t_one = _median_seconds(lambda: single_fn(rows, single_params[0]), args.steps)
  t_seq = _median_seconds(lambda: [single_fn(examples, sp) for sp in single_params], args.steps)
  # Mixed: 4 tasks' prompts (all length P: the same shape as the single-task batch).
  mixed_entries = [bank_lib.BankEntry(f"task{i}", 0.5 * rng.randn(p, config.emb_dim).astype(
      np.float32)) for i in range(4)]
  mixed_table = bank_lib.build_table(mixed_entries)
  mixed_dev = bank_lib.device_bank(mixed_table)
  which = jnp.asarray((np.arange(e * n) % 4).astype(np.int32)[:, None])  # [B, 1]
  t_mixed = _median_seconds(lambda: bank_fn(rows, which, mixed_dev, mixed_table.layout),
                            args.steps)
  frozen_mb = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(frozen)) / 2**20
  table_mb = table.table.nbytes / 2**20
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  pair = lambda s: 1000 * s / (e * n)
  say(f"  ensemble, {e} examples x {n} prompts in one batch: {t_ens:.4f} s "
        f"({pair(t_ens):.3f} ms per example-prompt pair)")
  say(f"  one prompt, the same {e * n} rows:             {t_one:.4f} s "
        f"({pair(t_one):.3f} ms per row)")
  say(f"  {n} sequential single-prompt runs of {e} examples: {t_seq:.4f} s "
        f"({pair(t_seq):.3f} ms per example-prompt pair)")
  say(f"  ratio per pair: ensemble / one prompt {t_ens / t_one:.2f} (target <= 1.1); "
        f"ensemble / sequential {t_ens / t_seq:.2f}")
  say(f"  mixed batch of 4 tasks' prompts, {e * n} rows: {t_mixed:.4f} s; throughput "
        f"mixed / single-task {t_one / t_mixed:.2f} (target >= 0.9)")
  say(f"  memory: peak RSS {peak:.0f} MB; frozen weights {frozen_mb:.1f} MB (one copy), "
        f"prompt table {table_mb:.2f} MB")
  return 0
