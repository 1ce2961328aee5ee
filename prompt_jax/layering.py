"""How `prompt-jax` layers gin: later layers win, and no packaged file can override yours.

  1. runs/defaults.gin       every packaged default value (PROMPT_LENGTH = 100, BATCH_SIZE = 32..)
     + the command's run file (eval: runs/prompt_eval.gin, infer: runs/prompt_infer.gin), which
     only wires function parameters to macros
  2. packaged files you name (--gin_file=runs/..., models/..., prompts/...), general to specific
     whatever their order: runs/, then models/, then prompts/ (a method file beats a run file)
  3. MODEL_DIR/config.gin    eval / infer / export / describe of a trained run: what it was
     trained with (model, method, prompt length, task, lengths, backbone) wins over 1-2
  4. your own gin files, in order
  5. --gin_bindings and --gin.NAME=VALUE flags

Packaged run files bind no values (only `param = %MACRO` wiring), so including them anywhere
cannot clobber a value. A packaged file whose value the run's config.gin replaces gets a note;
an override (4-5) that contradicts the run's checkpoint gets one error line naming both values.

This module is the CLI's (floor 5): gin stays at the edge. `snapshot()` reads gin's table of
bindings (gin has no public API for it); the CLI already relies on it for unbound macros.
"""
import contextlib
import dataclasses
import functools
import logging
import os
import re
import tokenize
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from prompt_jax.errors import ConfigError, did_you_mean

DEFAULTS_FILE = "runs/defaults.gin"
PACKAGED_ORDER = ("runs/", "models/", "prompts/")  # general -> specific

Key = Tuple[str, str, str]  # (scope, selector, parameter); a macro is (NAME, 'gin.macro', 'value')
_MISSING = object()


@dataclasses.dataclass
class Layers:
  """What was parsed, in order, and what a run's config.gin contributed."""
  defaults: List[str]
  packaged: List[str]
  own: List[str]
  bindings: List[str]
  run_config: Optional[str] = None  # MODEL_DIR/config.gin when layered
  run_values: Optional[Dict[Key, Any]] = None  # the bindings right after config.gin (layer 3)
  notes: List[str] = dataclasses.field(default_factory=list)

  def from_run(self, macro: str) -> bool:
    """Whether `macro` holds the value the run's config.gin gave it: set there, not changed by
    an own file after it, nor set again by a binding."""
    key = (macro, "gin.macro", "value")
    if self.run_values is None or key not in self.run_values:
      return False
    if any(b.split("=", 1)[0].strip() == macro for b in self.bindings):
      return False
    return _same(self.run_values[key], snapshot().get(key, _MISSING))


def _gin():
  import gin  # pylint: disable=g-import-not-at-top
  return gin


class _QuietGinLookups(logging.Filter):
  """gin logs 'Path not found' for every search path it tries before the one that has the file."""

  def filter(self, record):
    return not str(record.getMessage()).startswith("Path not found")


_QUIET_LOOKUPS = _QuietGinLookups()


def quiet_gin_lookups() -> None:
  """Hides gin's `Path not found` log lines (one per search path it tries before the one that
  has the file): not actionable; a file found nowhere is an error of its own."""
  logging.getLogger().removeFilter(_QUIET_LOOKUPS)
  logging.getLogger().addFilter(_QUIET_LOOKUPS)


def first_line(e: BaseException) -> str:
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  if not lines:
    return type(e).__name__
  # gin appends "In file ..., line N" context: keep it on the same line.
  return "; ".join(lines[:3])


def _parse(files: Sequence[str], bindings: Sequence[str] = ()) -> None:
  try:
    _gin().parse_config_files_and_bindings(list(files), list(bindings), finalize_config=False)
  except tokenize.TokenError as e:  # unbalanced brackets: gin does not say where
    raise ConfigError(f"gin: {_unbalanced(files) or _unbalanced_binding(bindings) or first_line(e)}"
                      ) from e
  except SyntaxError as e:
    raise ConfigError(f"gin: {_binding_syntax(e) or first_line(e)}") from e
  except (ValueError, KeyError, IOError) as e:
    raise ConfigError(f"gin: {first_line(e)}{_gin_hint(e)}") from e


