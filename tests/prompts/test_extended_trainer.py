"""Issue 16's methods through `prompt-jax train` / `export` on the embedded default: P-tuning
trains only its network and exports its folded [P, H] prompt; a visibility run records its
setting in config.gin and trains."""
import contextlib
import io
import os

import numpy as np

from prompt_jax import cli
from prompt_jax import trees
from prompt_jax.prompts import p_tuning
from tests import numerics
from tests.train import common

H = 64  # the embedded tiny T5's width


def _cli(argv):
  err, out = io.StringIO(), io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
    code = cli.main(list(argv))
  return code, out.getvalue() + err.getvalue()


def test_p_tuning_trains_and_exports_its_folded_prompt(tmp_path):
  model_dir = str(tmp_path / "p_tuning")
  code, out = _cli(["train", "--gin_file=prompts/p_tuning.gin", *common.flags(
      model_dir, 3, "--gin.PROMPT_LENGTH=4", "--gin.P_TUNING_ENCODER='lstm'",
      "--gin.P_TUNING_HIDDEN=16")])
  assert code == 0, out
  ckpt = os.path.join(model_dir, "numpy_checkpoints", "checkpoint_3")
  files = sorted(os.listdir(ckpt))
  assert files and all(f.startswith("encoder.prompt.prompt.") for f in files), files
  first = os.path.join(model_dir, "numpy_checkpoints", "checkpoint_1")
  assert any(not np.array_equal(np.load(os.path.join(first, f)), np.load(os.path.join(ckpt, f)))
             for f in files)
  out_file = str(tmp_path / "prompt.npy")
  code, out = _cli(["export", "--format=npy", f"--gin.MODEL_DIR='{model_dir}'",
                    f"--output={out_file}"])
  assert code == 0, out
  exported = np.load(out_file)
  params = trees.unflatten({f[len("encoder.prompt.prompt."):-len(".npy")].replace(".", "/"):
                            np.load(os.path.join(ckpt, f)) for f in files})
  fold = lambda dtype: np.asarray(p_tuning.fold(numerics.cast(params, dtype), 4, H, 16, "lstm"))
  assert exported.shape == (4, H)
  # export may compile the fold differently (jit vs eager): bound derived from the float32
  # fold's own error against the float64 fold (tests/numerics.py).
  with numerics.float64():
    ref64 = fold(np.float64)
  numerics.assert_close(exported, fold(np.float32), ref64, what="exported P-tuning prompt")


def test_visibility_run_records_its_setting_and_trains(tmp_path):
  model_dir = str(tmp_path / "visibility")
  code, out = _cli(["train", "--gin_file=prompts/visibility.gin", *common.flags(
      model_dir, 2, "--gin.PROMPT_VISIBILITY='input->prompt,prompt->prompt;causal'")])
  assert code == 0, out
  config = open(os.path.join(model_dir, "config.gin")).read()
  assert "input->prompt,prompt->prompt;causal" in config
  code, out = _cli(["describe", f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 0, out
  assert not np.array_equal(common.prompt_at(model_dir, 1), common.prompt_at(model_dir, 2))
