"""Predictions for seqio: greedy or beam-search decoding (KV cache), or rank classification.

`predict_tokens(run, encoder_inputs, ...)` returns one token list per example: tasks with a label
set are rank-classified (each label text scored as the target, teacher forced, summed
log-likelihood; the best predicted, so the task's postprocessor and metrics apply unchanged; a
`_sentinel` task's candidates start with <extra_id_0>, as its training targets do),
others are decoded as `DecodingConfig` says (gin: `prompt_jax.decoding_config.method = 'beam'`,
`.beam_size`, `.alpha`; see gin/decoding/beam.gin). The encoder runs once per example in every
case. The row-level pieces (`label_scores`, `decode_rows`) take any [N, T] rows, e.g. examples x
prompts of an ensemble, and return arrays over those rows.
"""
import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import gin
import jax
import numpy as np
import seqio

from prompt_jax import partitioning
from prompt_jax import trees
from prompt_jax.errors import ConfigError
from prompt_jax.models import decoding
from prompt_jax.models.decoding import DecodingConfig
from prompt_jax.train import data as data_lib
from prompt_jax.train import summaries

_EVALUATORS: Dict[tuple, seqio.Evaluator] = {}
EOS_ID = 1


@gin.configurable(module="prompt_jax")
def decoding_config(method: str = "greedy", beam_size: int = 4,
                    alpha: float = 0.6) -> DecodingConfig:
  """The gin-configured decoding of eval, infer and training's inference evaluation."""
  return DecodingConfig(method=method, beam_size=beam_size, alpha=alpha)


def label_set(task_name: str) -> Optional[Sequence[str]]:
  """The task's declared label texts (`registration.LabelSet`: a tuple with `.sentinel`), or
  None (decode instead)."""
  try:
    from prompt_jax.tasks import registration  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return registration.registered_label_set(task_name) or None


def label_tokens(labels: Sequence[str], vocabulary,
                 sentinel: Optional[bool] = None) -> np.ndarray:
  """[C, L] token ids of each label text + EOS, 0-padded: the targets the task trains on.

  `sentinel` (default: `labels.sentinel`, as `label_set` returns it, else False): each
  candidate starts with <extra_id_0>, the vocabulary's last id, as `add_sentinel_to_targets`
  puts it in front of a `_sentinel` task's targets.
  """
  if sentinel is None:
    sentinel = getattr(labels, "sentinel", False)
  prefix = [vocabulary.vocab_size - 1] if sentinel else []
  ids = [prefix + list(vocabulary.encode(l)) + [EOS_ID] for l in labels]
  width = max(len(i) for i in ids)
  return np.array([i + [0] * (width - len(i)) for i in ids], np.int32)


def _global_rows(sharding, x: np.ndarray) -> jax.Array:
  """[B, ...] rows, the same on every process -> a global array on `sharding` (the `data`
  sharding): each process feeds the rows its devices hold (`data_lib.process_rows`, as in
  training), so processes that share rows (a `model` axis across processes) feed the same."""
  start, stop = data_lib.process_rows(sharding, x.shape[0])
  return jax.make_array_from_process_local_data(sharding, x[start:stop], x.shape)


def _batches(run, encoder_inputs: np.ndarray, batch_size: int,
             progress: Optional[str] = None, task_ids: Optional[np.ndarray] = None
             ) -> Iterator[Tuple[int, jax.Array, Optional[jax.Array]]]:
  """(rows in this batch, [batch_size, T'] global array on the data axis, the rows' task ids
  [batch_size] or None) per batch of rows.
  `progress`: a label; long work then logs 'label: n/N examples ... ETA' lines.
  With `prompt_jax.length_buckets.num_buckets` > 0 (as in training), each batch's inputs are cut
  to the smallest of the fixed lengths of `data.bucket_lengths(T, ...)` that holds its longest row
  (T' <= T; trailing padding only, the prompt is added by the model after the cut), so short
  examples are not run at TASK_FEATURE_LENGTHS and jit compiles at most num_buckets programs.
  `encoder_inputs` is the same on every process, so all agree on the cut."""
  sharding = partitioning.data_sharding(run.mesh)
  meter = summaries.Meter(progress, encoder_inputs.shape[0]) if progress else None
  num_buckets, multiple = data_lib.length_buckets()
  buckets = (data_lib.bucket_lengths(encoder_inputs.shape[1], num_buckets, multiple)
             if num_buckets and encoder_inputs.ndim == 2 else None)

  def global_rows(x, begin, cut=None):
    chunk = x[begin:begin + batch_size]
    if cut is not None:
      chunk = chunk[:, :cut]
    padded = np.zeros((batch_size,) + chunk.shape[1:], np.int32)
    padded[:chunk.shape[0]] = chunk
    return chunk.shape[0], _global_rows(sharding, padded)

  for begin in range(0, encoder_inputs.shape[0], batch_size):
    cut = None
    if buckets is not None:
      cut = data_lib.bucket_for(data_lib.used_length(encoder_inputs[begin:begin + batch_size]),
                                buckets)
    n, enc = global_rows(encoder_inputs, begin, cut)
    ids = None if task_ids is None else global_rows(np.asarray(task_ids), begin)[1]
    yield n, enc, ids
    if meter is not None:
      meter.update(begin + n)