def _binding_syntax(e: SyntaxError) -> Optional[str]:
  """The binding (--gin.NAME=VALUE / --gin_bindings) that gin could not parse, and how to quote
  a string in it; None for an error in a file (gin's message names the file and line)."""
  if e.filename is not None or not e.text or "=" not in e.text:
    return None
  name, value = (part.strip() for part in e.text.split("=", 1))
  # gin's message may span lines and quote a Python object's repr (`<ast.Name object at 0x..>`):
  # its readable lines, joined.
  why = "; ".join(l.strip().rstrip(".") for l in str(e.msg).splitlines()
                  if l.strip() and "object at 0x" not in l) or "a syntax error"
  message = f"cannot parse the binding `{e.text.strip()}` ({why})"
  number = _bound_number(name)
  if number is not None:  # TRAIN_STEPS=abc, LEARNING_RATE=3e-1x: quoting would not help
    message += f"; {name} takes a number, e.g. --gin.{name}={number!r}"
  elif re.match(r"[A-Za-z_/.~]", value):  # a bare word or path: a string without its quotes
    message += (f"; a string value needs quotes inside the flag: "
                f"--gin.{name}=\"'{value}'\"")
  return message


def is_bound(selector: str) -> bool:
  """Whether the parsed gin config binds `selector` (`configurable.parameter`, or `%MACRO`)."""
  try:
    _gin().query_parameter(selector)
    return True
  except ValueError:
    return False


BINDS_A_MODEL = "prompt_jax.t5_config.preset"  # what a models/*.gin file binds


def _bound_number(name: str) -> Optional[float]:
  """The number `name` (a macro, or configurable.parameter) is bound to so far (a packaged
  default), or None when it is unbound or not a number."""
  try:
    value = _gin().query_parameter(name if "." in name else f"%{name}")
  except Exception:  # pylint: disable=broad-except
    return None
  return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def gin_path(f: str, search_paths: Optional[Sequence[str]] = None) -> Optional[str]:
  """Where gin finds the file `f`: as given, or in a search path (gin's own by default)."""
  if search_paths is None:
    from gin import config as gin_config  # pylint: disable=g-import-not-at-top
    search_paths = gin_config._LOCATION_PREFIXES  # pylint: disable=protected-access
  candidates = [f] + [os.path.join(d, f) for d in search_paths]
  return next((p for p in candidates if os.path.isfile(p)), None)


def _unbalanced(files: Sequence[str]) -> Optional[str]:
  """'<file>: a bracket opened on line N is never closed' for the first such gin file."""
  import io  # pylint: disable=g-import-not-at-top
  for f in files:
    path = gin_path(f)
    if path is None:
      continue
    with open(path) as fh:
      text = fh.read()
    opened = []  # line of each bracket still open
    try:
      for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
          opened.append(tok.start[0])
        elif tok.type == tokenize.OP and tok.string in ")]}" and opened:
          opened.pop()
    except tokenize.TokenError:
      return (f"{path}: the bracket opened on line {opened[-1] if opened else '?'} is never "
              f"closed")
  return None


def _unbalanced_binding(bindings: Sequence[str]) -> Optional[str]:
  """'the binding `X = {...` opens a bracket it never closes' for the first such binding
  (--gin.X=V / --gin_bindings)."""
  import io  # pylint: disable=g-import-not-at-top
  for binding in bindings:
    try:
      list(tokenize.generate_tokens(io.StringIO(binding).readline))
    except tokenize.TokenError:
      name = binding.split("=", 1)[0].strip()
      return (f"the binding `{binding.strip()}` opens a bracket it never closes; close it "
              f"(--gin.{name}=...)")
  return None


