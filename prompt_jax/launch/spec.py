"""The sweep spec: a YAML file of base gin files and axes of overrides, expanded into jobs.

  # launch/sweeps/lester_fig3a_prompt_length.yaml (abridged)
  name: lester_fig3a_prompt_length          # default: the file's name
  root: /tmp/sweeps/fig3a                   # job MODEL_DIR = <root>/<job name>; --root overrides
  gin_files: [runs/prompt_finetune.gin, prompts/from_class_labels.gin]
  bindings:                                 # every job; a string is gin text, as after --gin.X=
    MIXTURE_OR_TASK_NAME: "'taskless_super_glue_rte_v102'"
    TRAIN_STEPS: 30000                      # numbers, booleans, lists: written as gin values
  axes:
    model:                                  # a choice axis: label -> overrides (gin_file + bindings)
      small: {gin_file: models/t5_1_1_small.gin}
      base:  {gin_file: models/t5_1_1_base.gin}
    PROMPT_LENGTH: [1, 5, 20, 100, 150]     # a binding axis: --gin.PROMPT_LENGTH=<value>
    init:                                   # a gin-file axis (labels: the files' names)
      gin_file: [prompts/uniform.gin, prompts/from_sampled_vocab.gin]
  zip: [[model, checkpoint]]                # these axes advance together (equal lengths)
  seeds: [0, 1, 2]                          # binds RANDOM_SEED; one job per seed
  eval: {bindings: {EVAL_SPLIT: "'validation'"}}   # extra overrides of the eval jobs
  report: {metric: "inference_eval/*/accuracy", figures: [{x: model, lines: PROMPT_LENGTH}]}

Axes combine by product (zip groups count as one axis); seeds vary slowest, so every
configuration's seed 0 runs before any seed 1. `${axis}` in a binding value or gin file (base,
axis or `eval:`) is the job's label on that axis (e.g. a checkpoint path per model size).

A job's name is `<axis>-<label>__...__seed-<s>` and its MODEL_DIR `<root>/<name>` (an axis name
such as `train/prompt_jax.DatasetConfig.x` appears path-safe: `train-prompt_jax.DatasetConfig.x`;
a binding value's label keeps its sign: `-0.5`); its command is
`prompt-jax train --gin_file=<base files> --gin_file=<axis files> --gin.<base bindings>
--gin.<command-line overrides> --gin.<axis bindings> --gin.RANDOM_SEED=<s> --gin.MODEL_DIR=<dir>`.
Packaged gin files stay relative (the cluster's install finds them); your own, and local
gin_search_paths, become absolute (emitted scripts run from other directories).
"""
import ast
import dataclasses
import math
import os
import re
import shlex
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from prompt_jax import paths
from prompt_jax.errors import ConfigError, did_you_mean

KEYS = ("name", "root", "gin_files", "gin_search_paths", "bindings", "axes", "zip", "seeds",
        "eval", "report")
SEED_MACRO = "RANDOM_SEED"
SPEC_SUFFIXES = (".yaml", ".yml")
MAX_NAME_BYTES = 255  # a file name's limit on common filesystems (ext4, xfs, GCS objects' parts)


@dataclasses.dataclass(frozen=True)
class Choice:
  """One value of an axis: a label and the overrides it adds."""
  label: str
  gin_files: Tuple[str, ...] = ()
  bindings: Tuple[Tuple[str, Any], ...] = ()  # (name, raw YAML value), before ${axis} filling


@dataclasses.dataclass(frozen=True)
class Axis:
  name: str
  choices: Tuple[Choice, ...]

  @property
  def labels(self) -> List[str]:
    return [c.label for c in self.choices]


