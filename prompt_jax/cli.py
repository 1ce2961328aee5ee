"""`prompt-jax`: train | eval | infer | describe | tasks | bench, with t5x's flags.

  prompt-jax train --gin_file=models/t5_1_1_large.gin --gin_file=runs/prompt_finetune.gin \\
      --gin.MODEL_DIR="'/tmp/m'" --gin.TRAIN_STEPS=1000 ...

Flags (as t5x's train.py): --gin_file (repeatable; later overrides earlier), --gin.NAME=VALUE,
--gin_bindings (repeatable), --gin_search_paths (comma separated; the packaged gin dir is
always searched), --tfds_data_dir, and --multiprocess_gpu / --coordinator_address /
--process_count / --process_index for multi-host runs.

Precedence (no include-order traps): packaged gin files are parsed first, from the general to
the specific whatever their order on the command line -- runs/ (defaults of a kind of run), then
models/, then prompts/ (a method may rebind the run's prompt or optimizer) -- then your own gin
files in order, then --gin_bindings and --gin.NAME=VALUE flags. So a packaged file never
overrides a value you set in your file or on the command line, and a method file always wins
over a run file.

Bad configurations print one line `prompt-jax <cmd>: error: ...` and exit with status 2,
before anything is written to MODEL_DIR (--verbose adds the traceback). A run that cannot go on
(non-finite loss, no intact checkpoint, a failed write) prints one such line and exits 1; a run
preempted by SIGTERM saves a checkpoint, says so and exits 143 (README "When things go wrong").
"""
import argparse
import logging
import os
import sys
import tokenize
from typing import List, Optional, Sequence, Tuple

COMMANDS = ("train", "eval", "infer", "describe", "tasks", "bench")
# Macros each command needs bound (t5x names).
REQUIRED_MACROS = {
    "train": ("MODEL_DIR", "MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "TRAIN_STEPS",
              "BATCH_SIZE", "INITIAL_CHECKPOINT_PATH"),
    "eval": ("MODEL_DIR", "MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "BATCH_SIZE",
             "INITIAL_CHECKPOINT_PATH"),
    "infer": ("MODEL_DIR", "MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "BATCH_SIZE",
              "INITIAL_CHECKPOINT_PATH"),
    "describe": (),
}
EXIT_CONFIG_ERROR = 2
EXIT_RUN_ERROR = 1
EXIT_PREEMPTED = 128 + 15  # what a shell reports for a process ended by SIGTERM


class _Error(Exception):
  """A usage/configuration error reported as one line."""


class _OneLineParser(argparse.ArgumentParser):
  """argparse's errors as one line (`prompt-jax <cmd>: error: ...`), not usage + message."""

  def error(self, message):
    raise _Error(message + " (prompt-jax <command> --help lists the flags)")


def _parser(command: str) -> argparse.ArgumentParser:
  parser = _OneLineParser(
      prog=f"prompt-jax {command}",
      description=f"prompt-jax {command}: configured by gin, with t5x's flags. "
                  "--gin.NAME=VALUE binds a gin macro or parameter (e.g. "
                  "--gin.MODEL_DIR=\"'/tmp/run'\", --gin.TRAIN_STEPS=1000); it wins over every "
                  "gin file. Packaged gin files are parsed before your own files.",
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin file (repeatable; later overrides earlier). Relative paths are "
                           "looked up in --gin_search_paths and the packaged gin dir, e.g. "
                           "runs/prompt_finetune.gin")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="gin binding, e.g. 'MODEL_DIR=\"/tmp/m\"' (repeatable)")
  parser.add_argument("--gin.NAME=VALUE", dest="_gin_dot", metavar="", default=None,
                      help="a gin binding NAME = VALUE (repeatable; applied last)")
  parser.add_argument("--gin_search_paths", action="append", default=[],
                      help="comma-separated dirs to search for gin files (the packaged gin "
                           "dir is always searched)")
  parser.add_argument("--tfds_data_dir", default=None,
                      help="TFDS data dir override for seqio tasks")
  parser.add_argument("--data_dir", default=None,
                      help="dir of official-format task files (super_glue/, glue/, mrqa/), "
                           "read instead of TFDS by every task; same as --gin.DATA_DIR")
  parser.add_argument("--multiprocess_gpu", action="store_true",
                      help="initialise jax.distributed for multi-process GPU runs")
  parser.add_argument("--coordinator_address", default=None,
                      help="host:port of process 0 (multi-host)")
  parser.add_argument("--process_count", type=int, default=None,
                      help="number of processes (multi-host)")
  parser.add_argument("--process_index", type=int, default=None,
                      help="index of this process (multi-host)")
  parser.add_argument("--verbose", action="store_true",
                      help="print the traceback of an error, not only its one-line message")
  return parser


