"""A run directory that describes itself: relative MODEL_DIR, a DPT run evaluated / exported /
described from MODEL_DIR alone, overrides that contradict the checkpoint, export's fold table."""
import contextlib
import io
import json
import os
import re

import numpy as np
import pytest

from prompt_jax import cli
from prompt_jax.errors import ConfigError
from prompt_jax.evaluation import export
from prompt_jax.models import get_config
from prompt_jax.prompts import residual
from prompt_jax.prompts import prefix
from prompt_jax.prompts import specs
from prompt_jax import run_setup
from prompt_jax.train import run_dir
from tests import numerics
from tests.train import common


def run_cli(argv):
  """(exit code, stdout, stderr) of `prompt-jax <argv>` in this process."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(list(argv))
  return code, out.getvalue(), err.getvalue()


def test_relative_model_dir_trains_and_resumes_from_another_directory(tmp_path, monkeypatch):
  first, second = tmp_path / "a", tmp_path / "b"
  first.mkdir()
  second.mkdir()
  monkeypatch.chdir(first)
  code, out, err = run_cli(["train"] + common.flags("runs/exp1", 2))
  assert code == 0, err
  model_dir = first / "runs" / "exp1"
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["1", "2"]
  assert f"'{model_dir}'" in (model_dir / "config.gin").read_text()  # absolute, as resumed
  assert out.splitlines()[-1].startswith(f"checkpoint {model_dir}/checkpoints/2; prompt ")
  monkeypatch.chdir(second)  # the same run, resumed from elsewhere by its absolute path
  code, out, err = run_cli(["train"] + common.flags(str(model_dir), 4))
  assert code == 0, err
  assert f"restored step 2 from {model_dir}/checkpoints" in out
  assert os.path.isdir(model_dir / "checkpoints" / "4" / "state")
  assert not np.array_equal(common.prompt_at(str(model_dir), 2), common.prompt_at(str(model_dir), 4))
  assert os.listdir(second) == []


def test_a_methods_relative_file_is_recorded_absolute_and_eval_reads_it_elsewhere(
    tmp_path, monkeypatch):
  """DPT_PROMPT_FILE (like IPT_TABLE_FILE, EMBEDDING_FILE, MPT_SOURCE) given relative: config.gin
  records it absolute, so eval given only MODEL_DIR from another directory reads the same file
  (it failed there; an encoder IPT table of the same name elsewhere was silently used)."""
  first, second = tmp_path / "a", tmp_path / "b"
  first.mkdir()
  second.mkdir()
  np.save(first / "p.npy", np.random.RandomState(0).randn(8, 64).astype(np.float32))
  monkeypatch.chdir(first)
  model_dir = str(tmp_path / "run")
  code, _, err = run_cli(["train"] + common.flags(
      model_dir, 1, "--gin_file=prompts/dpt.gin", "--gin.DPT_RANK=4", "--gin.PROMPT_LENGTH=8",
      "--gin.DPT_INIT='svd'", "--gin.DPT_PROMPT_FILE='p.npy'"))
  assert code == 0, err
  with open(os.path.join(model_dir, "config.gin")) as f:
    recorded = re.sub(r"\\\n\s*", "", f.read())  # gin wraps a long value onto the next line
  assert f"DPT_PROMPT_FILE = '{first / 'p.npy'}'" in recorded
  monkeypatch.chdir(second)
  code, out, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 0, err
  assert os.listdir(second) == []


@pytest.mark.parametrize("start", ["prompt_file", "dpt_svd"])
def test_eval_of_a_run_needs_not_the_file_it_started_from(start, tmp_path):
  """A run started from PROMPT_FILE (prompts/from_file.gin) or from DPT_PROMPT_FILE's SVD: its
  checkpoint holds what it trained, so `eval` given MODEL_DIR alone gives the same metrics after
  that file is deleted (it failed: "PROMPT_FILE ... does not exist", the init being built)."""
  import json  # pylint: disable=g-import-not-at-top
  path = tmp_path / "start" / "p.npy"
  path.parent.mkdir()
  np.save(path, np.random.RandomState(0).randn(8, 64).astype(np.float32))
  method = (["--gin_file=prompts/from_file.gin", f"--gin.PROMPT_FILE='{path}'"]
            if start == "prompt_file" else
            ["--gin_file=prompts/dpt.gin", "--gin.DPT_RANK=4", "--gin.DPT_INIT='svd'",
             f"--gin.DPT_PROMPT_FILE='{path}'"])
  model_dir = str(tmp_path / "run")
  code, _, err = run_cli(["train"] + common.flags(model_dir, 1, "--gin.PROMPT_LENGTH=8",
                                                  *method))
  assert code == 0, err

  def evaluated():
    code, out, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=64"])
    assert code == 0, err
    with open(os.path.join(model_dir, "eval", "embedded_last_letter-validation-step1.json")) as f:
      return json.load(f)["metrics"], _accuracy(out)

  before = evaluated()
  path.unlink()
  assert evaluated() == before


@pytest.fixture(scope="module")
def dpt_run(tmp_path_factory):
  """3 steps of DPT (rank 4 and 8 prompt tokens, not the method file's 10 and 100) on the
  embedded default."""
  model_dir = str(tmp_path_factory.mktemp("dpt"))
  code, out, err = run_cli(["train"] + common.flags(model_dir, 3, "--gin_file=prompts/dpt.gin",
                                                    "--gin.DPT_RANK=4", "--gin.PROMPT_LENGTH=8"))
  assert code == 0, err
  return model_dir, out


def _accuracy(out: str) -> str:
  line = next(l for l in out.splitlines() if l.startswith("final metrics: "))
  return line.split("embedded_last_letter/accuracy=")[1].split()[0]


def test_dpt_run_ends_with_its_arrays_and_describes_itself(dpt_run):
  model_dir, out = dpt_run
  assert out.splitlines()[-1].startswith(
      f"checkpoint {model_dir}/checkpoints/3; prompt arrays in "
      f"{model_dir}/numpy_checkpoints/checkpoint_3; TensorBoard: ")
  code, out, err = run_cli(["describe", f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 0, err
  assert f"run {model_dir}: checkpoint step 3" in out
  assert "encoder/prompt/prompt/a" in out and "(8, 4)" in out and "(4, 64)" in out
  assert "trainable parameters: 288" in out  # r (P + H) = 4 (8 + 64)


def test_eval_of_a_dpt_run_is_unchanged_by_its_method_and_run_files(dpt_run):
  model_dir, _ = dpt_run
  code, alone, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=64"])
  assert code == 0, err
  code, layered, err = run_cli(["eval", "--gin_file=prompts/dpt.gin",
                                "--gin_file=runs/prompt_eval.gin",
                                f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=64"])
  assert code == 0, err
  assert _accuracy(layered) == _accuracy(alone)
  assert (f"note: {model_dir}/config.gin keeps DPT_RANK=4: prompts/dpt.gin's 10 does not apply "
          f"to this run") in layered


def test_an_override_contradicting_the_dpt_checkpoint_names_both_values(dpt_run):
  model_dir, _ = dpt_run
  code, out, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'", "--gin.DPT_RANK=2"])
  assert code == 2 and out == ""
  assert err == (f"prompt-jax eval: error: DPT_RANK=2 contradicts the checkpoint in {model_dir} "
                 f"(trained with DPT_RANK=4): drop the override or use a new MODEL_DIR\n")
  code, _, err = run_cli(["export", f"--gin.MODEL_DIR='{model_dir}'", "--gin.PROMPT_LENGTH=5"])
  assert code == 2 and "PROMPT_LENGTH=5 contradicts" in err and "PROMPT_LENGTH=8)" in err


def test_another_runs_checkpoint_that_does_not_fit_is_named_with_its_own_config(dpt_run,
                                                                                 tmp_path):
  """eval/export of MODEL_DIR's run with CHECKPOINT_PATH of another run (DPT) whose shapes do not
  fit: the line blamed "the checkpoint in <MODEL_DIR>" and told to use "the run's own settings".
  Now it names CHECKPOINT_PATH and the other run's config.gin, and that advice works."""
  dpt_dir, _ = dpt_run
  plain = str(tmp_path / "plain")
  code, _, err = run_cli(["train"] + common.flags(plain, 1))
  assert code == 0, err
  checkpoint = f"{dpt_dir}/checkpoints/3"
  for command in ("eval", "export"):
    code, out, err = run_cli([command, f"--gin.MODEL_DIR='{plain}'",
                              f"--gin.CHECKPOINT_PATH='{checkpoint}'"])
    assert code == 2 and out == "", (out, err)
    assert err == (f"prompt-jax {command}: error: CHECKPOINT_PATH {checkpoint} does not fit "
                   f"MODEL_DIR {plain}'s configuration: encoder/prompt/prompt/prompt is not in "
                   f"the checkpoint (it has encoder/prompt/prompt/a, encoder/prompt/prompt/b); "
                   f"give its run's configuration, --gin_file="
                   f"{dpt_dir}/config.gin, or evaluate it in its own MODEL_DIR {dpt_dir}\n")
  code, out, err = run_cli(["eval", f"--gin.MODEL_DIR='{plain}'",
                            f"--gin.CHECKPOINT_PATH='{checkpoint}'",
                            f"--gin_file={dpt_dir}/config.gin"])
  assert code == 0, err
  code, own, err = run_cli(["eval", f"--gin.MODEL_DIR='{dpt_dir}'"])
  assert code == 0, err
  assert _accuracy(out) == _accuracy(own)


def test_train_given_only_model_dir_continues_the_run_with_its_config(dpt_run, tmp_path):
  """`prompt-jax train --gin.MODEL_DIR=<run> --gin.TRAIN_STEPS=<more>` (no gin file, as eval and
  infer take) continues the DPT run with its method and values; it used to say MODEL_DIR and
  TRAIN_STEPS were 'not used by this configuration', then ask for the task macros."""
  import shutil  # pylint: disable=g-import-not-at-top
  model_dir = str(tmp_path / "continued")
  shutil.copytree(dpt_run[0], model_dir)
  code, out, err = run_cli(["train", f"--gin.MODEL_DIR='{model_dir}'", "--gin.TRAIN_STEPS=4"])
  assert code == 0, err
  assert f"note: no gin file: continuing the run in {model_dir} with its config.gin" in out
  assert "restored step 3 from" in out and "not used by this configuration" not in out
  arrays = os.path.join(model_dir, "numpy_checkpoints", "checkpoint_4")
  shapes = {f: np.load(os.path.join(arrays, f)).shape for f in os.listdir(arrays)}
  assert sorted(shapes.values()) == [(4, 64), (8, 4)], shapes  # DPT_RANK 4, PROMPT_LENGTH 8
  code, out, err = run_cli(["train", f"--gin.MODEL_DIR='{model_dir}'", "--gin.TRAIN_STEPS=5",
                            "--gin.DPT_RANK=2"])
  assert code == 2 and "DPT_RANK=2 contradicts the checkpoint" in err, err
  code, out, err = run_cli(["train", f"--gin.MODEL_DIR='{tmp_path / 'none'}'",
                            "--gin.TRAIN_STEPS=4"])
  assert code == 2 and out == "" and not os.path.exists(tmp_path / "none")
  assert err == (f"prompt-jax train: error: train was given no gin file and MODEL_DIR "
                 f"{tmp_path / 'none'} holds no run to continue (no config.gin): name the run's "
                 f"gin files (e.g. --gin_file=runs/embedded_default.gin), or set MODEL_DIR to a "
                 f"trained run's directory to continue it\n")


def test_export_folds_dpt_and_the_folded_prompt_evaluates_the_same(dpt_run):
  model_dir, _ = dpt_run
  code, out, err = run_cli(["export", "--format=npy", f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 0, err
  path = os.path.join(model_dir, "export", "prompt_step3.npy")
  assert out.splitlines()[-1] == f"wrote prompt [8, 64] float32 of checkpoint step 3 to {path}"
  exported = np.load(path)
  numpy_dir = run_dir.resolve(model_dir).numpy_dir
  a = np.load(os.path.join(numpy_dir, "encoder.prompt.prompt.a.npy"))
  b = np.load(os.path.join(numpy_dir, "encoder.prompt.prompt.b.npy"))
  # A·B in float32 and float64: the bound is derived from float32's own error (tests/numerics).
  numerics.assert_close(exported, a @ b, a.astype(np.float64) @ b.astype(np.float64),
                        what="exported DPT prompt")
  # The folded prompt as plain prompt tuning (PROMPT_FILE) predicts as the DPT run does.
  code, dpt_out, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=64"])
  assert code == 0, err
  code, file_out, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=64",
                                 f"--gin.PROMPT_FILE='{path}'"])
  assert code == 0, err
  # The folded prompt is A·B rounded once in numpy; the DPT run computes it in its graph: two
  # programs, equal accuracies but for float32 near-ties (tests/train/common.embedded_near_ties).
  ties = common.embedded_near_ties(exported, a.astype(np.float64) @ b.astype(np.float64))
  assert sum(ties.values()) <= 0.05 * len(ties), sum(ties.values())
  assert abs(float(_accuracy(file_out)) - float(_accuracy(dpt_out))) <= (
      100 * sum(ties.values()) / len(ties) + 5e-5)  # 5e-5: the printed rounding
  # --output names the file.
  mine = os.path.join(model_dir, "mine.npy")
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{model_dir}'", f"--output={mine}"])
  assert code == 0 and out.splitlines()[-1].endswith(f"to {mine}"), err
  np.testing.assert_array_equal(np.load(mine), exported)


def test_checkpoint_paths_name_their_step_and_outputs_never_collide(dpt_run, tmp_path):
  """CHECKPOINT_PATH of t5x's `checkpoint_<N>` names step N; one with no step in its name gets
  its own output name; another run's checkpoint never takes this run's .npy exports."""
  import shutil  # pylint: disable=g-import-not-at-top
  model_dir, _ = dpt_run
  ours = run_dir.resolve(model_dir, os.path.join(model_dir, "checkpoints", "2"))
  assert ours.step == 2 and ours.numpy_dir and ours.label == "step2"
  t5x_like = tmp_path / "checkpoint_2"
  shutil.copytree(os.path.join(model_dir, "checkpoints", "2"), t5x_like)
  theirs = run_dir.resolve(model_dir, str(t5x_like))
  # Another run's checkpoint_2 is named by its run too: it never takes this run's step2 names.
  assert theirs.step == 2 and theirs.numpy_dir is None and not theirs.own
  assert theirs.label == f"{tmp_path.name}_step2" != ours.label
  named = tmp_path / "best run"
  shutil.copytree(t5x_like, named)
  assert run_dir.resolve(model_dir, str(named)).label == "best_run"
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{model_dir}'",
                            f"--gin.CHECKPOINT_PATH='{named}'"])
  assert code == 0, err
  assert out.splitlines()[-1].endswith(os.path.join(model_dir, "export", "prompt_best_run.npy"))
  assert "note:" not in out  # export reads CHECKPOINT_PATH itself


