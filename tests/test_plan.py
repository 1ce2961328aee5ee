"""`prompt-jax plan` (issue 11): the train step compiled ahead of time on a fake mesh, from
abstract shapes, with per-device memory that follows the sharding."""
import re

import pytest

from prompt_jax import plan
from tests.train.common import cli_subprocess

TINY = ["--model=models/embedded_tiny.gin", "--batch=8", "--inputs=16", "--targets=4",
        "--prompt_length=8", "--dtype=float32", "--frozen_dtype=float32"]


def _per_device(argv, devices):
  """Plans in a subprocess with `devices` fake CPU devices; returns (arguments, total) bytes."""
  code = ("import json, sys\nfrom prompt_jax import plan\n"
          "args = plan._parser().parse_args(sys.argv[1:])\n"
          "print('PLAN ' + json.dumps(plan.plan(args)))\n")
  proc = cli_subprocess(argv, devices=devices, python_code=code, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:]
  import json  # pylint: disable=g-import-not-at-top
  return json.loads(proc.stdout.split("PLAN ")[-1].splitlines()[0])


def test_plan_memory_follows_the_mesh():
  one = _per_device(TINY + ["--mesh=1x1"], devices=1)
  four = _per_device(TINY + ["--mesh=1x4"], devices=4)
  # Frozen weights dominate the arguments: 4-way model parallelism holds about a quarter of
  # them per device (replicated layer norms and relative-position tables make it a bit more).
  frozen_bytes = one["params_frozen"] * 4  # float32
  assert one["argument"] >= frozen_bytes
  assert four["argument"] < 0.45 * one["argument"], (four["argument"], one["argument"])
  assert one["params_frozen"] == four["params_frozen"] > 0
  assert one["params_trainable"] == 8 * 64  # the [P, H] prompt
  assert all(v >= 0 for v in one.values())
  assert one["total"] > one["argument"] - one["alias"]


def test_plan_cli_runs_on_fake_devices_and_prints_memory():
  # As a user's shell starts it: no TF_CPP_MIN_LOG_LEVEL of our own in the environment.
  proc = cli_subprocess(["plan", *TINY, "--mesh=2x2", "--budget_gib=1"], devices=1,
                        timeout=600, env={"TF_CPP_MIN_LOG_LEVEL": None})
  assert proc.returncode == 0, proc.stdout[-3000:]
  out = proc.stdout
  assert "planning on 4 fake CPU devices" in out
  # The re-run on fake devices is as quiet as the first process: no TensorFlow/absl lines.
  assert "oneDNN" not in out and "absl::InitializeLog" not in out and "cuda" not in out, out
  assert re.search(r"per-device peak .*: [0-9.]+ (MiB|GiB) -> fits in 1 GiB", out), out[-2000:]


def test_plan_takes_the_model_files_dtype_and_exits_1_over_budget():
  """embedded_tiny.gin trains in float32, and plan planned it in bfloat16 (its --dtype default);
  "does NOT fit" exited 0, so a script could not tell."""
  argv = [a for a in TINY if not a.startswith(("--dtype", "--frozen_dtype"))]
  proc = cli_subprocess(["plan", *argv, "--budget_gib=0.0001"], devices=1, timeout=600)
  assert proc.returncode == 1, proc.stdout[-3000:]
  assert "float32 activations, auto (float32) frozen weights" in proc.stdout, proc.stdout
  assert "-> does NOT fit in 0.0001 GiB" in proc.stdout, proc.stdout


def test_plan_refuses_a_bad_mesh():
  proc = cli_subprocess(["plan", *TINY, "--mesh=8by8"], devices=1, timeout=300)
  assert proc.returncode == 2
  assert "prompt-jax plan: error: --mesh='8by8'" in proc.stdout