def split_gin_dot_flags(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
  """Pulls `--gin.NAME=VALUE` (or `--gin.NAME VALUE`) out of argv -> (rest, bindings)."""
  rest, bindings = [], []
  argv = list(argv)
  i = 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith("--gin.") and arg != "--gin.NAME=VALUE":
      name_value = arg[len("--gin."):]
      if "=" in name_value:
        name, value = name_value.split("=", 1)
      elif i + 1 < len(argv):
        name, value = name_value, argv[i + 1]
        i += 1
      else:
        raise _Error(f"{arg} needs a value: --gin.NAME=VALUE")
      bindings.append(f"{name} = {value}")
    else:
      rest.append(arg)
    i += 1
  return rest, bindings


def initialize_distributed(args) -> None:
  """jax.distributed.initialize from t5x's multi-host flags (before any other jax use)."""
  if not (args.multiprocess_gpu or args.coordinator_address):
    if args.process_count not in (None, 1):
      raise _Error("--process_count > 1 needs --coordinator_address")
    return
  import jax  # pylint: disable=g-import-not-at-top
  if args.coordinator_address is None or args.process_count is None or args.process_index is None:
    raise _Error("multi-host runs need --coordinator_address, --process_count and "
                 "--process_index")
  if not 0 <= args.process_index < args.process_count:
    raise _Error(f"--process_index={args.process_index} must be in [0, --process_count="
                 f"{args.process_count}); number the processes 0 .. process_count - 1")
  if not args.multiprocess_gpu:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=args.coordinator_address,
                             num_processes=args.process_count, process_id=args.process_index)


_PACKAGED_ORDER = ("runs/", "models/", "prompts/")  # general -> specific


def _packaged_rank(path: str) -> int:
  for rank, prefix in enumerate(_PACKAGED_ORDER):
    if path.startswith(prefix):
      return rank
  return len(_PACKAGED_ORDER)


def _packaged(path: str, gin_dir: str) -> bool:
  return not os.path.isabs(path) and os.path.exists(os.path.join(gin_dir, path))


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str],
              search_paths: Sequence[str]) -> None:
  """Packaged files first, then the user's files (in order), then the bindings."""
  import gin  # pylint: disable=g-import-not-at-top
  from prompt_jax import paths  # pylint: disable=g-import-not-at-top
  _register_configurables()
  gin.clear_config()
  gin_dir = paths.gin_dir()
  dirs = [d for p in search_paths for d in p.split(",") if d] + [gin_dir]
  for d in dirs:
    gin.add_config_file_search_path(d)
  user_dirs = dirs[:-1]
  packaged = [f for f in gin_files
              if _packaged(f, gin_dir) and not any(os.path.exists(os.path.join(d, f))
                                                   for d in user_dirs)]
  own = [f for f in gin_files if f not in packaged]
  packaged.sort(key=_packaged_rank)  # stable: same-kind files keep their order
  for f in list(packaged) + list(own):
    if not _exists(f, dirs):
      raise _Error(f"gin file {f!r} not found (searched ., {', '.join(dirs)})"
                   + _did_you_mean(f, _gin_files(gin_dir)))
  logging.getLogger().addFilter(_QuietGinLookups())
  try:
    gin.parse_config_files_and_bindings(packaged + own, list(bindings), finalize_config=False)
  except tokenize.TokenError as e:  # unbalanced brackets: gin does not say where
    raise _Error(f"gin: {_unbalanced(packaged + own, dirs) or _first_line(e)}") from e
  except (ValueError, KeyError, SyntaxError, IOError) as e:
    raise _Error(f"gin: {_first_line(e)}{_gin_hint(e)}") from e


class _QuietGinLookups(logging.Filter):
  """gin logs 'Path not found' for every search path it tries before the one that has the file."""

  def filter(self, record):
    return not str(record.getMessage()).startswith("Path not found")


def _unbalanced(files: Sequence[str], dirs: Sequence[str]) -> Optional[str]:
  """'<file>: a bracket opened on line N is never closed' for the first such gin file."""
  import io  # pylint: disable=g-import-not-at-top
  for f in files:
    path = next((p for p in [f] + [os.path.join(d, f) for d in dirs] if os.path.exists(p)), None)
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


def _exists(f: str, dirs: Sequence[str]) -> bool:
  return os.path.exists(f) or any(os.path.exists(os.path.join(d, f)) for d in dirs)


def _first_line(e: BaseException) -> str:
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  if not lines:
    return type(e).__name__
  # gin appends "In file ..., line N" context: keep it on the same line.
  return "; ".join(lines[:3])


