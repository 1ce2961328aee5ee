"""`prompt-jax ensemble-eval` and `prompt-jax infer` with PROMPT_BANK: N prompts, one frozen model.

Prompts (ENSEMBLE_PROMPTS / PROMPT_BANK: a list of paths, a dict name -> path, or a directory):
  *.npy [P, H]         an exported input-independent prompt (`prompt-jax export --format=npy`:
                       prompt tuning, folded DPT / residual), placed as a prefix
  MODEL_DIR            a trained run: its config.gin names the method; an input-independent one
                       is folded (`MethodSpec.fold`) and joins the bank with its own placement;
                       an input-dependent one (IDPG, IPT), a deep prefix, or a run a plain row
                       cannot hold (a PROMPT_VISIBILITY other than full, or a TRAINABLE_REGEX
                       wider than its method's: e.g. encoder_norm trained too) runs through its
                       own module (its trained parameters + the one copy of the frozen weights)
A directory bank holds *.npy files and run directories (named by file stem / directory name).

The bank prompts are evaluated in batched passes of examples x N rows (`prompts.bank`: the
frozen model is loaded once, each example's token embedding computed once and shared by its N
rows, prompts of different lengths padded and masked); each module prompt runs on the same
example batch right after. Rank classification (tasks with a label set) encodes once per row
and scores every label; other tasks decode (greedy or beam, `prompt_jax.decoding_config`).

Combination (Lester et al. 2021, Section 7):
  majority vote         over each prompt's decoded output text; a tie goes to the tied answer
                        given first by the lowest-numbered prompt (the order of the prompts)
  mean log-likelihood   (label tasks) the label with the highest mean over the N prompts of its
                        summed log-likelihood; a tie goes to the first label of the label set
Outputs: MODEL_DIR/ensemble/<task>-<split>.json and .md (each prompt's metrics, their mean and
best, the ensemble's) and <task>-<split>-predictions.jsonl (each example's per-prompt and
ensemble outputs; for label tasks each prompt's summed log-likelihood of every label, to combine
them other ways); named by the split as `eval`'s results are (`run.result_stem`), so the results
of several splits never overwrite each other.
A prompt may have any name (`targets`, `majority_vote`, ...): its outputs are only ever under its
name inside `prompts` / `predictions` / `label_log_likelihood`, never beside the ensemble's keys.
Metrics are the task's own (seqio.Evaluator), computed on each prompt's predictions: a prompt's
row equals `prompt-jax eval` of that prompt alone up to float32 rounding (the batched program
has other shapes, so an answer can differ only where two labels' scores are within rounding).
"""
import collections
import contextlib
import dataclasses
import json
import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import gin
import jax
import jax.numpy as jnp
import numpy as np

from prompt_jax import npy
from prompt_jax import partitioning
from prompt_jax import paths
from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.errors import ConfigError
from prompt_jax.evaluation import inference
from prompt_jax.evaluation import run as run_lib
from prompt_jax.models import T5
from prompt_jax.models import decoding
from prompt_jax.prompts import bank as bank_lib
from prompt_jax.prompts import specs
from prompt_jax.prompts import visibility
from prompt_jax.train import data as data_lib
from prompt_jax.train import run_dir
from prompt_jax.train import summaries

# MODEL_DIR/ensemble/<task>-<split>.{json,md}, <task>-<split>-predictions.jsonl
ENSEMBLE_DIR = "ensemble"
VOTE, MEAN_LL = "majority_vote", "mean_log_likelihood"
Prompts = Union[None, str, Sequence[str], Mapping[str, str]]


# ===== Combination =====

def majority_vote(answers: Sequence[Sequence[str]]) -> List[Tuple[str, int]]:
  """(answer, prompt index that first gave it) per example, from answers[example][prompt].

  The most frequent answer wins; among tied answers, the one given by the lowest-numbered
  prompt (so the result never depends on anything but the prompts' order)."""
  out = []
  for row in answers:
    counts = collections.Counter(row)
    best = max(counts.values())
    for n, answer in enumerate(row):
      if counts[answer] == best:
        out.append((answer, n))
        break
  return out


def mean_log_likelihood(scores: np.ndarray) -> np.ndarray:
  """[E] label index of the highest mean log-likelihood over prompts, from scores [E, N, C];
  ties go to the first label (np.argmax)."""
  return np.argmax(np.mean(np.asarray(scores, np.float64), axis=1), axis=-1)


# ===== Loading the prompts =====

