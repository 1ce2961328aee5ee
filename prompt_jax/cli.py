"""`prompt-jax`: train | eval | ensemble-eval | infer | export | inspect | describe | tasks |
bench | sweep | plan | recycle | ipt-pretrain, with t5x's flags.

  prompt-jax train --gin_file=models/t5_1_1_large.gin --gin_file=runs/prompt_finetune.gin \\
      --gin.MODEL_DIR="'/tmp/m'" --gin.TRAIN_STEPS=1000 ...
  prompt-jax eval --gin.MODEL_DIR="'/tmp/m'"          (a trained run describes itself)
  prompt-jax infer --gin.MODEL_DIR="'/tmp/m'" --input="some text" --input="more text"
  prompt-jax ensemble-eval --gin.ENSEMBLE_PROMPTS="['/p/a.npy', '/runs/b']" ...  (N prompts)
  prompt-jax export --format=npy --gin.MODEL_DIR="'/tmp/m'"      (--format=peft: a PEFT adapter)
  prompt-jax inspect --gin.MODEL_DIR="'/tmp/m'"     (or --prompt=p.npy: neighbours, spectrum)
  prompt-jax describe --gin.MODEL_DIR="'/tmp/m'"
  prompt-jax plan --model=models/t5_1_1_xxl.gin --mesh=8x8 --batch=32 --inputs=512
  prompt-jax recycle --prompt=p.npy --source=CKPT --target=CKPT --output_dir=/tmp/r  (no gin)
  prompt-jax ipt-pretrain --data=labelled.jsonl --emb_dim=768 --out=ipt_table.npy   (no gin)

Flags (as t5x's train.py): --gin_file (repeatable; later overrides earlier), --gin.NAME=VALUE,
--gin_bindings (repeatable), --gin_search_paths (comma separated; the packaged gin dir is
always searched), --tfds_data_dir, and --multiprocess_gpu / --coordinator_address /
--process_count / --process_index for multi-host runs; --verbose shows TensorFlow/absl logs
and tracebacks.

Order (later wins; no include-order traps):
  1. runs/defaults.gin: every packaged default value, and the command's run file (eval:
     runs/prompt_eval.gin, infer: runs/prompt_infer.gin), which binds no values, only wiring;
  2. packaged files you name, from the general to the specific whatever their order on the
     command line: runs/, then models/, then prompts/ (a method file beats a run file);
  3. MODEL_DIR/config.gin, for eval / infer / export / describe of a trained run: the model,
     method, prompt length, task and backbone it was trained with (a packaged file's value it
     replaces gets a note);
  4. your own gin files, in order;
  5. --gin_bindings and --gin.NAME=VALUE flags.
So a packaged file never overrides a value that your file, your flags or the run has set. An
override that contradicts the run's checkpoint (another PROMPT_LENGTH, another method) is
refused with one line naming both values.

Relative paths (MODEL_DIR, PROMPT_FILE, CHECKPOINT_PATH, INITIAL_CHECKPOINT_PATH, DATA_DIR,
--data_dir) are made absolute against the working directory first; gs:// paths are unchanged;
an empty one is refused. Bad configurations print one line `prompt-jax <cmd>: error: ...` and
exit with status 2, before anything is written to MODEL_DIR (--verbose adds the traceback). A
run that cannot go on (non-finite loss, no intact checkpoint, a failed write) prints one such
line and exits 1; a run preempted by SIGTERM saves a checkpoint, says so and exits 143 (README
"When things go wrong"). Every command's last line says where its results are.
"""
import argparse
import contextlib
import functools
import os
import shlex
import signal
import sys
import warnings
import traceback
from typing import List, Optional, Sequence, Tuple

from prompt_jax import errors
from prompt_jax.errors import ConfigError
from prompt_jax import paths
from prompt_jax.paths import absolute

COMMANDS = ("train", "eval", "ensemble-eval", "infer", "export", "inspect", "describe", "tasks",
            "bench", "sweep", "plan", "recycle", "ipt-pretrain")
# Commands that read a trained MODEL_DIR: its config.gin is layered under your files and flags.
RUN_COMMANDS = ("eval", "infer", "export", "inspect", "describe")
# Commands that build the model and its prompt but read no task: a macro only the task's
# settings reference (MIXTURE_OR_TASK_NAME of a t5x run's checkpoint) need not be set.
MODEL_ONLY_COMMANDS = ("export", "inspect", "describe")
# Packaged run files (wiring only) a command always needs.
IMPLIED_RUN_FILES = {"eval": "runs/prompt_eval.gin", "infer": "runs/prompt_infer.gin",
                     "ensemble-eval": "runs/prompt_ensemble_eval.gin"}
# Macros each command needs bound (t5x names).
REQUIRED_MACROS = {
    "train": ("MODEL_DIR", "MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "TRAIN_STEPS",
              "BATCH_SIZE", "INITIAL_CHECKPOINT_PATH"),
    "eval": ("MODEL_DIR", "MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "BATCH_SIZE",
             "INITIAL_CHECKPOINT_PATH"),
    "infer": ("MODEL_DIR", "MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "BATCH_SIZE",
              "INITIAL_CHECKPOINT_PATH"),
    "ensemble-eval": ("MODEL_DIR", "MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "BATCH_SIZE",
                      "INITIAL_CHECKPOINT_PATH", "ENSEMBLE_PROMPTS"),
    "export": ("MODEL_DIR",),
    "inspect": (),  # MODEL_DIR or --prompt (evaluation/inspect.py says which is missing)
    "describe": (),
}
# Macros a command reads itself (not through a gin binding): set on the command line, they are
# used even where no gin file references them.
READ_MACROS = {"inspect": ("MODEL_DIR", "CHECKPOINT_PATH", "INITIAL_CHECKPOINT_PATH",
                           "MIXTURE_OR_TASK_NAME", "MIXTURE_OR_TASK_MODULE"),
               "export": ("MODEL_DIR", "CHECKPOINT_PATH", "INITIAL_CHECKPOINT_PATH"),
               "describe": ("MODEL_DIR", "CHECKPOINT_PATH")}