def check_required(command: str) -> None:
  import gin  # pylint: disable=g-import-not-at-top
  missing = []
  for name in REQUIRED_MACROS.get(command, ()):
    try:
      value = gin.query_parameter(f"%{name}")
    except ValueError:
      missing.append(name)
      continue
    if value is gin.REQUIRED or repr(value) == "%gin.REQUIRED":
      missing.append(name)
  if command != "describe":  # describe needs only the model's bindings
    missing += [m for m in unbound_macros() if m not in missing]
  check_macro_typos()
  if missing:
    raise _Error(f"missing required macro{'s' if len(missing) > 1 else ''} "
                 f"{', '.join(missing)}: set {' '.join(f'--gin.{m}=...' for m in missing)} "
                 f"or bind {'them' if len(missing) > 1 else 'it'} in a gin file")


def unbound_macros() -> List[str]:
  """Macros that some binding references (e.g. %CLASS_LABELS) but nothing binds."""
  import gin  # pylint: disable=g-import-not-at-top
  referenced = set()

  def walk(value):
    if isinstance(value, gin.config.ConfigurableReference):
      if value.configurable.selector == "gin.macro":
        referenced.add(value.scoped_selector.split("/")[0])
    elif isinstance(value, dict):
      for v in value.values():
        walk(v)
    elif isinstance(value, (list, tuple)):
      for v in value:
        walk(v)

  for params in gin.config._CONFIG.values():  # pylint: disable=protected-access
    walk(params)
  bound = {scope for scope, selector in gin.config._CONFIG  # pylint: disable=protected-access
           if selector == "gin.macro"}
  return sorted(referenced - bound)


def _referenced_macros() -> set:
  import gin  # pylint: disable=g-import-not-at-top
  referenced = set()

  def walk(value):
    if isinstance(value, gin.config.ConfigurableReference):
      if value.configurable.selector == "gin.macro":
        referenced.add(value.scoped_selector.split("/")[0])
    elif isinstance(value, dict):
      for v in value.values():
        walk(v)
    elif isinstance(value, (list, tuple)):
      for v in value:
        walk(v)

  for params in gin.config._CONFIG.values():  # pylint: disable=protected-access
    walk(params)
  return referenced


_USER_MACROS: List[str] = []  # macros bound by --gin.NAME=VALUE / --gin_bindings


def check_macro_typos() -> None:
  """A macro set on the command line that no binding uses is a typo (gin would ignore it)."""
  referenced = _referenced_macros()
  for name in _USER_MACROS:
    if name not in referenced:
      raise _Error(f"--gin.{name} sets a macro that nothing uses"
                   + (_did_you_mean(name, referenced) or
                      "; check its spelling against the run's gin files"))


def _did_you_mean(name: str, choices) -> str:
  import difflib  # pylint: disable=g-import-not-at-top
  close = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.6)
  return f"; did you mean {close[0]}?" if close else ""


def _gin_files(gin_dir: str) -> List[str]:
  return [os.path.relpath(os.path.join(d, f), gin_dir)
          for d, _, fs in os.walk(gin_dir) for f in fs if f.endswith(".gin")]


