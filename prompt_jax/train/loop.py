"""The training loop: `prompt-jax train` calls `train()` with everything bound by gin.

  state <- restore latest MODEL_DIR/checkpoints (or init), frozen <- INITIAL_CHECKPOINT_PATH
  for step in [state.step, TRAIN_STEPS):  batch -> jit step -> (log, summaries, checkpoint, eval)
"""
import json
import logging
import math
import os
import re
import time
from typing import Any, Callable, Dict, Mapping, Optional

import gin
import jax
from etils import epath
import numpy as np

from prompt_jax import partitioning
from prompt_jax import run_setup
from prompt_jax.errors import ConfigError, Preempted, RunError, check_integer
from prompt_jax.train import checkpointing
from prompt_jax.train import data as data_lib
from prompt_jax.train import guards
from prompt_jax.train import losses
from prompt_jax.train import methods
from prompt_jax.train import optimizers
from prompt_jax.train import run_dir
from prompt_jax.train import startup as startup_lib
from prompt_jax.train import state as state_lib
from prompt_jax.train import summaries


# MODEL_DIR/<this>: the last step whose evaluation finished, with what it evaluated (process 0
# writes it after both evaluations are written), so that a resume at that step does not redo it.
EVALUATED_FILE = "last_evaluation.json"


def write_config(model_dir: str, resumed_at: Optional[int] = None) -> None:
  """The resolved gin config, as t5x writes it (process 0 only). A run resumed at step N with
  other settings keeps the config.gin its steps so far trained with as config_to_step<N>.gin
  (it was replaced without a word: nothing said which learning rate steps 0-N had) and says
  which macros changed."""
  if jax.process_index() == 0:
    directory = epath.Path(model_dir)
    directory.mkdir(parents=True, exist_ok=True)
    text = gin.config_str()
    old_file = directory / run_dir.CONFIG_FILE
    if resumed_at and old_file.exists():
      old = old_file.read_text()
      if old != text:
        kept = directory / f"config_to_step{resumed_at}.gin"
        if not kept.exists():  # (an earlier resume at the same step kept the first)
          (directory / (kept.name + ".tmp")).write_text(old)
          (directory / (kept.name + ".tmp")).replace(kept)
        macro = re.compile(r"^([A-Z][A-Z0-9_]*) = (.*)$", re.M)
        was, now = dict(macro.findall(old)), dict(macro.findall(text))
        changes = [f"{k} {was.get(k, 'unset')} -> {now.get(k, 'unset')}"
                   for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
        summaries.log("settings changed at step %d (%s): config.gin has the new ones, %s the "
                      "ones steps 0-%d trained with", resumed_at,
                      ", ".join(changes) or "bindings other than macros", kept, resumed_at)
    tmp = directory / (run_dir.CONFIG_FILE + ".tmp")
    tmp.write_text(text)
    tmp.replace(old_file)


def global_batch(local: Mapping[str, np.ndarray], sharding,
                 rows: Optional[int] = None) -> Dict[str, jax.Array]:
  """Per-process rows -> global jax.Arrays sharded on `data` (`rows`: the global batch size)."""
  return {k: jax.make_array_from_process_local_data(
      sharding, v, None if rows is None else (rows,) + v.shape[1:]) for k, v in local.items()}


def pad_batch(batch: Mapping[str, np.ndarray], rows: int) -> Dict[str, np.ndarray]:
  """Pads a short final batch with all-zero (weightless) rows."""
  n = next(iter(batch.values())).shape[0]
  if n == rows:
    return dict(batch)
  return {k: np.concatenate([v, np.zeros((rows - n,) + v.shape[1:], v.dtype)])
          for k, v in batch.items()}


def _agreed_count(n: int) -> int:
  """The largest `n` over processes (every process must run the same number of steps)."""
  if jax.process_count() == 1:
    return n
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return int(np.max(multihost_utils.process_allgather(np.int32(n))))


def _agreed_all(flag: bool) -> bool:
  """True only where `flag` is true on every process (the same decision everywhere)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.min(multihost_utils.process_allgather(np.int32(flag))))


def _evaluation_record(step: int, training: Optional[data_lib.DatasetConfig],
                       inference: Optional[data_lib.DatasetConfig]) -> Dict[str, Any]:
  """What MODEL_DIR/last_evaluation.json holds: the step and the evaluations' task and split (a
  resume with another evaluation configuration evaluates its restored step again)."""
  what = lambda cfg: None if cfg is None else [cfg.mixture_or_task_name, cfg.split]
  return {"step": step, "training_eval": what(training), "inference_eval": what(inference)}


def _record_evaluation(model_dir: str, record: Mapping[str, Any],
                       metrics: Mapping[str, float]) -> None:
  """Records a finished evaluation and its metrics (process 0; written whole: tmp + replace, as
  config.gin)."""
  if jax.process_index() == 0:
    directory = epath.Path(model_dir)
    tmp = directory / (EVALUATED_FILE + ".tmp")
    tmp.write_text(json.dumps({**record, "metrics": {k: float(v) for k, v in metrics.items()}}))
    tmp.replace(directory / EVALUATED_FILE)


def _recorded_metrics(model_dir: str, record: Mapping[str, Any]) -> Optional[Dict[str, float]]:
  """The metrics of `record`'s evaluation when MODEL_DIR/last_evaluation.json records it, on
  every process, else None (a missing or unreadable record: not recorded, the evaluation is
  redone; a record written before metrics were kept: {})."""
  path = epath.Path(model_dir) / EVALUATED_FILE
  try:
    data = json.loads(path.read_text()) if path.exists() else None
    found = isinstance(data, dict) and {k: v for k, v in data.items()
                                        if k != "metrics"} == dict(record)
  except Exception:  # pylint: disable=broad-except  (a garbled record: evaluate again)
    found = False
  if not _agreed_all(found):
    return None
  metrics = data.get("metrics")
  return dict(metrics) if isinstance(metrics, dict) else {}


def empty_batch(element_spec: Mapping[str, Any], rows: int) -> Dict[str, np.ndarray]:
  """An all-padding batch of `rows` with the model features of a batched dataset's spec (a
  multi-task mixture's `task_ids` included): what a process whose data shard has run out feeds."""
  return {k: np.zeros((rows,) + tuple(spec.shape[1:]), spec.dtype.as_numpy_dtype)
          for k, spec in element_spec.items() if k in data_lib.model_features(element_spec)}


