"""Acceptance 2: the emitted TPU-VM, SLURM and local scripts pass `bash -n`, carry every job's gin
flags and the multi-host flags (read back by running them against fake gcloud / srun / scontrol /
prompt-jax), and the SLURM script, run under a fake `srun` with 2 local processes, trains what a
plain single-process run trains."""
import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from prompt_jax.launch import emit
from prompt_jax.launch import spec as spec_lib
from tests.launch import helpers
from tests.train import common

# Records its argv (JSON, one line per call) and fails for commands naming $FAKE_FAIL.
RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["FAKE_RECORD"], "a") as f:
  f.write(json.dumps(sys.argv[1:]) + "\\n")
fail = os.environ.get("FAKE_FAIL")
sys.exit(1 if fail and any(fail in a for a in sys.argv) else 0)
"""

# srun on one machine: the command once per task of the allocation (SLURM_NTASKS), each with its
# SLURM_PROCID / SLURM_LOCALID; the worst exit status.
FAKE_SRUN = f"""#!{sys.executable}
import json, os, subprocess, sys
args = sys.argv[1:]
options = []
while args and args[0].startswith("-"):
  options.append(args.pop(0))
n = int(os.environ["SLURM_NTASKS"])
procs = [subprocess.Popen(args, env={{**os.environ, "SLURM_PROCID": str(i),
                                      "SLURM_LOCALID": str(i), "SLURM_NODEID": "0"}})
         for i in range(n)]
codes = [p.wait() for p in procs]
with open(os.environ["FAKE_RECORD"], "a") as f:
  f.write(json.dumps({{"options": options, "command": args[:2], "codes": codes}}) + "\\n")
