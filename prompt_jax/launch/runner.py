"""`prompt-jax sweep run`: the jobs of a sweep as `prompt-jax train` subprocesses on this machine.

Each job runs the exact command `sweep plan` prints (`prompt-jax` as found on PATH, else this
interpreter's `python -m prompt_jax`), its output appended to <root>/logs/<job>.log, so one job's
crash never stops the others. <root>/sweep_status.json records every job's state (pending,
running, done, failed + the error line, and the command each job last ran), rewritten
atomically after each change. Re-running skips done jobs, resumes interrupted and preempted ones
(the trainer restarts from MODEL_DIR/checkpoints) and leaves failed ones alone unless
--retry_failed. A done job whose command changed since it ran runs again only when the change
is a larger --gin.TRAIN_STEPS: as `t5x.train` on the same MODEL_DIR, the trainer resumes from its
checkpoint and continues. Any other change to a trained job (done, or failed with checkpoints) is
refused before anything starts (the trainer would restore the old run and record its results as
the new command's): use a new --root, or remove that MODEL_DIR. A done job whose MODEL_DIR (or its
checkpoints) is gone runs again. A lock file stops two runners from sharing a root.

Stopping the runner (Ctrl-C, SIGTERM) sends SIGTERM to its jobs, which is what makes the trainer
save a checkpoint before it exits (143); a job that has not ended `stop_timeout` seconds later is
killed. The jobs ignore SIGINT, so a terminal's Ctrl-C (sent to the whole process group) reaches
them only as the runner's SIGTERM.
"""
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, TextIO, Tuple

from prompt_jax import console
from prompt_jax import paths
from prompt_jax.errors import ConfigError, make_dirs
from prompt_jax.launch import spec as spec_lib

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
STATUS_FILE = "sweep_status.json"
LOCK_FILE = ".sweep.lock"
POLL_SECONDS = 0.5
STOP_TIMEOUT = 300.0  # seconds a stopped job has to save its checkpoint before it is killed
PREEMPTED_CODES = (143, -signal.SIGTERM)  # the trainer saved a checkpoint and stopped


def status_path(root: str) -> str:
  return os.path.join(root, STATUS_FILE)


def log_path(root: str, job: spec_lib.Job) -> str:
  return os.path.join(root, "logs", job.name + ".log")


def prompt_jax_command() -> List[str]:
  exe = shutil.which("prompt-jax")
  return [exe] if exe else [sys.executable, "-m", "prompt_jax"]


def read_status(root: str) -> Dict:
  try:
    with open(status_path(root)) as f:
      return json.load(f)
  except FileNotFoundError:
    return {"jobs": {}}
  except NotADirectoryError as e:
    raise ConfigError(f"--root {root}: a file is in the way of the sweep's directory; choose "
                      f"another --root") from e
  except json.JSONDecodeError as e:
    raise ConfigError(f"{status_path(root)} is not valid JSON ({e}); move it away to start the "
                      f"sweep's bookkeeping afresh (finished runs resume from their MODEL_DIRs)")


def write_status(root: str, status: Dict) -> None:
  """Atomic: a temporary file renamed over the old one."""
  tmp = status_path(root) + ".tmp"
  with open(tmp, "w") as f:
    json.dump(status, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, status_path(root))


def error_line(log: str, start: int, returncode: int) -> str:
  """The line that says why a job failed: the CLI's `error:` line, else an exception, else the
  last line of its output."""
  try:
    with open(log, errors="replace") as f:
      f.seek(start)
      lines = [l.rstrip() for l in f.read().splitlines() if l.strip()]
  except OSError:
    lines = []
  if returncode < 0:
    try:
      why = f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
      why = f"killed by signal {-returncode}"
  else:
    why = f"exit status {returncode}"
  for pattern in (r"^prompt-jax \w+: error: ", r"^\w*(Error|Exception)\b"):
    hits = [l for l in lines if re.match(pattern, l)]
    if hits:
      return f"{why}: {hits[-1][:300]}"
  return f"{why}: {lines[-1][:300]}" if lines else why


def _check_not_running(job: spec_lib.Job, pid) -> None:
  """A job whose runner was killed alone (not its process group) may still be training: a second
  trainer on the same MODEL_DIR would corrupt it."""
  if not pid:
    return
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      cmdline = f.read().decode(errors="replace")
  except OSError:
    return  # gone (or no /proc: nothing to check against)
  if job.model_dir in cmdline:
    raise ConfigError(f"job {job.name} is still running as pid {pid} (its sweep runner died); "
                      f"wait for it to end or stop it, then run again")