def teacher_forced_eval(run: run_setup.Run, eval_step, cfg: data_lib.DatasetConfig,
                        max_batches: Optional[int] = None) -> Dict[str, float]:
  """Token-weighted mean teacher-forced metrics over the (first `max_batches` batches of the)
  split. Each process reads the data shard of the rows its devices hold (`data_lib.process_rows`;
  processes sharing rows, a `model` axis across processes, read the same shard) and feeds those
  rows; processes with fewer batches of their shard feed all-padding batches."""
  sharding = partitioning.data_sharding(run.mesh)
  start, stop = data_lib.process_rows(sharding, cfg.batch_size)
  rows = stop - start
  ds = data_lib.get_dataset(cfg, num_epochs=1, drop_remainder=False, shard_id=start // rows,
                            num_shards=cfg.batch_size // rows)
  if max_batches is not None:
    ds = ds.take(max_batches)
  local = [pad_batch(b, rows) for b in data_lib.numpy_batches(ds)]
  count = _agreed_count(len(local))
  empty = empty_batch(ds.element_spec, rows)  # the same features as the other processes' batches
  totals, tokens = {}, 0.0
  for i in range(count):
    batch = local[i] if i < len(local) else empty
    with partitioning.axis_rules(run.mesh):
      m = jax.device_get(eval_step(run.trainable, run.frozen,
                                   global_batch(batch, sharding, cfg.batch_size)))
    w = float(m["num_tokens"])
    for k in ("loss", "accuracy", "cross_ent_loss_per_token"):
      totals[k] = totals.get(k, 0.0) + float(m[k]) * w
    tokens += w
  return {k: v / max(tokens, 1.0) for k, v in totals.items()}


@gin.configurable(module="prompt_jax")
def train(*, model_dir: str = gin.REQUIRED,
          train_dataset_cfg: data_lib.DatasetConfig = gin.REQUIRED,
          model: Optional[run_setup.ModelSpec] = None,
          optimizer: optimizers.Optimizer = None,
          initial_checkpoint_path: Optional[str] = None,
          total_steps: int = gin.REQUIRED,
          train_eval_dataset_cfg: Optional[data_lib.DatasetConfig] = None,
          infer_eval_dataset_cfg: Optional[data_lib.DatasetConfig] = None,
          eval_period: int = 1000, eval_steps: Optional[int] = 20,
          checkpoint_period: int = 1000, keep_checkpoints: Optional[int] = 3,
          stats_period: int = 100, random_seed: int = 0, num_partitions: int = 1,
          z_loss: float = 1e-4,
          loss_normalizing_factor: Any = losses.NUM_REAL_TARGET_TOKENS,
          stop_after_step: Optional[int] = None, return_state: bool = False,
          eval_before_training: bool = False,
          infer_fn: Optional[Callable[..., Dict[str, float]]] = None,
          cache_representations: bool = True, num_data_shards: int = 1,
          compile_ahead: bool = True, check_only: bool = False,
          announce: Optional[Callable[[], None]] = None):
  """Trains the parameters matching TRAINABLE_REGEX; returns the final eval metrics.

  `infer_fn(run, dataset_cfg, model_dir, step) -> metrics` runs inference evaluation on
  `infer_eval_dataset_cfg` (the CLI passes `evaluation.inference.evaluate`; train/ does not
  import evaluation/). Without it only teacher-forced evaluation runs.

  `eval_before_training` evaluates the untrained prompt first (t5x's run_eval_before_training),
  so a run shows what training changed.

  `cache_representations`: a method that reads the frozen encoder's representation of the input
  (IDPG) gets it from a per-example host cache instead of one more encoder pass a step
  (train/methods.py).

  `stop_after_step` ends the run early right after checkpointing that step (what a kill after
  step k leaves behind). `return_state`: return (metrics, run, state) instead (tests).

  `compile_ahead`: the train step is compiled on a background thread while the backbone is
  read from INITIAL_CHECKPOINT_PATH (when every batch has the same shapes: no length buckets).
  False compiles it at the first step, after the read (less memory at once on the host; the
  compiler's GPU autotuning then does not run beside the restore).

  `num_data_shards` (K): the training split is read as K seqio shards whose rows are laid out
  the same way for any number of processes and devices (see train/data.py); it must divide
  BATCH_SIZE and stay fixed for a run (checkpoints record it). 1: every process reads the whole
  stream and keeps its rows; more spreads the input work over processes.

  Reliability (README "When things go wrong"): resumes from the newest intact checkpoint (broken
  newer ones are moved to MODEL_DIR/corrupt_checkpoints), stops on a non-finite loss without
  saving it, and saves a checkpoint then raises `Preempted` on SIGTERM.

  `check_only`: check the configured values (types, ranges, the method's spec, the optimizer)
  and return None: nothing is read, written or compiled (`sweep` checks each job so before any
  runs).

  `announce()` is called once the quick checks have passed (TRAIN_STEPS, the parameters' shapes,
  BATCH_SIZE and the data pipeline against the checkpoint to resume, the datasets, the training
  data's first read), before the slow start (the backbone, the compile): the CLI's "<task> for
  N steps into MODEL_DIR" line, so that a refusal up to there is the only line.
  """
  startup = startup_lib.StartupTimer()
  model = model or run_setup.model_spec()
  optimizer = optimizer or optimizers.adafactor()
  _check_run_values(model_dir, total_steps, checkpoint_period=checkpoint_period,
                    stats_period=stats_period, keep_checkpoints=keep_checkpoints,
                    eval_period=eval_period, random_seed=random_seed,
                    writable=not check_only)
  losses.check_normalizing_factor(loss_normalizing_factor)
  if check_only:  # (what follows needs the devices, the data or the checkpoint)
    data_lib.check_config(train_dataset_cfg)
    run_setup.check_batch(train_dataset_cfg.batch_size, None)
    if model.prompt is not None:
      model.prompt.check(model.config)
      model.prompt.check_fits(train_dataset_cfg.task_feature_lengths["inputs"])
    return None
  mesh = partitioning.create_mesh(num_partitions)
  run_setup.check_batch(train_dataset_cfg.batch_size, mesh)
  task = data_lib.checked_task(train_dataset_cfg)
  if model.prompt is not None:
    model.prompt.check_features(set(task.output_features))  # e.g. a multi-task prompt's index
  vocabulary = task.output_features["targets"].vocabulary
  found = checkpointing.steps(model_dir)
  if found and found[0] > total_steps:
    raise ConfigError(f"TRAIN_STEPS={total_steps} is below the step {found[0]} restored from "
                      f"{checkpointing.checkpoints_dir(model_dir)}; raise TRAIN_STEPS or use a "
                      f"new MODEL_DIR")
  # The evaluation datasets this run will read (a finished run evaluates once), checked before
  # anything is written.
  if eval_period or eval_before_training or (found and found[0] == total_steps):
    for cfg in (train_eval_dataset_cfg, infer_eval_dataset_cfg if infer_fn else None):
      if cfg is not None:
        run_setup.check_batch(cfg.batch_size, mesh)
        data_lib.checked_task(cfg)
  data_sharding = partitioning.data_sharding(mesh)
  # Built before the backbone so that data errors (a malformed file) come first.
  stream = data_lib.TrainStream(
      train_dataset_cfg, num_data_shards,
      data_lib.process_rows(data_sharding, train_dataset_cfg.batch_size),
      data_lib.process_spans(data_sharding, train_dataset_cfg.batch_size))
  tx = optimizer.tx
  replicated = partitioning.replicated(mesh)
  # The step is built from the run's layout, before any weight is read, and compiled on a
  # background thread while the checkpoint is read (`compile_ahead`).
  planned = run_setup.layout(
      config=model.config, prompt=model.prompt,
      feature_lengths=train_dataset_cfg.task_feature_lengths,
      trainable_regex=model.trainable_regex, mesh=mesh, frozen_dtype=model.frozen_dtype)
  # Before the slow start (the backbone, the compile), from metadata alone: the errors prepare
  # would raise (a vocabulary or INITIAL_CHECKPOINT_PATH of another model), then what the
  # newest checkpoint was written with.
  run_setup.check_sources(model.config, vocabulary, initial_checkpoint_path)
  if found:
    checkpointing.check_resumable(model_dir, found[0], state_lib.abstract_state(
        planned.trainable, state_lib.shardings_of(planned.trainable), tx, mesh), stream)
  if announce is not None:
    announce()
  batch_shapes = stream.batch_shapes()  # None: batches of several shapes (length buckets)
  reads_representations = (cache_representations and model.prompt is not None
                           and model.prompt.representation_pooling is not None)
  if not compile_ahead or reads_representations:  # (the cache adds a feature to the batch)
    batch_shapes = None
  step_fn, ahead = state_lib.step_compiled_ahead(
      run_setup.step_model(model.config, model.prompt, vocabulary), tx, planned.trainable,
      planned.frozen, mesh, batch_shapes, z_loss=z_loss,
      loss_normalizing_factor=loss_normalizing_factor,
      auxiliary_loss=methods.auxiliary_loss(model.prompt, model.config, vocabulary))
  try:
    run = run_setup.prepare(
        config=model.config, prompt=model.prompt,
        feature_lengths=train_dataset_cfg.task_feature_lengths,
        initial_checkpoint_path=initial_checkpoint_path, trainable_regex=model.trainable_regex,
        mesh=mesh, vocabulary=vocabulary, random_seed=random_seed,
        frozen_dtype=model.frozen_dtype, planned=planned,
        init_trainable=not found)  # a checkpoint to resume holds the prompt: no init traced
  finally:
    if ahead is not None:  # compiled while the checkpoint was read: the first step finds it
      ahead.wait()  # (and after an error no compile is left running behind it)

  backbone = run_setup.backbone_paths(model.config)  # not exported as .npy (full fine-tuning)
  mngr = checkpointing.manager(model_dir, period=checkpoint_period, keep=keep_checkpoints)
  # The newest intact checkpoint; with none, the prompt's init after all.
  run, state, restored = checkpointing.resume_or_initialise(mngr, model_dir, run, tx, mesh,
                                                            stream)
  position = _resumed(mngr, model_dir, restored, stream, backbone) if restored is not None else 0
  write_config(model_dir, restored.step if restored is not None else None)

  first_bad = guards.initial_flag(replicated)
  eval_step = jax.jit(
      state_lib.make_eval_step(run.model, z_loss=z_loss,
                               loss_normalizing_factor=loss_normalizing_factor),
      in_shardings=(run.trainable_shardings, run.frozen_shardings, data_sharding),
      out_shardings=replicated)
  dropout_rng = jax.device_put(jax.random.fold_in(jax.random.PRNGKey(random_seed), 1), replicated)

  train_writer = summaries.writer(model_dir, summaries.TRAIN_DIR)
  start = int(jax.device_get(state.step))
  summaries.log("trainable parameters: %d, frozen parameters: %d (%s); training steps %d -> %d",
                run_setup.count(run.trainable), run_setup.count(run.frozen),
                run_setup.count_by_dtype(run.frozen), start, total_steps)
  progress = summaries.Progress(start, total_steps, train_dataset_cfg.batch_size)
  final_metrics: Dict[str, float] = {}
  # The method's needs beyond the step (train/methods.py): IDPG's cached M(x), its summaries.
  rep_cache = (methods.representation_cache(model.prompt, run) if cache_representations
               else None)
  method_summaries = methods.summary_fn(model.prompt)

  evaluated_infer_cfg = infer_eval_dataset_cfg if infer_fn is not None else None

  def evaluate(step: int):
    results = _evaluate(step)
    # Both evaluations are written: a resume at `step` need not redo them.
    _record_evaluation(model_dir, _evaluation_record(step, train_eval_dataset_cfg,
                                                     evaluated_infer_cfg), results)
    return results

  def already_evaluated(step: int) -> Optional[Dict[str, float]]:
    """The recorded metrics of `step`'s evaluation (of the same tasks and splits), logged as
    not evaluated again; None when it was not recorded."""
    recorded = _recorded_metrics(model_dir, _evaluation_record(step, train_eval_dataset_cfg,
                                                               evaluated_infer_cfg))
    if recorded is not None:
      summaries.log("the evaluation of the restored step %d is already recorded (%s, in %s): "
                    "not evaluated again", step, os.path.join(model_dir, EVALUATED_FILE),
                    " and ".join(os.path.join(model_dir, d) for d, cfg in (
                        (summaries.TRAINING_EVAL_DIR, train_eval_dataset_cfg),
                        (summaries.INFERENCE_EVAL_DIR, evaluated_infer_cfg)) if cfg is not None))
    return recorded

  def _evaluate(step: int):
    results = {}
    if train_eval_dataset_cfg is not None:
      run.trainable = state.params
      tf_metrics = teacher_forced_eval(run, eval_step, train_eval_dataset_cfg, eval_steps)
      summaries.writer(model_dir, summaries.TRAINING_EVAL_DIR,
                       train_eval_dataset_cfg.mixture_or_task_name).write_scalars(
                           step, {f"eval/{k}": v for k, v in tf_metrics.items()})
      summaries.log("training_eval step %d: %s", step,
                    " ".join(f"{k} {v:.4f}" for k, v in tf_metrics.items()))
      results.update({f"training_eval/{k}": v for k, v in tf_metrics.items()})
    if infer_eval_dataset_cfg is not None and infer_fn is not None:
      run.trainable = state.params
      infer_metrics = infer_fn(run, infer_eval_dataset_cfg, model_dir, step)
      summaries.log("inference_eval step %d: %s", step,
                    " ".join(f"{k} {v:.4f}" for k, v in infer_metrics.items()))
      results.update({f"inference_eval/{k}": v for k, v in infer_metrics.items()})
    return results

  def save(done: int) -> None:
    """Checks for non-finite values, then saves the checkpoint and the .npy export."""
    guards.check_finite(first_bad, done, lambda: _last_good(model_dir),
                        lambda: checkpointing.all_finite(state.params))
    _write_checkpoint(mngr, model_dir, done, state, position, stream, backbone,
                      keep=keep_checkpoints)

  buckets = _BucketPrograms(stream.buckets)
  watch = guards.PreemptionWatch().install()  # SIGTERM, Ctrl-C: save after a step
  try:  # an exception leaves no handler behind (a notebook's Ctrl-C would be swallowed)
    evaluated_first = False
    if eval_before_training and start == 0:
      evaluate(0)
      evaluated_first = True
    elif eval_period and 0 < start < total_steps and start % eval_period == 0:
      # The run that saved `start` may have stopped (killed, preempted) before or during its
      # evaluation, which no later step would redo: evaluate it now, unless its evaluation (of the
      # same tasks and splits) finished and was recorded.
      if already_evaluated(start) is None:
        summaries.log("evaluating the restored step %d (its run may have stopped before its "
                      "evaluation finished)", start)
        evaluate(start)
        evaluated_first = True
    if evaluated_first and start < total_steps and watch.requested(start):  # (during it)
      _stop_before_training(watch, start, model_dir)
    for step in range(start, total_steps):
      local = next(stream)
      if model.prompt is not None:
        model.prompt.check_batch(local)  # e.g. multi-task prompts: task_ids within NUM_TASKS
      if rep_cache is not None:
        local = rep_cache.add_to(local)
      batch = global_batch(local, data_sharding, train_dataset_cfg.batch_size)
      new_bucket = buckets.new_shape(batch)  # length buckets: a program to compile now
      began = time.perf_counter()
      with partitioning.axis_rules(mesh):
        state, metrics, first_bad = step_fn(state, run.frozen, batch, dropout_rng, first_bad)
      position += 1
      done = step + 1
      if step == start:  # the wait a user sees before training (one sync, on this step only)
        jax.block_until_ready(metrics)
        summaries.log(startup.first_step_done())
        train_writer.write_scalars(done, startup.scalars())
        progress.start(done)  # steps/s and the ETA leave out start-up and the compile
      elif new_bucket:  # a pause the steps/s would show unexplained (one sync, on this step only)
        jax.block_until_ready(metrics)
        summaries.log(buckets.line(done, batch, time.perf_counter() - began))
      last = done == total_steps
      if done % stats_period == 0 or last:
        guards.check_finite(first_bad, done, lambda: _last_good(model_dir))
        host = {k: float(v) for k, v in jax.device_get(metrics).items()}
        lr = float(optimizer.schedule(step))
        line = progress.line(done, host, lr)
        summaries.log(line)
        sps = progress.steps_per_sec
        timing = summaries.Progress.timing(sps, train_dataset_cfg.batch_size)
        train_writer.write_scalars(done, {**{f"train/{k}": v for k, v in host.items()},
                                          **(method_summaries(state.params)
                                             if method_summaries else {}),
                                          "learning_rate": lr,
                                          "data/real_token_share": stream.real_token_share,
                                          **timing})
      saving = done % checkpoint_period == 0 or last or done == stop_after_step
      if saving:
        save(done)
      if watch.requested(done):
        _stop_preempted(watch, save, done, saved=saving, model_dir=model_dir, mngr=mngr)
      if eval_period and (done % eval_period == 0 or last):
        try:
          final_metrics = evaluate(done)
        except Exception:  # pylint: disable=broad-except  (a damaged eval file, a full disk)
          if not saving:  # the steps since the last checkpoint are not lost with the run
            _save_before_failing(save, done, model_dir, mngr)
          raise
        if final_metrics:  # and evaluations (which waited for the steps so far)
          progress.start(done)
        if not last and watch.requested(done):  # SIGTERM during the evaluation: stop now
          _stop_preempted(watch, save, done, saved=saving, model_dir=model_dir, mngr=mngr)
      if stop_after_step is not None and done == stop_after_step:
        break
    else:
      if start >= total_steps:  # a finished run: its final evaluation, once
        recorded = already_evaluated(start)
        final_metrics = evaluate(start) if recorded is None else recorded
  finally:
    watch.uninstall()
  mngr.wait_until_finished()
  mngr.close()
  train_writer.flush()
  run.trainable = state.params
  if return_state:
    return final_metrics, run, state
  return final_metrics


# ===== Reliability: checks, resume, save, preemption (README "When things go wrong") =====

def _check_run_values(model_dir: Any, total_steps: Any, *, checkpoint_period: Any = 1,
                      stats_period: Any = 1, keep_checkpoints: Any = None,
                      eval_period: Any = 0, random_seed: Any = 0,
                      writable: bool = True) -> None:
  """Values checked before any compilation, data loading or writing (`writable`: and that
  MODEL_DIR can be written)."""
  if not isinstance(model_dir, str) or not model_dir:
    raise ConfigError(f"MODEL_DIR must be a directory path string, got {model_dir!r}")
  check_integer(random_seed, "RANDOM_SEED")
  check_integer(total_steps, "TRAIN_STEPS", 1)
  check_integer(checkpoint_period, "CHECKPOINT_PERIOD", 1)
  check_integer(stats_period, "prompt_jax.train.stats_period", 1)
  check_integer(eval_period, "EVAL_PERIOD", 0, " (0: no evaluation during training)")
  # (0 would have orbax delete each checkpoint as it is written)
  check_integer(keep_checkpoints, "KEEP_CHECKPOINTS", 1, " or None (keep them all)", none_ok=True)
  if writable:
    checkpointing.check_writable(model_dir)


def _resumed(mngr, model_dir: str, restored: checkpointing.Restored,
             stream: data_lib.TrainStream, backbone) -> int:
  """The data position of the `restored` checkpoint, after positioning `stream`, moving broken
  newer checkpoints aside and re-exporting a missing .npy."""
  checkpointing.quarantine(mngr, model_dir, restored.broken)
  if not restored.data_restored and restored.position:
    summaries.log("replaying %d batches of training data (checkpoint %d has no data "
                  "iterator state)", restored.position, restored.step)
    stream.restart(skip=restored.position)
  summaries.log("restored step %d from %s", restored.step,
                checkpointing.checkpoints_dir(model_dir))
  if not checkpointing.exported(model_dir, restored.step):  # killed between save and export
    checkpointing.export_numpy(model_dir, restored.step, restored.state.params, exclude=backbone)
  return restored.position


class _BucketPrograms:
  """With length buckets, which batch shapes the step has met: a new one compiles a program in
  the loop, whose wait `train` logs ('step 40: a new length bucket (inputs 24, targets 8):
  compiled and ran in 3.2 s; 2 of at most 4 programs')."""

  def __init__(self, buckets: Optional[Mapping[str, Any]]):
    self.buckets = buckets
    self.seen = set()
    self.most = math.prod(len(lengths) for lengths in buckets.values()) if buckets else 0

  def new_shape(self, batch: Mapping[str, Any]) -> bool:
    if self.buckets is None:
      return False
    shape = state_lib.batch_shape(batch)
    if shape in self.seen:
      return False
    self.seen.add(shape)
    return True

  def line(self, step: int, batch: Mapping[str, Any], seconds: float) -> str:
    lengths = {"inputs": batch["encoder_input_tokens"].shape[1],
               "targets": batch["decoder_target_tokens"].shape[1]}
    return (f"step {step}: a new length bucket (inputs {lengths['inputs']}, targets "
            f"{lengths['targets']}): compiled and ran in {seconds:.1f} s; {len(self.seen)} of at "
            f"most {self.most} programs")


def _last_good(model_dir: str) -> Optional[str]:
  found = checkpointing.steps(model_dir)
  return checkpointing.step_dir(model_dir, found[0]) if found else None


def _write_checkpoint(mngr, model_dir: str, step: int, state: state_lib.TrainState,
                      position: int, stream: data_lib.TrainStream, backbone,
                      keep: Optional[int] = None) -> None:
  """Checkpoint + .npy export of `step`; a failed write (disk full, permissions) stops the run
  with one line saying what is kept. A checkpoint written whose old ones could not be deleted
  (KEEP_CHECKPOINTS) is exported and the run goes on, with a warning."""
  existed = step in checkpointing.steps(model_dir)
  try:
    checkpointing.save(mngr, step, state, position, force=True, stream=stream)
  except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many kinds)
    if not existed and step in checkpointing.steps(model_dir):  # written; the clean-up failed
      old = checkpointing.steps(model_dir)[keep:] if keep else []
      logging.warning("checkpoint %d saved; could not delete the old checkpoint%s (%s): delete "
                      "it by hand if space runs short", step,
                      (" " + ", ".join(str(s) for s in sorted(old))) if old else "",
                      checkpointing.reason(e))
    else:
      _raise_write_failure(model_dir, step, e)
  try:
    checkpointing.export_numpy(model_dir, step, state.params, exclude=backbone)
  except Exception as e:  # pylint: disable=broad-except
    _raise_write_failure(model_dir, step, e)