def test_plan_words_an_indivisible_model_axis_in_its_own_flag():
  """A model axis that does not divide the model's dimensions names --mesh and the mesh that
  fits, not train's NUM_PARTITIONS (a macro plan has no flag for)."""
  proc = cli_subprocess(["plan", *TINY, "--mesh=1x3"], devices=1, timeout=300)
  assert proc.returncode == 2, proc.stdout[-3000:]
  error = [l for l in proc.stdout.splitlines() if "error" in l]
  assert error == [
      "prompt-jax plan: error: --mesh=1x3 splits decoder/layers_0/encoder_decoder_attention/key/"
      "kernel (64, 64) along a dimension of 64 over 3 devices ('model' mesh axis), which do not "
      "divide it; on 3 devices the largest model axis this model fits is 1 (--mesh=3x1)"], error


def _temp_mib(proc) -> float:
  assert proc.returncode == 0, proc.stdout[-3000:]
  return float(re.search(r"temp ([0-9.]+) MiB", proc.stdout).group(1))


def test_plan_schedules_for_memory_so_remat_shows():
  """On the CPU, plan compiles with XLA's memory-minimising scheduler: with the default
  (concurrency-optimised) one, recomputed activations stay alive and 'full' remat saved 0.5% of
  the temporaries here (41.6 -> 41.4 MiB); with it, 42% (30.7 -> 17.7 MiB)."""
  shapes = ["--model=models/embedded_tiny.gin", "--batch=32", "--inputs=64", "--targets=4",
            "--prompt_length=8", "--mesh=1x1"]
  none = _temp_mib(cli_subprocess(["plan", *shapes, "--remat=none"], devices=1, timeout=600))
  full = _temp_mib(cli_subprocess(["plan", *shapes, "--remat=full"], devices=1, timeout=600))
  assert full < 0.8 * none, (full, none)


# ===== Bad inputs: one line `prompt-jax plan: error: ...`, exit 2, before anything compiles =====

def _plan_cli(capsys, argv):
  """(exit status, stdout, stderr lines) of `prompt-jax plan argv`, in process."""
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  code = cli.main(["plan", *argv])
  out, err = capsys.readouterr()
  return code, out, err.splitlines()


@pytest.mark.parametrize("model", ["prompts/dpt.gin", "runs/prompt_finetune.gin", "USER"])
def test_plan_refuses_a_file_that_binds_no_model(capsys, tmp_path, model):
  if model == "USER":  # a user file that binds no prompt_jax.t5_config
    model = str(tmp_path / "mine.gin")
    (tmp_path / "mine.gin").write_text("PROMPT_LENGTH = 8\n")
  code, out, err = _plan_cli(capsys, [*TINY, f"--model={model}"])
  assert code == 2 and not out, (out, err)
  assert len(err) == 1, err
  assert err[0].startswith(f"prompt-jax plan: error: --model={model!r} binds no model"), err
  assert "models/t5_1_1_base.gin" in err[0], err


@pytest.mark.parametrize("flag", ["--batch=0", "--batch=-8", "--inputs=0", "--targets=-1",
                                  "--prompt_length=0", "--budget_gib=0", "--batch=two",
                                  "--mesh=2x0"])
def test_plan_refuses_sizes_that_are_not_positive(capsys, flag):
  code, out, err = _plan_cli(capsys, [*TINY, flag])
  assert code == 2 and not out, (out, err)
  assert len(err) == 1 and err[0].startswith("prompt-jax plan: error: "), err
  assert flag.split("=")[0] in err[0], err
  if not flag.startswith("--mesh"):
    assert "must be a positive" in err[0], err


def _including_model_file(tmp_path) -> str:
  """A user's gin file that includes a packaged model file and changes it."""
  path = tmp_path / "small_1_layer.gin"
  path.write_text("include 'models/t5_1_1_small.gin'\n"
                  "prompt_jax.t5_config.num_encoder_layers = 1\n")
  return str(path)