def _command(job: spec_lib.Job) -> List[str]:
  return ["prompt-jax"] + job.train_args()


def _interrupted(entry: Dict) -> bool:
  """`running` (its runner died) or `pending` after an attempt (stopped, preempted)."""
  return entry.get("state") == RUNNING or bool(entry.get("state") == PENDING
                                               and entry.get("attempts"))


def command_changed(entry: Dict, job: spec_lib.Job) -> bool:
  """A done, failed or interrupted job last ran another command."""
  return (entry.get("state") in (DONE, FAILED) or _interrupted(entry)) and \
      entry.get("command") not in (None, _command(job))


def has_checkpoints(model_dir: str) -> bool:
  """MODEL_DIR/checkpoints holds a step (what a resumed run restores)."""
  try:
    return any(name.isdigit() for name in os.listdir(os.path.join(model_dir, "checkpoints")))
  except OSError:
    return False


def model_dir_gone(model_dir: str) -> bool:
  """Nothing of a run is left: no config.gin (written when training starts) and no checkpoint.
  Pruned checkpoints alone leave the run (its config.gin and evaluations) in place."""
  return not os.path.exists(os.path.join(model_dir, "config.gin")) and \
      not has_checkpoints(model_dir)


RUN_ANEW = ("command changed: running it", "MODEL_DIR gone: running again")  # rerun_verdict's


def move_aside(model_dir: str) -> Optional[str]:
  """Moves what an earlier run left in `model_dir` (its config.gin, TensorBoard events, logs:
  a failed run without checkpoints) to `<model_dir>.replaced-<k>` before a new command trains
  there anew, so the report reads no step of the old run as the new one's; its path, or None
  when there is nothing to move."""
  try:
    if not os.listdir(model_dir):
      return None
  except OSError:
    return None
  return paths.keep_aside(model_dir)


def _flags(command: List[str]) -> Dict[str, object]:
  """`--gin.X=v` -> {"--gin.X": v}; repeated flags (--gin_file) -> their values in order."""
  out: Dict[str, object] = {}
  for arg in command[1:]:
    key, _, value = arg.partition("=")
    if key == "--gin_file":
      out.setdefault(key, []).append(value)
    else:
      out[key] = value
  return out


def _run_steps(model_dir: str, command_steps) -> object:
  """The TRAIN_STEPS a run trained to: its command's flag, else its config.gin's value."""
  if command_steps is not None:
    return command_steps
  try:
    with open(os.path.join(model_dir, "config.gin")) as f:
      m = re.search(r"^TRAIN_STEPS\s*=\s*(\S+)\s*$", f.read(), re.M)
    return m.group(1) if m else None
  except OSError:
    return None


def _int(text) -> object:
  try:
    return int(str(text).strip())
  except (TypeError, ValueError):
    return None


def rerun_verdict(entry: Dict, job: spec_lib.Job) -> Optional[Tuple[str, str]]:
  """What `run` does with a done, failed or interrupted (running, or pending after an attempt)
  job that is not simply kept or resumed: None (keep or resume it), or ("run", why) to run it
  (again), or ("refuse", changed flags) when it would resume a trained MODEL_DIR under another
  configuration (the trainer restores the old run's checkpoint, so the old run's results would
  be recorded as the new command's).

  A done job whose MODEL_DIR is gone (no config.gin, no checkpoint) runs again from scratch. A
  changed command resumes only when it raises --gin.TRAIN_STEPS and changes nothing else, and
  only from a checkpoint; a failed or interrupted job without checkpoints runs any new command
  (nothing of the old one would be restored)."""
  state = entry.get("state")
  if state == DONE and model_dir_gone(job.model_dir):
    return ("run", RUN_ANEW[1])
  if not command_changed(entry, job):
    return None
  if state != DONE and not has_checkpoints(job.model_dir):
    return ("run", RUN_ANEW[0])
  old, new = _flags(list(entry["command"])), _flags(_command(job))
  # MODEL_DIR is the job's own directory (<root>/<name>): a moved root changes no configuration.
  changed = [k for k in sorted(set(old) | set(new))
             if old.get(k) != new.get(k) and k != "--gin.MODEL_DIR"]
  if not changed:
    return None
  steps = "--gin.TRAIN_STEPS"
  old_steps = _int(_run_steps(job.model_dir, old.get(steps)))
  new_steps = _int(new.get(steps, job.train_steps))
  if changed == [steps] and None not in (old_steps, new_steps) and new_steps > old_steps:
    if not has_checkpoints(job.model_dir):  # pruned: more steps would silently train anew
      return ("refuse", f"{steps} {old_steps} -> {new_steps}, but its checkpoints are gone: "
                        f"nothing to resume from")
    return ("run", "command changed: resuming")

  def show(k):
    if k == steps:
      return f"{k} {old_steps if old_steps is not None else '?'} -> " \
             f"{new_steps if new_steps is not None else '?'}"
    if k == "--gin_file" or k not in old or k not in new:
      return k if k in old and k in new else f"{k} ({'added' if k in new else 'dropped'})"
    return f"{k} {old[k]} -> {new[k]}"
  return ("refuse", ", ".join(show(k) for k in changed))