@contextlib.contextmanager
def _isolated_gin():
  """gin's global configuration saved and restored around the block (a run's config.gin is
  parsed inside without touching the command's own)."""
  from gin import config as gin_config  # pylint: disable=g-import-not-at-top
  # pylint: disable=protected-access
  saved = ({k: dict(v) for k, v in gin_config._CONFIG.items()}, dict(gin_config._SINGLETONS),
           set(gin_config._IMPORTS), dict(gin_config._OPERATIVE_CONFIG),
           gin_config.config_is_locked())
  try:
    yield
  finally:
    gin_config._set_config_is_locked(False)
    gin_config._CONFIG.clear()
    gin_config._CONFIG.update(saved[0])
    gin_config._SINGLETONS.clear()
    gin_config._SINGLETONS.update(saved[1])
    gin_config._IMPORTS.clear()
    gin_config._IMPORTS.update(saved[2])
    gin_config._OPERATIVE_CONFIG.clear()
    gin_config._OPERATIVE_CONFIG.update(saved[3])
    gin_config._set_config_is_locked(saved[4])
    # pylint: enable=protected-access


def run_method(model_dir: str) -> specs.MethodSpec:
  """The method spec a trained MODEL_DIR was trained with (from its config.gin)."""
  return run_model(model_dir)[0]


def run_model(model_dir: str) -> Tuple[specs.MethodSpec, str]:
  """(method spec, TRAINABLE_REGEX) a trained MODEL_DIR was trained with (from its config.gin);
  the regex is the run's own (wider than the spec's when it also trained e.g. encoder_norm)."""
  record = read_run(model_dir)
  return record.spec, record.regex


@dataclasses.dataclass
class RunRecord:
  """What a trained MODEL_DIR's config.gin says it was trained with."""
  spec: specs.MethodSpec
  regex: str  # its TRAINABLE_REGEX
  # {'task', 'initial_checkpoint'}: MIXTURE_OR_TASK_NAME and INITIAL_CHECKPOINT_PATH (a reference
  # such as @prompt_jax.embedded_checkpoint_path() called); a value that cannot be read is left out
  trained_with: Dict[str, Any]


def read_run(model_dir: str) -> RunRecord:
  """A trained MODEL_DIR's config.gin, parsed once (apart from the command's own gin)."""
  from prompt_jax import layering  # pylint: disable=g-import-not-at-top
  path = run_dir.config_path(model_dir)
  with open(path) as f:
    text = f.read()
  with _isolated_gin():
    gin.clear_config()
    try:
      gin.parse_config_files_and_bindings([layering.DEFAULTS_FILE], [], finalize_config=False)
      gin.parse_config(text)
      model = run_setup.model_spec()
    except (ValueError, KeyError, SyntaxError, IOError) as e:
      raise ConfigError(f"{path}: {layering.first_line(e)}") from e
    trained = {}
    for key, macro in (("task", "MIXTURE_OR_TASK_NAME"),
                       ("initial_checkpoint", "INITIAL_CHECKPOINT_PATH")):
      try:
        value = gin.query_parameter(f"%{macro}")
        if isinstance(value, gin.config.ConfigurableReference):
          value = value.configurable.wrapped()
      except Exception:  # pylint: disable=broad-except
        continue
      if isinstance(value, str) or value is None:
        trained[key] = value
  if model.prompt is None:
    raise ConfigError(f"{model_dir} is a full fine-tuning run: it has no prompt to ensemble")
  return RunRecord(model.prompt, model.trainable_regex, trained)


def _same_path(a: Optional[str], b: Optional[str]) -> bool:
  if not a or not b or "://" in a or "://" in b:
    return (a or None) == (b or None)
  return os.path.realpath(a.rstrip("/")) == os.path.realpath(b.rstrip("/"))


def warn_of_other_sources(members: List["Member"], task: str,
                          initial_checkpoint_path: Optional[str]) -> List[str]:
  """One warning line per MODEL_DIR member trained on another task or another frozen model
  than this command's (both legitimate in a transfer study, never silent)."""
  lines = []
  for m in members:
    trained = m.trained_with
    if "task" in trained and trained["task"] != task:
      lines.append(f"prompt {m.name!r} was trained on {trained['task']}, not {task}")
    if "initial_checkpoint" in trained and not _same_path(trained["initial_checkpoint"],
                                                          initial_checkpoint_path):
      lines.append(f"prompt {m.name!r} was trained on the frozen model "
                   f"{trained['initial_checkpoint']}, not this command's "
                   f"INITIAL_CHECKPOINT_PATH {initial_checkpoint_path}")
  for line in lines:
    logging.warning(line)
  return lines


