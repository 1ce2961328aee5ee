"""Predictions for seqio: greedy decoding (KV cache) or rank classification over a label set.

`predict_tokens(run, batches)` returns one token list per example; rank classification scores
each label text as the target (teacher forced, summed log-likelihood) and predicts the best, so
the task's postprocessor and metrics apply unchanged.
"""
import functools
import os
from typing import Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import seqio

from prompt_jax import partitioning
from prompt_jax import trees
from prompt_jax.models import decoding
from prompt_jax.train import data as data_lib
from prompt_jax.train import summaries

_EVALUATORS: Dict[tuple, seqio.Evaluator] = {}


def label_set(task_name: str) -> Optional[List[str]]:
  """The task's declared label texts, or None (decode instead)."""
  try:
    from prompt_jax.tasks import registration  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  labels = registration.registered_label_set(task_name)
  return list(labels) if labels else None


@functools.partial(jax.jit, static_argnames=("model",))
def _score(model, params, encoder_input_tokens, targets):
  """Summed log-likelihood [B] of `targets` [B, L] given the inputs."""
  decoder_inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))  # shift right, BOS = 0
  logits = model.apply({"params": params}, encoder_input_tokens, decoder_inputs, targets,
                       enable_dropout=False).astype(jnp.float32)  # [B, L, V]
  logp = jax.nn.log_softmax(logits)
  token = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [B, L]
  return jnp.sum(token * (targets > 0), axis=-1)


def _label_tokens(labels: Sequence[str], vocabulary) -> np.ndarray:
  ids = [list(vocabulary.encode(l)) + [1] for l in labels]  # + EOS
  width = max(len(i) for i in ids)
  return np.array([i + [0] * (width - len(i)) for i in ids], np.int32)  # [C, L]


def _local_rows(x: np.ndarray) -> np.ndarray:
  n = x.shape[0] // jax.process_count()
  return x[jax.process_index() * n:(jax.process_index() + 1) * n]


def _gather(x) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def predict_tokens(run, encoder_inputs: np.ndarray, *, batch_size: int, max_decode_length: int,
                   labels: Optional[Sequence[str]] = None, vocabulary=None,
                   progress: Optional[str] = None) -> List[List[int]]:
  """Predicted target tokens for every row of `encoder_inputs` [N, T] (same on all processes).

  `progress`: a label; long work then logs 'label: n/N examples ... ETA' lines.
  """
  params = trees.merge(run.trainable, run.frozen)
  sharding = partitioning.data_sharding(run.mesh)
  label_ids = _label_tokens(labels, vocabulary) if labels else None
  out: List[List[int]] = []
  meter = summaries.Meter(progress, encoder_inputs.shape[0]) if progress else None
  for begin in range(0, encoder_inputs.shape[0], batch_size):
    chunk = encoder_inputs[begin:begin + batch_size]
    n = chunk.shape[0]
    padded = np.zeros((batch_size,) + chunk.shape[1:], np.int32)
    padded[:n] = chunk
    enc = jax.make_array_from_process_local_data(sharding, _local_rows(padded))
    with partitioning.axis_rules(run.mesh):
      if label_ids is None:
        tokens = _gather(decoding.greedy_decode(run.model, params, enc, max_decode_length))
        for row in tokens[:n]:
          row = list(row)
          out.append(row[:row.index(1)] if 1 in row else [t for t in row if t])
      else:
        scores = []
        for c in range(label_ids.shape[0]):
          tgt = np.tile(label_ids[c][None], (batch_size, 1))
          tgt = jax.make_array_from_process_local_data(sharding, _local_rows(tgt))
          scores.append(_gather(_score(run.model, params, enc, tgt)))
        best = np.argmax(np.stack(scores, axis=-1), axis=-1)  # [B]
        for b in best[:n]:
          row = list(label_ids[b])
          out.append(row[:row.index(1)])
    if meter is not None:
      meter.update(len(out))
  return out


def _evaluator(cfg: data_lib.DatasetConfig, log_dir: Optional[str]) -> seqio.Evaluator:
  key = (cfg.mixture_or_task_name, cfg.split, tuple(sorted(cfg.task_feature_lengths.items())),
         log_dir)
  if key not in _EVALUATORS:
    data_lib.import_task_module(cfg.module)
    loggers = [seqio.TensorBoardLogger] if log_dir and jax.process_index() == 0 else []
    _EVALUATORS[key] = seqio.Evaluator(
        cfg.mixture_or_task_name, seqio.EncDecFeatureConverter(pack=False),
        eval_split=cfg.split, use_cached=cfg.use_cached, seed=cfg.seed,
        sequence_length=dict(cfg.task_feature_lengths), logger_cls=loggers, log_dir=log_dir,
        async_compute_metrics=False)
  return _EVALUATORS[key]


def _as_float(value) -> float:
  return float(getattr(value, "value", value))


def evaluate(run, cfg: data_lib.DatasetConfig, model_dir: Optional[str], step: int,
             rank_classification: Optional[bool] = None) -> Dict[str, float]:
  """seqio.Evaluator metrics of the task(s) of `cfg` (rank classification if labels exist)."""
  log_dir = os.path.join(model_dir, summaries.INFERENCE_EVAL_DIR) if model_dir else None
  evaluator = _evaluator(cfg, log_dir)
  max_decode_length = cfg.task_feature_lengths["targets"]

  def predict_fn(ds) -> List:
    examples = list(ds.as_numpy_iterator())
    indices = [i for i, _ in examples]
    inputs = np.stack([ex["encoder_input_tokens"] for _, ex in examples])
    task_name = evaluator.eval_tasks[0].name if len(evaluator.eval_tasks) == 1 else None
    labels = None
    if rank_classification is not False and task_name:
      labels = label_set(task_name)
    vocabulary = evaluator.eval_tasks[0].output_features["targets"].vocabulary
    tokens = predict_tokens(run, inputs, batch_size=cfg.batch_size,
                            max_decode_length=max_decode_length, labels=labels,
                            vocabulary=vocabulary, progress="eval")
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