def label_scores(run, encoder_inputs: np.ndarray, label_ids: np.ndarray, *,
                 batch_size: int, progress: Optional[str] = None,
                 task_ids: Optional[np.ndarray] = None) -> np.ndarray:
  """[N, C] summed log-likelihood of each label [C, L] (from `label_tokens`) for every row of
  `encoder_inputs` [N, T]; the encoder runs once per row (same on all processes)."""
  params = trees.merge(run.trainable, run.frozen)
  out = []
  with partitioning.axis_rules(run.mesh):
    for n, enc, ids in _batches(run, encoder_inputs, batch_size, progress, task_ids):
      out.append(partitioning.to_host(decoding.score_targets(run.model, params, enc, label_ids,
                                                task_ids=ids))[:n])
  return np.concatenate(out) if out else np.zeros((0, label_ids.shape[0]), np.float32)


def decode_rows(run, encoder_inputs: np.ndarray, *, batch_size: int, max_decode_length: int,
                decoding_cfg: Optional[DecodingConfig] = None, progress: Optional[str] = None,
                task_ids: Optional[np.ndarray] = None, eos_id: int = EOS_ID
                ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
  """Decoded tokens [N, max_decode_length] (EOS, then 0) of every row of `encoder_inputs`
  [N, T], and for beam search the best beam's score [N] (None for greedy). `task_ids` [N]:
  each row's task (multi-task prompts). `eos_id=-1` decodes max_decode_length tokens whatever
  comes (bench: the same work on every side)."""
  cfg = decoding_cfg or DecodingConfig()
  params = trees.merge(run.trainable, run.frozen)
  tokens, scores = [], []
  with partitioning.axis_rules(run.mesh):
    for n, enc, ids in _batches(run, encoder_inputs, batch_size, progress, task_ids):
      if cfg.method == "beam":
        beams, beam_scores = decoding.beam_decode(run.model, params, enc, max_decode_length,
                                                  beam_size=cfg.beam_size, alpha=cfg.alpha,
                                                  eos_id=eos_id, task_ids=ids)
        tokens.append(partitioning.to_host(beams)[:n, 0])
        scores.append(partitioning.to_host(beam_scores)[:n, 0])
      else:
        tokens.append(partitioning.to_host(decoding.greedy_decode(run.model, params, enc, max_decode_length,
                                                     eos_id=eos_id, task_ids=ids))[:n])
  empty = np.zeros((0, max_decode_length), np.int32)
  return (np.concatenate(tokens) if tokens else empty,
          np.concatenate(scores) if scores else None)


def until_eos(row) -> List[int]:
  """A decoded row (or label ids) up to its EOS, else its non-padding tokens."""
  row = [int(t) for t in row]
  return row[:row.index(EOS_ID)] if EOS_ID in row else [t for t in row if t]


def predict_tokens(run, encoder_inputs: np.ndarray, *, batch_size: int, max_decode_length: int,
                   labels: Optional[Sequence[str]] = None, vocabulary=None,
                   decoding_cfg: Optional[DecodingConfig] = None,
                   progress: Optional[str] = None,
                   task_ids: Optional[np.ndarray] = None) -> List[List[int]]:
  """Predicted target tokens (without EOS) for every row of `encoder_inputs` [N, T]: the best
  label when `labels` are given (rank classification), else decoded by `decoding_cfg` (default
  greedy). Same on all processes. `progress`: a label for progress lines on long work.
  `task_ids` [N]: each row's task (multi-task prompts), or None."""
  if labels:
    label_ids = label_tokens(labels, vocabulary)  # [C, L]
    best = np.argmax(label_scores(run, encoder_inputs, label_ids, batch_size=batch_size,
                                  progress=progress, task_ids=task_ids), -1)
    return [until_eos(label_ids[b]) for b in best]
  tokens, _ = decode_rows(run, encoder_inputs, batch_size=batch_size,
                          max_decode_length=max_decode_length, decoding_cfg=decoding_cfg,
                          progress=progress, task_ids=task_ids)
  return [until_eos(row) for row in tokens]


def mixture_task_name(mixture_name: str, task_id: int,
                      task_names: Sequence[str]) -> Optional[str]:
  """The name, among `task_names`, of a multi-task mixture's copy of its `task_id`-th task
  (tasks/multitask.py `copy_name`: its labels are its task's), or None if not exactly one."""
  prefix = f"{mixture_name}__{task_id}_"
  named = [n for n in task_names if n.startswith(prefix)]
  return named[0] if len(named) == 1 else None


def _evaluator(cfg: data_lib.DatasetConfig, log_dir: Optional[str]) -> seqio.Evaluator:
  key = (cfg.mixture_or_task_name, cfg.module, cfg.split, cfg.use_cached, cfg.seed,
         tuple(sorted(cfg.task_feature_lengths.items())), log_dir)  # all the evaluator reads
  if key not in _EVALUATORS:
    data_lib.import_task_module(cfg.module)
    loggers = [seqio.TensorBoardLogger] if log_dir and jax.process_index() == 0 else []
    with data_lib.user_data_errors():  # the Evaluator reads the split: a missing file, one line
      _EVALUATORS[key] = seqio.Evaluator(
          cfg.mixture_or_task_name, data_lib.EncDecFeatureConverter(pack=False),
          eval_split=cfg.split, use_cached=cfg.use_cached, seed=cfg.seed,
          sequence_length=dict(cfg.task_feature_lengths), logger_cls=loggers, log_dir=log_dir,
          async_compute_metrics=False)
  return _EVALUATORS[key]


def no_examples(task_name: str, split: str) -> ConfigError:
  """The one-line error of a task split that yields no examples (an empty data file, or a
  filter that drops every row): seqio would evaluate nothing and report no metrics."""
  return ConfigError(f"task {task_name}'s split {split!r} has no examples: check its data "
                     f"files (empty, or every row filtered out), or name a split that has rows "
                     f"(EVAL_SPLIT)")


def check_examples(evaluator: seqio.Evaluator, split: str) -> None:
  """`no_examples` for the first of the evaluator's tasks whose split has no rows (read from
  its cache, before anything is predicted or written)."""
  for task in evaluator.eval_tasks:
    ds = evaluator.cached_model_datasets.get(task.name)
    if ds is None or not list(ds.take(1).as_numpy_iterator()):
      raise no_examples(task.name, split)


def _as_float(value) -> float:
  return float(getattr(value, "value", value))


def evaluate(run, cfg: data_lib.DatasetConfig, model_dir: Optional[str], step: int,
             rank_classification: Optional[bool] = None,
             decoding_cfg: Optional[DecodingConfig] = None,
             log_dir: Optional[str] = None) -> Dict[str, float]:
  """seqio.Evaluator metrics of the task(s) of `cfg` (rank classification if labels exist, else
  decoding by `decoding_cfg`, default the gin-configured `decoding_config()`), logged to
  TensorBoard under MODEL_DIR/`log_dir` (default inference_eval, training's curve)."""
  decoding_cfg = decoding_cfg or decoding_config()
  log_dir = (os.path.join(model_dir, log_dir or summaries.INFERENCE_EVAL_DIR) if model_dir
             else None)
  evaluator = _evaluator(cfg, log_dir)
  check_examples(evaluator, cfg.split)
  max_decode_length = cfg.task_feature_lengths["targets"]

  def predict_fn(ds) -> List:
    examples = list(ds.as_numpy_iterator())
    indices = [i for i, _ in examples]
    inputs = np.stack([ex["encoder_input_tokens"] for _, ex in examples])
    # seqio passes each task's cached dataset in turn: that names the task, in a mixture too
    # (whose labelled tasks are then rank-classified like the task alone).
    task_name = next((name for name, cached in evaluator.cached_model_datasets.items()
                      if cached is ds), None)
    if task_name is None and len(evaluator.eval_tasks) == 1:
      task_name = evaluator.eval_tasks[0].name
    task_ids = None  # each example's task (a multi-task mixture's data)
    if examples and data_lib.TASK_IDS in examples[0][1]:
      task_ids = np.stack([ex[data_lib.TASK_IDS] for _, ex in examples])
      # seqio evaluates a mixture one task at a time: the ids name the mixture's task copy
      # (tasks/multitask.py `copy_name`), whose labels are its task's.
      named = mixture_task_name(cfg.mixture_or_task_name, int(task_ids[0]),
                                [t.name for t in evaluator.eval_tasks])
      if len(set(task_ids.tolist())) == 1 and named:
        task_name = named
    labels = None
    if rank_classification is not False and task_name:
      labels = label_set(task_name)
    vocabulary = evaluator.eval_tasks[0].output_features["targets"].vocabulary
    tokens = predict_tokens(run, inputs, batch_size=cfg.batch_size,
                            max_decode_length=max_decode_length, labels=labels,
                            vocabulary=vocabulary, decoding_cfg=decoding_cfg, progress="eval",
                            task_ids=task_ids)
    return list(zip(indices, tokens))

  all_metrics, _ = evaluator.evaluate(compute_metrics=jax.process_index() == 0, step=step,
                                      predict_fn=predict_fn)
  if hasattr(all_metrics, "result"):
    all_metrics = all_metrics.result()
  flat = {}
  for task_name, metrics in (all_metrics or {}).items():
    for name, value in metrics.items():
      try:
        flat[f"{task_name}/{name}"] = _as_float(value)
      except (TypeError, ValueError):
        pass
  return flat