# ===== export's fold table, without training =====

CONFIG = get_config("t5_1_1_small", emb_dim=64, num_heads=4, head_dim=16, mlp_dim=128,
                    num_encoder_layers=2, num_decoder_layers=2, vocab_size=260)


def _params(spec):
  import jax  # pylint: disable=g-import-not-at-top
  model = run_setup.build_model(CONFIG, spec)
  inputs = run_setup.model_inputs(1, {"inputs": 8, "targets": 4})
  from prompt_jax import trees  # pylint: disable=g-import-not-at-top
  return trees.unbox(model.init(jax.random.PRNGKey(0), *inputs, enable_dropout=False)["params"])


@pytest.mark.parametrize("spec,method", [(specs.idpg_prompt(length=4, bottleneck=8), "IDPG"),
                                         (specs.ipt_prompt(length=4), "IPT")])
def test_export_refuses_input_dependent_methods_in_one_line(spec, method):
  with pytest.raises(ConfigError, match=f"^{method} generates its prompt from each input"):
    export.fold(spec, CONFIG, {})


def test_export_folds_residual_through_its_fold_function():
  spec = specs.residual_prompt(length=4, bottleneck=8, separate_mlps=True)
  params = _params(spec)
  folded = export.fold(spec, CONFIG, params)
  # The table passes the spec's bottleneck and separate_mlps: the same program, so exact.
  expected = residual.fold(params["encoder"]["prompt"]["prompt"], 8, True)
  assert list(folded) == ["prompt"] and folded["prompt"].shape == (4, 64)
  np.testing.assert_array_equal(folded["prompt"], np.asarray(expected))


