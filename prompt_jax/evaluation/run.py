"""`prompt-jax eval` and `prompt-jax infer`: a trained prompt on a task's split (or on texts).

The prompt comes from PROMPT_FILE (.npy) with the frozen INITIAL_CHECKPOINT_PATH, else from
CHECKPOINT_PATH (a `MODEL_DIR/checkpoints/<step>` dir), else from the latest intact checkpoint
of MODEL_DIR (`train.run_dir.resolve`). Given a trained MODEL_DIR, the CLI has already layered
its config.gin under your files and flags, so MODEL_DIR is all these need.
"""
import dataclasses
import functools
import itertools
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

from etils import epath
import gin
import jax
import numpy as np

from prompt_jax import partitioning
from prompt_jax import paths
from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.errors import ConfigError, did_you_mean
from prompt_jax.evaluation import inference
from prompt_jax.prompts import specs
from prompt_jax.train import checkpointing
from prompt_jax.train import data as data_lib
from prompt_jax.train import run_dir
from prompt_jax.train import summaries

EVAL_DIR = "eval"  # MODEL_DIR/eval/<task>-<split>-step<N>[-beam<K>].json (`result_label`)
INFERENCE_DIR = "inference"  # MODEL_DIR/inference/<task>-<split>[-beam<K>].jsonl


def checkpoint_params(path: str) -> Dict[str, np.ndarray]:
  """{parameter path: array} of the trained parameters of a `checkpoints/<step>` dir (or of a
  t5x `checkpoint_<step>` dir written by t5x.train)."""
  state = os.path.abspath(run_dir.state_dir(path))
  try:  # verified against its fingerprint, as the run's latest checkpoint would be
    restored = checkpointing.read_verified(os.path.dirname(state))
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(f"cannot read the checkpoint {path}: {checkpointing.reason(e)}; name an "
                      f"intact one (CHECKPOINT_PATH) or leave it out for the run's latest "
                      f"intact checkpoint") from e
  if "params" not in restored and "target" in restored:
    # A t5x checkpoint (`python -m t5x.train` with gin/t5x/): the whole model is its `target`.
    return trees.flatten(restored["target"])
  return trees.flatten(restored["params"])


def checkpoint_of(model_dir: Optional[str], checkpoint_path: Optional[str],
                  prompt_file: Optional[str]) -> run_dir.RunDir:
  """Where the trained parameters come from: (step, checkpoint) of the run, or none with
  PROMPT_FILE."""
  if prompt_file or not model_dir:
    return run_dir.RunDir(model_dir=model_dir, config=None, step=None,
                          checkpoint=checkpoint_path, numpy_dir=None)
  return run_dir.resolve(model_dir, checkpoint_path)


def load_run(model_dir: Optional[str], dataset_cfg: data_lib.DatasetConfig,
             initial_checkpoint_path: Optional[str], checkpoint_path: Optional[str],
             prompt_file: Optional[str], num_partitions: int,
             model: Optional[run_setup.ModelSpec]) -> run_setup.Run:
  """The frozen backbone + the trained parameters, placed on a mesh."""
  model = model or run_setup.model_spec()
  mesh = partitioning.create_mesh(num_partitions)
  run_setup.check_batch(dataset_cfg.batch_size, mesh)
  task = data_lib.checked_task(dataset_cfg)  # RANDOM_SEED, TASK_FEATURE_LENGTHS, the split
  if not checkpoint_path and model_dir and not prompt_file:
    checkpoint_path = run_dir.resolve(model_dir).checkpoint
  if not checkpoint_path and not prompt_file and model.prompt is not None:
    where = (f"MODEL_DIR {model_dir} holds no checkpoint (train first, or) "
             if model_dir and os.path.isfile(run_dir.config_path(model_dir)) else "")
    raise ConfigError(f"nothing to evaluate: {where}set CHECKPOINT_PATH or PROMPT_FILE, or point "
                      f"MODEL_DIR at a trained run")
  prompt = model.prompt
  if prompt_file and prompt is not None:
    prompt = specs.from_prompt_file(prompt, prompt_file)
  run = run_setup.prepare(
      config=model.config, prompt=prompt, feature_lengths=dataset_cfg.task_feature_lengths,
      initial_checkpoint_path=initial_checkpoint_path, trainable_regex=model.trainable_regex,
      mesh=mesh, vocabulary=task.output_features["targets"].vocabulary,
      frozen_dtype=model.frozen_dtype,
      # The checkpoint's values replace any init: none is run, nor read (PROMPT_FILE, ...).
      init_trainable=not checkpoint_path, read_inits=not checkpoint_path)
  if checkpoint_path:
    saved = checkpoint_params(checkpoint_path)
    current = trees.flatten(run.trainable)
    shardings = trees.flatten(run.trainable_shardings)
    for name, value in current.items():
      if name not in saved or tuple(saved[name].shape) != tuple(value.shape):
        held = (f"; it holds {name} of shape {tuple(saved[name].shape)}: set the gin values "
                f"it was trained with (e.g. PROMPT_LENGTH)" if name in saved else "")
        raise ConfigError(f"checkpoint {checkpoint_path!r} has no parameter {name} of shape "
                          f"{tuple(value.shape)}{held}")
      current[name] = jax.device_put(np.asarray(saved[name]), shardings[name])
    run.trainable = trees.unflatten(current)
    run.deferred, run.deferred_init = (), None
  return run