@dataclasses.dataclass
class Job:
  """One `prompt-jax train` run of the sweep."""
  name: str
  group: str                       # the name without the seed: jobs differing only by seed
  model_dir: str
  values: Dict[str, str]           # axis name -> label
  seed: Optional[int]
  gin_files: Tuple[str, ...]
  bindings: Tuple[Tuple[str, str], ...]  # (name, gin text), in order; ends with MODEL_DIR
  search_paths: Tuple[str, ...] = ()
  train_steps: Optional[int] = None      # known after `validate_gin`
  eval_gin_files: Tuple[str, ...] = ()   # the spec's `eval:` overrides, ${axis} filled
  eval_bindings: Tuple[Tuple[str, str], ...] = ()

  def _flags(self, gin_files: Sequence[str], bindings: Sequence[Tuple[str, str]]) -> List[str]:
    out = [f"--gin_file={f}" for f in gin_files]
    if self.search_paths:
      out.append(f"--gin_search_paths={','.join(self.search_paths)}")
    return out + [f"--gin.{k}={v}" for k, v in bindings]

  def train_args(self) -> List[str]:
    """Arguments after `prompt-jax`: `train --gin_file=... --gin.X=...`."""
    return ["train"] + self._flags(self.gin_files, self.bindings)

  def eval_config(self, extra_gin_files: Optional[Sequence[str]] = None,
                  extra_bindings: Optional[Sequence[Tuple[str, str]]] = None
                  ) -> Tuple[List[str], List[Tuple[str, str]]]:
    """(gin files, bindings) of `prompt-jax eval` on this job's final checkpoint, results under
    MODEL_DIR/eval. runs/prompt_eval.gin comes first so that the job's own files keep their
    values (packaged run files are parsed in command-line order). The extras default to the
    spec's `eval:` section for this job."""
    if extra_gin_files is None:
      extra_gin_files = self.eval_gin_files
    if extra_bindings is None:
      extra_bindings = self.eval_bindings
    step = self.train_steps if self.train_steps is not None else "<TRAIN_STEPS>"
    bindings = [(k, v) for k, v in self.bindings if k != "MODEL_DIR"] + [
        ("MODEL_DIR", gin_string(join(self.model_dir, "eval"))),
        ("CHECKPOINT_PATH", gin_string(join(self.model_dir, "checkpoints", str(step)))),
    ] + list(extra_bindings)
    return ["runs/prompt_eval.gin", *self.gin_files, *extra_gin_files], bindings

  def eval_args(self, extra_gin_files: Optional[Sequence[str]] = None,
                extra_bindings: Optional[Sequence[Tuple[str, str]]] = None) -> List[str]:
    """Arguments after `prompt-jax`: `eval --gin_file=... --gin.X=...` (see eval_config)."""
    return ["eval"] + self._flags(*self.eval_config(extra_gin_files, extra_bindings))


@dataclasses.dataclass
class Sweep:
  name: str
  path: str                          # the spec file
  root: str
  axes: Tuple[Axis, ...]
  zip_groups: Tuple[Tuple[str, ...], ...]
  seeds: Tuple[int, ...]
  jobs: List[Job]
  eval_gin_files: Tuple[str, ...] = ()        # the spec's `eval:` as written; each job has its
  eval_bindings: Tuple[Tuple[str, str], ...] = ()  # own, ${axis} filled (Job.eval_*)
  report: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  binding_sources: Dict[str, str] = dataclasses.field(default_factory=dict)
  flags: Tuple[str, ...] = ()  # --root (when given) and the --gin overrides, as on the command

  def command(self, subcommand: str, *extra: str) -> str:
    """`prompt-jax sweep SUBCOMMAND SPEC` with this sweep's --root (when given) and --gin
    overrides: the line a final message tells the user to run. (report needs the overrides
    too: a run short of its TRAIN_STEPS is incomplete.)"""
    return " ".join(["prompt-jax sweep", subcommand,
                     *map(shlex.quote, [self.path, *self.flags, *extra])])

  @property
  def local(self) -> bool:
    return not is_remote(self.root)

  def groups(self) -> Dict[str, List[Job]]:
    out: Dict[str, List[Job]] = {}
    for job in self.jobs:
      out.setdefault(job.group, []).append(job)
    return out

  def shape(self) -> str:
    """'2 model x 5 PROMPT_LENGTH x 3 seeds'."""
    parts, seen = [], set()
    for axis in self.axes:
      if axis.name in seen:
        continue
      group = next((g for g in self.zip_groups if axis.name in g), (axis.name,))
      seen.update(group)
      parts.append(f"{len(axis.choices)} {'+'.join(group)}")
    if self.seeds:
      parts.append(f"{len(self.seeds)} seed{'s' if len(self.seeds) > 1 else ''}")
    return " x ".join(parts) or "1 job"


# --- small helpers -----------------------------------------------------------------------------

def is_remote(path: str) -> bool:
  return "://" in path


def join(*parts: str) -> str:
  return "/".join([parts[0].rstrip("/")] + list(parts[1:])) if is_remote(parts[0]) \
      else os.path.join(*parts)


def gin_string(text: str) -> str:
  return repr(str(text))


def gin_text(value: Any, where: str) -> str:
  """A YAML value as gin source: strings verbatim (gin text), other scalars and lists as values."""
  if isinstance(value, str):
    return value
  if value is None or isinstance(value, (bool, int, float, list, tuple, dict)):
    return repr(value)
  raise ConfigError(f"{where}: {value!r} is not a gin value (use a string of gin text)")


# report.csv's own columns beside the axes' (launch/report.py): no axis may take their names.
REPORT_COLUMNS = ("job", "seed", "state", "step", "metric", "final", "best", "best_step")