def test_plan_reads_a_user_file_that_includes_a_packaged_model(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the include is found in the packaged gin dir, not the cwd
  args = plan._parser().parse_args([*TINY, f"--model={_including_model_file(tmp_path)}"])
  config = plan._config(args)  # pylint: disable=protected-access
  assert config.emb_dim == 512 and config.num_encoder_layers == 1, config


def test_plan_shows_no_gin_path_lookup_lines(tmp_path):
  """gin logs 'ERROR:root:Path not found' for each search path it tries before the one with the
  file: a bad --dtype after an include is the error line alone."""
  model = _including_model_file(tmp_path)
  proc = cli_subprocess(["plan", f"--model={model}", "--dtype=bfloat17"], timeout=300)
  assert proc.returncode == 2, proc.stdout
  assert "Path not found" not in proc.stdout, proc.stdout
  lines = proc.stdout.splitlines()
  assert len(lines) == 1 and lines[0].startswith("prompt-jax plan: error: unknown dtype"), \
      proc.stdout


def test_plan_given_a_gin_file_names_its_model_flag(capsys):
  """t5x users type `--gin_file=models/...`: plan's flag is --model (it said only
  `unrecognized arguments`)."""
  code, out, err = _plan_cli(capsys, ["--gin_file=models/t5_1_1_xxl.gin", "--mesh=8x8"])
  assert code == 2 and not out, (out, err)
  assert err == ["prompt-jax plan: error: unrecognized arguments: --gin_file=models/t5_1_1_xxl.gin"
                 "; plan takes the model file as --model=models/<name>.gin (prompt tuning of "
                 "--prompt_length tokens) (prompt-jax plan --help lists the flags)"], err


def test_plan_refuses_a_run_file_that_sets_what_its_flags_set(capsys):
  """`--model=runs/embedded_default.gin` (it includes a model) was planned with plan's default
  batch, lengths and prompt, under the run's name: 100 prompt tokens, where the run has 8."""
  code, out, err = _plan_cli(capsys, [*TINY, "--model=runs/embedded_default.gin"])
  assert code == 2 and not out, (out, err)
  assert err == ["prompt-jax plan: error: --model='runs/embedded_default.gin' is a run's file: it "
                 "sets BATCH_SIZE (--batch), TASK_FEATURE_LENGTHS (--inputs, --targets), "
                 "PROMPT_LENGTH (--prompt_length), which plan takes from its flags; give the "
                 "models/*.gin file it includes and those flags"], err


def test_plan_refuses_more_fake_devices_than_xla_takes(capsys):
  """--mesh=1000x1000 started a million fake CPU devices and hung with no word; 4096 fail in
  XLA's CPU backend. One line, before any device starts."""
  code, out, err = _plan_cli(capsys, [*TINY, "--mesh=1000x1000", "--batch=1000000"])
  assert code == 2 and not out, (out, err)
  assert err == ["prompt-jax plan: error: --mesh=1000x1000 is 1000000 devices; plan fakes at most "
                 "2048 CPU devices (XLA's CPU backend takes no more): plan a slice of it with "
                 "the same per-device shapes, e.g. --mesh=2x1000 and --batch scaled alike"], err


def test_plan_out_of_host_memory_names_plans_own_flags(capsys, monkeypatch):
  """`plan --inputs=100000000` ran out of host memory and was told to lower BATCH_SIZE and to run
  `prompt-jax plan`: gin macros and the command it was, not plan's flags."""
  def allocation(args):
    raise MemoryError("Unable to allocate 35.5 PiB for an array with shape (100000100, 100000100)")

  monkeypatch.setattr(plan, "plan", allocation)
  code, out, err = _plan_cli(capsys, TINY)
  assert code == 1 and not out, (out, err)
  assert err == ["prompt-jax plan: error: out of memory on this machine while planning (Unable "
                 "to allocate 35.5 PiB for an array with shape (100000100, 100000100)): plan "
                 "compiles the whole program here; lower --batch, --inputs, --targets or "
                 "--prompt_length"], err
