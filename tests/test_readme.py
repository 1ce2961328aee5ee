"""The README journey, run literally: every command of "Set up" (its `prompt-jax` parts) and of
"Next", with a temporary MODEL_DIR for /tmp/prompt_jax_default, so the README cannot drift from
the code. Also: the run of command 1 evaluates to 100% from MODEL_DIR alone, and packaged files
added to that command change nothing.
"""
import contextlib
import io
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from prompt_jax import cli
from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
README_MODEL_DIR = "/tmp/prompt_jax_default"
# Parts of README commands that set up the environment this test already runs in.
SET_UP_PARTS = ("python3 -m venv .venv", ". .venv/bin/activate", "pip install -q -e .",
                "pip install -q -e \".[test]\"", "pytest -q -ra")
# Our own line openings (what command 1 may print first).
OWN_LINES = re.compile(r"^(prompt-jax train: |trainable parameters: |training_eval step |"
                       r"inference_eval step |step \d+/\d+ |restored step )")


def section(title: str) -> str:
  text = README.read_text()
  match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
  assert match, f"README.md has no '## {title}' section"
  return match.group(1)


def commands(title: str):
  """The commands of a section's ```bash blocks (comments dropped, `\\` lines joined)."""
  out = []
  for block in re.findall(r"```bash\n(.*?)```", section(title), re.S):
    joined = block.replace("\\\n", " ")
    out += [l.strip() for l in joined.splitlines() if l.strip() and not l.startswith("#")]
  return out


def runnable(command: str, model_dir: str):
  """The parts of a README command this test runs (set-up parts checked and skipped)."""
  parts = []
  for part in command.split(" && "):
    part = part.strip()
    if part in SET_UP_PARTS:
      continue
    assert part.startswith(("prompt-jax ", "tensorboard ")), (
        f"README command part {part!r} is neither set-up nor prompt-jax/tensorboard: teach "
        f"tests/test_readme.py how to run it")
    parts.append(part.replace(README_MODEL_DIR, model_dir))
  return parts


def _env():
  env = dict(os.environ)
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the CLI itself must keep the screen quiet
  return env


def run_shell(command: str, timeout: float = 300) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=_env(), text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


@pytest.fixture(scope="module")
def journey(tmp_path_factory):
  """README command 1 (its prompt-jax part), literally, into a temporary MODEL_DIR."""
  model_dir = str(tmp_path_factory.mktemp("readme") / "prompt_jax_default")
  setup = commands("Set up")
  parts = runnable(setup[0], model_dir)
  assert len(parts) == 1 and parts[0].startswith("prompt-jax train ")
  result = run_shell(parts[0], timeout=600)
  assert result.returncode == 0, result.stdout[-3000:]
  return model_dir, result.stdout


def test_set_up_has_two_commands_and_ci_runs_them():
  setup = commands("Set up")
  assert len(setup) == 2, setup
  ci = (REPO_ROOT / ".ci" / "run").read_text()
  for command in setup:
    assert command in ci, f".ci/run does not run README's {command!r}"
  assert runnable(setup[1], "/unused") == []  # command 2 is the test suite this runs in


def test_command_1_screen_is_ours_and_ends_with_where_results_are(journey):
  model_dir, out = journey
  lines = out.splitlines()
  for line in lines[:3]:
    assert OWN_LINES.match(line), f"not our line: {line!r}\n" + "\n".join(lines[:5])
  assert not re.search(r"^(WARNING|[IWE]\d{4} |E0000|W0000|I0000)", out, re.M), out[:2000]
  last = lines[-1]
  checkpoint = os.path.join(model_dir, "checkpoints", "300")
  prompt = os.path.join(model_dir, "numpy_checkpoints", "checkpoint_300",
                        "encoder.prompt.prompt.prompt.npy")
  assert f"checkpoint {checkpoint};" in last and f"prompt {prompt};" in last, last
  assert f"tensorboard --logdir {model_dir}" in last
  assert os.path.isdir(os.path.join(checkpoint, "state")) and os.path.isfile(prompt)
  assert "inference_eval step 300: embedded_last_letter/accuracy 100.0000" in out