sys.exit(max(codes, key=abs))
"""

FAKE_SCONTROL = """#!/bin/sh
# The allocation's node names; the first is this machine.
if [ "$1 $2" = "show hostnames" ]; then echo 127.0.0.1; echo fakenode2; exit 0; fi
exit 1
"""


def _bash_n(path):
  proc = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr


def _emit(tmp_path, spec_text, *argv):
  spec = helpers.write_spec(tmp_path, spec_text)
  out = str(tmp_path / "launch")
  root = argv[0] if argv and not argv[0].startswith("--") else str(tmp_path / "root")
  argv = [a for a in argv if a != root]
  rc, stdout, err = helpers.sweep_cli(["emit", spec, f"--root={root}", f"--out={out}", *argv])
  assert rc == 0, err
  sweep = spec_lib.build(spec, root=root)
  spec_lib.validate_gin(sweep, *_gin_fns())
  return sweep, out, stdout


def _gin_fns():
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  return cli.parse_gin, cli.check_job


def _records(path):
  with open(path) as f:
    return [json.loads(l) for l in f]


def _run_script(args, env, timeout=420):
  proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)
  try:
    out = proc.communicate(timeout=timeout)[0]
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  return proc.returncode, out


def test_tpu_vm_script(tmp_path):
  sweep, out, stdout = _emit(tmp_path, helpers.TINY_SPEC, "gs://bucket/sweeps/tiny",
                             "--target=tpu-vm", "--tpu_name=pod-1", "--zone=europe-west4-a")
  script = os.path.join(out, "tpu_vm.sh")
  # --tpu_name and --zone given: the script is run as it is.
  assert stdout.strip().splitlines()[-1].endswith(f"; run: {script}"), stdout
  _bash_n(script)
  fakes = tmp_path / "bin"
  fakes.mkdir()
  helpers.write_executable(fakes, "gcloud", RECORDER)
  record = str(tmp_path / "gcloud.jsonl")
  setup = "cd ~/prompt_jax && . .venv/bin/activate"
  failing = sweep.jobs[1].name
  rc, output = _run_script(["bash", script], helpers.job_env(
      {"FAKE_RECORD": record, "FAKE_FAIL": f"/{failing}'", "SETUP": setup, "PROJECT": "proj"},
      [str(fakes)]))
  # A failing job is reported at the end; the others still run.
  assert rc == 1 and output.strip().splitlines()[-1] == f"failed: {failing}"
  calls = _records(record)
  expected = [job.train_args() for job in sweep.jobs] + [
      args for jobs in sweep.groups().values() for args in emit.group_eval_commands(sweep, jobs)]
  assert len(calls) == len(expected) == 16
  for call, args in zip(calls, expected):
    assert call[:5] == ["compute", "tpus", "tpu-vm", "ssh", "pod-1"]
    assert {"--zone=europe-west4-a", "--project=proj", "--worker=all"} <= set(call)
    command = [a for a in call if a.startswith("--command=")]
    assert len(command) == 1
    remote = command[0][len("--command="):]
    assert remote.startswith(setup + " && ")
    # The remote shell's words: exactly the job's command, with its gin flags; no coordinator
    # flags (the TPU runtime tells each worker's JAX about the slice).
    words = shlex.split(remote[len(setup) + 4:])
    assert words == ["prompt-jax", *args]
    assert not any(w.startswith(("--coordinator_address", "--process_", "--multiprocess_gpu"))
                   for w in words)
  assert all("gs://bucket/sweeps/tiny/" in " ".join(c) for c in calls)


def test_tpu_vm_project_given_at_emit_is_cleared_by_an_empty_project(tmp_path):
  """`PROJECT= bash tpu_vm.sh` (the header: "empty: gcloud's default project") still passed
  the --project given at emit (`${PROJECT:-proj}`)."""
  _, out, stdout = _emit(tmp_path, helpers.TINY_SPEC, "gs://bucket/t", "--target=tpu-vm",
                         "--project=proj")
  script = os.path.join(out, "tpu_vm.sh")
  # No --tpu_name / --zone: the last line says what to set and what the script would use.
  assert stdout.strip().splitlines()[-1].endswith(
      f"run: TPU_NAME=<name> ZONE=<zone> {script} (the script's defaults: my-tpu in "
      f"us-central2-b)"), stdout
  fakes = tmp_path / "bin"
  fakes.mkdir()
  helpers.write_executable(fakes, "gcloud", RECORDER)
  for project, expected in ((None, {"--project=proj"}), ("", set())):
    record = str(tmp_path / f"gcloud{project}.jsonl")
    env = helpers.job_env({"FAKE_RECORD": record}, [str(fakes)])
    env.pop("PROJECT", None)
    if project is not None:
      env["PROJECT"] = project
    rc, output = _run_script(["bash", script], env)
    assert rc == 0, output
    assert {tuple(a for a in call if a.startswith("--project")) for call in _records(record)} \
        == {tuple(expected)}


def test_scripts_name_the_emit_flags_and_overrides_they_were_made_with(tmp_path):
  """The headers said `sweep emit SPEC --target=slurm` without --nodes & co, and the report
  command (headers, local.sh's last line) dropped --gin.X: with --gin.TRAIN_STEPS=2 that report
  counted every finished run as incomplete (short of the spec's TRAIN_STEPS)."""
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  root = tmp_path / "root"
  for target in (["--target=slurm", "--nodes=2", "--partition=a100"],
                 ["--target=local-script"]):
    rc, _, err = helpers.sweep_cli(["emit", spec, f"--root={root}", *target,
                                    "--gin.TRAIN_STEPS=2"])
    assert rc == 0, err
  report = f"prompt-jax sweep report {spec} --root={root} --gin.TRAIN_STEPS=2"
  for name in ("train.sbatch", "eval.sbatch", "submit.sh", "local.sh"):
    with open(root / "launch" / name) as f:
      text = f.read()
    target = "--target=local-script" if name == "local.sh" else \
        "--target=slurm --nodes=2 --partition=a100"
    assert f"# Generated by `prompt-jax sweep emit {spec} --root={root} --gin.TRAIN_STEPS=2 " \
           f"{target}`" in text, text
    assert f"results: {report}\n" in text
  assert text.strip().endswith(f'report: {report}"')  # local.sh's last line (an echo)


def _run_local_script(tmp_path, spec_text):
  """(sweep, output) of the emitted local.sh run against a recording `prompt-jax`, which must
  have received every job's train command, then every group's eval commands."""
  sweep, out, _ = _emit(tmp_path, spec_text, "--target=local-script")
  script = os.path.join(out, "local.sh")
  _bash_n(script)
  fakes = tmp_path / "bin"
  fakes.mkdir()
  helpers.write_executable(fakes, "prompt-jax", RECORDER)
  record = str(tmp_path / "calls.jsonl")
  rc, output = _run_script(["bash", script], helpers.job_env({"FAKE_RECORD": record},
                                                             [str(fakes)]))
  assert rc == 0, output
  assert _records(record) == [j.train_args() for j in sweep.jobs] + [
      args for jobs in sweep.groups().values() for args in emit.group_eval_commands(sweep, jobs)]
  return sweep, output


def test_local_script(tmp_path):
  sweep, output = _run_local_script(tmp_path, helpers.TINY_SPEC)
  # Its last line names the report command for this root (emitted with --root).
  assert output.strip().splitlines()[-1] == (
      f"sweep tiny: all jobs done; report: prompt-jax sweep report {sweep.path} "
      f"--root={sweep.root}")


def _arms(script_text):
  """case arm -> the argvs of its `launch` lines."""
  arms, current = {}, None
  for line in script_text.splitlines():
    stripped = line.strip()
    if stripped[:1].isdigit() and stripped.split(")")[0].isdigit():
      current = int(stripped.split(")")[0])
      arms[current] = []
    elif stripped.startswith("launch ") and current is not None:
      arms[current].append(shlex.split(stripped[len("launch "):].rsplit(" || ", 1)[0]))
  return arms


def test_slurm_scripts_gpu(tmp_path):
  sweep, out, stdout = _emit(tmp_path, helpers.TINY_SPEC, "--target=slurm", "--nodes=2",
                             "--process_per=gpu", "--gpus_per_node=4", "--max_parallel=3",
                             "--partition=a100", "--time=04:00:00")
  assert os.path.join(out, "submit.sh") in stdout.strip().splitlines()[-1]
  for name in ("train.sbatch", "eval.sbatch", "submit.sh"):
    _bash_n(os.path.join(out, name))
  with open(os.path.join(out, "train.sbatch")) as f:
    train = f.read()
  for directive in ("--array=0-7%3", "--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4",
                    "--partition=a100", "--time=04:00:00", "--requeue"):
    assert f"#SBATCH {directive}\n" in train
  assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in train
  for flag in ("--multiprocess_gpu", '--coordinator_address="$COORDINATOR_ADDRESS"',
               '--process_count="$SLURM_NTASKS"', '--process_index="$SLURM_PROCID"',
               "CUDA_VISIBLE_DEVICES=$SLURM_LOCALID"):
    assert flag in train
  assert _arms(train) == {i: [job.train_args()] for i, job in enumerate(sweep.jobs)}
  with open(os.path.join(out, "eval.sbatch")) as f:
    evals = f.read()
  assert "#SBATCH --array=0-3%3\n" in evals
  groups = list(sweep.groups().values())
  assert _arms(evals) == {i: emit.group_eval_commands(sweep, jobs)
                          for i, jobs in enumerate(groups)}
  assert all(a[0] == "eval" and any(x.startswith("--gin.CHECKPOINT_PATH=") and x.endswith(
      "/checkpoints/4'") for x in a) for arm in _arms(evals).values() for a in arm)


def test_slurm_script_under_fake_srun_matches_a_plain_run(tmp_path):
  """train.sbatch's array task 0 under a fake srun: 2 processes x 1 CPU device on 127.0.0.1 vs
  the job's command as 1 process x 2 devices, bit for bit (helpers.assert_multihost_prompt_matches)."""
  sweep, out, _ = _emit(tmp_path, helpers.MULTIHOST_SPEC, "--target=slurm", "--platform=cpu")
  (job,) = sweep.jobs
  script = os.path.join(out, "train.sbatch")
  _bash_n(script)
  with open(script) as f:
    text = f.read()
  assert "--multiprocess_gpu" not in text and "--gpus-per-node" not in text
  fakes = tmp_path / "bin"
  fakes.mkdir()
  helpers.write_executable(fakes, "srun", FAKE_SRUN)
  helpers.write_executable(fakes, "scontrol", FAKE_SCONTROL)
  record = str(tmp_path / "srun.jsonl")
  port = helpers.free_port(20000, 40000)  # the script's port is 20000 + SLURM_JOB_ID % 20000
  env = helpers.job_env({
      "FAKE_RECORD": record, "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_ID": str(port - 20000),
      "SLURM_JOB_NODELIST": "fakenode[1-2]", "SLURM_NTASKS": "2",
      "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, [str(fakes)])
  rc, output = _run_script(["bash", script], env)
  assert rc == 0, output[-4000:]
  assert f"prompt-jax train on 2 processes, coordinator 127.0.0.1:{port}" in output
  assert "training steps 0 -> 3" in output
  (call,) = _records(record)
  assert call["codes"] == [0, 0] and call["command"] == ["bash", "-c"]
  single = str(tmp_path / "single")
  proc = common.cli_subprocess(helpers.replace_model_dir(job.train_args(), single), devices=2)
  assert proc.returncode == 0, proc.stdout[-3000:]
  helpers.assert_multihost_prompt_matches(job.model_dir, single, step=3)


def test_local_script_with_axis_names_that_need_quoting(tmp_path):
  """A scoped gin parameter and a name with a space as axes: each job still runs its own command
  (the job names are path-safe and quoted)."""
  text = helpers.TINY_SPEC.replace("  PROMPT_LENGTH: [4, 8]\n  init:\n", (
      "  train/prompt_jax.DatasetConfig.shuffle: [true, false]\n  my init:\n")).replace(
          "seeds: [0, 1]\n", "")
  sweep, output = _run_local_script(tmp_path, text)
  assert len(sweep.jobs) == 4
  assert f"== {sweep.jobs[0].name}" in output
  assert "== train-prompt_jax.DatasetConfig.shuffle-True__my-init-uniform" in output


def test_slurm_scripts_with_a_relative_out_dir(tmp_path, monkeypatch):
  """submit.sh cds to its own directory before sbatch: the logs path SLURM writes to must not
  be relative to where `emit` ran."""
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  monkeypatch.chdir(tmp_path)
  rc, _, err = helpers.sweep_cli(["emit", spec, "--root=root", "--target=slurm",
                                  "--out=slurm_out"])
  assert rc == 0, err
  with open(tmp_path / "slurm_out" / "train.sbatch") as f:
    train = f.read()
  assert f"#SBATCH --output={tmp_path}/slurm_out/logs/slurm-%x-%A_%a.out\n" in train
  with open(tmp_path / "slurm_out" / "submit.sh") as f:
    assert f"logs in\" {tmp_path}/slurm_out/logs\n" in f.read()


def _sbatch_words(line: str):
  """The words sbatch reads from an `#SBATCH ...` line: a port of SchedMD/slurm
  src/sbatch/opt.c `_get_argument` (blanks split, `"` or `'` opens quoting until the same quote,
  a backslash escapes the next character, an unescaped `#` ends the word and the line; a quote
  left open is sbatch's fatal "Unmatched" error)."""
  words, i, text = [], 0, line[len("#SBATCH"):]
  while True:
    while i < len(text) and text[i].isspace():
      i += 1
    word, quoted, escaped = "", "", False
    while i < len(text) and (quoted or not text[i].isspace()) and text[i] != "\n":
      c = text[i]
      i += 1
      if escaped:
        word, escaped = word + c, False
      elif c == "\\":
        escaped = True
      elif quoted and c == quoted:
        quoted = ""
      elif not quoted and c in "\"'":
        quoted = c
      elif c == "#" and not quoted:
        i = len(text)
        break
      else:
        word += c
    assert not quoted, f"sbatch: Unmatched `{quoted}` in [{line.rstrip()}]"
    if not word:
      return words
    words.append(word)


def test_slurm_logs_under_a_directory_with_blanks_hash_and_percent(tmp_path):
  """An out directory `it's my runs #1/100%`: the #SBATCH --output line is one word to sbatch
  (it was cut at the blank; the `'` was an unmatched quote, fatal to sbatch), its `%` is SLURM's
  literal `%%`, and submit.sh prints the real path."""
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  out = tmp_path / "it's my runs #1" / "100%"
  rc, _, err = helpers.sweep_cli(["emit", spec, f"--root={tmp_path / 'root'}", "--target=slurm",
                                  f"--out={out}"])
  assert rc == 0, err
  with open(out / "train.sbatch") as f:
    line = next(l for l in f if l.startswith("#SBATCH") and "--output" in l)
  logs = str(out / "logs").replace("%", "%%")
  assert _sbatch_words(line) == [f"--output={logs}/slurm-%x-%A_%a.out"], line
  # Without a blank the word is not in double quotes: a lone ' or " must not open a quote.
  for word in ("--output=/runs/it's/x", '--output=/runs/a"b/x', "--output=/r/#1\\"):
    assert _sbatch_words("#SBATCH " + emit.sbatch_word(word) + " #c") == [word]
  fake = tmp_path / "bin"
  fake.mkdir()
  (fake / "sbatch").write_text("#!/bin/sh\necho 7\n")
  (fake / "sbatch").chmod(0o755)
  proc = subprocess.run(["bash", str(out / "submit.sh")], capture_output=True, text=True,
                        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip().endswith(f"logs in {out / 'logs'}"), proc.stdout


def test_a_slurm_out_directory_with_a_newline_is_one_line(tmp_path):
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  out = tmp_path / "a\nb"
  rc, stdout, err = helpers.sweep_cli(["emit", spec, f"--root={tmp_path / 'root'}",
                                       "--target=slurm", f"--out={out}"])
  assert rc == 2 and len(err.strip().splitlines()) == 1 and "newline" in err, (stdout, err)
  assert not out.exists()


def test_an_output_path_in_the_way_is_one_line_without_traceback(tmp_path):
  """Not a bad spec but a file where emit must make a directory: one line naming --out, exit 2
  (was the NotADirectoryError's words, exit 1)."""
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  in_the_way = tmp_path / "a_file"
  in_the_way.write_text("")
  rc, out, err = helpers.sweep_cli(["emit", spec, f"--root={tmp_path / 'root'}",
                                    "--target=local-script", f"--out={in_the_way / 'launch'}"])
  assert rc == 2, (out, err)
  lines = [l for l in err.splitlines() if l.startswith("prompt-jax")]
  assert lines == [f"prompt-jax sweep: error: --out: cannot create the directory "
                   f"{in_the_way / 'launch'} (Not a directory); choose another place"], err
  assert "Traceback" not in err + out
  # No --out: the --root given is where the file is in the way (the line named --out).
  for target in ("--target=local-script", "--target=slurm"):
    rc, out, err = helpers.sweep_cli(["emit", spec, f"--root={in_the_way}", target])
    assert rc == 2 and err.splitlines() == [
        f"prompt-jax sweep: error: --root: cannot create the directory {in_the_way / 'launch'} "
        f"(Not a directory); choose another place"], err


@pytest.mark.parametrize("flags,expected", [
    (["--nodes=0"], "--nodes must be >= 1 (nodes per job), got 0"),
    (["--process_per=gpu", "--platform=cpu"],  # (the script started one process per node)
     "--process_per=gpu starts one process per GPU, but --platform=cpu requests none"),
    (["--gpus_per_node=4", "--platform=cpu"],  # (was dropped without a word)
     "--gpus_per_node requests GPUs, but --platform=cpu requests none"),
    (["--gpus_per_node=-2"], "--gpus_per_node must be >= 1, got -2"),
    (["--max_parallel=-1"], "--max_parallel must be >= 0"),
    (["--time=4 hours"], "--time must be a SLURM time limit"),
    (["--partition=a100 --qos=x"], "--partition must be a SLURM partition name"),
])
def test_impossible_slurm_settings_are_one_line_and_write_nothing(tmp_path, flags, expected):
  """--nodes=0 --gpus_per_node=-2 --max_parallel=-1 used to write `--array=0-7%-1` and friends."""
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  root = tmp_path / "root"
  rc, out, err = helpers.sweep_cli(["emit", spec, f"--root={root}", "--target=slurm", *flags])
  assert rc == 2 and len(err.strip().splitlines()) == 1 and expected in err, (out, err)
  assert not root.exists() and "wrote" not in out


def test_slurm_time_limits_sbatch_accepts(tmp_path):
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  for time_limit in ("90", "1-00:00:00", "2-12", "30:00", "UNLIMITED"):
    rc, _, err = helpers.sweep_cli(["emit", spec, f"--root={tmp_path / 'root'}", "--target=slurm",
                                    f"--time={time_limit}", "--platform=cpu",
                                    "--gpus_per_node=0"])
    assert rc == 0, err


def test_re_emitting_keeps_a_script_the_user_edited(tmp_path):
  """The header says 'edit freely': emit again replaced an edited train.sbatch silently. An
  edited script is kept as <name>.replaced-1 (and said so); unchanged ones are rewritten as
  they were, with nothing kept."""
  argv = ("--target=slurm", "--time=01:00:00")
  _, out, _ = _emit(tmp_path, helpers.TINY_SPEC, *argv)
  train = os.path.join(out, "train.sbatch")
  with open(train, "a") as f:
    f.write("echo my own line\n")
  edited = open(train).read()
  _, _, stdout = _emit(tmp_path, helpers.TINY_SPEC, *argv)
  assert open(train + ".replaced-1").read() == edited
  assert "echo my own line" not in open(train).read()
  assert f"kept the earlier train.sbatch, which differs, as {train}.replaced-1" in stdout
  assert sorted(f for f in os.listdir(out) if "replaced" in f) == ["train.sbatch.replaced-1"]