def _gin_hint(e: BaseException) -> str:
  """'did you mean' for a misspelled configurable or parameter in a gin error."""
  import gin  # pylint: disable=g-import-not-at-top
  text = str(e)
  registry = gin.config._REGISTRY  # pylint: disable=protected-access
  match = re.search(r"No configurable matching '([^']+)'", text)
  if match:
    return did_you_mean(match.group(1), [k for k, _ in registry.items()])
  match = re.search(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'", text)
  if match:
    try:
      import inspect  # pylint: disable=g-import-not-at-top
      fn = registry.get_match(match.group(1)).wrapped
      return did_you_mean(match.group(2), inspect.signature(fn).parameters)
    except Exception:  # pylint: disable=broad-except
      return ""
  return ""


def _rank(path: str) -> int:
  from prompt_jax import paths  # pylint: disable=g-import-not-at-top
  if is_initialiser(paths.gin_dir(), path):  # after the method file, whatever the order given
    return len(PACKAGED_ORDER)
  for rank, prefix in enumerate(PACKAGED_ORDER):
    if path.startswith(prefix):
      return rank
  return len(PACKAGED_ORDER)


def _gin_files(gin_dir: str) -> List[str]:
  return [os.path.relpath(os.path.join(d, f), gin_dir)
          for d, _, fs in os.walk(gin_dir) for f in fs if f.endswith(".gin")]


@functools.lru_cache(maxsize=None)
def packaged_macros() -> frozenset:
  """Every macro a packaged gin file binds or references (NAME = ..., %NAME)."""
  import re  # pylint: disable=g-import-not-at-top
  from prompt_jax import paths  # pylint: disable=g-import-not-at-top
  gin_dir = paths.gin_dir()
  names = set()
  for f in _gin_files(gin_dir):
    with open(os.path.join(gin_dir, f)) as fh:
      text = fh.read()
    names.update(re.findall(r"%([A-Z][A-Z0-9_]*)", text))
    names.update(re.findall(r"^([A-Z][A-Z0-9_]*)\s*=", text, flags=re.M))
  return frozenset(names)


# A method file's own line: the spec it trains (prompts/*.gin), `@prompt_jax.<configurable>()`.
_METHOD_BINDING = re.compile(r"^\s*(?:prompt_jax\.)?model_spec\.prompt\s*=\s*@(?:prompt_jax\.)?"
                             r"(\w+)\(\)", re.M)
# An initialiser file's line (prompts/from_*.gin, uniform.gin): PROMPT_INIT starts the [P, H]
# prompt of each method the included file binds.
INITIALISERS_FILE = "prompts/init/every_method.gin"
_INITIALISER = re.compile(rf"^include '{re.escape(INITIALISERS_FILE)}'", re.M)


@functools.lru_cache(maxsize=None)
def _read(path: str) -> str:
  with open(path) as f:
    return f.read()


def is_initialiser(gin_dir: str, f: str) -> bool:
  return bool(_INITIALISER.search(_read(os.path.join(gin_dir, f))))


_INCLUDE = re.compile(r"^\s*include\s+['\"]([^'\"]+)['\"]", re.M)


def prompt_includes(gin_dir: str, f: str) -> List[str]:
  """The packaged prompts/ files that the packaged file `f` includes itself."""
  return [i for i in _INCLUDE.findall(_read(os.path.join(gin_dir, f)))
          if i.startswith("prompts/") and os.path.isfile(os.path.join(gin_dir, i))]


def method_of(gin_dir: str, files: Sequence[str]) -> Optional[str]:
  """The configurable the first method file (prompts/*.gin) among `files` trains, or None; a
  file that builds on another method file (prefix_ipt.gin includes prefix.gin) trains its."""
  for f in files:
    if f.replace(os.sep, "/").startswith("prompts/"):
      m = _METHOD_BINDING.search(_read(os.path.join(gin_dir, f)))
      if m:
        return m.group(1)
      included = method_of(gin_dir, prompt_includes(gin_dir, f))
      if included:
        return included
  return None


def check_method_files(gin_dir: str, packaged: Sequence[str],
                       named: Callable[[str], str] = lambda f: f) -> None:
  """Two packaged method files (the later would train, with settings left over from the other),
  or an initialiser file with a method that has no [P, H] prompt to start (it would be ignored):
  one ConfigError each, naming each file as `named` does (as the user gave it)."""
  methods = [(f, m) for f in packaged for m in [method_of(gin_dir, [f])] if m]
  if len(methods) > 1:
    raise ConfigError(f"--gin_file={named(methods[0][0])} and --gin_file={named(methods[1][0])} "
                      f"each choose the prompt method (prompt_jax.model_spec.prompt): give one "
                      f"method file; initialisers (prompts/from_*.gin, uniform.gin) and "
                      f"prompts/visibility.gin go with any method that has a prompt to start")
  initialisers = [f for f in packaged if is_initialiser(gin_dir, f)]
  if methods and initialisers:
    takes = set(re.findall(r"^prompt_jax\.(\w+)\.\w+ = %PROMPT_INIT", _read(
        os.path.join(gin_dir, INITIALISERS_FILE)), re.M))
    (method_file, method), = methods
    if method not in takes:
      raise ConfigError(f"--gin_file={named(initialisers[0])} starts a [P, H] prompt, which "
                        f"{named(method_file)}'s {method} does not have (it would be ignored): "
                        f"drop it; the method file's own macros set how it starts")


def split_files(gin_files: Sequence[str], search_paths: Sequence[str]
                ) -> Tuple[List[str], List[str], List[str]]:
  """(search dirs, packaged files sorted general -> specific, own files in order)."""
  from prompt_jax import paths  # pylint: disable=g-import-not-at-top
  gin_dir = paths.gin_dir()
  dirs = [d for p in search_paths for d in p.split(",") if d] + [gin_dir]
  user_dirs = dirs[:-1]

  def is_packaged(f):
    return (not os.path.isabs(f) and os.path.exists(os.path.join(gin_dir, f))
            and not any(os.path.exists(os.path.join(d, f)) for d in user_dirs))

  packaged = [f for f in gin_files if is_packaged(f)]
  for f in packaged:
    if f.replace(os.sep, "/").startswith("t5x/runs/"):  # they wire t5x's own binaries' scripts
      own_run = f[len("t5x/"):]
      raise ConfigError(
          f"gin file {f} is for t5x's binaries (python -m t5x.train / eval / infer); prompt-jax "
          f"takes its own run files: "
          + (f"--gin_file={own_run}" if os.path.exists(os.path.join(gin_dir, own_run))
             else "runs/*.gin"))
  check_method_files(gin_dir, packaged)
  own = [f for f in gin_files if f not in packaged]
  packaged.sort(key=_rank)  # stable: same-kind files keep their order
  for f in packaged + own:
    if not (os.path.exists(f) or any(os.path.exists(os.path.join(d, f)) for d in dirs)):
      raise ConfigError(f"gin file {f!r} not found (searched ., {', '.join(dirs)})"
                        + did_you_mean(f, _gin_files(gin_dir)))
  return dirs, packaged, own


def parse(gin_files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str],
          implied: Sequence[str] = (),
          find_run_config: Optional[Callable[[], Optional[Tuple[str, str]]]] = None) -> Layers:
  """Parses the layers above into gin's (cleared) config; not finalized.

  `implied`: packaged run files the command always needs (wiring only). `find_run_config()`,
  called once everything but a run is parsed (so MODEL_DIR is known), returns (path, text) of
  the run's config.gin to layer in, or None.
  """
  gin = _gin()
  gin.clear_config()
  dirs, packaged, own = split_files(gin_files, search_paths)
  for d in dirs:
    gin.add_config_file_search_path(d)
  quiet_gin_lookups()
  defaults = [DEFAULTS_FILE] + [f for f in implied if f != DEFAULTS_FILE]
  packaged = [f for f in packaged if f not in defaults]  # parsed once, first
  layers = Layers(defaults=defaults, packaged=packaged, own=own, bindings=list(bindings))
  _parse(defaults + packaged)
  _parse(own, bindings)
  run = find_run_config() if find_run_config else None
  if run is None:
    return layers

  path, text = run
  gin.clear_config()
  _parse(defaults)
  before = snapshot()
  set_by: Dict[Key, str] = {}
  for f in packaged:
    _parse([f])
    after = snapshot()
    set_by.update({k: f for k in changed(before, after)})
    before = after
  try:
    gin.parse_config(text)
  except (ValueError, KeyError, SyntaxError, IOError) as e:
    raise ConfigError(f"{path}: {first_line(e)}") from e
  layers.run_config = path
  layers.run_values = snapshot()
  for key, f in sorted(set_by.items()):
    if not _same(layers.run_values.get(key, _MISSING), before.get(key, _MISSING)):
      layers.notes.append(f"{path} keeps {show(layers.run_values, key)}: {f}'s "
                          f"{_value(before, key)} does not apply to this run")
  _parse(own, bindings)
  return layers