# Paths (gin macros) made absolute against the working directory before anything runs, so a
# relative MODEL_DIR writes where you are and resumes from anywhere given the same absolute path.
PATH_MACROS = ("MODEL_DIR", "PROMPT_FILE", "CHECKPOINT_PATH", "INITIAL_CHECKPOINT_PATH",
               "DATA_DIR", "DPT_PROMPT_FILE", "IPT_TABLE_FILE", "EMBEDDING_FILE", "MPT_SOURCE")
EXIT_CONFIG_ERROR = 2
EXIT_FAILURE = 1  # a run that cannot go on, or an unexpected error
EXIT_PREEMPTED = 128 + 15  # what a shell reports for a process ended by SIGTERM
EXIT_INTERRUPTED = 128 + 2  # ... by SIGINT (Ctrl-C)
EXIT_BROKEN_PIPE = 128 + 13  # ... by SIGPIPE (its reader, e.g. `| head`, left)


class _Error(Exception):
  """A usage/configuration error reported as one line."""


# evaluation/export.py's FORMATS (tests/test_errors.py checks that they agree).
EXPORT_FORMATS = ("npy", "peft")


def _parser(command: str) -> argparse.ArgumentParser:
  parser = errors.OneLineParser(
      prog=f"prompt-jax {command}",
      description=f"prompt-jax {command}: configured by gin, with t5x's flags. "
                  "--gin.NAME=VALUE binds a gin macro or parameter (e.g. "
                  "--gin.MODEL_DIR=\"'/tmp/run'\", --gin.TRAIN_STEPS=1000); it wins over every "
                  "gin file. Packaged gin files are parsed before your own files"
                  + ("; a trained MODEL_DIR's config.gin comes between them."
                     if command in RUN_COMMANDS else "."),
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
  parser.add_argument("--initialization_timeout", type=float, default=300.0, metavar="SECONDS",
                      help="how long the processes of a multi-host run wait for each other "
                           "(default 300, jax.distributed's)")
  parser.add_argument("--verbose", action="store_true",
                      help="show TensorFlow/CUDA/absl log lines and the traceback of errors")
  if command == "infer":
    parser.add_argument("--input", action="append", default=[], metavar="TEXT",
                        help="predict for this input text (repeatable) instead of the split; "
                             "the text is what the task's preprocessed `inputs` reads")
    parser.add_argument("--input_task", default=None, metavar="TASK",
                        help="on a multi-task mixture: the task (index or name) whose prompt "
                             "the --input texts get (a multi-task prompt needs it)")
  if command == "export":  # (flags are read before TensorFlow loads: no evaluation/ import here)
    parser.add_argument("--format", choices=EXPORT_FORMATS, default="npy",
                        help="npy: the trained prompt as [PROMPT_LENGTH, emb_dim] (DPT, residual "
                             "and prefix methods folded); peft: a Hugging Face PEFT "
                             "prompt-tuning adapter dir (adapter_config.json + "
                             "adapter_model.safetensors)")
    parser.add_argument("--output", default=None,
                        help="file to write, or a directory (DIR/) for each array "
                             "(default: MODEL_DIR/export/<name>_step<N>.npy; peft: the adapter "
                             "dir, default MODEL_DIR/export/peft_step<N>)")
  if command == "inspect":
    from prompt_jax.evaluation import inspect as inspect_lib  # pylint: disable=g-import-not-at-top
    parser.add_argument("--prompt", default=None, metavar="FILE.npy",
                        help="a [P, H] prompt file to inspect (default: the run in MODEL_DIR, "
                             "its prompt folded); the frozen model is INITIAL_CHECKPOINT_PATH")
    parser.add_argument("--top_k", type=int, default=inspect_lib.DEFAULT_TOP_K,
                        help="nearest vocabulary rows listed per prompt position")
    parser.add_argument("--vocabulary", default=None, metavar="SPIECE.model",
                        help="SentencePiece model decoding the neighbours (default: the task's "
                             "vocabulary, else $PROMPT_JAX_SPM_PATH)")
    parser.add_argument("--output_dir", default=None,
                        help="where the plots and tables go (default: beside --prompt, or "
                             "MODEL_DIR/inspect)")
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
      if not value.strip():  # `--gin.MODEL_DIR=$DIR` with DIR unset: gin's "Unable to parse"
        example = "\"'/a/path'\"" if name in PATH_MACROS else "<value>"
        raise _Error(f"--gin.{name}= has no value (an unset shell variable?): give it one, "
                     f"--gin.{name}={example}")
      bindings.append(f"{name} = {value}")
    else:
      rest.append(arg)
    i += 1
  return rest, bindings


def initialize_distributed(args, command: str = "train") -> None:
  """jax.distributed.initialize from t5x's multi-host flags (before any other jax use)."""
  if not (args.multiprocess_gpu or args.coordinator_address):
    if args.process_count not in (None, 1):
      raise _Error("--process_count > 1 needs --coordinator_address")
    if args.process_index not in (None, 0):  # else it would run alone, as process 0 of 1
      raise _Error(f"--process_index={args.process_index} needs --coordinator_address and "
                   "--process_count (multi-host runs)")
    return
  import jax  # pylint: disable=g-import-not-at-top
  if args.coordinator_address is None or args.process_count is None or args.process_index is None:
    raise _Error("multi-host runs need --coordinator_address, --process_count and "
                 "--process_index")
  if not 0 <= args.process_index < args.process_count:
    raise _Error(f"--process_index={args.process_index} must be in [0, --process_count="
                 f"{args.process_count}); number the processes 0 .. process_count - 1")
  if not args.initialization_timeout > 0:
    raise _Error(f"--initialization_timeout must be > 0 seconds, got "
                 f"{args.initialization_timeout:g}")
  if not args.multiprocess_gpu:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  with _joining(args, command):
    # jax's own deadline aborts the process from C++ (a fatal log line and a stack trace, after
    # 5 silent minutes): _joining's comes first.
    jax.distributed.initialize(coordinator_address=args.coordinator_address,
                               num_processes=args.process_count, process_id=args.process_index,
                               initialization_timeout=int(args.initialization_timeout) + 60)
  if jax.process_count() != args.process_count:  # the coordinator's count wins silently
    raise _Error(f"--process_count={args.process_count}, but the coordinator at "
                 f"{args.coordinator_address} runs {jax.process_count()} processes: give every "
                 f"process the same --process_count")


@contextlib.contextmanager
def _joining(args, command: str):
  """While the processes join: after 10 s a line saying this one waits; at
  --initialization_timeout, one error line naming the flags to check, and exit 2 (a process
  given a wrong --coordinator_address or --process_index, or one never started)."""
  import threading  # pylint: disable=g-import-not-at-top
  done = threading.Event()
  where = (f"process {args.process_index} of {args.process_count} (--coordinator_address="
           f"{args.coordinator_address})")

  quiet = min(10.0, args.initialization_timeout / 2)  # a prompt join says nothing

  def watch():
    if done.wait(quiet):
      return
    print(f"prompt-jax {command}: {where}: waiting for the other processes to join (up to "
          f"{args.initialization_timeout:g} s)", flush=True)
    if done.wait(args.initialization_timeout - quiet):
      return
    _fail(command, f"{where}: not all {args.process_count} processes joined within "
                   f"{args.initialization_timeout:g} s: start each --process_index 0.."
                   f"{args.process_count - 1} once, all with this --coordinator_address and "
                   f"--process_count (--initialization_timeout=<s> waits longer)")
    os._exit(EXIT_CONFIG_ERROR)  # the main thread is inside jax's C++ wait

  watcher = threading.Thread(target=watch, daemon=True)
  watcher.start()
  try:
    yield
  finally:
    done.set()


# ===== gin: layers, paths, required macros =====

def _macro(name: str):
  import gin  # pylint: disable=g-import-not-at-top
  try:
    return gin.query_parameter(f"%{name}")
  except ValueError:
    return None


def resolve_paths() -> Optional[str]:
  """Rebinds every relative path macro to its absolute path; refuses an empty one (an unset
  shell variable) before anything is written. Returns MODEL_DIR (absolute) or None."""
  import gin  # pylint: disable=g-import-not-at-top
  for name in PATH_MACROS:
    value = _macro(name)
    if not isinstance(value, str):
      continue
    if not value.strip():
      raise _Error(f"{name} is empty (an unset shell variable?): set "
                   f"--gin.{name}=\"'/a/path'\"" + ("" if name == "MODEL_DIR" else " or None"))
    if absolute(value) != value:
      gin.parse_config(f"{name} = {absolute(value)!r}")
  _check_gcs_reachable()
  value = _macro("MODEL_DIR")
  if not isinstance(value, str):
    return None
  _check_not_a_file(value)
  return value


def _check_moved_run_config(gin_files: Sequence[str], search_paths: Sequence[str]) -> None:
  """A run's config.gin given as --gin_file names its MODEL_DIR: in a run that was moved or
  copied, the old one. Without a --gin.MODEL_DIR of the user's, the command read and wrote the
  original run (eval of a copy wrote its results into the original) or found nothing there."""
  import ast  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  from prompt_jax import layering  # pylint: disable=g-import-not-at-top
  if "MODEL_DIR" in _USER_MACROS:
    return
  dirs = [d for p in search_paths for d in p.split(",") if d]
  for f in gin_files:
    path = layering.gin_path(f, dirs) if os.path.basename(f) == "config.gin" else None
    if path is None:
      continue
    here = os.path.dirname(os.path.abspath(path))
    with open(path) as fh:
      text = fh.read()
    # (a run's: gin's resolved config beside its checkpoints, not a file of the user's own
    # that names where its run goes)
    if not text.startswith("# Macros:") or not os.path.isdir(os.path.join(here, "checkpoints")):
      continue
    m = re.search(r"^MODEL_DIR = (.+)$", text, re.M)
    try:
      named = ast.literal_eval(m[1]) if m else None
    except (ValueError, SyntaxError):
      continue
    if isinstance(named, str) and "://" not in named and \
        os.path.realpath(named) != os.path.realpath(here):
      raise _Error(f"--gin_file={f} is the config.gin of a run in {named} (MODEL_DIR), not of "
                   f"{here}, where it lies (a moved or copied run): give --gin.MODEL_DIR="
                   f"\"'{here}'\" for this one, or a MODEL_DIR of your own for the results "
                   f"(with --gin.CHECKPOINT_PATH=\"'{here}/checkpoints/<step>'\")")


def _check_results_writable(command: str, layers) -> None:
  """eval's, infer's and ensemble-eval's results go under MODEL_DIR: a read-only one is one line
  before any work (eval failed after it, in TensorFlow's summary writer's words)."""
  model_dir = _macro("MODEL_DIR")
  if command not in ("eval", "infer", "ensemble-eval") or not isinstance(model_dir, str) \
      or "://" in model_dir:
    return
  where = paths.nearest_existing(model_dir)
  try:
    paths.probe_writable(where)
  except OSError as e:
    hint = "choose a writable MODEL_DIR for the results"
    if layers.run_config is not None:  # the run's own settings and checkpoint, results elsewhere
      hint += (f" and give the run as --gin_file={shlex.quote(layers.run_config)} "
               f"--gin.CHECKPOINT_PATH=\"'{model_dir}/checkpoints/<step>'\"")
    raise _Error(f"MODEL_DIR {model_dir} is not writable ({where}: {e.strerror}), and "
                 f"{command} writes its results there: {hint}") from None


def _check_gcs_reachable() -> None:
  """A gs:// path on a machine that cannot reach GCS: one line at once (it hung for minutes in
  GCS's credential and retry loops, printing C++ log lines, then failed with libcurl's words)."""
  on_gcs = [(n, _macro(n)) for n in PATH_MACROS
            if isinstance(_macro(n), str) and _macro(n).startswith("gs://")]
  if not on_gcs:
    return
  why = paths.unreachable_gcs()
  if why:
    name, value = on_gcs[0]
    raise _Error(f"{name} {value} is on Google Cloud Storage, which this machine cannot reach "
                 f"({why}: no network?); copy it to a local path, or run where GCS is reachable")


def _check_not_a_file(model_dir: str) -> None:
  """A MODEL_DIR that is (or lies below) a file: one line before any work (eval's results,
  ensemble-eval's tables failed only once everything was computed, with a traceback line)."""
  message = paths.not_a_directory_message(model_dir)
  if message:
    raise _Error(message)


def _find_run_config(command: str) -> Optional[Tuple[str, str]]:
  """(path, text) of MODEL_DIR/config.gin when MODEL_DIR holds a run that wrote one."""
  model_dir = resolve_paths()
  if not model_dir:
    return None
  from etils import epath  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import run_dir  # pylint: disable=g-import-not-at-top
  path = epath.Path(run_dir.config_path(model_dir))
  if not path.is_file():
    return None
  text = path.read_text()
  if "import __main__ as train_script" in text:  # what t5x.train writes, not ours
    if command == "train":
      raise _Error(f"MODEL_DIR {model_dir} is a run of t5x.train, whose config.gin prompt-jax "
                   f"does not read: continue it with t5x.train")
    verb = {"eval": "evaluate it", "infer": "infer with it"}.get(command, f"{command} it")
    files = "model and method" if command in MODEL_ONLY_COMMANDS else "model, method and task"
    raise _Error(f"MODEL_DIR {model_dir} is a run of t5x.train, whose config.gin prompt-jax "
                 f"does not read: {verb} with --gin.CHECKPOINT_PATH=\"'{model_dir}/"
                 f"checkpoint_<step>'\", the run's {files} gin files, and a MODEL_DIR of its "
                 f"own for the results")
  return str(path), text


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str],
              search_paths: Sequence[str], command: Optional[str] = None):
  """Parses gin in the order of the module docstring (`layering`); returns its `Layers`.
  `command` adds its implied run file and, for the commands that read a run (and `train` given
  no gin file: it continues the run in MODEL_DIR), MODEL_DIR/config.gin; paths are then made
  absolute."""
  from prompt_jax import layering  # pylint: disable=g-import-not-at-top
  _register_configurables()
  implied = [IMPLIED_RUN_FILES[command]] if command in IMPLIED_RUN_FILES else []
  reads_run = command in RUN_COMMANDS or (command == "train" and not gin_files)
  try:
    layers = layering.parse(gin_files, bindings, search_paths, implied=implied,
                            find_run_config=(functools.partial(_find_run_config, command)
                                             if reads_run else None))
  except ConfigError as e:
    raise _Error(str(e)) from e
  if command is not None:
    resolve_paths()
  return layers