def path_safe(text: str) -> str:
  """`text` as one path component: runs of other characters than letters, digits, . _ + - become
  one '-' (job names are directory names and words in emitted shell scripts)."""
  return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-")


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _label(value: Any) -> str:
  """A readable, path-safe label for a binding value: 20 -> '20', -0.5 -> '-0.5' (a number keeps
  its sign, else -0.5 and 0.5 would share a MODEL_DIR), "'gs://b/x/ckpt_1'" -> 'x-ckpt_1'."""
  text = gin_text(value, "value").strip().strip("'\"")
  if _NUMBER.fullmatch(text):
    return text[:48]
  if "/" in text:
    text = "-".join([p for p in text.rstrip("/").split("/") if p][-2:])
  text = re.sub(r"[^A-Za-z0-9._+-]+", "-", text)
  text = re.sub(r"_{2,}", "_", text).strip("-._")
  return text[:48] or "empty"


_TEMPLATE = re.compile(r"\$\{(\w+)\}")


def fill(text: str, labels: Mapping[str, str], where: str) -> str:
  """`${axis}` -> the job's label on that axis."""
  def sub(m):
    if m.group(1) not in labels:
      raise ConfigError(f"{where}: ${{{m.group(1)}}} names no axis (axes: "
                        f"{', '.join(labels) or 'none'}){did_you_mean(m.group(1), labels)}")
    return labels[m.group(1)]
  return _TEMPLATE.sub(sub, text)


def is_macro(name: str) -> bool:
  return re.fullmatch(r"[A-Za-z_]\w*", name) is not None


# --- locating specs and gin files --------------------------------------------------------------

def sweeps_dir() -> str:
  """The shipped specs: `prompt_jax/sweeps` in a wheel, the repository's `launch/sweeps` in an
  editable install or a source checkout (as paths.gin_dir finds gin/)."""
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for candidate in (os.path.join(package, "sweeps"),
                    os.path.join(os.path.dirname(package), "launch", "sweeps")):
    if os.path.isdir(candidate):
      return candidate
  return os.path.join(package, "sweeps")


def shipped_specs() -> List[str]:
  d = sweeps_dir()
  if not os.path.isdir(d):
    return []
  return sorted(os.path.splitext(f)[0] for f in os.listdir(d) if f.endswith(SPEC_SUFFIXES))


def find_spec(spec: str) -> str:
  """A spec path, or the name of a shipped spec (`lester_fig3a_prompt_length`)."""
  if os.path.isfile(spec):
    return os.path.abspath(spec)
  for name in (spec, *(spec + s for s in SPEC_SUFFIXES)):
    candidate = os.path.join(sweeps_dir(), name)
    if os.path.isfile(candidate):
      return candidate
  shipped = shipped_specs()
  raise ConfigError(f"sweep spec {spec!r} not found: not a file, nor a shipped spec "
                    f"({', '.join(shipped) or 'none'})"
                    f"{did_you_mean(os.path.splitext(os.path.basename(spec))[0], shipped)}")


def packaged_gin_files() -> List[str]:
  gin_dir = paths.gin_dir()
  out = []
  for dirpath, _, files in os.walk(gin_dir):
    for f in files:
      if f.endswith(".gin"):
        out.append(os.path.relpath(os.path.join(dirpath, f), gin_dir))
  return sorted(out)


def resolve_gin_file(path: str, spec_dir: str, search_paths: Sequence[str], where: str) -> str:
  """Packaged or search-path files stay as written; your own files become absolute paths."""
  if os.path.isabs(path):
    if os.path.isfile(path):
      return path
  else:
    if any(os.path.isfile(os.path.join(d, path)) for d in (*search_paths, paths.gin_dir())):
      return path
    for base in (spec_dir, os.getcwd()):
      if os.path.isfile(os.path.join(base, path)):
        return os.path.abspath(os.path.join(base, path))
  raise ConfigError(f"{where}: gin file {path!r} not found (packaged gin files, "
                    f"{', '.join(search_paths) + ', ' if search_paths else ''}the spec's "
                    f"directory, .){did_you_mean(path, packaged_gin_files())}")


# --- parsing -----------------------------------------------------------------------------------

def _unique_key_loader():
  """yaml's SafeLoader, but a key given twice in one mapping is an error (safe_load keeps the
  last silently: an axis or a choice would be lost without a word)."""
  import yaml  # pylint: disable=g-import-not-at-top

  class Loader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors

    def construct_mapping(self, node, deep=False):
      if isinstance(node, yaml.MappingNode):
        seen = {}
        for key_node, _ in node.value:  # its own keys (a `<<:` merge's may be overridden)
          if key_node.tag == "tag:yaml.org,2002:merge":
            continue
          key = self.construct_object(key_node, deep=True)
          try:
            hash(key)
          except TypeError:
            continue  # the base class reports an unhashable key
          if key in seen:
            raise _DuplicateKey(key, seen[key], key_node.start_mark.line + 1)
          seen[key] = key_node.start_mark.line + 1
      return super().construct_mapping(node, deep=deep)

  return Loader