def test_export_stacks_deep_prefix_key_and_value():
  spec = specs.deep_prefix(length=3, hidden=16, decoder=True)
  params = _params(spec)
  folded = export.fold(spec, CONFIG, params)
  assert sorted(folded) == ["decoder_prefix", "prefix"]
  for name, stack in (("prefix", "encoder"), ("decoder_prefix", "decoder")):
    module = prefix.DeepPrefix(length=3, num_layers=2, num_heads=4, head_dim=16, emb_dim=64,
                               hidden=16)
    direct = prefix.fold(params[stack]["layer_prompts"], module)
    assert folded[name].shape == (2, 2, 3, 64)  # [key/value, L, P, heads * head_dim]
    np.testing.assert_array_equal(folded[name][0], np.asarray(direct["key"]))
    np.testing.assert_array_equal(folded[name][1], np.asarray(direct["value"]))


def test_a_beam_result_sits_beside_the_greedy_one(dpt_run):
  """eval / infer with another decoding wrote the same file as greedy's, replacing it."""
  model_dir, _ = dpt_run
  eval_dir = os.path.join(model_dir, "eval")
  stem = os.path.join(eval_dir, "embedded_last_letter-validation-step3")
  beam = ["--gin.prompt_jax.decoding_config.method='beam'"]
  for extra, suffix in (([], ""), (beam, "-beam4"),
                        (beam + ["--gin.prompt_jax.decoding_config.beam_size=2",
                                 "--gin.prompt_jax.decoding_config.alpha=0.0"], "-beam2-alpha0")):
    code, out, err = run_cli(["eval", f"--gin.MODEL_DIR='{model_dir}'", *extra])
    assert code == 0, err
    assert f"metrics {stem}{suffix}.json;" in out, out
    with open(f"{stem}{suffix}.json") as f:
      assert json.load(f)["decoding"]["method"] == ("beam" if extra else "greedy")
    code, out, err = run_cli(["infer", f"--gin.MODEL_DIR='{model_dir}'", "--input=abcabd",
                              *extra])
    assert code == 0, err
    assert os.path.isfile(os.path.join(model_dir, "inference",
                                       f"embedded_last_letter-inputs{suffix}.jsonl"))
  mine = os.path.basename(stem)  # (other tests of this module evaluate the run too)
  assert sorted(f for f in os.listdir(eval_dir) if f.startswith(mine)) == sorted(
      mine + s for s in (".json", "-beam2-alpha0.json", "-beam4.json"))