def check_required(command: str, layers=None) -> None:
  """Names every required macro left unset (and, for a command that reads a run, says when
  MODEL_DIR holds none)."""
  missing = _missing_macros(command)
  model_dir = _macro("MODEL_DIR")
  if command == "train" and missing and layers is not None and not (
      layers.packaged or layers.own):  # no gin file, and no run in MODEL_DIR to continue
    where = (f"MODEL_DIR {model_dir} holds no run to continue (no config.gin)" if model_dir
             else "MODEL_DIR is not set")
    raise _Error(f"train was given no gin file and {where}: name the run's gin files (e.g. "
                 f"--gin_file=runs/embedded_default.gin), or set MODEL_DIR to a trained run's "
                 f"directory to continue it")
  if command in RUN_COMMANDS and model_dir and layers is not None and layers.run_config is None:
    no_run = (f"MODEL_DIR {model_dir} does not exist"
              if "://" not in model_dir and not os.path.lexists(model_dir) else
              f"MODEL_DIR {model_dir} holds no trained run (no config.gin){_runs_near(model_dir)}")
    if missing:
      raise _Error(f"{no_run}: point it at a run's directory, or set {', '.join(missing)} "
                   f"(--gin.NAME=... or a gin file)")
    from prompt_jax import layering  # pylint: disable=g-import-not-at-top
    if command in MODEL_ONLY_COMMANDS and not layering.is_bound(layering.BINDS_A_MODEL):
      raise _Error(f"{no_run}: point it at a run's directory, or name a model file "
                   f"(--gin_file=models/t5_1_1_base.gin)")
  check_macro_typos(READ_MACROS.get(command, ()))
  if missing:
    raise _Error(f"missing required macro{'s' if len(missing) > 1 else ''} "
                 f"{', '.join(missing)}: set {' '.join(f'--gin.{m}=...' for m in missing)} "
                 f"or bind {'them' if len(missing) > 1 else 'it'} in a gin file"
                 + _a_members_settings(command))