class _DuplicateKey(Exception):

  def __init__(self, key, first_line: int, line: int):
    super().__init__(key)
    self.key, self.first_line, self.line = key, first_line, line


def load(spec: str) -> Dict[str, Any]:
  import yaml  # pylint: disable=g-import-not-at-top
  path = find_spec(spec)
  try:
    with open(path) as f:
      data = yaml.load(f, Loader=_unique_key_loader())  # pylint: disable=no-value-for-parameter
  except _DuplicateKey as e:
    raise ConfigError(f"sweep spec {path}: key {e.key!r} appears twice in one mapping (lines "
                      f"{e.first_line} and {e.line}); YAML would keep only the last: merge or "
                      f"rename them") from e
  except yaml.YAMLError as e:
    mark = getattr(e, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    raise ConfigError(f"sweep spec {path} does not parse{where}: {problem}") from e
  if not isinstance(data, dict):
    raise ConfigError(f"sweep spec {path} does not parse: expected a mapping of "
                      f"{', '.join(KEYS)}, got {type(data).__name__}")
  for key in data:
    if key not in KEYS:
      raise ConfigError(f"sweep spec {path}: unknown key {key!r} (keys: {', '.join(KEYS)})"
                        f"{did_you_mean(str(key), KEYS)}")
  data["__path__"] = path
  return data


def _as_list(value: Any, where: str) -> List[Any]:
  if value is None:
    return []
  if isinstance(value, (list, tuple)):
    return list(value)
  if isinstance(value, (str, int, float)):
    return [value]
  raise ConfigError(f"{where}: expected a list, got {value!r}")


def _bindings(value: Any, where: str) -> List[Tuple[str, Any]]:
  if value is None:
    return []
  if not isinstance(value, dict):
    raise ConfigError(f"{where}: expected a mapping NAME: value, got {value!r}")
  out = []
  for name, v in value.items():
    if name in ("MODEL_DIR",):
      raise ConfigError(f"{where}: MODEL_DIR is set by the sweep (<root>/<job name>); set "
                        f"`root:` in the spec or --root instead")
    out.append((str(name), v))
  return out


def _gin_value(value: Any) -> Any:
  """What gin makes of a YAML value, as far as Python literals tell ('1e-1' -> 0.1); gin text
  that is no literal (@ref, %MACRO) stays text. Typed, so 1 and 1.0 stay apart."""
  text = gin_text(value, "value")
  try:
    parsed = ast.literal_eval(text.strip())
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    return ("text", text.strip())
  return (type(parsed).__name__, repr(parsed))


def _check_distinct(values: Sequence[Any], where: str) -> None:
  """Two equal values of a binding axis ([0.1, 1e-1]) would be two identical jobs under two
  names, each costing a full run: one line instead."""
  seen: Dict[Any, Any] = {}
  for v in values:
    key = _gin_value(v)
    if key in seen:
      raise ConfigError(f"{where}: {gin_text(seen[key], where)} and {gin_text(v, where)} are the "
                        f"same value; list each value once")
    seen[key] = v


def _axis(name: str, value: Any) -> Axis:
  where = f"axis {name!r}"
  if value is None or (isinstance(value, (list, tuple, dict)) and not value):
    raise ConfigError(f"{where} is empty: give it at least one value")
  if isinstance(value, (list, tuple)):  # a binding axis
    if name == "MODEL_DIR":  # the sweep's own MODEL_DIR replaced its values silently
      raise ConfigError(f"{where}: MODEL_DIR is set by the sweep (<root>/<job name>); set "
                        f"`root:` in the spec or --root instead")
    if not is_macro(name) and "." not in name:
      raise ConfigError(f"{where}: a list of values needs a gin macro or parameter as the axis "
                        f"name (e.g. PROMPT_LENGTH: [1, 5]); use `gin_file: [...]` for files")
    _check_distinct(value, where)
    return Axis(name, tuple(Choice(_label(v), (), ((name, v),)) for v in value))
  if isinstance(value, dict) and set(value) == {"gin_file"} and isinstance(
      value["gin_file"], (list, tuple)):  # a gin-file axis
    files = list(value["gin_file"])
    if not files:
      raise ConfigError(f"{where} is empty: give it at least one gin file")
    return Axis(name, tuple(  # labels: the files' names, path-safe ('my init.gin' -> my-init)
        Choice(path_safe(os.path.splitext(os.path.basename(str(f)))[0]) or "file", (str(f),), ())
        for f in files))
  if isinstance(value, dict):  # a choice axis: label -> overrides
    choices = []
    for label, overrides in value.items():
      cwhere = f"{where}, choice {label!r}"
      if overrides is None:
        overrides = {}
      if not isinstance(overrides, dict):
        raise ConfigError(f"{cwhere}: expected a mapping of gin_file and NAME: value overrides "
                          f"(or write the axis as a list of values), got {overrides!r}")
      safe = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(label)).strip("-")
      if safe != str(label):
        raise ConfigError(f"{cwhere}: a label must be path-safe (letters, digits, . _ + -), "
                          f"e.g. {safe or 'choice'!r}")
      overrides = dict(overrides)
      files = [str(f) for f in _as_list(overrides.pop("gin_file", None), cwhere)]
      choices.append(Choice(str(label), tuple(files), tuple(_bindings(overrides, cwhere))))
    return Axis(name, tuple(choices))
  raise ConfigError(f"{where}: expected a list of values, {{gin_file: [files]}} or a mapping "
                    f"label -> overrides, got {value!r}")