def test_the_last_lines_tensorboard_command_pastes_into_a_shell():
  """MODEL_DIR with a space or a quote (a sweep's root): the command was printed unquoted."""
  import shlex  # pylint: disable=g-import-not-at-top
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  line = cli._tensorboard("/tmp/sw it's/run 1")  # pylint: disable=protected-access
  assert shlex.split(line.split(": ", 1)[1]) == ["tensorboard", "--logdir", "/tmp/sw it's/run 1"]


def test_next_commands_run_literally(journey):
  model_dir, _ = journey
  done = set()
  for command in commands("Next"):
    for part in runnable(command, model_dir):
      kind = part.split()[1] if part.startswith("prompt-jax ") else "tensorboard"
      if kind == "tensorboard":
        _check_tensorboard(part, model_dir)
      else:
        result = run_shell(part)
        assert result.returncode == 0, f"{part}\n{result.stdout[-3000:]}"
        CHECKS[kind](model_dir, result.stdout, part)
      done.add(kind)
  assert done == {"eval", "infer", "export", "describe", "inspect", "tensorboard"}, done


def _check_eval(model_dir, out, part):
  del part
  assert "final metrics: embedded_last_letter/accuracy=100.0000" in out, out
  metrics = os.path.join(model_dir, "eval", "embedded_last_letter-validation-step300.json")
  assert out.splitlines()[-1].startswith(f"metrics {metrics};")
  saved = json.loads(pathlib.Path(metrics).read_text())
  assert saved["step"] == 300 and saved["metrics"] == {"embedded_last_letter/accuracy": 100.0}


def _check_infer(model_dir, out, part):
  texts = [a.split("=", 1)[1] for a in shlex.split(part) if a.startswith("--input=")]
  assert texts, "the README's infer command gives --input texts"
  for text in texts:  # the embedded task's answer is the last letter
    assert f"{text} -> {text[-1]}" in out.splitlines(), out
  path = os.path.join(model_dir, "inference", "embedded_last_letter-inputs.jsonl")
  assert out.splitlines()[-1] == f"wrote {len(texts)} predictions to {path}"
  rows = [json.loads(l) for l in pathlib.Path(path).read_text().splitlines()]
  assert [(r["inputs"], r["prediction"]) for r in rows] == [(t, t[-1]) for t in texts]


def _check_export(model_dir, out, part):
  del part
  path = os.path.join(model_dir, "export", "prompt_step300.npy")
  assert out.splitlines()[-1] == (f"wrote prompt [8, 64] float32 of checkpoint step 300 to "
                                  f"{path}")
  trained = np.load(os.path.join(model_dir, "numpy_checkpoints", "checkpoint_300",
                                 "encoder.prompt.prompt.prompt.npy"))
  np.testing.assert_array_equal(np.load(path), trained)  # the same array, copied


def _check_describe(model_dir, out, part):
  del part
  assert f"run {model_dir}: checkpoint step 300" in out
  assert re.search(r"encoder/prompt/prompt/prompt\s+\(8, 64\)\s+512", out), out
  assert "trainable parameters: 512" in out