def prompt_sources(prompts: Prompts, what: str = "ENSEMBLE_PROMPTS") -> List[Tuple[str, str]]:
  """[(name, path)] of a list of paths, a dict name -> path, or a bank directory."""
  if isinstance(prompts, str) and os.path.isdir(prompts) and not os.path.isfile(
      run_dir.config_path(prompts)):
    found = []
    for f in sorted(os.listdir(prompts)):
      path = os.path.join(prompts, f)
      if f.endswith(".npy") and os.path.isfile(path):
        found.append((f[:-len(".npy")], path))
      elif os.path.isfile(run_dir.config_path(path)):
        found.append((f, path))
    items = found
  elif isinstance(prompts, str):
    items = [(_stem(prompts), prompts)]
  elif isinstance(prompts, Mapping):
    items = [(str(k), v) for k, v in prompts.items()]
  elif prompts is None or isinstance(prompts, (list, tuple)):
    items = list(zip(_distinct_names(prompts or ()), prompts or ()))
  else:  # e.g. ENSEMBLE_PROMPTS=5: a count, not the prompts
    raise ConfigError(f"{what} must name the prompts: a list of .npy prompt files or trained "
                      f"MODEL_DIRs, a dict name -> path, or a directory of them; got "
                      f"{prompts!r}, e.g. --gin.{what}=\"['/p/a.npy', '/p/b.npy']\"")
  if not items:
    raise ConfigError(f"{what} names no prompt (N = 0): give .npy prompt files or trained "
                      f"MODEL_DIRs, e.g. --gin.{what}=\"['/p/a.npy', '/p/b.npy']\"")
  names = [n for n, _ in items]
  dupes = sorted({n for n in names if names.count(n) > 1})
  if dupes:
    raise ConfigError(f"{what}: prompt name(s) {', '.join(dupes)} appear twice; name them with "
                      f"a dict {{'name': path}}")
  for name, path in items:
    if not isinstance(path, str) or not os.path.exists(path):
      raise ConfigError(f"{what}: prompt {name!r} is {path!r}, which does not exist (a .npy "
                        f"prompt file or a trained MODEL_DIR)")
  # Absolute, as the path macros are: orbax restores from absolute paths only (a relative
  # run directory was reported as a damaged checkpoint).
  return [(name, paths.absolute(path)) for name, path in items]


def _stem(path: str) -> str:
  base = os.path.basename(str(path).rstrip("/"))
  return base[:-len(".npy")] if base.endswith(".npy") else base


def _distinct_names(listed: Sequence[Any]) -> List[str]:
  """Each listed prompt's name: its file's stem, or where stems coincide (every run's export is
  export/prompt_step<N>.npy) the shortest end of its path that tells it apart
  ('runA/export/prompt_step4'); the same path listed twice keeps its stem (an error later)."""
  parts = [[_stem(p)] if not isinstance(p, str) else
           os.path.normpath(p).split(os.sep)[:-1] + [_stem(p)] for p in listed]
  names = []
  for i, own in enumerate(parts):
    k = 1
    while any(j != i and other[-k:] == own[-k:] for j, other in enumerate(parts)) and \
        k < len(own) and any(other != own for other in parts if other[-1] == own[-1]):
      k += 1
    names.append("/".join(own[-k:]))
  return names


@dataclasses.dataclass
class Member:
  """One prompt of an ensemble or bank: a bank row (`entry`) or its own module."""
  name: str
  source: str
  method: str
  length: int
  entry: Optional[bank_lib.BankEntry] = None
  spec: Optional[specs.MethodSpec] = None
  trainable: Optional[Dict[str, np.ndarray]] = None  # {path: array} (module members)
  trained_with: Dict[str, Any] = dataclasses.field(default_factory=dict)  # RunRecord's (runs)