def _a_members_settings(command: str) -> str:
  """For ensemble-eval (which reads no run's config.gin): how to take a member run's settings."""
  if command != "ensemble-eval":
    return ""
  from prompt_jax.train import run_dir  # pylint: disable=g-import-not-at-top
  prompts = _macro("ENSEMBLE_PROMPTS")
  paths = (list(prompts.values()) if isinstance(prompts, dict) else list(prompts)
           if isinstance(prompts, (list, tuple)) else [prompts])
  runs = [p for p in [_macro("MODEL_DIR")] + paths
          if isinstance(p, str) and os.path.isfile(run_dir.config_path(p))]
  if not runs:
    return ""
  return (f" (ensemble-eval reads no run's config.gin: --gin_file={run_dir.config_path(runs[0])} "
          f"gives that run's)")


def _missing_macros(command: str) -> List[str]:
  """The command's required macros left unset, and macros referenced but bound nowhere."""
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
  # (a run's settings that only the task, the data or the optimizer read are not needed to build
  # the model: a t5x run's checkpoint exports given its model and method files)
  unneeded = ({m for c in ("train", "eval") for m in REQUIRED_MACROS[c]}
              - set(REQUIRED_MACROS[command]) if command in MODEL_ONLY_COMMANDS else set())
  missing += [m for m in unbound_macros() if m not in missing and m not in unneeded]
  if command not in ("describe", "inspect"):  # these need only the model's bindings
    from prompt_jax import layering  # pylint: disable=g-import-not-at-top
    missing += [scope for (scope, selector, _), value in layering.snapshot().items()
                if selector == "gin.macro" and scope not in missing  # a file's `X = %gin.REQUIRED`
                and (value is gin.REQUIRED or repr(value) == "%gin.REQUIRED")]
  return missing


def _runs_near(model_dir: str) -> str:
  """' (did you mean <the run above it>?)' for a MODEL_DIR inside a run (its checkpoints/,
  checkpoints/<step>), or ' (it holds runs: a, b, ...: a sweep's root?)' for one above runs;
  '' otherwise (and for remote paths)."""
  if "://" in model_dir or not os.path.isdir(model_dir):
    return ""
  from prompt_jax.train import run_dir  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(model_dir)
  for parent in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
    if os.path.isfile(run_dir.config_path(parent)):
      return f" (did you mean {parent}?)"
  try:
    runs = sorted(d for d in os.listdir(path)
                  if os.path.isfile(run_dir.config_path(os.path.join(path, d))))
  except OSError:
    return ""
  if runs:
    more = f", ... ({len(runs)} in all)" if len(runs) > 3 else ""
    return f" (it holds runs: {', '.join(runs[:3])}{more}: a sweep's root?)"
  return ""


