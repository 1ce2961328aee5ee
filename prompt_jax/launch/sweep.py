"""`prompt-jax sweep plan|run|emit|report SPEC`: design-decision sweeps from one YAML spec.

  prompt-jax sweep plan   SPEC            the jobs, their MODEL_DIRs and exact train commands
  prompt-jax sweep run    SPEC [--parallel=N] [--retry_failed] [--stop_timeout=SECONDS]
                                          run them here; re-run to resume (status file)
  prompt-jax sweep emit   SPEC --target=tpu-vm|slurm|local-script [target options]
  prompt-jax sweep report SPEC [--metric=PATTERN]
                                          report.csv, report.md, PNG figures (Figure 3 style)

SPEC is a YAML file (format: prompt_jax/launch/spec.py, README "Sweeps") or the name of a
shipped spec in launch/sweeps/ (e.g. lester_fig3a_prompt_length). Every subcommand takes --root
(where the MODEL_DIRs go; default: the spec's `root`) and --gin.NAME=VALUE overrides applied to
every job. A bad spec is one line `prompt-jax sweep: error: ...` (exit 2) before anything runs.
"""
import argparse
import functools
import os
import sys
from typing import Callable, List, Optional, Sequence, Tuple

from prompt_jax import errors
from prompt_jax.errors import ConfigError
from prompt_jax.launch import spec as spec_lib

SUBCOMMANDS = ("plan", "run", "emit", "report")
EXIT_CONFIG_ERROR = 2