def load_member(name: str, path: str, config, vocabulary) -> Member:
  """A prompt file or trained MODEL_DIR as a bank entry, or as its own module."""
  if os.path.isfile(path):
    array = npy.load(path, f"prompt {name!r}: {path}", npy.EXPORT_HINT)
    if array.ndim == 4:
      raise ConfigError(f"prompt {name!r}: {path} is a deep prefix {list(array.shape)}; give "
                        f"its MODEL_DIR instead (a prefix needs its layers' module)")
    if array.ndim != 2:
      raise ConfigError(f"prompt {name!r}: {path} has shape {list(array.shape)}; a prompt file "
                        f"is [P, H]")
    entry = bank_lib.BankEntry(name, np.asarray(array, np.float32), "prefix", path)
    return Member(name, path, "prompt_tuning (file)", array.shape[0], entry=entry)
  if not os.path.isfile(run_dir.config_path(path)):
    raise ConfigError(f"prompt {name!r}: {path} is neither a .npy file nor a trained MODEL_DIR "
                      f"(no config.gin)")
  record = read_run(path)
  spec, regex = record.spec, record.regex
  try:  # a multi-task prompt reads each example's task id, which no member is given
    spec.check_features(("inputs", "targets"))
  except ConfigError:
    tasks = getattr(spec, "num_tasks", None)
    raise ConfigError(f"prompt {name!r}: {path} is a multi-task prompt run ({spec.name}"
                      f"{f', NUM_TASKS={tasks}' if tasks else ''}) whose prompt depends on each "
                      f"example's task id, which an ensemble or bank member is not given; "
                      f"evaluate it alone on its multi-task mixture (prompt-jax eval or infer), "
                      f"or leave it out") from None
  source = run_dir.resolve(path)
  if source.checkpoint is None:
    raise ConfigError(f"prompt {name!r}: MODEL_DIR {path} has no checkpoint yet: train it "
                      f"first (prompt-jax train resumes it), or leave it out")
  saved = run_lib.checkpoint_params(source.checkpoint)
  # The run's own TRAINABLE_REGEX: a wider one (e.g. encoder_norm too) trained weights beside the
  # prompt, which its module member uses (a bank row could not hold them).
  expected = run_dir.trainable_shapes(run_setup.ModelSpec(config, spec, regex))
  problem = run_dir.shape_mismatch(expected, {k: v.shape for k, v in saved.items()})
  if problem:
    raise ConfigError(f"prompt {name!r}: {path} does not fit this frozen model ({problem}); "
                      f"were the widths H the same?")
  method = spec.name
  # A bank row is a plain [P, H] prompt under full visibility: only a run that trained nothing
  # but its prompt (its spec's own regex) with full attention visibility folds into one; any
  # other runs through its own module, as it does alone.
  if (not spec.input_dependent and regex == spec.trainable_regex
      and visibility.parse(spec.visibility) is None):
    folded = spec.fold(trees.unflatten(saved), config)
    if set(folded) == {"prompt"}:
      prompt = np.asarray(jax.device_get(folded["prompt"]), np.float32)
      placement = specs.resolve_placement(spec.placement, vocabulary)
      entry = bank_lib.BankEntry(name, prompt, placement, path)
      return Member(name, path, method, prompt.shape[0], entry=entry,
                    trained_with=record.trained_with)
  trainable = {k: v for k, v in saved.items() if k in expected}
  return Member(name, path, method, spec.length, spec=spec, trainable=trainable,
                trained_with=record.trained_with)


# ===== Running =====

@dataclasses.dataclass
class Server:
  """One frozen model serving a bank table plus module members."""
  run: run_setup.Run
  members: List[Member]
  table: Optional[bank_lib.PromptTable]
  bank_model: T5
  modules: Dict[str, Tuple[Any, Any]]  # name -> (model, params) of module members

  @property
  def names(self) -> List[str]:
    return [m.name for m in self.members]


def serve(members: List[Member], model: run_setup.ModelSpec, dataset_cfg, initial_checkpoint_path,
          num_partitions: int, vocabulary) -> Server:
  """Loads the frozen model once and places the bank and each module member's parameters."""
  entries = [m.entry for m in members if m.entry is not None]
  table = bank_lib.build_table(entries, width=model.config.emb_dim) if entries else None
  for m in members:
    if m.entry is None:
      m.spec.check_fits(dataset_cfg.task_feature_lengths["inputs"])
  mesh = partitioning.create_mesh(num_partitions)
  run_setup.check_batch(dataset_cfg.batch_size, mesh)
  # The frozen backbone (one copy); the 1-position placeholder prompt is never initialised.
  placeholder = specs.PromptTuningSpec(length=1)
  run = run_setup.prepare(config=model.config, prompt=placeholder,
                          feature_lengths=dataset_cfg.task_feature_lengths,
                          initial_checkpoint_path=initial_checkpoint_path,
                          trainable_regex=placeholder.trainable_regex, mesh=mesh,
                          vocabulary=vocabulary, frozen_dtype=model.frozen_dtype,
                          init_trainable=False, read_inits=False)
  modules = {}
  for m in members:
    if m.entry is not None:
      continue
    # Its parameters are its checkpoint's and the backbone's, never an init's: the initialisers
    # are built from shapes only (no embedding table), so none reads the files the run started
    # from (PROMPT_FILE, IPT_TABLE_FILE, ...), which may be gone.
    module = run_setup.build_model(model.config, m.spec, None, vocabulary, params=run.frozen)
    trainable_dt = jnp.promote_types(jnp.float32, model.config.dtype)
    own = trees.unflatten({k: jnp.asarray(v, trainable_dt) for k, v in m.trainable.items()})
    modules[m.name] = (module, trees.merge(own, run.frozen))
  return Server(run=run, members=members, table=table, bank_model=T5(model.config),
                modules=modules)