def build(spec: str, root: Optional[str] = None,
          overrides: Sequence[Tuple[str, str]] = ()) -> Sweep:
  """The jobs of a spec: everything checked that needs no gin parsing (see validate_gin)."""
  data = load(spec)
  path = data["__path__"]
  spec_dir = os.path.dirname(path)
  name = str(data.get("name") or os.path.splitext(os.path.basename(path))[0])
  if not re.fullmatch(r"[A-Za-z0-9._+-]+", name):
    raise ConfigError(f"name: {name!r} must be path-safe (letters, digits, . _ + -)")
  given_root = bool(root)
  root = root or data.get("root") or os.path.join("sweep_runs", name)
  root = str(root)
  if not is_remote(root):
    root = os.path.abspath(os.path.expanduser(root))
  search_paths = tuple(
      str(p) if is_remote(str(p)) else os.path.abspath(os.path.expanduser(str(p)))
      for p in _as_list(data.get("gin_search_paths"), "gin_search_paths"))
  base_files = [str(f) for f in _as_list(data.get("gin_files"), "gin_files")]  # per job: ${axis}
  base_bindings = _bindings(data.get("bindings"), "bindings")
  sources = {k: "bindings" for k, _ in base_bindings}
  for k, _ in overrides:
    if k == "MODEL_DIR":
      raise ConfigError("--gin.MODEL_DIR: MODEL_DIR is set by the sweep; use --root")
    sources[k] = f"--gin.{k}"

  axes_data = data.get("axes") or {}
  if not isinstance(axes_data, dict):
    raise ConfigError(f"axes: expected a mapping axis name -> values, got {axes_data!r}")
  axes = tuple(_axis(str(n), v) for n, v in axes_data.items())
  by_name = {a.name: a for a in axes}
  safe_names: Dict[str, str] = {}
  for axis in axes:
    safe = path_safe(axis.name)
    if not safe:
      raise ConfigError(f"axis {axis.name!r}: an axis name needs a letter or digit")
    if axis.name in REPORT_COLUMNS:
      raise ConfigError(f"axis {axis.name!r}: the name of a column of `sweep report` "
                        f"({', '.join(REPORT_COLUMNS)}); rename the axis")
    if safe in safe_names:
      raise ConfigError(f"axes {safe_names[safe]!r} and {axis.name!r} both appear as {safe!r} in "
                        f"job names: rename one")
    safe_names[safe] = axis.name
  for axis in axes:
    for choice in axis.choices:
      for k, _ in choice.bindings:
        if k in sources and sources[k].startswith("--gin."):
          raise ConfigError(f"--gin.{k} overrides axis {axis.name!r}: drop the flag or the axis")
        sources.setdefault(k, f"axis {axis.name!r}")

  zip_groups = []
  seen = set()
  for group in _as_list(data.get("zip"), "zip"):
    if not isinstance(group, (list, tuple)) or len(group) < 2 or any(
        isinstance(a, (list, tuple, dict)) for a in group):
      flat = data.get("zip")
      hint = (f"; for these axes to advance together write zip: [[{', '.join(map(str, flat))}]]"
              if isinstance(flat, list) and all(isinstance(a, str) for a in flat) else "")
      raise ConfigError(f"zip: each zip group is a list of two or more axis names, got "
                        f"{group!r}{hint}")
    group = tuple(str(a) for a in group)
    for a in group:
      if a not in by_name:
        raise ConfigError(f"zip: {a!r} is not an axis (axes: {', '.join(by_name) or 'none'})"
                          f"{did_you_mean(a, by_name)}")
      if a in seen:
        raise ConfigError(f"zip: axis {a!r} is in two zip groups")
      seen.add(a)
    lengths = {a: len(by_name[a].choices) for a in group}
    if len(set(lengths.values())) > 1:
      raise ConfigError("zip: axes of different lengths ("
                        + ", ".join(f"{a} has {n}" for a, n in lengths.items())
                        + "): zipped axes advance together and need as many values each")
    zip_groups.append(group)

  seeds = []
  if data.get("seeds") is not None and not isinstance(data["seeds"], (list, tuple)):
    # `seeds: 3` would be the one seed 3, not three seeds.
    raise ConfigError(f"seeds: {data['seeds']!r} is not a list: seeds must be a list, e.g. "
                      f"[0, 1, 2]")
  for s in _as_list(data.get("seeds"), "seeds"):
    if isinstance(s, bool) or not isinstance(s, int):
      raise ConfigError(f"seeds: {s!r} is not an integer")
    seeds.append(s)
  if "seeds" in data and not seeds:
    raise ConfigError("seeds is empty: give at least one seed, or drop the key")
  if seeds and SEED_MACRO in sources:
    raise ConfigError(f"{sources[SEED_MACRO]} sets {SEED_MACRO}, which `seeds:` sets per job")
  if seeds:
    sources[SEED_MACRO] = "seeds"

  # Dimensions: a zip group is one dimension (at its first axis' position), others one each.
  dims: List[Tuple[str, ...]] = []
  for axis in axes:
    group = next((g for g in zip_groups if axis.name in g), (axis.name,))
    if group not in dims:
      dims.append(group)
  combos = [[]]
  for dim in dims:
    n = len(by_name[dim[0]].choices)
    combos = [c + [(a, i) for a in dim] for c in combos for i in range(n)]

  eval_data = data.get("eval") or {}
  if not isinstance(eval_data, dict) or set(eval_data) - {"gin_files", "bindings"}:
    raise ConfigError("eval: expected a mapping with gin_files and/or bindings")
  eval_files = tuple(str(f) for f in _as_list(eval_data.get("gin_files"), "eval.gin_files"))
  eval_bindings = tuple((k, gin_text(v, f"eval.bindings.{k}"))
                        for k, v in _bindings(eval_data.get("bindings"), "eval.bindings"))

  jobs: List[Job] = []
  for seed in (seeds or [None]):
    for combo in combos:
      picked = [(a, by_name[a].choices[i]) for a, i in sorted(
          combo, key=lambda ai: [x.name for x in axes].index(ai[0]))]
      labels = {a: c.label for a, c in picked}
      parts = [f"{path_safe(a)}-{c.label}" for a, c in picked]
      group = "__".join(parts) or name
      job_name = "__".join(parts + ([f"seed-{seed}"] if seed is not None else [])) or name
      files = [resolve_gin_file(fill(f, labels, "gin_files"), spec_dir, search_paths, "gin_files")
               for f in base_files]
      bindings = [(k, gin_text(v, f"bindings.{k}")) for k, v in base_bindings]
      bindings += list(overrides)
      for a, c in picked:
        where = f"axis {a!r}, value {c.label!r}"
        files += [resolve_gin_file(fill(f, labels, where), spec_dir, search_paths, where)
                  for f in c.gin_files]
        bindings += [(k, fill(gin_text(v, where), labels, where)) for k, v in c.bindings]
      bindings = [(k, fill(v, labels, f"bindings.{k}")) for k, v in bindings]
      if seed is not None:
        bindings.append((SEED_MACRO, str(seed)))
      model_dir = join(root, job_name)
      bindings.append(("MODEL_DIR", gin_string(model_dir)))
      job_eval_files = tuple(
          resolve_gin_file(fill(f, labels, "eval.gin_files"), spec_dir, search_paths,
                           "eval.gin_files") for f in eval_files)
      job_eval_bindings = tuple((k, fill(v, labels, f"eval.bindings.{k}"))
                                for k, v in eval_bindings)
      jobs.append(Job(job_name, group, model_dir, labels, seed, tuple(files), tuple(bindings),
                      search_paths, eval_gin_files=job_eval_files,
                      eval_bindings=job_eval_bindings))

  dirs: Dict[str, Job] = {}
  for job in jobs:
    # The longest file a job makes in a directory named after it: logs/<name>.log.
    if len(job.name.encode()) + len(".log") > MAX_NAME_BYTES:
      raise ConfigError(f"job name {job.name[:60]}... is {len(job.name.encode())} characters, "
                        f"more than a file name may hold ({MAX_NAME_BYTES - len('.log')} at "
                        f"most): shorten axis names or choice labels (a choice axis names its "
                        f"values, e.g. ckpt: {{base: {{INITIAL_CHECKPOINT_PATH: ...}}}})")
    if job.model_dir in dirs:
      raise ConfigError(f"two jobs share MODEL_DIR {job.model_dir} (values "
                        f"{dirs[job.model_dir].values} and {job.values}): make the labels of "
                        f"each axis distinct")
    dirs[job.model_dir] = job
  fileless = [job.name for job in jobs if not job.gin_files]
  if fileless:  # (`prompt-jax train` given no gin file refuses too: it names no model or task)
    which = ("no job" if len(fileless) == len(jobs)
             else f"job {fileless[0]}" + (f" (and {len(fileless) - 1} more)"
                                          if len(fileless) > 1 else ""))
    raise ConfigError(f"gin_files: {which} names a gin file, and train needs one for its model, "
                      f"task and run settings: add e.g. `gin_files: [runs/embedded_default.gin]` "
                      f"(the embedded default) or your own files to the spec")
  report = _report(data.get("report"), by_name)
  flags = ((f"--root={root}",) if given_root else ()) + tuple(
      f"--gin.{k}={v}" for k, v in overrides)
  return Sweep(name, path, root, axes, tuple(zip_groups), tuple(seeds), jobs, eval_files,
               eval_bindings, report, sources, flags)