def _parser() -> argparse.ArgumentParser:
  p = errors.OneLineParser(prog="prompt-jax sweep", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("subcommand", choices=SUBCOMMANDS)
  p.add_argument("spec", help="a sweep spec (.yaml) or the name of a shipped one")
  p.add_argument("--root", default=None, help="sweep root: job MODEL_DIR = ROOT/<job name>")
  p.add_argument("--parallel", type=int, default=1, help="run: jobs at a time")
  p.add_argument("--retry_failed", action="store_true", help="run: rerun failed jobs")
  p.add_argument("--stop_timeout", type=float, default=None,
                 help="run: when stopped (Ctrl-C, SIGTERM), seconds the running jobs have to save "
                      "a checkpoint after their SIGTERM before they are killed (default 300)")
  p.add_argument("--target", default=None, help="emit: tpu-vm | slurm | local-script")
  p.add_argument("--out", default=None,
                 help="emit/report: output dir (default ROOT/launch, ROOT/report)")
  p.add_argument("--setup", default="", help="emit: shell command run before the jobs "
                 "(e.g. '. ~/prompt_jax/.venv/bin/activate')")
  p.add_argument("--tpu_name", default="my-tpu", help="emit tpu-vm: TPU VM name ($TPU_NAME)")
  p.add_argument("--zone", default="us-central2-b", help="emit tpu-vm: zone ($ZONE)")
  p.add_argument("--project", default="", help="emit tpu-vm: GCP project ($PROJECT)")
  p.add_argument("--nodes", type=int, default=1, help="emit slurm: nodes per job")
  p.add_argument("--gpus_per_node", type=int, default=8, help="emit slurm: GPUs per node")
  p.add_argument("--process_per", default="node", choices=("node", "gpu"),
                 help="emit slurm: one process per node (drives all its GPUs) or per GPU")
  p.add_argument("--platform", default="gpu", choices=("gpu", "cpu"),
                 help="emit slurm: cpu drops --gpus-per-node and --multiprocess_gpu")
  p.add_argument("--partition", default="", help="emit slurm: partition")
  p.add_argument("--time", default="", help="emit slurm: time limit per job (HH:MM:SS)")
  p.add_argument("--max_parallel", type=int, default=0, help="emit slurm: array tasks at once")
  p.add_argument("--metric", default=None,
                 help="report: metric name or pattern (default: the spec's report.metric, "
                      "else inference_eval/*/accuracy)")
  return p


# The subcommands each flag acts on (--root and --gin.X: all); given to another, it is refused
# rather than ignored (`sweep plan --target=slurm` printed the plan as if it were not there).
FLAG_SUBCOMMANDS = {"parallel": ("run",), "retry_failed": ("run",), "stop_timeout": ("run",),
                    "out": ("emit", "report"), "metric": ("report",),
                    **{name: ("emit",) for name in (
                        "target", "setup", "tpu_name", "zone", "project", "nodes",
                        "gpus_per_node", "process_per", "platform", "partition", "time",
                        "max_parallel")}}


# emit's flags of one --target only.
TARGET_FLAGS = {"slurm": ("nodes", "gpus_per_node", "process_per", "platform", "partition",
                          "time", "max_parallel"),
                "tpu-vm": ("tpu_name", "zone", "project")}


def _given(args: argparse.Namespace, parser: argparse.ArgumentParser, name: str) -> bool:
  return getattr(args, name) != parser.get_default(name)


def check_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
  given = functools.partial(_given, args, parser)
  for name, subcommands in FLAG_SUBCOMMANDS.items():
    if args.subcommand not in subcommands and given(name):
      raise ConfigError(f"--{name} is a flag of `sweep {' / '.join(subcommands)}`, not of "
                        f"`sweep {args.subcommand}`: drop it, or run `prompt-jax sweep "
                        f"{subcommands[0]} ...`")
  if args.subcommand == "emit":
    for target, names in TARGET_FLAGS.items():
      for name in names:
        if args.target and args.target != target and given(name):
          raise ConfigError(f"--{name} is a flag of --target={target}, not of "
                            f"--target={args.target}: drop it")
    if args.platform == "cpu" and given("gpus_per_node") and args.gpus_per_node != 0:
      raise ConfigError("--gpus_per_node requests GPUs, but --platform=cpu requests none: drop "
                        "one of them")


def given_emit_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> List[str]:
  """emit's flags the user gave but --target (`--nodes=2`), for the scripts' headers."""
  return [f"--{name}={getattr(args, name)}" for name, subcommands in FLAG_SUBCOMMANDS.items()
          if "emit" in subcommands and name != "target" and _given(args, parser, name)]


def split_overrides(argv: Sequence[str]) -> Tuple[List[str], List[Tuple[str, str]]]:
  """`--gin.NAME=VALUE` flags -> (rest, [(NAME, VALUE)])."""
  rest, overrides = [], []
  for arg in argv:
    if arg.startswith("--gin.") and "=" in arg:
      name, value = arg[len("--gin."):].split("=", 1)
      overrides.append((name, value))
    elif arg.startswith("--gin."):
      raise ConfigError(f"{arg} needs a value: --gin.NAME=VALUE")
    else:
      rest.append(arg)
  return rest, overrides


def plan_lines(sweep: spec_lib.Sweep) -> List[str]:
  from prompt_jax.launch import emit  # pylint: disable=g-import-not-at-top
  from prompt_jax.launch import runner  # pylint: disable=g-import-not-at-top
  status = runner.read_status(sweep.root).get("jobs", {}) if sweep.local else {}
  lines = [f"sweep {sweep.name}: {len(sweep.jobs)} jobs ({sweep.shape()}) under {sweep.root}"]
  for i, job in enumerate(sweep.jobs, 1):
    state = status.get(job.name, {}).get("state")
    verdict = runner.rerun_verdict(status[job.name], job) if state else None
    if verdict and verdict[0] == "refuse":
      state += (f", command changed ({verdict[1]}): run refuses it; use a new --root or remove "
                f"its MODEL_DIR")
    elif verdict:
      state += {"command changed: resuming": ", command changed: run resumes it",
                "MODEL_DIR gone: running again": ", MODEL_DIR gone: run runs it again",
                "command changed: running it": ", command changed: run runs it again"
                }.get(verdict[1], f", {verdict[1]}")
    lines.append(f"# [{i}/{len(sweep.jobs)}] {job.name}" + (f"  ({state})" if state else ""))
    lines.append("prompt-jax " + emit.command_line(job.train_args()))
  n_eval = sum(len(emit.group_eval_commands(sweep, g)) for g in sweep.groups().values())
  lines.append(f"{len(sweep.jobs)} train jobs in {len(sweep.groups())} groups (+{n_eval} eval "
               f"jobs in `sweep emit` scripts); run them: {sweep.command('run')}")
  return lines


def main(argv: Sequence[str], parse_gin: Optional[Callable[..., None]] = None,
         check_required: Optional[Callable[[str], None]] = None) -> int:
  """`parse_gin` / `check_required`: the CLI's gin parsing (validates each job's config)."""
  argv = list(argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(__doc__)
    return 0 if argv else EXIT_CONFIG_ERROR
  try:
    rest, overrides = split_overrides(argv)
    parser = _parser()
    args = parser.parse_args(rest)
    check_flags(args, parser)
    sweep = spec_lib.build(args.spec, root=args.root, overrides=overrides)
    if args.subcommand != "report" and parse_gin is not None:
      spec_lib.validate_gin(sweep, parse_gin, check_required or (lambda _: None),
                            check_eval=args.subcommand == "emit")
    if args.subcommand == "plan":
      print("\n".join(plan_lines(sweep)), flush=True)
      return 0
    if args.subcommand == "run":
      from prompt_jax.launch import runner  # pylint: disable=g-import-not-at-top
      stop_timeout = runner.STOP_TIMEOUT if args.stop_timeout is None else args.stop_timeout
      return runner.run(sweep, parallel=args.parallel, retry_failed=args.retry_failed,
                        stop_timeout=stop_timeout)
    if args.subcommand == "emit":
      from prompt_jax.launch import emit  # pylint: disable=g-import-not-at-top
      if not args.target:
        raise ConfigError(f"emit needs --target ({', '.join(emit.TARGETS)})")
      opts = emit.Options(out_dir=args.out, setup=args.setup, tpu_name=args.tpu_name,
                          zone=args.zone, project=args.project, nodes=args.nodes,
                          gpus_per_node=args.gpus_per_node, process_per=args.process_per,
                          platform=args.platform, partition=args.partition, time=args.time,
                          max_parallel=args.max_parallel,
                          given=given_emit_flags(args, parser))
      written = emit.emit(sweep, args.target, opts)
      for path in written:
        print(f"wrote {path}")
      script = emit.shell_quote(written[0])
      if args.target == "tpu-vm" and sweep.local:
        print(f"note: --root {sweep.root} is a local path: on a slice of several workers each "
              f"writes its own copy there; a gs:// --root is shared by all of them")
      named = {flag.split("=", 1)[0] for flag in opts.given}
      tpu_vm_hint = (f"run: {script}" if {"--tpu_name", "--zone"} <= named else
                     f"run: TPU_NAME=<name> ZONE=<zone> {script} (the script's defaults: "
                     f"{opts.tpu_name} in {opts.zone})")
      hint = {"slurm": "submit: " + emit.shell_quote(
                  os.path.join(os.path.dirname(written[0]), "submit.sh")),
              "tpu-vm": tpu_vm_hint,
              "local-script": f"run: {script}"}[args.target]
      print(f"sweep {sweep.name}: {len(sweep.jobs)} jobs for {args.target}; {hint}", flush=True)
      return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from prompt_jax.launch import report  # pylint: disable=g-import-not-at-top
    out = report.write(sweep, out_dir=args.out, metric=args.metric)
    done = sum(1 for r in out["rows"] if r["final"] != "")
    figures = len(out["figures"])
    print(f"sweep {sweep.name}: {done}/{len(sweep.jobs)} jobs with metrics; "
          f"{figures} figure{'' if figures == 1 else 's'}; report: {out['md']} (and report.csv, "
          f"*.png in {out['out_dir']})", flush=True)
    return 0
  except ConfigError as e:
    print(f"prompt-jax sweep: error: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
    return EXIT_CONFIG_ERROR