def _rows(server: Server, tokens: np.ndarray, prompt_of_row: Optional[np.ndarray], *,
          batch_size: int, labels: Optional[np.ndarray], max_decode_length: int,
          decoding_cfg: decoding.DecodingConfig, progress: Optional[str] = None
          ) -> Dict[str, np.ndarray]:
  """Outputs of `tokens` [E, T] under every member ({'scores': [E, N, C]} for labels, else
  {'tokens': [E, N, L]}), or, with `prompt_of_row` [E] (member indices), under each example's
  own member ([E, 1, ...])."""
  run = server.run
  num = len(server.members)
  bank_ids = [i for i, m in enumerate(server.members) if m.entry is not None]
  bank_index = {i: server.table.index(server.members[i].name) for i in bank_ids}
  params = run.frozen
  dev_bank = (bank_lib.device_bank(server.table, jnp.float32)
              if server.table is not None else None)
  layout = server.table.layout if server.table is not None else ((), False)
  targets = jnp.asarray(labels) if labels is not None else None
  width = 1 if prompt_of_row is not None else num
  examples = tokens.shape[0]
  # Scores keep the model's float type (float64 under jax x64: the tests' reference run).
  score_dtype = np.promote_types(np.float32, jnp.dtype(server.bank_model.config.dtype))
  out = (np.zeros((examples, width, labels.shape[0]), score_dtype) if labels is not None
         else np.zeros((examples, width, max_decode_length), np.int32))
  meter = summaries.Meter(progress, examples) if progress else None
  sharding = partitioning.data_sharding(run.mesh)

  def bank_call(enc, row_prompt):
    if labels is not None:
      return bank_lib.score(server.bank_model, params, enc, dev_bank, row_prompt, layout,
                            targets)
    if decoding_cfg.method == "beam":
      return bank_lib.beam(server.bank_model, params, enc, dev_bank, row_prompt, layout,
                           max_decode_length, decoding_cfg.beam_size, decoding_cfg.alpha)[0]
    return bank_lib.greedy(server.bank_model, params, enc, dev_bank, row_prompt, layout,
                           max_decode_length)

  def module_call(name, enc):
    module, module_params = server.modules[name]
    if labels is not None:
      return decoding.score_targets(module, module_params, enc, targets)
    if decoding_cfg.method == "beam":
      return decoding.beam_decode(module, module_params, enc, max_decode_length,
                                  beam_size=decoding_cfg.beam_size, alpha=decoding_cfg.alpha)[0][:, 0]
    return decoding.greedy_decode(module, module_params, enc, max_decode_length)

  with partitioning.axis_rules(run.mesh):
    for begin in range(0, examples, batch_size):
      chunk = tokens[begin:begin + batch_size]
      n = chunk.shape[0]
      padded = np.zeros((batch_size,) + chunk.shape[1:], np.int32)
      padded[:n] = chunk
      enc = inference._global_rows(sharding, padded)  # pylint: disable=protected-access
      if prompt_of_row is None:
        if bank_ids:
          row_prompt = jnp.asarray(np.tile(np.array([bank_index[i] for i in bank_ids],
                                                    np.int32), (batch_size, 1)))
          res = partitioning.to_host(bank_call(enc, row_prompt))
          res = res.reshape((batch_size, len(bank_ids)) + res.shape[1:])[:n]
          for j, i in enumerate(bank_ids):
            out[begin:begin + n, i] = res[:, j]
        for i, m in enumerate(server.members):
          if m.entry is None:
            out[begin:begin + n, i] = partitioning.to_host(module_call(m.name, enc))[:n]
      else:
        own = np.zeros(batch_size, np.int32)
        own[:n] = prompt_of_row[begin:begin + n]
        in_bank = [i for i in sorted(set(own[:n].tolist())) if i in bank_index]
        if in_bank:
          row_prompt = np.array([[bank_index.get(int(i), 0)] for i in own], np.int32)
          res = partitioning.to_host(bank_call(enc, jnp.asarray(row_prompt)))[:n]
          rows = np.isin(own[:n], in_bank)
          out[begin:begin + n, 0][rows] = res[rows]
        for i in sorted(set(own[:n].tolist()) - set(bank_index)):
          res = partitioning.to_host(module_call(server.members[i].name, enc))[:n]
          rows = own[:n] == i
          out[begin:begin + n, 0][rows] = res[rows]
      if meter is not None:
        meter.update(begin + n)
  return {"scores" if labels is not None else "tokens": out}


# ===== ensemble-eval =====

@dataclasses.dataclass
class EnsembleResult:
  report: Dict[str, Any]
  files: List[str]


