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
before anything is written to MODEL_DIR.
"""
import argparse
import logging
import os
import sys
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


class _Error(Exception):
  """A usage/configuration error reported as one line."""


def _parser(command: str) -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
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
      raise _Error(f"gin file {f!r} not found (searched ., {', '.join(dirs)})")
  logging.getLogger().addFilter(_QuietGinLookups())
  try:
    gin.parse_config_files_and_bindings(packaged + own, list(bindings), finalize_config=False)
  except (ValueError, KeyError, SyntaxError, IOError) as e:
    raise _Error(f"gin: {_first_line(e)}") from e


class _QuietGinLookups(logging.Filter):
  """gin logs 'Path not found' for every search path it tries before the one that has the file."""

  def filter(self, record):
    return not str(record.getMessage()).startswith("Path not found")


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


def _register_configurables() -> None:
  # Importing registers every gin configurable the packaged gin files name.
  import prompt_jax.embedded  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.evaluation.run  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.prompts.specs  # pylint: disable=g-import-not-at-top,unused-import
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
  try:
    rest, dot_bindings = split_gin_dot_flags(rest)
    args = _parser(command).parse_args(rest)
    initialize_distributed(args)
    if args.tfds_data_dir:
      import seqio  # pylint: disable=g-import-not-at-top
      seqio.set_tfds_data_dir_override(args.tfds_data_dir)
    if args.data_dir:
      import prompt_jax.tasks  # pylint: disable=g-import-not-at-top
      prompt_jax.tasks.set_data_dir(args.data_dir)  # wins over gin's DATA_DIR and the env
    parse_gin(args.gin_file, list(args.gin_bindings) + dot_bindings, args.gin_search_paths)
    check_required(command)
    return _run(command)
  except _Error as e:
    return _fail(command, str(e))
  except Exception as e:  # pylint: disable=broad-except
    from prompt_jax import checkpoints  # pylint: disable=g-import-not-at-top
    from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
    if isinstance(e, (ConfigError, checkpoints.CheckpointError)):
      return _fail(command, str(e).splitlines()[0] if str(e) else type(e).__name__)
    if isinstance(e, RuntimeError) and "Required bindings" in str(e):
      hint = (" (add a model file, e.g. --gin_file=models/t5_1_1_base.gin)"
              if "t5_config" in str(e) else "")
      return _fail(command, "gin: " + str(e).splitlines()[0] + hint)
    if isinstance(e, (TypeError, ValueError)) and "gin" in str(e).lower():
      return _fail(command, "gin: " + _first_line(e))
    raise


def _fail(command: str, message: str) -> int:
  print(f"prompt-jax {command}: error: {message}", file=sys.stderr, flush=True)
  return EXIT_CONFIG_ERROR


if __name__ == "__main__":
  sys.exit(main())
