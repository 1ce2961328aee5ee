"""`prompt-jax eval` and `prompt-jax infer`: a trained prompt on a task's split.

The prompt comes from CHECKPOINT_PATH (a `MODEL_DIR/checkpoints/<step>` dir), else the latest
checkpoint in MODEL_DIR, else PROMPT_FILE (.npy) with the frozen INITIAL_CHECKPOINT_PATH.
"""
import json
import os
from typing import Dict, Optional

import gin
import jax
import numpy as np
import orbax.checkpoint as ocp

from prompt_jax import partitioning
from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.errors import ConfigError
from prompt_jax.evaluation import inference
from prompt_jax.prompts import specs
from prompt_jax.train import checkpointing
from prompt_jax.train import data as data_lib
from prompt_jax.train import summaries


def _checkpoint_params(path: str) -> Dict[str, np.ndarray]:
  state_dir = path if os.path.basename(path.rstrip("/")) == "state" else os.path.join(path, "state")
  if not os.path.isdir(state_dir):
    raise ConfigError(f"CHECKPOINT_PATH {path!r} is not a prompt_jax checkpoint "
                      f"(no {state_dir})")
  restored = ocp.StandardCheckpointer().restore(os.path.abspath(state_dir))
  return trees.flatten(restored["params"])


def load_run(model_dir: Optional[str], dataset_cfg: data_lib.DatasetConfig,
             initial_checkpoint_path: Optional[str], checkpoint_path: Optional[str],
             prompt_file: Optional[str], num_partitions: int,
             model: Optional[run_setup.ModelSpec]) -> run_setup.Run:
  """The frozen backbone + the trained parameters, placed on a mesh."""
  model = model or run_setup.model_spec()
  mesh = partitioning.create_mesh(num_partitions)
  run_setup.check_batch(dataset_cfg.batch_size, mesh)
  task = data_lib.get_task(dataset_cfg.mixture_or_task_name, dataset_cfg.module)
  data_lib.check_split(task, dataset_cfg.split)
  if not checkpoint_path and model_dir and not prompt_file:
    latest = checkpointing.latest_step(model_dir)
    if latest is not None:
      checkpoint_path = os.path.join(checkpointing.checkpoints_dir(model_dir), str(latest))
  if not checkpoint_path and not prompt_file and model.prompt is not None:
    raise ConfigError("nothing to evaluate: set CHECKPOINT_PATH or PROMPT_FILE, or point "
                      "MODEL_DIR at a trained run")
  prompt = model.prompt
  if prompt_file and prompt is not None:
    prompt = specs.from_prompt_file(prompt, prompt_file)
  run = run_setup.prepare(
      config=model.config, prompt=prompt, feature_lengths=dataset_cfg.task_feature_lengths,
      initial_checkpoint_path=initial_checkpoint_path, trainable_regex=model.trainable_regex,
      mesh=mesh, vocabulary=task.output_features["targets"].vocabulary,
      frozen_dtype=model.frozen_dtype)
  if checkpoint_path:
    saved = _checkpoint_params(checkpoint_path)
    current = trees.flatten(run.trainable)
    shardings = trees.flatten(run.trainable_shardings)
    for name, value in current.items():
      if name not in saved or tuple(saved[name].shape) != tuple(value.shape):
        raise ConfigError(f"checkpoint {checkpoint_path!r} has no parameter {name} of shape "
                          f"{tuple(value.shape)}")
      current[name] = jax.device_put(np.asarray(saved[name]), shardings[name])
    run.trainable = trees.unflatten(current)
  return run


@gin.configurable(module="prompt_jax")
def evaluate(*, model_dir: Optional[str] = None,
             dataset_cfg: data_lib.DatasetConfig = gin.REQUIRED,
             initial_checkpoint_path: Optional[str] = None, checkpoint_path: Optional[str] = None,
             prompt_file: Optional[str] = None, num_partitions: int = 1,
             model: Optional[run_setup.ModelSpec] = None) -> Dict[str, float]:
  """seqio.Evaluator metrics (rank classification when the task declares its labels)."""
  run = load_run(model_dir, dataset_cfg, initial_checkpoint_path, checkpoint_path,
                 prompt_file, num_partitions, model)
  metrics = inference.evaluate(run, dataset_cfg, model_dir, step=0)
  summaries.log("eval: %s", " ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())))
  return metrics


@gin.configurable(module="prompt_jax")
def infer(*, model_dir: str = gin.REQUIRED,
          dataset_cfg: data_lib.DatasetConfig = gin.REQUIRED,
          initial_checkpoint_path: Optional[str] = None, checkpoint_path: Optional[str] = None,
          prompt_file: Optional[str] = None, num_partitions: int = 1,
          model: Optional[run_setup.ModelSpec] = None) -> str:
  """Writes MODEL_DIR/inference/<task>-<split>.jsonl: {"inputs", "prediction", "targets"}."""
  run = load_run(model_dir, dataset_cfg, initial_checkpoint_path, checkpoint_path,
                 prompt_file, num_partitions, model)
  task = data_lib.get_task(dataset_cfg.mixture_or_task_name, dataset_cfg.module)
  vocabulary = task.output_features["targets"].vocabulary
  ds = data_lib.get_dataset(dataset_cfg, num_epochs=1, shard_id=0, num_shards=1,
                            drop_remainder=False).unbatch()
  examples = list(ds.as_numpy_iterator())
  inputs = np.stack([ex["encoder_input_tokens"] for ex in examples])
  labels = inference.label_set(task.name)
  tokens = inference.predict_tokens(run, inputs, batch_size=dataset_cfg.batch_size,
                                    max_decode_length=dataset_cfg.task_feature_lengths["targets"],
                                    labels=labels, vocabulary=vocabulary)
  out = os.path.join(model_dir, "inference", f"{task.name}-{dataset_cfg.split}.jsonl")
  if jax.process_index() == 0:
    os.makedirs(os.path.dirname(out), exist_ok=True)
    inputs_vocab = task.output_features["inputs"].vocabulary
    with open(out + ".tmp", "w") as f:
      for ex, pred in zip(examples, tokens):
        f.write(json.dumps({
            "inputs": inputs_vocab.decode([int(t) for t in ex["encoder_input_tokens"] if t > 1]),
            "prediction": vocabulary.decode([int(t) for t in pred]),
            "targets": vocabulary.decode(
                [int(t) for t in ex["decoder_target_tokens"] if t > 1])}) + "\n")
    os.replace(out + ".tmp", out)
  summaries.log("wrote %d predictions to %s", len(tokens), out)
  return out