@dataclasses.dataclass
class EvalResult:
  metrics: Dict[str, float]
  metrics_file: Optional[str]  # MODEL_DIR/eval/<task>-<split>-step<N>.json (process 0)
  step: Optional[int]  # the checkpoint's step (None: PROMPT_FILE)


@gin.configurable(module="prompt_jax")
def evaluate(*, model_dir: Optional[str] = None,
             dataset_cfg: data_lib.DatasetConfig = gin.REQUIRED,
             initial_checkpoint_path: Optional[str] = None, checkpoint_path: Optional[str] = None,
             prompt_file: Optional[str] = None, num_partitions: int = 1,
             model: Optional[run_setup.ModelSpec] = None,
             backbone_label: Optional[str] = None) -> EvalResult:
  """seqio.Evaluator metrics (rank classification when the task declares its labels), logged to
  TensorBoard at the checkpoint's step (under MODEL_DIR/`summary_dir`: training's
  inference_eval curve only for the run's own checkpoint on the split training evaluated) and
  written as JSON. `backbone_label` (the CLI sets it when INITIAL_CHECKPOINT_PATH is not the
  frozen model the run trained on): results of their own, `...-on-<label>`, never a point of
  training's curve nor a replacement of the run's own result."""
  decoding_cfg = inference.decoding_config()  # before the model loads: bad settings fail fast
  source = checkpoint_of(model_dir, checkpoint_path, prompt_file)
  run = load_run(model_dir, dataset_cfg, initial_checkpoint_path, source.checkpoint,
                 prompt_file, num_partitions, model)
  step = source.step or 0
  label = result_label(source, prompt_file) + (f"-on-{backbone_label}" if backbone_label else "")
  log_dir = None
  if model_dir:
    log_dir = (f"{summaries.INFERENCE_EVAL_DIR}_{dataset_cfg.split}_{label}" if backbone_label
               else summary_dir(model_dir, source, prompt_file, dataset_cfg.split))
  metrics = inference.evaluate(run, dataset_cfg, model_dir, step=step, decoding_cfg=decoding_cfg,
                               log_dir=log_dir)
  summaries.log("eval: %s", " ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())))
  out = None
  if model_dir and jax.process_index() == 0:
    out = os.path.join(model_dir, EVAL_DIR, result_stem(
        dataset_cfg.mixture_or_task_name, dataset_cfg.split, label,
        *decoding_label(decoding_cfg)) + ".json")
    # "decoding": of the tasks without a label set (those with one are rank-classified), so
    # that a beam result and a greedy one of the same checkpoint tell themselves apart;
    # "initial_checkpoint": the frozen model the prompt ran on (the run's, or an override's).
    _write_text(out, json.dumps({"step": source.step, "checkpoint": source.checkpoint,
                                 "prompt_file": prompt_file, "split": dataset_cfg.split,
                                 "initial_checkpoint": initial_checkpoint_path,
                                 "decoding": dataclasses.asdict(decoding_cfg),
                                 "metrics": metrics}, indent=1, sort_keys=True) + "\n")
  return EvalResult(metrics=metrics, metrics_file=out, step=source.step)


def summary_dir(model_dir: str, source: run_dir.RunDir, prompt_file: Optional[str],
                split: str) -> str:
  """Where, under MODEL_DIR, eval's TensorBoard points go (seqio tags them
  `<task>/eval/<metric>`, naming no split, and `sweep report` keeps the latest write of a step):

  - training's own curve, `inference_eval`, only for the run's own checkpoint on the split its
    training evaluated (its config.gin's), which re-evaluates a point of that curve; or when
    MODEL_DIR holds no training run (no config.gin: a sweep's MODEL_DIR/eval, a fresh dir), as
    t5x's eval writes to its output dir's inference_eval;
  - `inference_eval_<split>` for the run's own checkpoint on another split (test accuracy never
    lands in the validation curve);
  - `inference_eval_<split>_<result_label>` for a PROMPT_FILE (step 0) or another run's
    checkpoint: a TensorBoard run of its own, as its JSON result has its own file, so it is
    neither a point of training's curve (nor a 'best' of it) nor mixed with another prompt's.
  """
  base = summaries.INFERENCE_EVAL_DIR
  config = run_dir.config_path(model_dir)
  trained_here = epath.Path(config).is_file()
  if prompt_file or (trained_here and not source.own):
    return f"{base}_{split}_{result_label(source, prompt_file)}"
  if not trained_here or split == trained_eval_split(config):
    return base
  return f"{base}_{split}"


def trained_eval_split(config_file: str) -> Optional[str]:
  """The split of the run's inference evaluation during training, as its config.gin says: the
  split of the DatasetConfig that `train.infer_eval_dataset_cfg` names (scope `infer_eval`),
  EVAL_SPLIT unless the scope binds its own; None if the file does not say."""
  from gin import config_parser  # pylint: disable=g-import-not-at-top

  class _Delegate(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
      return ("@", scoped_configurable_name)

    def macro(self, macro_name):
      return ("%", macro_name)

  bindings = {}  # (scope, selector's last name, parameter) -> value; macros: ("", NAME, "")
  try:
    for statement in config_parser.ConfigParser(epath.Path(config_file).read_text(),
                                                _Delegate()):
        if isinstance(statement, config_parser.BindingStatement):
          bindings[(statement.scope or "", statement.selector.rsplit(".", 1)[-1],
                    statement.arg_name)] = statement.value
  except Exception:  # pylint: disable=broad-except  (an unreadable file: say nothing)
    return None
  ref = bindings.get(("", "train", "infer_eval_dataset_cfg"))
  scope = "infer_eval"
  if isinstance(ref, tuple) and len(ref) == 2 and ref[0] == "@" and "/" in ref[1]:
    scope = ref[1].rsplit("/", 1)[0]
  value = bindings.get((scope, "DatasetConfig", "split"),
                       bindings.get(("", "DatasetConfig", "split")))
  for _ in range(10):  # a macro (EVAL_SPLIT), possibly of a macro
    if not (isinstance(value, tuple) and len(value) == 2 and value[0] == "%"):
      break
    value = bindings.get(("", value[1], ""))
  return value if isinstance(value, str) else None


def _inputs_task(dataset_cfg, input_task: Optional[str], model: run_setup.ModelSpec,
                 inputs) -> Optional[Tuple[int, str]]:
  """(task_index, the mixture's copy of the task) that `--input` texts belong to, or None (not a
  multi-task mixture, nothing asked); one ConfigError when it cannot be told. The mixture is
  registered (data_lib.get_task) before this is called."""
  from prompt_jax.tasks import multitask as multitask_tasks  # pylint: disable=g-import-not-at-top
  mixture = dataset_cfg.mixture_or_task_name
  tasks = multitask_tasks.tasks_of(mixture)
  choices = ", ".join(f"{i} ({name})" for i, _, name in tasks)
  if input_task is not None and not inputs:
    raise ConfigError("--input_task names the task of --input texts: give --input=TEXT too (the "
                      "split's examples carry their own task)")
  if input_task is None:
    try:
      if model.prompt is not None and model.prompt.input_dependent:
        model.prompt.check_features(("inputs", "targets"))
    except ConfigError:
      raise ConfigError("this multi-task prompt needs each input's task: give --input_task="
                        "<index or name>" + (f", one of {choices}" if tasks else "")) from None
    return None
  if not tasks:
    raise ConfigError(f"--input_task picks a task of a multi-task mixture, and "
                      f"MIXTURE_OR_TASK_NAME={mixture!r} is not one: drop --input_task")
  for index, copy, name in tasks:
    if input_task in (str(index), name, copy):
      return index, copy
  raise ConfigError(f"--input_task={input_task!r} is not a task of {mixture}: give one of "
                    f"{choices}{did_you_mean(input_task, [n for _, _, n in tasks])}")


def result_stem(task_name: str, split: str, *labels: str) -> str:
  """'<task>-<split>[-<label>...]', the name (less its extension) of a result of a task's split:
  eval, infer, ensemble-eval and bank infer all name the split, so results of several splits
  sit side by side in MODEL_DIR, never one over another."""
  return "-".join((task_name, split) + labels)


def decoding_label(decoding_cfg) -> Tuple[str, ...]:
  """What a result's file name says of a decoding other than greedy (the default): 'beam4',
  'beam4-alpha0' (alpha other than T5's 0.6), so a beam result never replaces the greedy one of
  the same checkpoint, nor one of another beam size."""
  if decoding_cfg.method == "greedy":
    return ()
  alpha = "" if decoding_cfg.alpha == 0.6 else f"-alpha{decoding_cfg.alpha:g}"
  return (f"{decoding_cfg.method}{decoding_cfg.beam_size}{alpha}",)


def result_label(source: run_dir.RunDir, prompt_file: Optional[str]) -> str:
  """What a result's file name says of the prompt evaluated: the checkpoint's 'step<N>' (or its
  name), or for a PROMPT_FILE the file's name and a hash of its path, so that evaluating
  several files (all `encoder.prompt.prompt.prompt.npy`, say) into one MODEL_DIR never
  overwrites a result."""
  if not prompt_file:
    return source.label
  return paths.label(prompt_file, keep_extension=False)


def _write_text(path: str, text: str) -> None:
  """Written whole or not at all (a temporary file renamed)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def _split_rows(task, dataset_cfg: data_lib.DatasetConfig) -> List[Tuple[str, Dict, Dict]]:
  """(task name, model features, `example_keys`) of every example of the split, once: a task's
  in order; a mixture's task by task, as seqio's Evaluator reads them (seqio's own mixture
  sampling stops at the first task to run out, dropping the other tasks' remaining rows),
  interleaved one row of each task in turn, so batches mix the tasks as training's do."""
  subtasks = data_lib.mixture_tasks(task, dataset_cfg.split) or [task]
  per_task = []
  for sub in subtasks:
    cfg = dataclasses.replace(dataset_cfg, mixture_or_task_name=sub.name, shuffle=False,
                              pack=False)
    ds = data_lib.get_dataset(cfg, num_epochs=1, shard_id=0, num_shards=1,
                              drop_remainder=False).unbatch()
    # The same examples before the feature converter, which drops all but the model's
    # features: their keys (`idx`) and whether they are labelled. Both reads are unshuffled
    # with one seed (stochastic preprocessors draw alike), and the converter maps one example
    # to one row, so the two streams pair up in order.
    with data_lib.user_data_errors():
      preprocessed = sub.get_dataset(
          sequence_length=dict(cfg.task_feature_lengths), split=cfg.split,
          use_cached=cfg.use_cached, shuffle=False, seed=cfg.seed,
          num_epochs=1).as_numpy_iterator()
      rows = [(sub.name, ex, example_keys(pre))
              for ex, pre in zip(ds.as_numpy_iterator(), preprocessed, strict=True)]
    per_task.append(rows)
  return [row for rows in itertools.zip_longest(*per_task) for row in rows if row is not None]


def _json_value(value):
  """A numpy value of a preprocessed example as JSON: arrays as lists, bytes as text."""
  value = np.asarray(value)
  if value.dtype.kind in "SO":
    decode = lambda v: v.decode() if isinstance(v, bytes) else v
    return decode(value.item()) if value.ndim == 0 else [decode(v) for v in value.tolist()]
  return value.tolist()


def example_keys(example) -> Dict:
  """What an infer row keeps of its preprocessed example beside the texts: `idx` (GLUE and
  SuperGLUE: an integer; ReCoRD, MultiRC: T5's flattened `idx/<part>` features as a mapping),
  which joins a test split's predictions to the benchmark's rows for a submission, and
  `labelled`: False for an unlabelled example (label -1, whose target T5's preprocessors
  write as '<unk>'), whose row then carries no `targets`."""
  keys = {}
  if "idx" in example:
    keys["idx"] = _json_value(example["idx"])
  else:
    parts = {k.split("/", 1)[1]: _json_value(v) for k, v in example.items()
             if k.startswith("idx/")}
    if parts:
      keys["idx"] = parts
  target = example.get("targets_pretokenized")
  keys["labelled"] = target is None or _json_value(target) not in ("<unk>", ["<unk>"])
  return keys


def encode_inputs(texts: Sequence[str], vocabulary, length: int) -> np.ndarray:
  """[N, length] encoder tokens of raw texts (+ EOS), as the task's `inputs` feature."""
  out = np.zeros((len(texts), length), np.int32)
  for i, text in enumerate(texts):
    ids = list(vocabulary.encode(text)) + [1]  # + EOS
    if len(ids) > length:  # (the whole text was in the line, however long)
      shown = repr(text) if len(text) <= 60 else repr(text[:57] + "...")
      raise ConfigError(f"--input {shown} is {len(ids)} tokens with EOS, longer than the inputs "
                        f"feature length {length}: shorten it, or raise TASK_FEATURE_LENGTHS' "
                        f"'inputs' to at least {len(ids)} (--gin.TASK_FEATURE_LENGTHS=\"{{'inputs'"
                        f": {len(ids)}, 'targets': ...}}\")")
    out[i, :len(ids)] = ids
  return out


@gin.configurable(module="prompt_jax")
def infer(*, model_dir: str = gin.REQUIRED,
          dataset_cfg: data_lib.DatasetConfig = gin.REQUIRED,
          initial_checkpoint_path: Optional[str] = None, checkpoint_path: Optional[str] = None,
          prompt_file: Optional[str] = None, num_partitions: int = 1,
          model: Optional[run_setup.ModelSpec] = None,
          inputs: Optional[Sequence[str]] = None, print_fn=print, prompt_bank=None,
          input_task: Optional[str] = None) -> str:
  """Writes MODEL_DIR/inference/<task>-<split>[-beam<K>].jsonl: {"idx", "inputs", "prediction",
  "targets"}; `idx` where the task's examples have one, `targets` where they are labelled;
  `-beam<K>` names a decoding other than greedy (`decoding_label`).

  With `inputs` (texts, `--input` on the command line): predicts those instead, prints
  'TEXT -> PREDICTION' lines and writes MODEL_DIR/inference/<task>-inputs.jsonl. On a multi-task
  mixture `input_task` (`--input_task`: a task's name or index) says whose prompt they get
  (`...-inputs-task<k>.jsonl`); a multi-task prompt needs it.
  With `prompt_bank` (PROMPT_BANK): each example names its prompt, one frozen model serves them
  all in mixed batches (`evaluation.ensemble.bank_infer`).
  """
  if prompt_bank is not None:
    other = [n for n, v in (("PROMPT_FILE", prompt_file), ("CHECKPOINT_PATH", checkpoint_path))
             if v]
    if other:  # (neither would be read: each example's prompt comes from the bank)
      raise ConfigError(f"PROMPT_BANK and {' and '.join(other)} both name the prompt: with "
                        f"PROMPT_BANK each example's prompt comes from the bank; drop "
                        f"{' and '.join(other)}, or PROMPT_BANK for one prompt")
    from prompt_jax.evaluation import ensemble  # pylint: disable=g-import-not-at-top
    return ensemble.bank_infer(model_dir=model_dir, dataset_cfg=dataset_cfg,
                               prompt_bank=prompt_bank,
                               initial_checkpoint_path=initial_checkpoint_path,
                               num_partitions=num_partitions, model=model, inputs=inputs)
  decoding_cfg = inference.decoding_config()  # before the model loads: bad settings fail fast
  task = data_lib.get_task(dataset_cfg.mixture_or_task_name, dataset_cfg.module)
  inputs_task = None
  if inputs or input_task is not None:
    inputs_task = _inputs_task(dataset_cfg, input_task, model or run_setup.model_spec(), inputs)
  source = checkpoint_of(model_dir, checkpoint_path, prompt_file)
  run = load_run(model_dir, dataset_cfg, initial_checkpoint_path, source.checkpoint,
                 prompt_file, num_partitions, model)
  vocabulary = task.output_features["targets"].vocabulary
  inputs_vocab = task.output_features["inputs"].vocabulary
  task_ids = None  # each example's task, from a multi-task mixture's data
  if inputs:
    texts = list(inputs)
    tokens_in = encode_inputs(texts, inputs_vocab, dataset_cfg.task_feature_lengths["inputs"])
    targets = [None] * len(texts)
    row_keys = [{}] * len(texts)
    row_tasks = [task.name] * len(texts)
    labels = decoding_label(decoding_cfg)
    if inputs_task is not None:  # one task of a multi-task mixture: its prompt and its labels
      index, copy = inputs_task
      task_ids = np.full([len(texts)], index, np.int32)  # [N]
      row_tasks = [copy] * len(texts)
      labels = (f"task{index}",) + labels
    name = result_stem(task.name, "inputs", *labels) + ".jsonl"
  else:
    examples = _split_rows(task, dataset_cfg)
    if not examples:
      raise inference.no_examples(task.name, dataset_cfg.split)
    tokens_in = np.stack([ex["encoder_input_tokens"] for _, ex, _ in examples])
    if data_lib.TASK_IDS in examples[0][1]:
      task_ids = np.stack([ex[data_lib.TASK_IDS] for _, ex, _ in examples])  # [N]
    texts = [inputs_vocab.decode([int(t) for t in ex["encoder_input_tokens"] if t > 1])
             for _, ex, _ in examples]
    targets = [vocabulary.decode([int(t) for t in ex["decoder_target_tokens"] if t > 1])
               if keys["labelled"] else None for _, ex, keys in examples]
    row_keys = [keys for _, _, keys in examples]
    row_tasks = [sub for sub, _, _ in examples]
    name = result_stem(task.name, dataset_cfg.split, *decoding_label(decoding_cfg)) + ".jsonl"
  predict = functools.partial(inference.predict_tokens, run, batch_size=dataset_cfg.batch_size,
                              max_decode_length=dataset_cfg.task_feature_lengths["targets"],
                              vocabulary=vocabulary, progress="infer",
                              decoding_cfg=decoding_cfg)
  # Each row is predicted as `eval` predicts its task's rows (inference.evaluate): rank-classified
  # on its task's labels (a mixture has none; each of its tasks, or multi-task copies, may),
  # else decoded; the rows keep their order.
  tokens = [None] * len(tokens_in)
  for sub in dict.fromkeys(row_tasks):
    rows = np.flatnonzero(np.array([t == sub for t in row_tasks]))
    for r, tok in zip(rows, predict(tokens_in[rows],
                                    task_ids=None if task_ids is None else task_ids[rows],
                                    labels=inference.label_set(sub))):
      tokens[r] = tok
  predictions = [vocabulary.decode([int(t) for t in pred]) for pred in tokens]
  out = os.path.join(model_dir, INFERENCE_DIR, name)
  if jax.process_index() == 0:
    rows = []
    for i, (text, pred, target) in enumerate(zip(texts, predictions, targets)):
      row = {"idx": row_keys[i]["idx"]} if "idx" in row_keys[i] else {}
      row.update(inputs=text, prediction=pred)
      if target is not None:
        row["targets"] = target
      if task_ids is not None:
        row["task"] = int(task_ids[i])
      if row_tasks[i] != task.name:  # a mixture's row: the task it came from
        row["task_name"] = row_tasks[i]
      rows.append(json.dumps(row) + "\n")
    _write_text(out, "".join(rows))
    if inputs:
      for text, pred in zip(texts, predictions):
        print_fn(f"{text} -> {pred}")
  summaries.log("wrote %d predictions to %s", len(tokens), out)
  return out