FIGURE_KEYS = ("x", "lines", "metric", "value", "x_values", "x_label", "log_x", "title")


def _report(report: Any, axes: Mapping[str, Axis]) -> Dict[str, Any]:
  """The `report:` section: metric (name or pattern) and figures (checked against the axes)."""
  report = report or {}
  if not isinstance(report, dict) or set(report) - {"metric", "figures"}:
    raise ConfigError(f"report: expected a mapping with metric and/or figures, got {report!r}")
  if "metric" in report and not (isinstance(report["metric"], str) and report["metric"]):
    raise ConfigError(f"report.metric: expected a metric name or pattern, got "
                      f"{report['metric']!r}")
  for i, fig in enumerate(_as_list(report.get("figures"), "report.figures")):
    where = f"report.figures[{i}]"
    if not isinstance(fig, dict) or "x" not in fig or set(fig) - set(FIGURE_KEYS):
      raise ConfigError(f"{where}: expected a mapping with x (an axis) and optionally "
                        f"{', '.join(FIGURE_KEYS[1:])}, got {fig!r}")
    for key in ("x", "lines"):
      name = fig.get(key)
      if key in fig and (not isinstance(name, str) or name not in axes):
        raise ConfigError(f"{where}.{key}: {name!r} is not an axis (one axis name; axes: "
                          f"{', '.join(axes) or 'none'}){did_you_mean(str(name), axes)}")
    if fig.get("lines") == fig["x"]:
      raise ConfigError(f"{where}: x and lines are both {fig['x']!r}")
    for key in ("metric", "x_label", "title"):
      if key in fig and not isinstance(fig[key], str):
        raise ConfigError(f"{where}.{key}: expected a string, got {fig[key]!r}")
    if "log_x" in fig and not isinstance(fig["log_x"], bool):
      raise ConfigError(f"{where}.log_x: true or false, got {fig['log_x']!r}")
    if fig.get("value", "final") not in ("final", "best"):
      raise ConfigError(f"{where}.value: final or best, got {fig['value']!r}")
    if fig.get("x_values") is not None:
      fig["x_values"] = _x_values(fig["x_values"], axes[fig["x"]], f"{where}.x_values",
                                  bool(fig.get("log_x")))
  return report