def check_job(command: str) -> None:
  """A sweep job's parsed config, checked as `prompt-jax <command>` checks it before it runs:
  the required macros, then (train) the run's values: types and ranges, the method's spec, the
  optimizer (`loop.train(check_only=True)`: nothing read, written or compiled)."""
  check_required(command)
  if command == "train":
    from prompt_jax.train import loop  # pylint: disable=g-import-not-at-top
    loop.train(check_only=True)


def _referenced_macros() -> set:
  """Macros that some binding references (e.g. %CLASS_LABELS)."""
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


def unbound_macros() -> List[str]:
  """Macros that some binding references (e.g. %CLASS_LABELS) but nothing binds."""
  import gin  # pylint: disable=g-import-not-at-top
  bound = {scope for scope, selector in gin.config._CONFIG  # pylint: disable=protected-access
           if selector == "gin.macro"}
  return sorted(_referenced_macros() - bound)


_USER_MACROS: List[str] = []  # macros bound by --gin.NAME=VALUE / --gin_bindings


def check_macro_typos(read: Sequence[str] = ()) -> None:
  """A macro set on the command line that no binding of this configuration uses, and that no
  packaged gin file knows, is a typo (gin would ignore it): one error. A packaged macro this
  configuration does not use (CLASS_LABELS with a uniform init, say: sweeps set such macros for
  every job) gets a note. `read`: macros the command reads itself (READ_MACROS)."""
  from prompt_jax import layering  # pylint: disable=g-import-not-at-top
  referenced = _referenced_macros() | set(read)
  known = referenced | layering.packaged_macros()
  for name in _USER_MACROS:
    if name in referenced:
      continue
    if name not in known:
      raise _Error(f"--gin.{name} sets a macro that nothing uses"
                   + (errors.did_you_mean(name, known) or
                      "; check its spelling against the run's gin files"))
    _say(f"note: --gin.{name} is not used by this configuration")


def _prompt_file(layers) -> Optional[str]:
  """PROMPT_FILE as this command sets it; None when the value is the run's config.gin's: the file
  a run of `prompts/from_file.gin` started from, not what it trained."""
  return None if layers is not None and layers.from_run("PROMPT_FILE") else _macro("PROMPT_FILE")


def evaluate_what_the_run_trained(command: str, layers) -> None:
  """`eval` / `infer` of a run that started from PROMPT_FILE evaluate its checkpoint, not that
  file (which its config.gin keeps as the prompt's initialiser), unless you name a file."""
  import gin  # pylint: disable=g-import-not-at-top
  if command not in ("eval", "infer") or _prompt_file(layers) or not _macro("PROMPT_FILE"):
    return
  gin.bind_parameter(f"prompt_jax.{'evaluate' if command == 'eval' else 'infer'}.prompt_file",
                     None)
  _say(f"note: PROMPT_FILE {_macro('PROMPT_FILE')} is where this run's prompt started; "
       f"{command} uses the run's trained checkpoint (--gin.PROMPT_FILE=... for a file)")


def check_against_run(layers) -> None:
  """Refuses, in one line, a configuration whose trainable parameters do not fit the
  checkpoint of the run in MODEL_DIR (names the overrides that caused it and the run's values)."""
  if layers is None or layers.run_values is None or _prompt_file(layers):
    return
  from prompt_jax import layering  # pylint: disable=g-import-not-at-top
  from prompt_jax import run_setup  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import run_dir  # pylint: disable=g-import-not-at-top
  model_dir = _macro("MODEL_DIR")
  run = run_dir.resolve(model_dir, _macro("CHECKPOINT_PATH"))
  if run.checkpoint is None:
    return
  saved = run_dir.checkpoint_shapes(run.checkpoint)
  problem = lambda: run_dir.shape_mismatch(run_dir.trainable_shapes(run_setup.model_spec()),
                                          saved)
  if not run.own:  # another run's checkpoint: MODEL_DIR's values are not what it was trained with
    mismatch = problem()
    if mismatch:
      raise _Error(f"CHECKPOINT_PATH {run.checkpoint} does not fit MODEL_DIR {model_dir}'s "
                   f"configuration: {mismatch}; {_its_settings(run.checkpoint)}")
    return
  message = layering.contradiction(layers.run_values, problem, model_dir)
  if message:
    raise _Error(message)


def _note_another_backbone(command: str, layers) -> None:
  """eval / infer of a run on another frozen model than it trained on (an INITIAL_CHECKPOINT_PATH
  override: the checkpoint moved, or a transfer study) say so first; eval's result file records
  the frozen model either way."""
  if command not in ("eval", "infer") or layers is None or layers.run_values is None:
    return
  from prompt_jax import layering  # pylint: disable=g-import-not-at-top
  key = ("INITIAL_CHECKPOINT_PATH", "gin.macro", "value")
  trained, now = layers.run_values.get(key), layering.snapshot().get(key)
  if key in layers.run_values and repr(trained) != repr(now):
    import gin  # pylint: disable=g-import-not-at-top
    label = paths.label(str(now))
    if command == "eval":
      gin.bind_parameter("prompt_jax.evaluate.backbone_label", label)
    layers.notes.append(f"the prompt runs on INITIAL_CHECKPOINT_PATH={now!r}, not the frozen "
                        f"model it was trained on ({trained!r})"
                        + (f"; its results are filed apart (-on-{label})" if command == "eval"
                           else ""))


def _its_settings(checkpoint: str) -> str:
  """How to evaluate another run's checkpoint with the settings it was trained with."""
  from prompt_jax.train import run_dir  # pylint: disable=g-import-not-at-top
  its_run = os.path.dirname(os.path.dirname(os.path.abspath(checkpoint.rstrip("/"))))
  if os.path.basename(os.path.dirname(os.path.abspath(checkpoint.rstrip("/")))) == "checkpoints" \
      and os.path.isfile(run_dir.config_path(its_run)):  # ours: <run>/checkpoints/<step>
    return (f"give its run's configuration, --gin_file={shlex.quote(run_dir.config_path(its_run))}"
            f", or evaluate it in its own MODEL_DIR {its_run}")
  return "set the values it was trained with (its method's gin file, PROMPT_LENGTH, ...)"