class _Terminated(KeyboardInterrupt):
  """SIGTERM to the runner (a scheduler's preemption): stops it as Ctrl-C does, exit 143."""


def _raise_terminated(*unused):
  raise _Terminated


class _Lock:
  def __init__(self, root: str):
    self.path = os.path.join(root, LOCK_FILE)
    self.file = None

  def __enter__(self):
    self.file = open(self.path, "a+")  # (not "w": a refused runner must keep the holder's pid)
    try:
      fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
      self.file.seek(0)
      holder = self.file.read().strip()
      self.file.close()
      raise ConfigError(f"another `prompt-jax sweep run`{f' (pid {holder})' if holder else ''} "
                        f"is running on this root (it holds {self.path}); wait for it or stop "
                        f"it") from e
    self.file.seek(0)
    self.file.truncate()
    self.file.write(str(os.getpid()))
    self.file.flush()
    return self

  def __exit__(self, *exc):
    fcntl.flock(self.file, fcntl.LOCK_UN)
    self.file.close()


def _ignore_sigint() -> None:
  """In a job before it execs: Ctrl-C in a terminal signals the whole process group, and a
  trainer stopped by SIGINT exits without saving; the runner's SIGTERM stops it with a save."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def run(sweep: spec_lib.Sweep, parallel: int = 1, retry_failed: bool = False,
        out: TextIO = sys.stdout, stop_timeout: float = STOP_TIMEOUT) -> int:
  """Runs the sweep's pending jobs, `parallel` at a time; 0 if every job is done, else 1 (130
  when stopped by Ctrl-C, 143 by SIGTERM, as a preempted trainer exits). `stop_timeout`:
  seconds a stopped job has to save before it is killed."""
  if not sweep.local:
    raise ConfigError(f"sweep run needs a local root, got {sweep.root}: use `prompt-jax sweep "
                      f"emit --target=tpu-vm|slurm` for remote storage")
  if parallel < 1:
    raise ConfigError(f"--parallel must be >= 1, got {parallel}")
  if not stop_timeout >= 0:
    raise ConfigError(f"--stop_timeout must be >= 0 seconds, got {stop_timeout}")
  root = sweep.root
  make_dirs(os.path.join(root, "logs"), "--root")
  with _Lock(root):
    return _Runner(sweep, parallel, retry_failed, out, stop_timeout).run()


class _Runner:
  """A poll loop over at most `parallel` child processes (no threads)."""

  def __init__(self, sweep: spec_lib.Sweep, parallel: int, retry_failed: bool, out: TextIO,
               stop_timeout: float = STOP_TIMEOUT):
    self.sweep, self.parallel, self.out = sweep, parallel, out
    self.stop_timeout = stop_timeout
    self.root = sweep.root
    self.status = read_status(self.root)
    self.status.update({"sweep": sweep.name, "spec": sweep.path, "root": self.root})
    entries = self.status.setdefault("jobs", {})
    self.notes: Dict[str, str] = {}  # job name -> why it starts again ("resuming", ...)
    self.anew: set = set()  # jobs that train from scratch where an earlier run left files
    refused: List[Tuple[spec_lib.Job, str]] = []  # trained under another command
    for job in sweep.jobs:
      entry = entries.setdefault(job.name, {"state": PENDING, "attempts": 0})
      entry.update({"model_dir": job.model_dir, "log": log_path(self.root, job),
                    "group": job.group})
      command = _command(job)
      if entry["state"] == RUNNING:  # its runner died (we hold the lock)
        _check_not_running(job, entry.get("pid"))
      verdict = rerun_verdict(entry, job)
      if verdict and verdict[1] in RUN_ANEW:
        self.anew.add(job.name)
      if verdict and verdict[0] == "refuse":
        refused.append((job, verdict[1]))
      elif _interrupted(entry):  # runner died, stopped or preempted: resume it
        entry["state"] = PENDING
        self.notes[job.name] = verdict[1] if verdict else (
            "resuming" if has_checkpoints(job.model_dir)
            else "stopped before its first checkpoint: from step 0")
      elif verdict:
        # Gone, or more TRAIN_STEPS: the new command (re)trains; more steps resume from the
        # job's checkpoint as `t5x.train` would.
        entry.update({"state": PENDING, "error": None})
        self.notes[job.name] = verdict[1]
      if entry["state"] == FAILED and retry_failed:
        entry["state"] = PENDING
      if entry["state"] == PENDING:
        entry["command"] = command
    if refused:  # before anything starts: nothing trained under the old command is touched
      job, flags = refused[0]
      state = entries[job.name]["state"]
      state = state if state in (DONE, FAILED) else "interrupted"
      more = f" (and {len(refused) - 1} more job(s))" if len(refused) > 1 else ""
      raise ConfigError(
          f"job {job.name}{more} is {state} under another command "
          f"(changed: {flags}); `sweep run` resumes a trained job only for a larger "
          f"--gin.TRAIN_STEPS, from its checkpoint: give the flags it ran with again, use a "
          f"new --root, or remove {job.model_dir} to train it again")
    self.queue = [j for j in sweep.jobs if entries[j.name]["state"] == PENDING]
    self.running: Dict[str, tuple] = {}  # name -> (job, Popen, log file, log start, t0)
    self.durations: List[float] = []
    self.interrupted = 0  # when stopped, its exit code: 130 (Ctrl-C) or 143 (SIGTERM)

  def _entry(self, job: spec_lib.Job) -> Dict:
    return self.status["jobs"][job.name]

  def _counts(self) -> Dict[str, int]:
    counts = {PENDING: 0, RUNNING: 0, DONE: 0, FAILED: 0}
    for job in self.sweep.jobs:
      counts[self._entry(job)["state"]] += 1
    return counts

  def _print(self, line: str) -> None:
    print(line, file=self.out, flush=True)

  def _eta(self) -> str:
    if not self.durations:
      return "?"
    left = len(self.queue) + len(self.running)
    return console.clock_text(sum(self.durations) / len(self.durations) * left / self.parallel)

  def _start(self, job: spec_lib.Job) -> None:
    entry = self._entry(job)
    log = log_path(self.root, job)
    argv = prompt_jax_command() + job.train_args()
    if job.name in self.anew:
      moved = move_aside(job.model_dir)
      self.anew.discard(job.name)
      if moved:
        self.notes[job.name] = f"{self.notes.get(job.name, 'running anew')}; the earlier " \
                               f"run's files are in {moved}"
    f = open(log, "a")
    entry["attempts"] = entry.get("attempts", 0) + 1
    f.write(f"=== sweep {self.sweep.name}: attempt {entry['attempts']} at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    start = f.tell()
    try:
      proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              preexec_fn=_ignore_sigint)
    except BaseException:
      f.close()
      raise
    entry.update({"state": RUNNING, "started": time.time(), "pid": proc.pid, "error": None,
                  "command": _command(job)})
    write_status(self.root, self.status)
    self.running[job.name] = (job, proc, f, start, time.time())
    n = self.sweep.jobs.index(job) + 1
    note = f" ({self.notes[job.name]})" if job.name in self.notes else ""
    self._print(f"[{n}/{len(self.sweep.jobs)}] start {job.name}{note}  log: {log}")

  def _finish(self, name: str, returncode: int) -> None:
    job, _, f, start, t0 = self.running.pop(name)
    f.close()
    entry = self._entry(job)
    seconds = time.time() - t0
    entry.update({"finished": time.time(), "seconds": round(seconds, 1), "pid": None,
                  "returncode": returncode})
    if returncode == 0:
      entry["state"] = DONE
      self.durations.append(seconds)
    elif returncode in PREEMPTED_CODES:  # checkpoint saved: the next `sweep run` resumes it
      entry["state"] = PENDING
      entry["error"] = "preempted: " + error_line(f.name, start, returncode)
      self.notes[job.name] = "resuming"
    else:
      entry["state"] = FAILED
      entry["error"] = error_line(f.name, start, returncode)
    write_status(self.root, self.status)
    c = self._counts()
    verb = {DONE: "done  ", PENDING: "preempted", FAILED: "FAILED"}[entry["state"]]
    took = console.clock_text(seconds)
    self._print(f"[{self.sweep.jobs.index(job) + 1}/{len(self.sweep.jobs)}] {verb} {job.name} "
                f"in {took}" + ("" if returncode == 0 else f": {entry['error']}")
                + f" | {c[DONE]} done, {c[FAILED]} failed, {len(self.queue) + len(self.running)}"
                f" left, ETA {self._eta()}")

  def _stop_children(self) -> None:
    """SIGTERM (the trainer saves a checkpoint, then exits), SIGKILL after stop_timeout seconds
    or at a second Ctrl-C / SIGTERM."""
    procs = [proc for _, proc, _, _, _ in self.running.values() if proc.poll() is None]
    deadline = time.time() + self.stop_timeout
    try:
      for proc in procs:
        proc.send_signal(signal.SIGTERM)
      if procs:
        self._print(f"stopping {len(procs)} running job(s): SIGTERM, waiting up to "
                    f"{self.stop_timeout:g}s for their checkpoints (a second Ctrl-C or SIGTERM "
                    f"kills them)")
      for proc in procs:
        try:
          proc.wait(timeout=max(deadline - time.time(), 0.01))
        except subprocess.TimeoutExpired:
          pass
    except KeyboardInterrupt:
      pass
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()

  def _stopped(self) -> None:
    """After _stop_children: a job that ended on its own keeps its outcome, the others (saved or
    killed) are pending, to resume at the next run."""
    for name, (job, proc, f, start, _) in list(self.running.items()):
      if proc.returncode == 0:
        self._finish(name, 0)
        continue
      self.running.pop(name)
      f.close()
      why = error_line(f.name, start, proc.returncode)
      self._entry(job).update({"state": PENDING, "pid": None, "error": f"interrupted: {why}"})
    write_status(self.root, self.status)

  def run(self) -> int:
    c = self._counts()
    self._print(f"sweep {self.sweep.name}: {len(self.sweep.jobs)} jobs ({self.sweep.shape()}), "
                f"{c[DONE]} done, {c[FAILED]} failed, {len(self.queue)} to run, "
                f"{self.parallel} at a time; MODEL_DIRs under {self.root}")
    write_status(self.root, self.status)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)  # stop as on Ctrl-C
    t0 = time.time()
    try:
      while self.queue or self.running:
        while self.queue and len(self.running) < self.parallel:
          self._start(self.queue.pop(0))
        time.sleep(POLL_SECONDS)
        for name, (_, proc, _, _, _) in list(self.running.items()):
          if proc.poll() is not None:
            self._finish(name, proc.returncode)
    except KeyboardInterrupt as e:
      self.interrupted = 143 if isinstance(e, _Terminated) else 130
      self._stop_children()
      self._stopped()
    except BaseException:  # e.g. starting the next job failed: the running ones must not be
      self._stop_children()  # orphaned, still `running` in the status file
      self._stopped()
      raise
    finally:
      signal.signal(signal.SIGTERM, previous)
    c = self._counts()
    where = f"status: {status_path(self.root)}; report: {self.sweep.command('report')}"
    if self.interrupted:
      took = console.clock_text(time.time() - t0)
      self._print(f"sweep {self.sweep.name}: interrupted after {took} "
                  f"({c[DONE]} done, {c[FAILED]} failed, {c[PENDING]} pending); run the same "
                  f"command to resume. {where}")
      return self.interrupted
    failed = [j.name for j in self.sweep.jobs if self._entry(j)["state"] == FAILED]
    if c[PENDING]:
      self._print(f"{c[PENDING]} job(s) preempted: run the same command to resume them from "
                  f"their checkpoints")
    if failed:
      self._print(f"failed: {', '.join(failed)} (see their logs under {self.root}/logs; "
                  f"--retry_failed reruns them)")
    self._print(f"sweep {self.sweep.name}: {c[DONE]}/{len(self.sweep.jobs)} done, {c[FAILED]} "
                f"failed in {console.clock_text(time.time() - t0)}. {where}")
    return 0 if c[DONE] == len(self.sweep.jobs) else 1