def _check_inspect(model_dir, out, part):
  del part
  stem = os.path.join(model_dir, "inspect", "prompt_step300_")
  written = [stem + "spectrum.png", stem + "inspect.json", stem + "inspect.md"]
  assert out.splitlines()[-1] == "wrote " + ", ".join(written), out
  assert pathlib.Path(written[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  report = json.loads(pathlib.Path(written[1]).read_text())
  trained = np.load(os.path.join(model_dir, "numpy_checkpoints", "checkpoint_300",
                                 "encoder.prompt.prompt.prompt.npy"))
  # The singular values of the trained [8, 64] prompt itself. A backward-stable float32 SVD is
  # within c * eps32 * s_max of the exact values (Weyl's bound), c a modest function of the
  # dimensions: c = max(P, H) = 64 here; the float64 SVD stands for the exact values.
  expected = np.linalg.svd(trained.astype(np.float64), compute_uv=False)
  np.testing.assert_allclose(report["singular_values"], expected,
                             rtol=0, atol=64 * np.finfo(np.float32).eps * expected[0])
  assert report["shape"] == [8, 64] and len(report["neighbours"]) == 8


CHECKS = {"eval": _check_eval, "infer": _check_infer, "export": _check_export,
          "describe": _check_describe, "inspect": _check_inspect}


def _check_tensorboard(part, model_dir):
  """Starts the README's tensorboard command, waits until it serves MODEL_DIR's runs, stops it."""
  args = shlex.split(part)
  if shutil.which("tensorboard", path=_env()["PATH"]) is None:  # same entry point as the script
    args = [sys.executable, "-m", "tensorboard.main"] + args[1:]
  proc = subprocess.Popen(args, cwd=REPO_ROOT, env=_env(), text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, start_new_session=True)
  try:
    url, deadline, seen = None, time.time() + 120, []
    while url is None and time.time() < deadline:
      line = proc.stdout.readline()
      if not line and proc.poll() is not None:
        break
      seen.append(line)
      match = re.search(r"(http://[^\s]+?)/? ", line)
      url = match.group(1) if match else None
    assert url, "tensorboard did not start:\n" + "".join(seen)
    runs = []
    while time.time() < deadline:
      with urllib.request.urlopen(f"{url}/data/runs", timeout=10) as response:
        runs = json.loads(response.read())
      if "train" in runs and "inference_eval/embedded_last_letter" in runs:
        break
      time.sleep(1)
    assert {"train", "training_eval/embedded_last_letter",
            "inference_eval/embedded_last_letter"} <= set(runs), runs
  finally:
    os.killpg(proc.pid, signal.SIGTERM)  # the process group this test started
    proc.wait(timeout=30)


# ===== Acceptance 2: packaged files added to eval change nothing; overrides that contradict =====

def _eval(*extra):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(["eval", *extra])
  return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("extra", [["--gin_file=runs/prompt_eval.gin"],
                                   ["--gin_file=prompts/from_sampled_vocab.gin"],
                                   ["--gin_file=runs/prompt_eval.gin",
                                    "--gin_file=runs/embedded_default.gin",
                                    "--gin_file=prompts/uniform.gin"]])
def test_packaged_files_added_to_eval_change_nothing(journey, extra):
  model_dir, _ = journey
  code, out, err = _eval(f"--gin.MODEL_DIR='{model_dir}'", *extra)
  assert code == 0, err
  assert "final metrics: embedded_last_letter/accuracy=100.0000" in out, out
  if "--gin_file=prompts/uniform.gin" in extra:  # the run's initializer stays, and says so
    assert "prompts/uniform.gin's %PROMPT_INIT does not apply" in out, out


def test_prompt_length_override_contradicting_the_checkpoint_is_one_line(journey):
  model_dir, _ = journey
  code, out, err = _eval(f"--gin.MODEL_DIR='{model_dir}'", "--gin.PROMPT_LENGTH=16")
  assert code == 2 and err.count("\n") == 1, err
  assert err == (f"prompt-jax eval: error: PROMPT_LENGTH=16 contradicts the checkpoint in "
                 f"{model_dir} (trained with PROMPT_LENGTH=8): drop the override or use a new "
                 f"MODEL_DIR\n")
  assert "final metrics" not in out


def test_method_override_contradicting_the_checkpoint_is_one_line(journey, tmp_path):
  model_dir, _ = journey
  mine = tmp_path / "mine.gin"  # your own file (layered after the run's config.gin)
  mine.write_text("include 'prompts/dpt.gin'\n")
  code, _, err = _eval(f"--gin.MODEL_DIR='{model_dir}'", f"--gin_file={mine}")
  assert code == 2 and err.count("\n") == 1, err
  assert ("prompt_jax.model_spec.prompt=@prompt_jax.dpt() contradicts the checkpoint in "
          f"{model_dir} (trained with prompt_jax.model_spec.prompt="
          "@prompt_jax.prompt_tuning())") in err, err