# ===== Bindings as data =====

def snapshot() -> Dict[Key, Any]:
  """Every binding gin holds now: {(scope, selector, parameter): value}."""
  config = _gin().config._CONFIG  # pylint: disable=protected-access
  return {(scope, selector, param): value
          for (scope, selector), params in config.items() for param, value in params.items()}


def _same(a, b) -> bool:
  return repr(a) == repr(b)  # gin references compare by what they print (@f(), %MACRO)


def changed(before: Mapping[Key, Any], after: Mapping[Key, Any]) -> List[Key]:
  return sorted(k for k in set(before) | set(after)
                if not _same(before.get(k, _MISSING), after.get(k, _MISSING)))


def name(key: Key) -> str:
  scope, selector, param = key
  if selector == "gin.macro":
    return scope
  return f"{scope + '/' if scope else ''}{selector}.{param}"


def _value(values: Mapping[Key, Any], key: Key) -> str:
  value = values.get(key, _MISSING)
  return "unset" if value is _MISSING else repr(value)


def show(values: Mapping[Key, Any], key: Key) -> str:
  """'PROMPT_LENGTH=8', 'prompt_jax.model_spec.prompt=@prompt_jax.dpt()', 'X unset'."""
  value = values.get(key, _MISSING)
  return f"{name(key)} unset" if value is _MISSING else f"{name(key)}={value!r}"