def _register_configurables() -> None:
  # Importing registers every gin configurable the packaged gin files name.
  import prompt_jax.embedded  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.evaluation.ensemble  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.evaluation.run  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.prompts.specs  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.tasks  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.train.describe  # pylint: disable=g-import-not-at-top,unused-import
  import prompt_jax.train.loop  # pylint: disable=g-import-not-at-top,unused-import


# ===== One function per subcommand; each ends with a line saying where its results are =====

def _say(line: str) -> None:
  """Our own lines, from process 0 only."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    print(line, flush=True)


def _tensorboard(model_dir: str) -> str:
  """The command to paste, quoted for the shell (a MODEL_DIR with a space or a quote)."""
  import shlex  # pylint: disable=g-import-not-at-top
  return f"TensorBoard: tensorboard --logdir {shlex.quote(model_dir)}"


def _train(args) -> None:
  del args
  from prompt_jax.evaluation import inference  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import loop  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import checkpointing  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import run_dir  # pylint: disable=g-import-not-at-top
  model_dir = _macro("MODEL_DIR")
  loop.train(check_only=True)  # a refused value is the only line, not after 'for abc steps'
  with checkpointing.run_lock(model_dir):  # one trainer per MODEL_DIR
    _print_final(loop.train(infer_fn=inference.evaluate, announce=lambda: _say(
        f"prompt-jax train: {_macro('MIXTURE_OR_TASK_NAME')} for {_macro('TRAIN_STEPS')} "
        f"steps into {model_dir}")))
  run = run_dir.resolve(model_dir)
  files = run.numpy_files()
  prompt = (f"; prompt {files[0]}" if len(files) == 1
            else f"; prompt arrays in {run.numpy_dir}" if files else "")
  _say(f"checkpoint {run.checkpoint}{prompt}; {_tensorboard(model_dir)}")


def _eval(args) -> None:
  del args
  from prompt_jax.evaluation import run as run_lib  # pylint: disable=g-import-not-at-top
  result = run_lib.evaluate()
  _print_final(result.metrics)
  if result.metrics_file:
    _say(f"metrics {result.metrics_file}; {_tensorboard(_macro('MODEL_DIR'))}")


def _infer(args) -> None:
  from prompt_jax.evaluation import run as run_lib  # pylint: disable=g-import-not-at-top
  # its last line: "wrote N predictions to <file>"
  run_lib.infer(inputs=args.input or None, input_task=args.input_task)


def _ensemble_eval(args) -> None:
  del args
  from prompt_jax.evaluation import ensemble  # pylint: disable=g-import-not-at-top
  result = ensemble.ensemble_eval()
  _say(ensemble.markdown(result.report))
  for key, metrics in sorted(result.report["ensemble"].items()):
    _print_final({f"ensemble_{key}/{k}": v for k, v in metrics.items()})
  _say("ensemble table " + ", ".join(result.files))


def _export(args) -> None:
  from prompt_jax.evaluation import export  # pylint: disable=g-import-not-at-top
  backbone = _macro("INITIAL_CHECKPOINT_PATH")  # the adapter's base_model_name_or_path (peft)
  output = None
  if args.output:  # absolute() drops a trailing '/': kept, it says the user named a directory
    output = absolute(args.output)
    if args.output.endswith(("/", os.sep)) and not output.endswith("/"):
      output += "/"
  written = export.export(args.format, model_dir=_macro("MODEL_DIR"),
                          checkpoint_path=_macro("CHECKPOINT_PATH"), output=output,
                          base_model=backbone if isinstance(backbone, str) else None)
  _say("wrote " + "; ".join(written))


def _macro_value(name: str):
  """A macro's value, a `@configurable()` reference evaluated (INITIAL_CHECKPOINT_PATH of the
  embedded default is `@prompt_jax.embedded_checkpoint_path()`)."""
  import gin  # pylint: disable=g-import-not-at-top
  value = _macro(name)
  if isinstance(value, gin.config.ConfigurableReference) and value.evaluate:
    return value.scoped_configurable_fn()
  return value


def _inspect(args) -> None:
  from prompt_jax.evaluation import inspect as inspect_lib  # pylint: disable=g-import-not-at-top
  # The flags' own problems first: a missing --prompt file was found only once the vocabulary
  # (checked next) was fixed.
  inspect_lib.check_inputs(args.top_k, absolute(args.prompt) if args.prompt else None)
  vocabulary = inspect_lib.vocabulary_of(
      absolute(args.vocabulary) if args.vocabulary else None,
      task=_macro("MIXTURE_OR_TASK_NAME"), task_module=_macro("MIXTURE_OR_TASK_MODULE"))
  result = inspect_lib.inspect(
      prompt_file=absolute(args.prompt) if args.prompt else None,
      model_dir=None if args.prompt else _macro("MODEL_DIR"),
      checkpoint_path=_macro("CHECKPOINT_PATH"),
      initial_checkpoint_path=_macro_value("INITIAL_CHECKPOINT_PATH"), vocabulary=vocabulary,
      top_k=args.top_k, output_dir=absolute(args.output_dir) if args.output_dir else None)
  for line in result.summary_lines():
    _say(line)
  _say("wrote " + ", ".join(result.files))


def _describe(args) -> None:
  del args
  from prompt_jax.train import describe  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import run_dir  # pylint: disable=g-import-not-at-top
  model_dir = _macro("MODEL_DIR")
  if model_dir:
    run = run_dir.resolve(model_dir, _macro("CHECKPOINT_PATH"))
    if run.config:
      _say(f"run {model_dir}: "
           + (f"checkpoint step {run.step}" if run.step is not None else "no checkpoint yet"))
  describe.describe()


_COMMANDS = {"train": _train, "eval": _eval, "ensemble-eval": _ensemble_eval, "infer": _infer,
             "export": _export, "inspect": _inspect, "describe": _describe}


def _print_final(metrics) -> None:
  if metrics:
    _say("final metrics: " + " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())))


def _gin_command(command: str, rest: Sequence[str]) -> int:
  rest, dot_bindings = split_gin_dot_flags(rest)
  _USER_MACROS[:] = [b.split("=", 1)[0].strip() for b in dot_bindings + _flag_values(
      rest, "--gin_bindings") if b.split("=", 1)[0].strip().isupper()]
  args = _parser(command).parse_args(rest)
  if command == "infer" and any(not text.strip() for text in args.input):
    raise _Error("--input is empty (an unset shell variable?): give the text to predict for")
  initialize_distributed(args, command)
  if args.tfds_data_dir:
    import seqio  # pylint: disable=g-import-not-at-top
    seqio.set_tfds_data_dir_override(args.tfds_data_dir)
  if args.data_dir is not None:
    if not args.data_dir.strip():
      raise _Error("--data_dir is empty (an unset shell variable?): give a directory")
    if command != "describe":  # describe reads no data
      _check_data_dir(absolute(args.data_dir))
    # Bound last, so it wins over gin files and --gin.DATA_DIR, and recorded in the run's
    # config.gin: eval / infer given only MODEL_DIR read the files the run trained on.
    dot_bindings.append(f"DATA_DIR = {absolute(args.data_dir)!r}")
  layers = parse_gin(args.gin_file, list(args.gin_bindings) + dot_bindings,
                     args.gin_search_paths, command=command)
  if command == "train" and layers.run_config:  # no gin file: parse_gin layered config.gin
    layers.notes.append(f"no gin file: continuing the run in {_macro('MODEL_DIR')} with its "
                        f"config.gin")
  _check_moved_run_config(args.gin_file, args.gin_search_paths)
  check_required(command, layers)
  _check_results_writable(command, layers)
  check_against_run(layers)
  _note_another_backbone(command, layers)
  evaluate_what_the_run_trained(command, layers)
  for note in layers.notes:
    _say(f"note: {note}")
  if command in ("train", "eval", "infer"):
    from prompt_jax import compile_cache  # pylint: disable=g-import-not-at-top
    compile_cache.enable()  # a restart loads the compiled steps (PROMPT_JAX_COMPILATION_CACHE)
  _COMMANDS[command](args)
  return 0


def console_main() -> int:
  """The `prompt-jax` program (and `python -m prompt_jax`): with PROMPT_JAX_MALLOC=jemalloc it
  first starts itself again under jemalloc (prompt_jax/host_malloc.py), then runs `main`."""
  from prompt_jax import host_malloc  # pylint: disable=g-import-not-at-top
  try:
    host_malloc.restart_under_jemalloc()
  except (ValueError, OSError) as e:
    return _fail("", str(e))
  host_malloc.configure_jax()
  code = main()
  # A Ctrl-C while the interpreter shuts down (JAX's and orbax's atexit handlers; a second
  # Ctrl-C after an interrupted run saved) printed tracebacks from those handlers: end at once.
  if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # (`sweep run`'s jobs ignore it)
    signal.signal(signal.SIGINT, lambda *_: os._exit(code))  # (its work is done)
  return code


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = _command_first(list(sys.argv[1:] if argv is None else argv))
  command = argv[0] if argv and argv[0] in COMMANDS else ""
  from prompt_jax import console  # pylint: disable=g-import-not-at-top
  try:  # Ctrl-C while starting (importing JAX, TensorFlow) is one line too, not a traceback
    with console.ctrl_c_remembered():
      return _main(argv)
  except KeyboardInterrupt:
    print(f"prompt-jax{' ' + command if command else ''}: interrupted", file=sys.stderr,
          flush=True)
    return EXIT_INTERRUPTED
  except BrokenPipeError:  # `prompt-jax tasks | head -1`: the reader left; end quietly, as
    _silence_stdout()      # a command killed by SIGPIPE (it was an error line, exit 1)
    return EXIT_BROKEN_PIPE


def _command_first(argv: List[str]) -> List[str]:
  """`prompt-jax --verbose train ...` as `prompt-jax train --verbose ...` (it printed the whole
  usage, exit 2): flags given before the command are its flags."""
  at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
  if at and argv[at] in COMMANDS and not {"-h", "--help"} & set(argv[:at]):
    return [argv[at]] + argv[:at] + argv[at + 1:]
  return argv


def _silence_stdout() -> None:
  """stdout to /dev/null, so that flushing it at exit raises no second BrokenPipeError."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stdout.fileno())