def _raise_write_failure(model_dir: str, step: int, e: Exception) -> None:
  if not checkpointing.is_write_failure(e):
    raise e
  last = _last_good(model_dir)
  raise RunError(
      f"cannot write checkpoint {step} to {model_dir} ({checkpointing.reason(e)}); "
      + (f"{last} is intact" if last else "no checkpoint was written")
      + ": free space or fix permissions, then run the same command to resume") from e


def _save_before_failing(save: Callable[[int], None], step: int, model_dir: str, mngr) -> None:
  """The evaluation of `step` failed: saves its checkpoint first (a validation file damaged at
  line 41 lost every step since the last checkpoint), then the caller re-raises the error."""
  try:
    save(step)
    mngr.wait_until_finished()
  except Exception:  # pylint: disable=broad-except  (the evaluation's error is the one to show)
    return
  summaries.log("the evaluation of step %d failed: saved %s first; once fixed, run the same "
                "command to continue from it", step, checkpointing.step_dir(model_dir, step))


def _stop_before_training(watch: guards.PreemptionWatch, start: int, model_dir: str) -> None:
  """Asked to stop during the evaluation before the first step: no step to train first (it
  trained one, compiling the step, then saved and stopped). Step `start`'s checkpoint is there
  already (0: nothing is trained yet)."""
  watch.uninstall()
  what = "interrupted (Ctrl-C)" if watch.by == "Ctrl-C" else "preempted (SIGTERM)"
  where = (f"{checkpointing.step_dir(model_dir, start)} is the checkpoint to resume from" if start
           else "nothing was trained yet")
  raise Preempted(f"{what} at step {start}, before training: {where}; run the same command to "
                  f"{'resume' if start else 'start again'}", start,
                  interrupted=watch.by == "Ctrl-C")


def _stop_preempted(watch: guards.PreemptionWatch, save: Callable[[int], None], step: int, *,
                    saved: bool, model_dir: str, mngr) -> None:
  if not saved:
    save(step)
  mngr.wait_until_finished()
  watch.uninstall()
  what = "interrupted (Ctrl-C)" if watch.by == "Ctrl-C" else "preempted (SIGTERM)"
  raise Preempted(f"{what} at step {step}: saved {checkpointing.step_dir(model_dir, step)}; "
                  f"run the same command to resume", step, interrupted=watch.by == "Ctrl-C")