@contextlib.contextmanager
def reverted(key: Key, values: Mapping[Key, Any]) -> Iterator[None]:
  """Temporarily gives `key` its value in `values` (or unbinds it)."""
  config = _gin().config._CONFIG  # pylint: disable=protected-access
  scope, selector, param = key
  created = (scope, selector) not in config
  entry = config.setdefault((scope, selector), {})
  old = entry.get(param, _MISSING)
  if key in values:
    entry[param] = values[key]
  else:
    entry.pop(param, None)
  try:
    yield
  finally:
    if old is _MISSING:
      entry.pop(param, None)
    else:
      entry[param] = old
    if created and not entry:
      del config[(scope, selector)]


METHOD_BINDING = "prompt_jax.model_spec.prompt"


def contradiction(run_values: Mapping[Key, Any], problem_fn: Callable[[], Optional[str]],
                  where: str) -> Optional[str]:
  """One line when the configuration contradicts the run's checkpoint, naming the overrides.

  `problem_fn()` says what does not fit (None: it fits) under the current bindings. The
  overrides are the bindings that differ from the run's (`run_values`); those that make it fit
  when reverted alone are named, e.g. "PROMPT_LENGTH=16 contradicts the checkpoint in /r
  (trained with PROMPT_LENGTH=8): drop the override or use a new MODEL_DIR".
  """
  problem = problem_fn()
  if problem is None:
    return None
  final = snapshot()
  overrides = changed(run_values, final)

  def problem_without(key):
    with reverted(key, run_values):
      try:
        return problem_fn()
      except Exception as e:  # pylint: disable=broad-except
        return f"{type(e).__name__}: {e}"  # reverting one binding alone can leave others dangling

  without = {k: problem_without(k) for k in overrides}
  culprits = ([k for k in overrides if without[k] is None]
              or [k for k in overrides if without[k] != problem])
  # Another method brings its own macros (its gin file binds them): name the method alone.
  culprits = [k for k in culprits if name(k) == METHOD_BINDING] or culprits
  if not culprits:
    return (f"the configuration contradicts the checkpoint in {where}: {problem}; use the "
            f"run's own settings or a new MODEL_DIR")
  verb = "contradicts" if len(culprits) == 1 else "contradict"
  return (f"{', '.join(show(final, k) for k in culprits)} {verb} the checkpoint in {where} "
          f"(trained with {', '.join(show(run_values, k) for k in culprits)}): drop the "
          f"override or use a new MODEL_DIR")