def _main(argv: List[str]) -> int:
  from prompt_jax import xla_defaults  # pylint: disable=g-import-not-at-top
  xla_defaults.apply()  # before JAX starts its backend (prompt_jax/xla_defaults.py)
  if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
    return _fail("", f"unknown command {argv[0]!r}{errors.did_you_mean(argv[0], COMMANDS)} "
                     f"(commands: {', '.join(COMMANDS)}; prompt-jax <command> --help)")
  if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
    print(f"usage: prompt-jax {{{','.join(COMMANDS)}}} [flags]   (prompt-jax <cmd> --help)\n\n"
          + __doc__, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
    return 0 if argv and argv[0] in ("-h", "--help") else EXIT_CONFIG_ERROR
  command, rest = argv[0], argv[1:]
  verbose = "--verbose" in rest
  from prompt_jax import console  # pylint: disable=g-import-not-at-top
  if not verbose:  # a save that failed leaves orbax's coroutine unawaited: said at exit, not ours
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited",
                            category=RuntimeWarning)
  if command not in _OWN_COMMANDS:  # a mistyped flag (and --help) before TensorFlow loads (s)
    try:
      _parser(command).parse_args(split_gin_dot_flags(rest)[0])
    except Exception as e:  # pylint: disable=broad-except
      return _error(command, e, verbose)
  # bench and plan read no data: they run where TensorFlow is absent (accelerator images).
  with console.quiet(enabled=not verbose, tensorflow=command not in ("bench", "plan")):
    try:
      if command in _OWN_COMMANDS:  # commands with their own flags (no gin run configuration)
        return _OWN_COMMANDS[command]([a for a in rest if a != "--verbose"], verbose)
      return _gin_command(command, rest)
    except BrokenPipeError:
      raise  # main's: no error line for a reader that left
    except Exception as e:  # pylint: disable=broad-except
      return _error(command, e, verbose)


def _bench(argv: List[str], verbose: bool) -> int:
  del verbose
  from prompt_jax import bench  # pylint: disable=g-import-not-at-top
  return bench.main(argv)