def _x_values(value: Any, axis: Axis, where: str, log_x: bool) -> Dict[str, float]:
  """`x_values: {label: number}` for every label of the figure's x axis (where to draw them);
  checked here so that `sweep report` cannot fail half-way on it."""
  labels = ", ".join(axis.labels)
  if not isinstance(value, dict):
    raise ConfigError(f"{where}: expected a mapping label -> number for the labels of axis "
                      f"{axis.name!r} ({labels}), got {value!r}")
  out = {str(k): v for k, v in value.items()}
  if set(out) != set(axis.labels):
    raise ConfigError(f"{where}: give a number for each label of axis {axis.name!r} ({labels}), "
                      f"got {sorted(out)}")
  for label, v in out.items():
    number = None
    if isinstance(v, (int, float, str)) and not isinstance(v, bool):
      try:  # YAML reads 7.7e7 (no exponent sign) as a string
        number = float(v)
      except ValueError:
        pass
    if number is None or not math.isfinite(number):
      raise ConfigError(f"{where}.{label}: expected a number (e.g. 7.7e7), got {v!r}")
    if log_x and number <= 0:
      raise ConfigError(f"{where}.{label}: {v!r} cannot be drawn on log_x: give a positive number")
    out[label] = number
  return out


# --- gin checks (before anything runs) ---------------------------------------------------------