def _metric_summary(per_prompt: Mapping[str, Mapping[str, float]]) -> Tuple[Dict, Dict]:
  names = sorted({k for m in per_prompt.values() for k in m})
  mean = {k: float(np.mean([m[k] for m in per_prompt.values() if k in m])) for k in names}
  best = {}
  for k in names:
    name = max(per_prompt, key=lambda p: per_prompt[p].get(k, -np.inf))  # first of the best
    best[k] = {"value": per_prompt[name][k], "prompt": name}
  return mean, best


def markdown(report: Mapping[str, Any]) -> str:
  """Lester et al.'s ensemble table: each prompt, mean, best, ensemble."""
  metrics = sorted(report["mean"])
  lines = [f"# Prompt ensemble: {report['task']} ({report['split']}, "
           f"{report['num_examples']} examples, N = {len(report['prompts'])})", "",
           "| | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
  fmt = lambda m: " | ".join(f"{m.get(k, float('nan')):.2f}" for k in metrics)
  for p in report["prompts"]:
    lines.append(f"| {p['name']} ({p['method']}, P={p['length']}) | {fmt(p['metrics'])} |")
  lines.append(f"| mean of {len(report['prompts'])} prompts | {fmt(report['mean'])} |")
  lines.append("| best prompt | " + " | ".join(
      f"{report['best'][k]['value']:.2f} ({report['best'][k]['prompt']})" for k in metrics)
               + " |")
  for key, label in ((VOTE, "ensemble: majority vote"),
                     (MEAN_LL, "ensemble: mean log-likelihood")):
    if key in report["ensemble"]:
      lines.append(f"| **{label}** | {fmt(report['ensemble'][key])} |")
  lines += ["", "Majority vote: ties go to the answer given first by the lowest-numbered prompt "
            "(the order above). Mean log-likelihood: ties go to the first label of the label "
            "set. Best: the highest value of each metric (first prompt among equals).", ""]
  return "\n".join(lines)


@gin.configurable(module="prompt_jax")
def ensemble_eval(*, model_dir: str = gin.REQUIRED,
                  dataset_cfg: data_lib.DatasetConfig = gin.REQUIRED,
                  initial_checkpoint_path: Optional[str] = None, prompts: Prompts = None,
                  num_partitions: int = 1, model: Optional[run_setup.ModelSpec] = None,
                  ) -> EnsembleResult:
  """Evaluates N prompts (`prompts`, ENSEMBLE_PROMPTS) and their ensemble on a task split."""
  decoding_cfg = inference.decoding_config()
  model = model or run_setup.model_spec()
  task = data_lib.checked_task(dataset_cfg)
  if hasattr(task, "tasks") and not hasattr(task, "preprocessors"):
    raise ConfigError(f"ensemble-eval evaluates one task, and {task.name} is a mixture: set "
                      f"MIXTURE_OR_TASK_NAME to one of its tasks")
  vocabulary = task.output_features["targets"].vocabulary
  members = [load_member(n, p, model.config, vocabulary)
             for n, p in prompt_sources(prompts)]
  warn_of_other_sources(members, dataset_cfg.mixture_or_task_name, initial_checkpoint_path)
  evaluator = inference._evaluator(dataset_cfg, None)  # pylint: disable=protected-access
  inference.check_examples(evaluator, dataset_cfg.split)  # before the model loads
  server = serve(members, model, dataset_cfg, initial_checkpoint_path, num_partitions,
                 vocabulary)
  labels = inference.label_set(task.name)
  label_ids = inference.label_tokens(labels, vocabulary) if labels else None
  max_decode_length = dataset_cfg.task_feature_lengths["targets"]
  inputs_vocab = task.output_features["inputs"].vocabulary
  # The examples (indices, inputs, targets, scores, texts) and the answers [example] of each
  # prompt and each combination, in their own mappings: a prompt may be named anything, e.g.
  # `targets` or `majority_vote`, without touching the examples or the ensemble's answers.
  cache: Dict[str, Any] = {}
  answers: Dict[str, Dict[str, List[Any]]] = {"prompt": {}, "ensemble": {}}

  def compute(ds):
    examples = list(ds.as_numpy_iterator())
    cache["indices"] = [i for i, _ in examples]
    tokens = np.stack([ex["encoder_input_tokens"] for _, ex in examples])
    cache["inputs"] = [inputs_vocab.decode([int(t) for t in ex["encoder_input_tokens"] if t > 1])
                       for _, ex in examples]
    cache["targets"] = [vocabulary.decode([int(t) for t in ex["decoder_target_tokens"] if t > 1])
                        for _, ex in examples]
    out = _rows(server, tokens, None, batch_size=dataset_cfg.batch_size, labels=label_ids,
                max_decode_length=max_decode_length, decoding_cfg=decoding_cfg,
                progress="ensemble")
    if labels:
      scores = out["scores"]  # [E, N, C]
      cache["scores"] = scores
      per_prompt = [[inference.until_eos(label_ids[c]) for c in row]
                    for row in np.argmax(scores, -1)]
      answers["ensemble"][MEAN_LL] = [inference.until_eos(label_ids[c])
                                      for c in mean_log_likelihood(scores)]
    else:
      per_prompt = [[inference.until_eos(r) for r in row] for row in out["tokens"]]
    for i, name in enumerate(server.names):
      answers["prompt"][name] = [row[i] for row in per_prompt]
    texts = [[vocabulary.decode(t) for t in row] for row in per_prompt]
    cache["texts"] = texts
    votes = majority_vote(texts)
    answers["ensemble"][VOTE] = [per_prompt[e][n] for e, (_, n) in enumerate(votes)]

  def predictor(kind, key):
    def predict_fn(ds):
      if not cache:
        compute(ds)
      return list(zip(cache["indices"], answers[kind][key]))
    return predict_fn

  def metrics_of(kind, key) -> Dict[str, float]:
    """The task's metrics of answers[kind][key] (kind: 'prompt' or 'ensemble')."""
    result, _ = evaluator.evaluate(compute_metrics=jax.process_index() == 0, step=0,
                                   predict_fn=predictor(kind, key))
    if hasattr(result, "result"):
      result = result.result()
    return {k: inference._as_float(v)  # pylint: disable=protected-access
            for k, v in (result or {}).get(task.name, {}).items()}

  per_prompt = {m.name: metrics_of("prompt", m.name) for m in members}
  ensemble = {VOTE: metrics_of("ensemble", VOTE)}
  if labels:
    ensemble[MEAN_LL] = metrics_of("ensemble", MEAN_LL)
  mean, best = _metric_summary(per_prompt)
  report = {"task": task.name, "split": dataset_cfg.split,
            "num_examples": len(cache.get("indices", [])),
            "combination": {VOTE: "ties: the answer given first by the lowest-numbered prompt",
                            MEAN_LL: "ties: the first label of the label set"},
            "rank_classification": bool(labels),
            "prompts": [{"name": m.name, "source": m.source, "method": m.method,
                         "length": m.length, "metrics": per_prompt[m.name]} for m in members],
            "mean": mean, "best": best, "ensemble": ensemble}
  out_dir = os.path.join(model_dir, ENSEMBLE_DIR)
  stem = os.path.join(out_dir, run_lib.result_stem(task.name, dataset_cfg.split,
                                                   *run_lib.decoding_label(decoding_cfg)))
  files = [stem + ".json", stem + ".md", stem + "-predictions.jsonl"]
  if jax.process_index() == 0:
    rows = []
    idx = _example_idx(task, dataset_cfg)
    for e, index in enumerate(cache.get("indices", [])):
      row = {"index": int(index), **({"idx": idx[index]} if index < len(idx) else {}),
             "inputs": cache["inputs"][e], "targets": cache["targets"][e],
             "predictions": dict(zip(server.names, cache["texts"][e])),
             VOTE: vocabulary.decode(answers["ensemble"][VOTE][e])}
      if labels:
        row[MEAN_LL] = vocabulary.decode(answers["ensemble"][MEAN_LL][e])
        row["label_log_likelihood"] = {
            name: {l: float(s) for l, s in zip(labels, cache["scores"][e, i])}
            for i, name in enumerate(server.names)}
        row["mean_label_log_likelihood"] = {
            l: float(s) for l, s in zip(labels, np.mean(cache["scores"][e], axis=0))}
      rows.append(json.dumps(row) + "\n")
    run_lib._write_text(files[0], json.dumps(report, indent=1, sort_keys=True) + "\n")  # pylint: disable=protected-access
    run_lib._write_text(files[1], markdown(report))  # pylint: disable=protected-access
    run_lib._write_text(files[2], "".join(rows))  # pylint: disable=protected-access
  return EnsembleResult(report=report, files=files)


def _example_idx(task, dataset_cfg: data_lib.DatasetConfig) -> List[Any]:
  """Each example's own `idx` (as `infer` rows carry it: run.example_keys), in the order seqio's
  Evaluator reads the split (unshuffled, the same seed); [] when the task has none. A
  prediction row's `index` is its position; `idx` joins it to the benchmark's rows."""
  with data_lib.user_data_errors():
    preprocessed = task.get_dataset(
        sequence_length=dict(dataset_cfg.task_feature_lengths), split=dataset_cfg.split,
        use_cached=dataset_cfg.use_cached, shuffle=False, seed=dataset_cfg.seed,
        num_epochs=1).as_numpy_iterator()
    keys = [run_lib.example_keys(ex).get("idx") for ex in preprocessed]
  return keys if any(k is not None for k in keys) else []


# ===== infer with a prompt bank =====

def bank_infer(*, model_dir: str, dataset_cfg: data_lib.DatasetConfig, prompt_bank: Prompts,
               initial_checkpoint_path: Optional[str] = None, num_partitions: int = 1,
               model: Optional[run_setup.ModelSpec] = None,
               inputs: Optional[Sequence[str]] = None, print_fn=print) -> str:
  """`prompt-jax infer` with PROMPT_BANK: each example names its prompt (its `prompt` feature,
  else the name of its task, e.g. in a mixture); one frozen model serves them all, in mixed
  batches. Writes MODEL_DIR/inference/<task>-<split>-bank.jsonl with each row's prompt."""
  decoding_cfg = inference.decoding_config()
  model = model or run_setup.model_spec()
  if inputs:
    raise ConfigError("with PROMPT_BANK, infer reads the task split, where each example names "
                      "its prompt; --input texts name none (use PROMPT_FILE for one prompt)")
  task = data_lib.checked_task(dataset_cfg)
  subtasks = data_lib.mixture_tasks(task, dataset_cfg.split) or [task]  # those with the split
  vocabulary = task.output_features["targets"].vocabulary
  members = [load_member(n, p, model.config, vocabulary)
             for n, p in prompt_sources(prompt_bank, "PROMPT_BANK")]
  names = [m.name for m in members]
  lengths = dict(dataset_cfg.task_feature_lengths)
  # Every example and the prompt it names, checked before the model loads.
  groups = []  # (task, tokens [E, T], prompt index [E], texts, targets, keys)
  for sub in subtasks:
    with data_lib.user_data_errors():  # a missing or malformed data file: one line
      examples = list(sub.get_dataset(sequence_length=lengths, split=dataset_cfg.split,
                                      shuffle=False, use_cached=dataset_cfg.use_cached)
                      .as_numpy_iterator())
    tokens, which, texts, targets, keys = [], [], [], [], []
    for ex in examples:
      name = ex.get("prompt", sub.name)
      name = name.decode() if isinstance(name, bytes) else str(name)
      if name not in names:
        raise ConfigError(f"an example of {sub.name} names prompt {name!r}, which is not in "
                          f"PROMPT_BANK (it has {', '.join(names)}); add it to the bank")
      ids = list(ex["inputs"])[:lengths["inputs"]]
      row = np.zeros(lengths["inputs"], np.int32)
      row[:len(ids)] = ids
      tokens.append(row)
      which.append(names.index(name))
      texts.append(sub.output_features["inputs"].vocabulary.decode(
          [int(t) for t in ex["inputs"] if t > 1]))
      targets.append(vocabulary.decode([int(t) for t in ex["targets"] if t > 1]))
      keys.append(run_lib.example_keys(ex))
    groups.append((sub, np.stack(tokens) if tokens else np.zeros((0, lengths["inputs"]),
                                                                  np.int32),
                   np.array(which, np.int32), texts, targets, keys))
  if not any(len(g[2]) for g in groups):
    raise inference.no_examples(task.name, dataset_cfg.split)
  server = serve(members, model, dataset_cfg, initial_checkpoint_path, num_partitions,
                 vocabulary)
  rows = []
  for sub, tokens, which, texts, targets, keys in groups:
    labels = inference.label_set(sub.name)
    label_ids = inference.label_tokens(labels, vocabulary) if labels else None
    out = _rows(server, tokens, which, batch_size=dataset_cfg.batch_size, labels=label_ids,
                max_decode_length=lengths["targets"], decoding_cfg=decoding_cfg,
                progress="infer")
    if labels:
      preds = [inference.until_eos(label_ids[c]) for c in np.argmax(out["scores"][:, 0], -1)]
    else:
      preds = [inference.until_eos(r) for r in out["tokens"][:, 0]]
    for text, pred, target, i, key in zip(texts, preds, targets, which, keys):
      row = {"task": sub.name, "prompt": names[i]}
      if "idx" in key:
        row["idx"] = key["idx"]
      row.update(inputs=text, prediction=vocabulary.decode(pred))
      if key["labelled"]:
        row["targets"] = target
      rows.append(json.dumps(row) + "\n")
  out_path = os.path.join(model_dir, run_lib.INFERENCE_DIR,
                          run_lib.result_stem(task.name, dataset_cfg.split, "bank",
                                              *run_lib.decoding_label(decoding_cfg)) + ".jsonl")
  if jax.process_index() == 0:
    run_lib._write_text(out_path, "".join(rows))  # pylint: disable=protected-access
  summaries.log("wrote %d predictions to %s", len(rows), out_path)
  return out_path
