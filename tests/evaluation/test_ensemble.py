"""`prompt-jax ensemble-eval` and `infer` with PROMPT_BANK on the embedded tiny T5, in-process:
per-prompt results equal each prompt alone, the combinations, and the bad-input lines."""
import contextlib
import io
import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

from prompt_jax import cli
from prompt_jax.evaluation import ensemble
from tests import numerics

TASK = "embedded_last_letter"
COMMON = ["--gin_file=models/embedded_tiny.gin",
          f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
          "--gin.INITIAL_CHECKPOINT_PATH=@prompt_jax.embedded_checkpoint_path()",
          "--gin.BATCH_SIZE=64"]
EMB = 64  # models/embedded_tiny.gin emb_dim


def run_cli(argv):
  """(exit code, stdout, stderr) of `prompt-jax <argv>` in this process."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(list(argv))
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory):
  """Three prompts of lengths 4, 8, 6 (scaled like the embedding rows, seeds 0..2)."""
  d = tmp_path_factory.mktemp("prompts")
  paths = {}
  for seed, length in enumerate((4, 8, 6)):
    path = str(d / f"p{seed}.npy")
    np.save(path, (3.0 * np.random.RandomState(seed).randn(length, EMB)).astype(np.float32))
    paths[f"p{seed}"] = path
  return paths


def ensemble_rows(prompts, model_dir, *, float64=False):
  """`prompt-jax ensemble-eval` of `prompts` into `model_dir`: (its stdout, its predictions
  rows); with `float64`, the same run in float64 (jax x64; the reference for `near_ties`)."""
  extra = ["--gin.prompt_jax.t5_config.dtype='float64'"] if float64 else []
  with jax.enable_x64(float64):
    code, out, err = run_cli(["ensemble-eval", f"--gin.MODEL_DIR='{model_dir}'",
                              f"--gin.ENSEMBLE_PROMPTS={dict(prompts)!r}"] + COMMON + extra)
  assert code == 0, err
  with open(os.path.join(model_dir, "ensemble", f"{TASK}-validation-predictions.jsonl")) as f:
    return out, [json.loads(l) for l in f]


def scores(rows, name=None):
  """[E, C] label log-likelihoods of prompt `name` (None: their mean over the prompts)."""
  labels = sorted(rows[0]["mean_label_log_likelihood"])
  pick = ((lambda r: r["mean_label_log_likelihood"]) if name is None
          else (lambda r: r["label_log_likelihood"][name]))
  return np.array([[pick(r)[l] for l in labels] for r in rows], np.float64)


def near_ties(rows32, rows64, name=None):
  """[E] examples whose answer under `name` (None: the mean log-likelihood) may differ between
  float32 programs of different shapes (tests/numerics.near_ties)."""
  return numerics.near_ties(scores(rows32, name), scores(rows64, name))


@pytest.fixture(scope="module")
def ensembled(prompt_files, tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("ens"))
  out, _ = ensemble_rows(prompt_files, model_dir)
  return model_dir, out


@pytest.fixture(scope="module")
def ensembled64(prompt_files, tmp_path_factory):
  """The float64 predictions rows of the same ensemble (the reference for near-ties)."""
  return ensemble_rows(prompt_files, str(tmp_path_factory.mktemp("ens64")), float64=True)[1]


def test_ensemble_eval_writes_the_table_and_predictions(ensembled, prompt_files):
  model_dir, out = ensembled
  report = json.load(open(os.path.join(model_dir, "ensemble", f"{TASK}-validation.json")))
  assert [p["name"] for p in report["prompts"]] == list(prompt_files)
  assert [p["length"] for p in report["prompts"]] == [4, 8, 6]
  accs = [p["metrics"]["accuracy"] for p in report["prompts"]]
  assert report["mean"]["accuracy"] == pytest.approx(np.mean(accs))
  assert report["best"]["accuracy"]["value"] == max(accs)
  rows = [json.loads(l) for l in open(os.path.join(model_dir, "ensemble",
                                                    f"{TASK}-validation-predictions.jsonl"))]
  assert len(rows) == report["num_examples"] == 256
  # The vote and the accuracy it gets are consistent with the per-prompt predictions.
  votes = ensemble.majority_vote([[r["predictions"][n] for n in prompt_files] for r in rows])
  assert [v for v, _ in votes] == [r["majority_vote"] for r in rows]
  vote_acc = 100 * np.mean([r["majority_vote"] == r["targets"] for r in rows])
  assert report["ensemble"]["majority_vote"]["accuracy"] == pytest.approx(vote_acc)
  means = np.array([[r["mean_label_log_likelihood"][l] for l in sorted(
      r["mean_label_log_likelihood"])] for r in rows])
  labels = sorted(rows[0]["mean_label_log_likelihood"])
  assert [labels[i] for i in np.argmax(means, -1)] == [r["mean_log_likelihood"] for r in rows]
  assert len({r["predictions"]["p0"] for r in rows}) > 1  # not a constant prediction
  md = open(os.path.join(model_dir, "ensemble", f"{TASK}-validation.md")).read()
  assert "ensemble: majority vote" in md and "mean of 3 prompts" in md
  assert out.strip().splitlines()[-1].startswith("ensemble table ")


def test_ensembles_of_two_splits_leave_both_results(ensembled, prompt_files):
  """Results are named by their split, as `eval`'s are: ensemble-eval of the test split into the
  MODEL_DIR of the validation one adds its own files and leaves the validation ones as they were
  (both were `<task>.json`, ...: the second run silently replaced the first)."""
  model_dir, _ = ensembled
  out_dir = os.path.join(model_dir, "ensemble")
  names = lambda split: [f"{TASK}-{split}.json", f"{TASK}-{split}.md",
                         f"{TASK}-{split}-predictions.jsonl"]
  read = lambda split: [open(os.path.join(out_dir, n)).read() for n in names(split)]
  validation = read("validation")
  code, out, err = run_cli(["ensemble-eval", f"--gin.MODEL_DIR='{model_dir}'",
                            f"--gin.ENSEMBLE_PROMPTS={dict(prompt_files)!r}",
                            "--gin.EVAL_SPLIT='test'"] + COMMON)
  assert code == 0, err
  assert read("validation") == validation
  assert sorted(os.listdir(out_dir)) == sorted(names("validation") + names("test"))
  test = json.loads(read("test")[0])
  assert test["split"] == "test" and json.loads(validation[0])["split"] == "validation"
  assert test["num_examples"] == 256
  rows = [json.loads(l) for l in read("test")[2].splitlines()]
  assert [r["inputs"] for r in rows] != [json.loads(l)["inputs"]
                                         for l in validation[2].splitlines()]
  assert out.strip().splitlines()[-1] == "ensemble table " + ", ".join(
      os.path.join(out_dir, n) for n in names("test"))


def test_each_prompt_in_the_ensemble_equals_the_prompt_alone(ensembled, ensembled64,
                                                             prompt_files, tmp_path):
  """Acceptance 1: p0 (P = 4, padded to 8 in the ensemble) and p1 (the longest) evaluated alone
  by `prompt-jax infer` / `eval` give the ensemble's predictions and metrics. Alone and in the
  ensemble are programs of different shapes (encoder length T + P vs T + 8 masked, batch B vs
  B x N), so their float32 scores differ in rounding: an answer may differ only on a float32
  near-tie (tests/numerics.near_ties, against the ensemble's float64 run), and the accuracy by
  at most those examples' share."""
  model_dir, _ = ensembled
  report = json.load(open(os.path.join(model_dir, "ensemble", f"{TASK}-validation.json")))
  rows = [json.loads(l) for l in open(os.path.join(model_dir, "ensemble",
                                                    f"{TASK}-validation-predictions.jsonl"))]
  for i, name in enumerate(("p0", "p1")):
    alone = tmp_path / name
    length = np.load(prompt_files[name]).shape[0]
    flags = [f"--gin.MODEL_DIR='{alone}'", f"--gin.PROMPT_FILE='{prompt_files[name]}'",
             f"--gin.PROMPT_LENGTH={length}"] + COMMON
    code, _, err = run_cli(["infer"] + flags)
    assert code == 0, err
    got = [json.loads(l)["prediction"] for l in open(alone / "inference" /
                                                     f"{TASK}-validation.jsonl")]
    ties = near_ties(rows, ensembled64, name)
    differ = numerics.assert_same_choices(got, [r["predictions"][name] for r in rows], ties,
                                          what=f"{name} alone vs in the ensemble")
    code, out, err = run_cli(["eval"] + flags)
    assert code == 0, err
    accuracy = float(re.search(rf"{TASK}/accuracy=([0-9.]+)", out).group(1))
    # Each differing answer moves the accuracy by 100 / E points; 0.00005: the printed rounding.
    assert abs(accuracy - report["prompts"][i]["metrics"]["accuracy"]) <= (
        100 * differ / len(rows) + 5e-5), (name, accuracy, differ)


def test_bank_infer_serves_each_example_its_named_prompt(prompt_files, tmp_path, ensembled,
                                                         ensembled64):
  """Examples of the task name their prompt by the task name: the bank's outputs equal the
  prompt's in the ensemble (= alone, test above), up to float32 near-ties (the bank here is
  batch B x 1, the ensemble's B x 3)."""
  model_dir, _ = ensembled
  bank = {TASK: prompt_files["p2"], "spare": prompt_files["p1"]}
  code, _, err = run_cli(["infer", f"--gin.MODEL_DIR='{tmp_path}'",
                          f"--gin.PROMPT_BANK={bank!r}"] + COMMON)
  assert code == 0, err
  got = [json.loads(l) for l in open(tmp_path / "inference" / f"{TASK}-validation-bank.jsonl")]
  rows = [json.loads(l) for l in open(os.path.join(model_dir, "ensemble",
                                                    f"{TASK}-validation-predictions.jsonl"))]
  assert {g["prompt"] for g in got} == {TASK}
  numerics.assert_same_choices([g["prediction"] for g in got],
                               [r["predictions"]["p2"] for r in rows],
                               near_ties(rows, ensembled64, "p2"), what="bank vs ensemble")


@pytest.mark.parametrize("names", [("indices", "targets", "mean_log_likelihood"),
                                   ("majority_vote", "texts", "scores")])
def test_prompt_names_never_collide_with_the_ensembles_own_keys(names, ensembled, prompt_files,
                                                                tmp_path):
  """Prompts named like the examples' fields (`indices`, `targets`, ...) or the combinations
  (`majority_vote`, `mean_log_likelihood`) give exactly the outputs of the same prompts under
  other names (the same program, the `ensembled` run's): only the names change."""
  model_dir, _ = ensembled
  renamed = dict(zip(names, prompt_files.values()))
  out, rows = ensemble_rows(renamed, str(tmp_path / "renamed"))
  rows0 = [json.loads(l) for l in open(os.path.join(model_dir, "ensemble",
                                                     f"{TASK}-validation-predictions.jsonl"))]
  report0 = json.load(open(os.path.join(model_dir, "ensemble", f"{TASK}-validation.json")))
  report = json.load(open(tmp_path / "renamed" / "ensemble" / f"{TASK}-validation.json"))
  assert report["ensemble"] == report0["ensemble"]
  assert [p["name"] for p in report["prompts"]] == list(names)
  assert [p["metrics"] for p in report["prompts"]] == [p["metrics"] for p in report0["prompts"]]
  assert report["mean"] == report0["mean"]
  old = dict(zip(prompt_files, names))
  rename = lambda d: {old[k]: v for k, v in d.items()}
  assert len(rows) == len(rows0) == 256
  for row, row0 in zip(rows, rows0):
    for key in ("index", "inputs", "targets", ensemble.VOTE, ensemble.MEAN_LL,
                "mean_label_log_likelihood"):
      assert row[key] == row0[key], (key, row[key], row0[key])
    assert row["predictions"] == rename(row0["predictions"])
    assert row["label_log_likelihood"] == rename(row0["label_log_likelihood"])
  assert isinstance(rows[0]["targets"], str)
  final = lambda text: [l for l in text.splitlines() if l.startswith("final metrics:")]
  assert final(out) == final(ensembled[1])


def test_majority_vote_and_mean_likelihood_on_crafted_cases():
  votes = ensemble.majority_vote([
      ["a", "b", "b"],          # plain majority
      ["x", "y", "y", "x"],     # tie 2-2: x was given first (prompt 0)
      ["q", "r", "s"],          # all different: prompt 0's answer
      ["m", "n", "n", "m", "o"],  # tie: m first
      ["v", "u", "u", "v"]])  # tie 2-2: v was given first
  assert votes == [("b", 1), ("x", 0), ("q", 0), ("m", 0), ("v", 0)]
  scores = np.array([
      [[-1.0, -2.0], [-3.0, -0.5]],   # means -2, -1.25 -> label 1 (a vote would tie)
      [[-1.0, -1.0], [-2.0, -2.0]],   # tied means -> the first label
      [[-0.1, -9.0], [-5.0, -4.0]]])  # means -2.55, -6.5 -> label 0
  np.testing.assert_array_equal(ensemble.mean_log_likelihood(scores), [1, 0, 0])


@pytest.mark.parametrize("case", ["n0", "count", "missing", "width", "unknown_name",
                                  "bank_and_file", "empty_input", "bad_shape", "npz", "npz_bank", "not_npy",
                                  "strings", "truncated"])
def test_bad_inputs_are_one_line_and_write_nothing(case, prompt_files, tmp_path):
  model_dir = tmp_path / "out"
  wide = str(tmp_path / "wide.npy")
  np.save(wide, np.zeros((4, EMB + 2), np.float32))
  cube = str(tmp_path / "cube.npy")
  np.save(cube, np.zeros((2, 3, 4), np.float32))
  npz = str(tmp_path / "prompt.npz")
  np.savez(npz, prompt=np.zeros((4, EMB), np.float32))
  text = str(tmp_path / "text.npy")
  with open(text, "w") as f:
    f.write("0.1 0.2\n")
  strings = str(tmp_path / "strings.npy")
  np.save(strings, np.full((4, EMB), "a"))
  truncated = str(tmp_path / "truncated.npy")
  with open(prompt_files["p0"], "rb") as f, open(truncated, "wb") as g:
    g.write(f.read()[:100])
  export = "export the prompt with `prompt-jax export --format=npy`"
  command, flag, expected = {
      "n0": ("ensemble-eval", "--gin.ENSEMBLE_PROMPTS=[]", "names no prompt (N = 0)"),
      # A count where the prompts go was a TypeError (exit 1).
      "count": ("ensemble-eval", "--gin.ENSEMBLE_PROMPTS=5",
                "ENSEMBLE_PROMPTS must name the prompts: a list of .npy prompt files or "
                "trained MODEL_DIRs, a dict name -> path, or a directory of them; got 5"),
      # PROMPT_FILE was silently ignored (the bank's prompts served every example).
      "bank_and_file": ("infer", [f"--gin.PROMPT_BANK={{'{TASK}': '{prompt_files['p0']}'}}",
                                  f"--gin.PROMPT_FILE='{prompt_files['p1']}'"],
                        "PROMPT_BANK and PROMPT_FILE both name the prompt"),
      "missing": ("ensemble-eval", f"--gin.ENSEMBLE_PROMPTS=['{prompt_files['p0']}', "
                  f"'/nonexistent/p.npy']", "'/nonexistent/p.npy', which does not exist"),
      "width": ("ensemble-eval", f"--gin.ENSEMBLE_PROMPTS=['{prompt_files['p0']}', '{wide}']",
                "different widths"),
      "unknown_name": ("infer", f"--gin.PROMPT_BANK={{'other': '{prompt_files['p0']}'}}",
                       f"names prompt '{TASK}', which is not in PROMPT_BANK"),
      # (an unset shell variable: it predicted for the empty text)
      "empty_input": ("infer", "--input=", "--input is empty (an unset shell variable?)"),
      "bad_shape": ("ensemble-eval", f"--gin.ENSEMBLE_PROMPTS=['{cube}']", "[2, 3, 4]"),
      "npz": ("ensemble-eval", f"--gin.ENSEMBLE_PROMPTS=['{prompt_files['p0']}', '{npz}']",
              f"{npz} is an .npz archive, not one .npy array; {export}"),
      "npz_bank": ("infer", f"--gin.PROMPT_BANK={{'{TASK}': '{npz}'}}",
                   f"{npz} is an .npz archive"),
      "not_npy": ("ensemble-eval", f"--gin.ENSEMBLE_PROMPTS=['{text}']",
                  f"{text} is not a .npy array file; {export}"),
      "strings": ("ensemble-eval", f"--gin.ENSEMBLE_PROMPTS=['{strings}']",
                  f"{strings} holds <U1 values, not numbers; {export}"),
      "truncated": ("ensemble-eval", f"--gin.ENSEMBLE_PROMPTS=['{truncated}']",
                    f"{truncated} is not a readable .npy array"),
  }[case]
  flags = flag if isinstance(flag, list) else [flag]
  code, out, err = run_cli([command, f"--gin.MODEL_DIR='{model_dir}'", *flags] + COMMON)
  assert code == 2, (out, err)
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith(f"prompt-jax {command}: error:"), err
  assert expected in lines[0], lines[0]
  assert not model_dir.exists()


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
  """2-step runs of residual (folded into the bank), IDPG (input-dependent) and deep prefix
  (its own module) on the embedded default."""
  from tests.train import common  # pylint: disable=g-import-not-at-top
  runs = {}
  for method in ("residual", "idpg", "prefix"):
    model_dir = str(tmp_path_factory.mktemp(method))
    code, _, err = run_cli(["train"] + common.flags(model_dir, 2,
                                                     f"--gin_file=prompts/{method}.gin"))
    assert code == 0, err
    runs[method] = model_dir
  return runs


def test_run_dirs_join_the_ensemble_and_equal_their_run_alone(trained_runs, prompt_files,
                                                               tmp_path):
  """MODEL_DIR members: residual is folded into the bank (with a .npy prompt beside it); IDPG
  and deep prefix run through their own modules on the same batches; each prompt's predictions
  equal `prompt-jax infer` of its run alone."""
  prompts = {"file": prompt_files["p1"], **trained_runs}
  model_dir = tmp_path / "ens"
  code, _, err = run_cli(["ensemble-eval", f"--gin.MODEL_DIR='{model_dir}'",
                          f"--gin.ENSEMBLE_PROMPTS={prompts!r}"] + COMMON)
  assert code == 0, err
  report = json.load(open(model_dir / "ensemble" / f"{TASK}-validation.json"))
  assert [p["method"] for p in report["prompts"]] == [
      "prompt_tuning (file)", "Residual", "IDPG", "DeepPrefix"], report["prompts"]
  rows = [json.loads(l) for l in open(model_dir / "ensemble" / f"{TASK}-validation-predictions.jsonl")]
  _, rows64 = ensemble_rows(prompts, str(tmp_path / "ens64"), float64=True)
  # Folded residual: another program than its run's (the MLP applied once, then banked);
  # IDPG / prefix: the module of the run alone. Answers equal up to float32 near-ties.
  assert_each_run_equals_its_infer(trained_runs, rows, rows64)


def test_a_member_run_without_a_checkpoint_says_what_to_do(trained_runs, prompt_files,
                                                            tmp_path):
  """A MODEL_DIR whose training has not saved yet (config.gin, no checkpoint): one line saying
  to train it or leave it out."""
  untrained = tmp_path / "untrained"
  untrained.mkdir()
  shutil.copy(os.path.join(trained_runs["residual"], "config.gin"), untrained)
  model_dir = tmp_path / "ens"
  prompts = {"file": prompt_files["p1"], "untrained": str(untrained)}
  code, out, err = run_cli(["ensemble-eval", f"--gin.MODEL_DIR='{model_dir}'",
                            f"--gin.ENSEMBLE_PROMPTS={prompts!r}"] + COMMON)
  assert code == 2, (out, err)
  assert err == (f"prompt-jax ensemble-eval: error: prompt 'untrained': MODEL_DIR {untrained} "
                 f"has no checkpoint yet: train it first (prompt-jax train resumes it), or "
                 f"leave it out\n")
  assert not model_dir.exists()


def test_a_relative_member_run_dir_is_read_from_the_working_directory(trained_runs, tmp_path,
                                                                     monkeypatch):
  """`ENSEMBLE_PROMPTS=['runA', './runB']` from the directory holding them, as relative .npy
  members already worked: orbax restores absolute paths only, and a relative run directory was
  reported as 'no intact checkpoint ... start over with a new MODEL_DIR', exit 1."""
  prefix, idpg = trained_runs["prefix"], trained_runs["idpg"]
  assert os.path.dirname(prefix) == os.path.dirname(idpg)  # both under tmp_path_factory's root
  monkeypatch.chdir(os.path.dirname(prefix))
  members = [os.path.basename(prefix), "./" + os.path.basename(idpg)]
  code, _, err = run_cli(["ensemble-eval", f"--gin.MODEL_DIR='{tmp_path / 'ens'}'",
                          f"--gin.ENSEMBLE_PROMPTS={members!r}"] + COMMON)
  assert code == 0, err
  report = json.load(open(tmp_path / "ens" / "ensemble" / f"{TASK}-validation.json"))
  assert [p["method"] for p in report["prompts"]] == ["DeepPrefix", "IDPG"], report["prompts"]


def assert_each_run_equals_its_infer(runs, rows, rows64):
  """Each run's predictions in the ensemble `rows` equal `prompt-jax infer` of the run alone, up
  to float32 near-ties (judged on the float64 ensemble `rows64`)."""
  for name, run in runs.items():
    code, _, err = run_cli(["infer", f"--gin.MODEL_DIR='{run}'", "--gin.BATCH_SIZE=64"])
    assert code == 0, err
    got = [json.loads(l)["prediction"] for l in open(os.path.join(
        run, "inference", f"{TASK}-validation.jsonl"))]
    numerics.assert_same_choices(got, [r["predictions"][name] for r in rows],
                                 near_ties(rows, rows64, name), what=name)


def test_ensemble_on_a_4_device_mesh_equals_one_device(ensembled, ensembled64, prompt_files,
                                                       tmp_path):
  """The example batch is sharded on the data axis (4 fake CPU devices) and its N rows follow
  it: the same per-prompt and ensemble predictions as on one device. Each device runs a quarter
  of the batch (another matmul shape), so the scores differ in rounding: answers are compared
  away from float32 near-ties, the rest of each row exactly."""
  from tests.train import common  # pylint: disable=g-import-not-at-top
  model_dir, _ = ensembled
  out_dir = tmp_path / "ens4"
  proc = common.cli_subprocess(["ensemble-eval", f"--gin.MODEL_DIR='{out_dir}'",
                                f"--gin.ENSEMBLE_PROMPTS={dict(prompt_files)!r}"] + COMMON,
                               devices=4, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:]
  name = f"{TASK}-validation-predictions.jsonl"
  one = [json.loads(l) for l in open(os.path.join(model_dir, "ensemble", name))]
  four = [json.loads(l) for l in open(out_dir / "ensemble" / name)]
  answers = {name: ("predictions", name) for name in prompt_files}
  answers[ensemble.MEAN_LL] = (ensemble.MEAN_LL, None)
  ties = {key: near_ties(one, ensembled64, key[1]) for key in answers.values()}
  for what, (field, name) in answers.items():
    pick = (lambda r: r[field][name]) if name else (lambda r: r[field])
    numerics.assert_same_choices([pick(r) for r in four], [pick(r) for r in one],
                                 ties[(field, name)], what=what)
  # The vote may follow a per-prompt answer that flipped on a near-tie.
  any_tie = np.any([ties[("predictions", n)] for n in prompt_files], axis=0)
  numerics.assert_same_choices([r[ensemble.VOTE] for r in four], [r[ensemble.VOTE] for r in one],
                               any_tie, what="majority vote", max_near_tie_share=0.15)
  fixed = lambda rows: [{k: r[k] for k in ("index", "inputs", "targets")} for r in rows]
  assert fixed(four) == fixed(one)


def test_members_trained_on_another_task_or_frozen_model_are_warned_of(trained_runs, tmp_path):
  """A member run trained on another task, or on another frozen model, joined the ensemble
  without a word (both can be meant: a transfer study); each is now one warning line."""
  from prompt_jax import embedded  # pylint: disable=g-import-not-at-top
  run = trained_runs["residual"]
  trained_with = ensemble.read_run(run).trained_with
  assert trained_with == {"task": TASK, "initial_checkpoint": embedded.CHECKPOINT_DIR}
  member = ensemble.Member("r", run, "Residual", 4, trained_with=trained_with)
  assert ensemble.warn_of_other_sources([member], TASK, embedded.CHECKPOINT_DIR + "/") == []
  moved = str(tmp_path / "moved")
  assert ensemble.warn_of_other_sources([member], "glue_sst2_v002", moved) == [
      f"prompt 'r' was trained on {TASK}, not glue_sst2_v002",
      f"prompt 'r' was trained on the frozen model {embedded.CHECKPOINT_DIR}, not this "
      f"command's INITIAL_CHECKPOINT_PATH {moved}"]
  # A .npy member records neither: nothing to say.
  assert ensemble.warn_of_other_sources(
      [ensemble.Member("f", str(tmp_path / "p.npy"), "prompt_tuning (file)", 4)], "x", moved) == []


def test_exports_of_several_runs_are_named_by_their_runs(tmp_path):
  """Every run exports export/prompt_step<N>.npy: listing two runs' exports was refused ("name(s)
  prompt_step4 appear twice; name them with a dict"), the usual case made the awkward one."""
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  listed = []
  for run in ("runA", "runB"):
    (tmp_path / run / "export").mkdir(parents=True)
    np.save(tmp_path / run / "export" / "prompt_step4.npy", np.zeros((2, 4), np.float32))
    listed.append(str(tmp_path / run / "export" / "prompt_step4.npy"))
  np.save(tmp_path / "other.npy", np.zeros((2, 4), np.float32))
  listed.append(str(tmp_path / "other.npy"))
  assert [n for n, _ in ensemble.prompt_sources(listed)] == [
      "runA/export/prompt_step4", "runB/export/prompt_step4", "other"]
  with pytest.raises(ConfigError, match=r"prompt name\(s\) other appear twice"):
    ensemble.prompt_sources(listed + [str(tmp_path / "other.npy")])  # the same file twice