def gin_macros() -> set:
  """Macros bound or referenced (`%NAME`) in the parsed gin config."""
  import gin  # pylint: disable=g-import-not-at-top
  names = set()

  def walk(value):
    if isinstance(value, gin.config.ConfigurableReference):
      if value.configurable.selector == "gin.macro":
        names.add(value.scoped_selector.split("/")[0])
    elif isinstance(value, dict):
      for v in value.values():
        walk(v)
    elif isinstance(value, (list, tuple)):
      for v in value:
        walk(v)

  for (scope, selector), params in gin.config._CONFIG.items():  # pylint: disable=protected-access
    if selector == "gin.macro":
      names.add(scope)
    walk(params)
  return names


def _first_line(e: BaseException) -> str:
  """The error's first two lines (a gin parse error's second names the place), without the
  "In call to configurable ..." gin appends to an error raised inside a configurable."""
  lines = [l.strip() for l in str(e).splitlines()
           if l.strip() and not l.strip().startswith("In call to configurable")]
  return "; ".join(lines[:2]) if lines else type(e).__name__


_FLAG_QUOTING = re.compile(r"a string value needs quotes inside the flag: "
                           r"--gin\.([\w.]+)=\"'(.*)'\"")


def _quoting_as_written(message: str, sweep: Sweep) -> str:
  """gin's parse error of a binding the spec file gives (not a --gin.X flag), with the quoting
  hint in YAML (`NAME: "'text'"`), where the CLI's hint shows the flag's syntax."""
  m = _FLAG_QUOTING.search(message)
  source = sweep.binding_sources.get(m[1], "") if m else ""
  if not m or source.startswith("--gin."):
    return message
  value = f"\"'{m[2]}'\""
  if source == f"axis {m[1]!r}":  # (a list of values)
    value = f"[{value}, ...]"
  return message[:m.start()] + (f"a string value needs gin's quotes inside the YAML string: "
                                f"{m[1]}: {value}") + message[m.end():]


def validate_gin(sweep: Sweep, parse_gin: Callable[..., None],
                 check_required: Callable[[str], None], check_eval: bool = False) -> None:
  """Parses each job's gin config as `prompt-jax train` would: unknown macros (did you mean),
  unknown configurables or parameters, missing required macros, and (`check_required`) the
  values train checks before it runs. Sets each job's train_steps.
  `check_eval`: also each group's `prompt-jax eval` config (the emitted eval jobs).

  `parse_gin(files, bindings, search_paths)` and `check_required(command)` are the CLI's (passed
  in: launch/ sits below cli.py; its `check_job`: the required macros and train's value checks).
  """
  import gin  # pylint: disable=g-import-not-at-top
  firsts = list({job.group: job for job in reversed(sweep.jobs)}.values())[::-1]
  known_by_files: Dict[Tuple, set] = {}
  try:
    for job in firsts:  # seeds change RANDOM_SEED only: one parse per group
      key = (job.gin_files, job.search_paths)
      if key not in known_by_files:
        try:
          parse_gin(list(job.gin_files), [], list(job.search_paths))
        except Exception as e:  # pylint: disable=broad-except
          raise ConfigError(f"job {job.name}: {_first_line(e)}") from e
        known_by_files[key] = gin_macros()
    # A macro bound for every job must be used by some job's files; an axis' macro by the
    # files of each job it is set for (else that axis changes nothing there).
    anywhere = set().union(*known_by_files.values()) if known_by_files else set()
    for job in firsts:
      own = known_by_files[(job.gin_files, job.search_paths)]
      for name, _ in job.bindings:
        if not is_macro(name) or name == "MODEL_DIR":
          continue
        where = sweep.binding_sources.get(name, "bindings")
        known = own if where.startswith("axis") else anywhere
        if name not in known:
          scope = f"job {job.name}" if where.startswith("axis") else "any job"
          raise ConfigError(
              f"{where}: unknown gin macro {name} (no gin file of {scope} binds or uses it)"
              f"{did_you_mean(name, sorted(known))}")
    steps_by_group: Dict[str, Optional[int]] = {}
    for job in firsts:
      try:
        parse_gin(list(job.gin_files), [f"{k} = {v}" for k, v in job.bindings],
                  list(job.search_paths))
        check_required("train")
        steps = gin.query_parameter("%TRAIN_STEPS")
      except Exception as e:  # pylint: disable=broad-except
        raise ConfigError(f"job {job.name}: {_quoting_as_written(_first_line(e), sweep)}") from e
      steps_by_group[job.group] = int(steps) if isinstance(steps, int) else None
      if check_eval:
        job.train_steps = steps_by_group[job.group]
        files, bindings = job.eval_config()
        try:
          parse_gin(files, [f"{k} = {v}" for k, v in bindings], list(job.search_paths))
          check_required("eval")
        except Exception as e:  # pylint: disable=broad-except
          raise ConfigError(f"eval job of {job.name}: "
                            f"{_quoting_as_written(_first_line(e), sweep)}") from e
    for job in sweep.jobs:
      job.train_steps = steps_by_group[job.group]
  finally:
    gin.clear_config()