def _plan(argv: List[str], verbose: bool) -> int:  # ahead-of-time compile on a (fake) mesh
  from prompt_jax import plan  # pylint: disable=g-import-not-at-top
  return plan.main(argv, verbose=verbose)


def _tasks(argv: List[str], verbose: bool) -> int:
  import prompt_jax.embedded.task  # pylint: disable=g-import-not-at-top,unused-import
  from prompt_jax.tasks import inspect as tasks_inspect  # pylint: disable=g-import-not-at-top
  return tasks_inspect.main(argv, verbose)


def _sweep(argv: List[str], verbose: bool) -> int:  # design-decision sweeps (prompt_jax/launch)
  del verbose
  from prompt_jax.launch import sweep  # pylint: disable=g-import-not-at-top
  return sweep.main(argv, parse_gin=parse_gin, check_required=check_job)  # jobs' gin


def _recycle(argv: List[str], verbose: bool) -> int:  # a prompt from one model to another
  del verbose
  from prompt_jax.evaluation import recycle  # pylint: disable=g-import-not-at-top
  return recycle.main(argv)


def _ipt_pretrain(argv: List[str], verbose: bool) -> int:  # IPT's table (prompts/ipt.gin)
  from prompt_jax.prompts import ipt_pretrain  # pylint: disable=g-import-not-at-top
  ipt_pretrain.main(argv + (["--verbose"] if verbose else []))
  return 0


_OWN_COMMANDS = {"bench": _bench, "plan": _plan, "tasks": _tasks, "sweep": _sweep,
                 "recycle": _recycle, "ipt-pretrain": _ipt_pretrain}


def _error(command: str, e: Exception, verbose: bool) -> int:
  """The one error path: a bad input is one line and exit 2; a run that cannot go on
  (`RunError`) or anything unexpected one line and exit 1 (the traceback with --verbose); a
  preempted run (`Preempted`, its checkpoint saved) one line and exit 143."""
  from prompt_jax.errors import Preempted, RunError  # pylint: disable=g-import-not-at-top
  if verbose:
    traceback.print_exc()
  if isinstance(e, Preempted):  # gin appends "In call to configurable ..." lines
    print(f"prompt-jax {command}: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED if e.interrupted else EXIT_PREEMPTED
  if _unrunnable_bfloat16_product(e):  # layers.CPU_PRODUCTS_ENV
    return _fail(command, "XLA CPU could not run one of this program's bfloat16 products summed "
                 "in float32 (UNIMPLEMENTED in its DotThunk); rerun with "
                 "PROMPT_JAX_CPU_BFLOAT16_PRODUCTS=plain (plain bfloat16 products: slower where "
                 "the CPU has bfloat16 units) or with "
                 "--gin.prompt_jax.t5_config.dtype=\"'float32'\"", EXIT_FAILURE)
  if isinstance(e, RunError):
    return _fail(command, str(e).splitlines()[0], EXIT_FAILURE)
  oom = _out_of_memory(e)
  if oom is not None and command == "plan":  # plan compiles on this host; its flags, not gin
    return _fail(command, f"out of memory on this machine while planning ({oom}): plan "
                 f"compiles the whole program here; lower --batch, --inputs, --targets or "
                 f"--prompt_length", EXIT_FAILURE)
  if oom is not None:
    return _fail(command, f"out of memory ({oom}): lower BATCH_SIZE, TASK_FEATURE_LENGTHS or "
                 f"PROMPT_LENGTH; `prompt-jax plan` prints what a configuration needs per "
                 f"device, before a run", EXIT_FAILURE)
  message = _bad_input_message(e)
  if message is not None:
    return _fail(command, message)
  hint = "" if verbose else " (--verbose shows the traceback)"
  text = str(e).splitlines()[0] if str(e).strip() else ""
  print(f"prompt-jax {command}: error: {type(e).__name__}: {text}{hint}", file=sys.stderr,
        flush=True)
  return EXIT_FAILURE


def _unrunnable_bfloat16_product(e: Optional[BaseException]) -> bool:
  """Whether `e` (or an error it was raised from) is XLA CPU's run-time refusal of a bfloat16
  product summed in float32 (models/layers.py CPU_PRODUCTS_ENV)."""
  return any("DotThunk" in str(c) and "BF16 x BF16 = F32" in str(c) for c in errors.causes(e))


def _out_of_memory(e: Optional[BaseException]) -> Optional[str]:
  """The first line of `e` (or an error it was raised from) when it is an allocation that failed:
  numpy's / Python's MemoryError, or XLA's RESOURCE_EXHAUSTED 'Out of memory' on any backend."""
  for c in errors.causes(e):
    text = str(c).strip()
    if isinstance(c, MemoryError) or ("RESOURCE_EXHAUSTED" in text
                                       and "out of memory" in text.lower()):
      return text.splitlines()[0] if text else type(c).__name__
  return None


def _bad_input_message(e: Exception) -> Optional[str]:
  """The one-line message of an error caused by the input (None: not one of those)."""
  from prompt_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from prompt_jax import layering  # pylint: disable=g-import-not-at-top
  if isinstance(e, _Error):
    return str(e)
  if isinstance(e, (ConfigError, checkpoints.CheckpointError)):
    return str(e).splitlines()[0] if str(e) else type(e).__name__
  try:
    from prompt_jax.tasks import DataFormatError  # pylint: disable=g-import-not-at-top
  except ImportError:  # no TensorFlow (bench, plan): no task read any data
    DataFormatError = ConfigError  # pylint: disable=invalid-name
  for cause in errors.causes(e):  # e.g. an unlabelled split's targets, inside seqio's error
    if isinstance(cause, DataFormatError):
      return str(cause).splitlines()[0]
  if isinstance(e, RuntimeError) and "Required bindings" in str(e):
    hint = (" (add a model file, e.g. --gin_file=models/t5_1_1_base.gin)"
            if "t5_config" in str(e) else "")
    return "gin: " + str(e).splitlines()[0] + hint
  if isinstance(e, (TypeError, ValueError)) and "gin" in str(e).lower():
    return "gin: " + layering.first_line(e)
  return None


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


def _fail(command: str, message: str, code: int = EXIT_CONFIG_ERROR) -> int:
  prog = f"prompt-jax {command}" if command else "prompt-jax"
  print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
  return code


if __name__ == "__main__":
  sys.exit(console_main())