def _gin_hint(e: BaseException) -> str:
  """'did you mean' for a misspelled configurable or parameter in a gin error."""
  import re  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  text = str(e)
  registry = gin.config._REGISTRY  # pylint: disable=protected-access
  match = re.search(r"No configurable matching '([^']+)'", text)
  if match:
    return _did_you_mean(match.group(1), [k for k, _ in registry.items()])
  match = re.search(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'", text)
  if match:
    try:
      import inspect  # pylint: disable=g-import-not-at-top
      fn = registry.get_match(match.group(1)).wrapped
      return _did_you_mean(match.group(2), inspect.signature(fn).parameters)
    except Exception:  # pylint: disable=broad-except
      return ""
  return ""


def _register_configurables() -> None:
  # Importing registers every gin configurable the packaged gin files name.
  import prompt_jax.embedded  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.evaluation.run  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.prompts.initializers  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.tasks  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.train.describe  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.train.loop  # pylint: disable=g-import-not-at-top,unused-import


def _run(command: str) -> int:
  if command == "train":
    from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
    from prompt_jax.train import loop  # pylint: disable=g-import-not-at-top
    metrics = loop.train(infer_fn=inference.evaluate)
    _print_final(metrics)
  elif command == "eval":
    from prompt_jax.evaluation import run  # pylint: disable=g-import-not-at-top
    _print_final(run.evaluate())
  elif command == "infer":
    from prompt_jax.evaluation import run  # pylint: disable=g-import-not-at-top
    run.infer()
  elif command == "describe":
    from prompt_jax.train import describe  # pylint: disable=g-import-not-at-top
    describe.describe()
  return 0


def _print_final(metrics) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  if metrics and jax.process_index() == 0:
    print("final metrics: " + " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())),
          flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
    return _fail("", f"unknown command {argv[0]!r}{_did_you_mean(argv[0], COMMANDS)} "
                     f"(commands: {', '.join(COMMANDS)}; prompt-jax <command> --help)")
  if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
    print(f"usage: prompt-jax {{{','.join(COMMANDS)}}} [flags]   (prompt-jax <cmd> --help)\n\n"
          + __doc__, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
    return 0 if argv and argv[0] in ("-h", "--help") else EXIT_CONFIG_ERROR
  command, rest = argv[0], argv[1:]
  if command == "bench":
    from prompt_jax import bench  # pylint: disable=g-import-not-at-top
    return bench.main(rest)
  if command == "tasks":
    import prompt_jax.embedded.task  # pylint: disable=g-import-not-at-top,unused-import
    from prompt_jax.tasks import inspect as tasks_inspect  # pylint: disable=g-import-not-at-top
    return tasks_inspect.main(rest)
  verbose = "--verbose" in rest
  try:
    rest, dot_bindings = split_gin_dot_flags(rest)
    _USER_MACROS[:] = [b.split("=", 1)[0].strip() for b in dot_bindings + _flag_values(
        rest, "--gin_bindings") if b.split("=", 1)[0].strip().isupper()]
    args = _parser(command).parse_args(rest)
    initialize_distributed(args)
    if args.tfds_data_dir:
      import seqio  # pylint: disable=g-import-not-at-top
      seqio.set_tfds_data_dir_override(args.tfds_data_dir)
    if args.data_dir:
      if command != "describe":  # describe reads no data
        _check_data_dir(args.data_dir)
      import prompt_jax.tasks  # pylint: disable=g-import-not-at-top
      prompt_jax.tasks.set_data_dir(args.data_dir)  # wins over gin's DATA_DIR and the env
    parse_gin(args.gin_file, list(args.gin_bindings) + dot_bindings, args.gin_search_paths)
    check_required(command)
    return _run(command)
  except _Error as e:
    return _fail(command, str(e), verbose=verbose)
  except Exception as e:  # pylint: disable=broad-except
    from prompt_jax import checkpoints  # pylint: disable=g-import-not-at-top
    from prompt_jax.errors import ConfigError, Preempted, RunError  # pylint: disable=g-import-not-at-top
    if isinstance(e, Preempted):  # gin appends "In call to configurable ..." lines
      print(f"prompt-jax {command}: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
      return EXIT_PREEMPTED
    if isinstance(e, RunError):
      return _fail(command, str(e).splitlines()[0], EXIT_RUN_ERROR, verbose=verbose)
    if isinstance(e, (ConfigError, checkpoints.CheckpointError)):
      return _fail(command, str(e).splitlines()[0] if str(e) else type(e).__name__,
                   verbose=verbose)
    if isinstance(e, RuntimeError) and "Required bindings" in str(e):
      hint = (" (add a model file, e.g. --gin_file=models/t5_1_1_base.gin)"
              if "t5_config" in str(e) else "")
      return _fail(command, "gin: " + str(e).splitlines()[0] + hint, verbose=verbose)
    if isinstance(e, (TypeError, ValueError)) and "gin" in str(e).lower():
      return _fail(command, "gin: " + _first_line(e), verbose=verbose)
    raise


def _check_data_dir(path: str) -> None:
  if "://" not in path and not os.path.isdir(path):
    raise _Error(f"--data_dir {path} is not a directory; point it at a folder laid out like "
                 f"../shared/data (super_glue/, glue/, mrqa/, ...) or leave it out to read TFDS")


def _flag_values(argv: Sequence[str], flag: str) -> List[str]:
  """Values of a repeatable `--flag=value` / `--flag value` in argv (before argparse)."""
  values = []
  for i, arg in enumerate(argv):
    if arg.startswith(flag + "="):
      values.append(arg[len(flag) + 1:])
    elif arg == flag and i + 1 < len(argv):
      values.append(argv[i + 1])
  return values


def _fail(command: str, message: str, code: int = EXIT_CONFIG_ERROR,
          verbose: bool = False) -> int:
  if verbose:
    import traceback  # pylint: disable=g-import-not-at-top
    traceback.print_exc()
  prog = f"prompt-jax {command}" if command else "prompt-jax"
  print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
  return code


if __name__ == "__main__":
  sys.exit(main())
