"""Sweep specs: expansion into jobs, the plan's commands, and bad inputs (one line, exit 2,
before anything runs)."""
import os
import shlex

import pytest

from prompt_jax.launch import spec as spec_lib
from tests.launch import helpers


def test_plan_lists_every_job_with_its_exact_train_command(tmp_path):
  spec = helpers.write_spec(tmp_path, helpers.TINY_SPEC)
  root = str(tmp_path / "root")
  rc, out, err = helpers.sweep_cli(["plan", spec, f"--root={root}"])
  assert rc == 0, err
  commands = [l for l in out.splitlines() if l.startswith("prompt-jax train ")]
  assert len(commands) == 8
  names = set()
  for line in commands:
    argv = shlex.split(line)  # the printed line is a valid shell command
    model_dirs = [a for a in argv if a.startswith("--gin.MODEL_DIR=")]
    assert len(model_dirs) == 1
    model_dir = model_dirs[0].split("=", 1)[1].strip("'")
    assert os.path.dirname(model_dir) == root
    names.add(os.path.basename(model_dir))
    # Every job: the base file, one init file, the base bindings, one length, one seed.
    assert argv[2] == "--gin_file=runs/embedded_default.gin"
    assert argv[3] in ("--gin_file=prompts/uniform.gin", "--gin_file=prompts/from_class_labels.gin")
    assert "--gin.TRAIN_STEPS=4" in argv and "--gin.CLASS_LABELS=['a', 'b', 'c', 'd']" in argv
    assert sum(a.startswith("--gin.PROMPT_LENGTH=") for a in argv) == 1
    assert sum(a.startswith("--gin.RANDOM_SEED=") for a in argv) == 1
  assert names == {f"PROMPT_LENGTH-{n}__init-{i}__seed-{s}" for n in (4, 8)
                   for i in ("uniform", "from_class_labels") for s in (0, 1)}
  assert not os.path.exists(root)  # plan writes nothing


def test_plan_says_the_run_command_with_its_root_and_overrides(tmp_path):
  """The plan's last line is the command that runs these jobs: with --root (else the jobs would
  go to the spec's root) and the --gin overrides (else other commands would run)."""
  spec = helpers.write_spec(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: [4, 8]\n")
  root = str(tmp_path / "my root")
  argv = [spec, f"--root={root}", "--gin.BATCH_SIZE=4"]
  rc, out, err = helpers.sweep_cli(["plan", *argv])
  assert rc == 0, err
  hint = out.strip().splitlines()[-1].split("run them: ", 1)[1]
  assert shlex.split(hint) == ["prompt-jax", "sweep", "run", *argv]
  # Without --root or overrides, none is added.
  rc, out, err = helpers.sweep_cli(["plan", spec])
  assert shlex.split(out.strip().splitlines()[-1].split("run them: ", 1)[1]) == [
      "prompt-jax", "sweep", "run", spec]


def test_zip_templates_and_overrides(tmp_path):
  """Zipped axes advance together; ${axis} fills a value; --gin.X reaches every job."""
  spec = helpers.write_spec(tmp_path, """\
      gin_files: [runs/embedded_default.gin]
      bindings: {TRAIN_STEPS: 2, MIXTURE_OR_TASK_NAME: "'embedded_last_letter'"}
      axes:
        size: {s: {PROMPT_LENGTH: 4}, m: {PROMPT_LENGTH: 8}}
        DPT_RANK: [1, 2]
        extra: {gin_file: [prompts/dpt.gin, prompts/residual.gin]}
        EMBEDDING_FILE: ["'/data/${size}.npy'", "'/data/${size}_b.npy'"]
      zip: [[size, DPT_RANK]]
      seeds: [3]
      """)
  sweep = spec_lib.build(spec, root=str(tmp_path / "r"), overrides=[("BATCH_SIZE", "16")])
  got = [(j.values["size"], j.values["DPT_RANK"], dict(j.bindings)["EMBEDDING_FILE"])
         for j in sweep.jobs if j.values["extra"] == "dpt"]
  assert len(sweep.jobs) == 2 * 2 * 2  # 2 (zipped) x 2 extra x 2 EMBEDDING_FILE x 1 seed
  assert ("s", "1", "'/data/s.npy'") in got and ("m", "2", "'/data/m_b.npy'") in got
  assert all(j.values["DPT_RANK"] == {"s": "1", "m": "2"}[j.values["size"]] for j in sweep.jobs)
  assert all(("BATCH_SIZE", "16") in j.bindings for j in sweep.jobs)
  assert all(dict(j.bindings)["RANDOM_SEED"] == "3" for j in sweep.jobs)


@pytest.mark.parametrize("spec", ["lester_fig3a_prompt_length", "lester_fig3b_prompt_init",
                                  "lester_fig3c_pretraining", "dpt_bottleneck"])
def test_shipped_specs_plan(spec, tmp_path):
  """The shipped specs are found by name and every job's gin config parses with all required
  macros bound."""
  rc, out, err = helpers.sweep_cli(["plan", spec, f"--root={tmp_path}/r"])
  assert rc == 0, err
  sweep = spec_lib.build(spec, root=f"{tmp_path}/r")
  assert out.count("\nprompt-jax train ") == len(sweep.jobs) >= 45
  assert len(sweep.seeds) == 3


def _error(tmp_path, text, *argv):
  spec = helpers.write_spec(tmp_path, text)
  root = tmp_path / "root"
  rc, out, err = helpers.sweep_cli([*argv, spec, f"--root={root}"])
  lines = [l for l in err.splitlines() if l.strip()]
  assert rc == 2, (out, err)
  assert len(lines) == 1 and lines[0].startswith("prompt-jax sweep: error: "), err
  assert not root.exists()  # nothing ran, nothing was written
  return lines[0]


BASE = """\
gin_files: [runs/embedded_default.gin]
bindings: {TRAIN_STEPS: 2}
"""


@pytest.mark.parametrize("command", ["plan", "run"])
def test_unknown_gin_file_in_axis(tmp_path, command):
  line = _error(tmp_path, BASE + "axes:\n  init: {gin_file: [prompts/unifrom.gin]}\n", command)
  assert "gin file 'prompts/unifrom.gin' not found" in line
  assert "did you mean prompts/uniform.gin?" in line


@pytest.mark.parametrize("command", ["plan", "run"])
def test_unknown_macro_in_axis(tmp_path, command):
  line = _error(tmp_path, BASE + "axes:\n  PROMPT_LENGHT: [4, 8]\n", command)
  assert "axis 'PROMPT_LENGHT': unknown gin macro PROMPT_LENGHT" in line
  assert "did you mean PROMPT_LENGTH?" in line


def test_unknown_macro_in_bindings(tmp_path):
  line = _error(tmp_path, BASE.replace("TRAIN_STEPS", "TRAIN_STEP"), "plan")
  assert "unknown gin macro TRAIN_STEP" in line and "did you mean TRAIN_STEPS?" in line


def test_a_model_dir_axis_is_refused_as_a_model_dir_binding_is(tmp_path):
  """Its values were replaced by the sweep's own <root>/<job name> without a word."""
  line = _error(tmp_path, BASE + "axes:\n  MODEL_DIR: ['/tmp/a', '/tmp/b']\n", "plan")
  assert "axis 'MODEL_DIR': MODEL_DIR is set by the sweep (<root>/<job name>); set `root:`" in line


def test_axis_macro_unused_by_its_jobs(tmp_path):
  """DPT_RANK is bound by prompts/dpt.gin only: sweeping it without that file changes nothing."""
  line = _error(tmp_path, BASE + "axes:\n  DPT_RANK: [4, 8]\n", "plan")
  assert "axis 'DPT_RANK': unknown gin macro DPT_RANK" in line


@pytest.mark.parametrize("seeds", ["3", "'0, 1, 2'"])
def test_seeds_that_are_not_a_list(tmp_path, seeds):
  """`seeds: 3` used to mean the one seed 3, not three seeds."""
  line = _error(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: [4]\n" + f"seeds: {seeds}\n", "plan")
  assert line.endswith("is not a list: seeds must be a list, e.g. [0, 1, 2]"), line


def test_empty_axis(tmp_path):
  line = _error(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: []\n", "plan")
  assert "axis 'PROMPT_LENGTH' is empty" in line


def test_empty_gin_file_axis(tmp_path):
  line = _error(tmp_path, BASE + "axes:\n  init: {gin_file: []}\n", "plan")
  assert "axis 'init' is empty" in line


@pytest.mark.parametrize("text,which", [
    ("bindings: {TRAIN_STEPS: 4}\naxes:\n  PROMPT_LENGTH: [2, 4]\n", "no job names"),
    ("axes:\n  m: {a: {gin_file: runs/embedded_default.gin}, b: {PROMPT_LENGTH: 2}}\n",
     "job m-b names")])
def test_a_job_without_a_gin_file_is_refused_as_train_refuses_it(tmp_path, text, which):
  """A spec without gin_files was 'unknown gin macro TRAIN_STEPS (no gin file of any job binds
  or uses it)', or a list of missing macros: neither said that the files were missing."""
  line = _error(tmp_path, text, "plan")
  assert line.startswith(f"prompt-jax sweep: error: gin_files: {which} a gin file"), line
  assert "gin_files: [runs/embedded_default.gin]" in line


def test_zip_axes_of_different_lengths(tmp_path):
  line = _error(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: [4, 8]\n  DROPOUT_RATE: [0.0]\n"
                "zip: [[PROMPT_LENGTH, DROPOUT_RATE]]\n", "run")
  assert "zip: axes of different lengths (PROMPT_LENGTH has 2, DROPOUT_RATE has 1)" in line


@pytest.mark.parametrize("zip_text", ["[PROMPT_LENGTH, DROPOUT_RATE]", "[[PROMPT_LENGTH]]",
                                      "PROMPT_LENGTH", "[[[PROMPT_LENGTH, DROPOUT_RATE]]]"])
def test_zip_group_that_is_not_a_list_of_axes(tmp_path, zip_text):
  """`zip: [a, b]` (one list, not a list of groups) used to make two one-axis groups: the axes
  were crossed (4 jobs), not zipped (2)."""
  line = _error(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: [4, 8]\n  DROPOUT_RATE: [0.0, 0.1]\n"
                f"zip: {zip_text}\n", "plan")
  assert "zip: each zip group is a list of two or more axis names" in line
  if zip_text.startswith("[PROMPT"):
    assert "write zip: [[PROMPT_LENGTH, DROPOUT_RATE]]" in line


@pytest.mark.parametrize("axes,key,lines", [
    ("  PROMPT_LENGTH: [4, 8]\n  PROMPT_LENGTH: [16]\n", "PROMPT_LENGTH", "lines 4 and 5"),
    ("  init:\n    uniform: {gin_file: prompts/uniform.gin}\n"
     "    uniform: {gin_file: prompts/from_class_labels.gin}\n", "uniform", "lines 5 and 6"),
])
def test_duplicate_yaml_keys(tmp_path, axes, key, lines):
  """yaml.safe_load keeps the last of two equal keys: an axis, or a choice whose label then
  names another choice's files, would be lost without a word."""
  line = _error(tmp_path, BASE + "axes:\n" + axes, "plan")
  assert f"key {key!r} appears twice in one mapping ({lines})" in line


def test_yaml_merge_keys_may_be_overridden(tmp_path):
  spec = helpers.write_spec(tmp_path, BASE + "axes:\n  init:\n    a: &a {PROMPT_LENGTH: 4}\n"
                            "    b: {<<: *a, PROMPT_LENGTH: 8}\n")
  sweep = spec_lib.build(spec, root=str(tmp_path / "root"))
  assert [j.bindings[-2] for j in sweep.jobs] == [("PROMPT_LENGTH", "4"), ("PROMPT_LENGTH", "8")]


def test_job_name_too_long_for_a_file_name(tmp_path):
  """Passed `plan`, then `run` crashed with an OSError traceback opening logs/<job>.log."""
  line = _error(tmp_path, BASE + "axes:\n  INITIAL_CHECKPOINT_PATH: ['" + "x" * 40 + "']\n"
                + "".join(f"  prompt_jax.train.stats_period{'_' * i}: [1]\n" for i in range(6)),
                "plan")
  assert "more than a file name may hold (251 at most)" in line


def test_two_jobs_sharing_a_model_dir(tmp_path):
  # Two different paths whose labels (their last two parts) are the same.
  line = _error(tmp_path, BASE + "axes:\n  INITIAL_CHECKPOINT_PATH: [\"'/x/run/ckpt'\", "
                "\"'/y/run/ckpt'\"]\n", "run")
  assert "two jobs share MODEL_DIR" in line and "INITIAL_CHECKPOINT_PATH-run-ckpt" in line


@pytest.mark.parametrize("values,shown", [
    ("[0.1, 1e-1]", "0.1 and 1e-1"),   # YAML reads 1e-1 as a string; gin, as 0.1
    ("[4, '4']", "4 and 4"),           # a string is gin text: --gin.X=4 both times
    ("[[1, 2], [1,2]]", "[1, 2] and [1, 2]"),  # YAML lists
    ("['%A', '%A']", "%A and %A"),
])
def test_an_axis_listing_one_value_twice(tmp_path, values, shown):
  """[0.1, 1e-1] gave two identical jobs under two names, each a full run."""
  line = _error(tmp_path, BASE + f"axes:\n  DROPOUT_RATE: {values}\n", "plan")
  assert f"axis 'DROPOUT_RATE': {shown} are the same value; list each value once" in line


def test_values_equal_in_python_but_not_in_gin_stay_apart(tmp_path):
  # 1 and 1.0 are different gin values (an integer parameter refuses 1.0): two jobs.
  spec = helpers.write_spec(tmp_path, BASE + "axes:\n  DROPOUT_RATE: [1, 1.0, true]\n")
  assert len(spec_lib.build(spec, root=str(tmp_path / "root")).jobs) == 3


@pytest.mark.parametrize("text,expected", [
    ("axes: [unclosed\n", "does not parse (line 2"),
    ("axes:\n  a: 1\n\tb: 2\n", "does not parse (line 3"),
    ("- just\n- a list\n", "does not parse: expected a mapping"),
    (BASE + "axis: {PROMPT_LENGTH: [4]}\n", "unknown key 'axis'"),
])
def test_spec_that_does_not_parse(tmp_path, text, expected):
  assert expected in _error(tmp_path, text, "plan")


def test_unknown_spec_name(tmp_path):
  rc, _, err = helpers.sweep_cli(["plan", "lester_fig3a_prompt_lenght"])
  assert rc == 2 and len(err.strip().splitlines()) == 1
  assert "did you mean lester_fig3a_prompt_length?" in err


def test_gin_error_in_a_job(tmp_path):
  """A binding gin cannot apply is reported with the job that has it."""
  line = _error(tmp_path, BASE + "axes:\n  prompt_jax.train.stats_perod: [1]\n", "plan")
  assert line.startswith("prompt-jax sweep: error: job prompt_jax.train.stats_perod-1: ")


@pytest.mark.parametrize("command", ["plan", "run", "emit"])
@pytest.mark.parametrize("axes, overrides, expected", [
    ("  PROMPT_LENGTH: [4, \"'abc'\"]\n", [],
     "job PROMPT_LENGTH-abc: PROMPT_LENGTH must be an integer, got 'abc'"),
    ("  PROMPT_LENGTH: [4]\n", ["--gin.TRAIN_STEPS='ten'"],
     "job PROMPT_LENGTH-4: TRAIN_STEPS must be an integer, got 'ten'"),
    ("  TRAIN_STEPS: [2, 0]\n", [], "job TRAIN_STEPS-0: TRAIN_STEPS must be >= 1, got 0"),
    ("  PROMPT_LENGTH: [4]\n", ["--gin.EVAL_PERIOD=-3"],
     "job PROMPT_LENGTH-4: EVAL_PERIOD must be >= 0 (0: no evaluation during training), got -3"),
    ("  BATCH_SIZE: [0]\n", [], "job BATCH_SIZE-0: BATCH_SIZE must be >= 1, got 0"),
])
def test_bad_values_are_refused_before_any_job_runs(tmp_path, command, axes, overrides,
                                                    expected):
  """A value `prompt-jax train` refuses (type, range) is one line naming the job, exit 2,
  before anything runs: not a failed job after the sweep started (root, logs, status)."""
  extra = ["--target=local-script"] if command == "emit" else []
  line = _error(tmp_path, BASE + "axes:\n" + axes, command, *overrides, *extra)
  assert line == "prompt-jax sweep: error: " + expected, line


def test_value_checks_write_nothing_for_good_jobs(tmp_path):
  """The value checks of a good sweep create no MODEL_DIR (plan writes nothing)."""
  spec = helpers.write_spec(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: [4, 8]\n")
  rc, out, err = helpers.sweep_cli(["plan", spec, f"--root={tmp_path}/root"])
  assert rc == 0, err
  assert out.count("\nprompt-jax train ") == 2
  assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("command, flag, expected", [
    ("plan", "--target=slurm", "--target is a flag of `sweep emit`, not of `sweep plan`"),
    ("plan", "--nodes=4", "--nodes is a flag of `sweep emit`, not of `sweep plan`"),
    ("run", "--metric=f1", "--metric is a flag of `sweep report`, not of `sweep run`"),
    ("run", "--out=x", "--out is a flag of `sweep emit / report`, not of `sweep run`"),
    ("emit", "--parallel=4", "--parallel is a flag of `sweep run`, not of `sweep emit`"),
    ("emit", "--target=tpu-vm --nodes=2",
     "--nodes is a flag of --target=slurm, not of --target=tpu-vm: drop it"),
    ("emit", "--target=slurm --zone=europe-west4-a",
     "--zone is a flag of --target=tpu-vm, not of --target=slurm: drop it"),
])
def test_a_flag_of_another_subcommand_is_refused_not_ignored(tmp_path, command, flag, expected):
  """`sweep plan --target=slurm --nodes=4` printed the plan as if the flags were not there (and
  emit --target=tpu-vm the scripts without the slurm-only --nodes)."""
  line = _error(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: [4]\n", command, *flag.split())
  assert line.startswith("prompt-jax sweep: error: " + expected), line


def test_an_axis_named_like_a_report_column(tmp_path):
  """report.csv has a `seed` column (and job, state, step, ...): an axis of that name would be
  overwritten there."""
  line = _error(tmp_path, BASE + "axes:\n  seed: {a: {PROMPT_LENGTH: 4}}\n", "plan")
  assert "axis 'seed': the name of a column of `sweep report`" in line


def test_figure_naming_no_axis(tmp_path):
  line = _error(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: [4]\n"
                "report: {figures: [{x: PROMPT_LENGTH, lines: seeed}]}\n", "plan")
  assert "report.figures[0].lines: 'seeed' is not an axis" in line


def test_scoped_parameter_axis_gives_path_safe_job_names(tmp_path):
  """A scoped gin parameter (with '/') or a name with a space is a fine axis; the job names
  (directories, log files, words in emitted scripts) hold it path-safe."""
  spec = helpers.write_spec(tmp_path, BASE + "axes:\n"
                            "  train/prompt_jax.DatasetConfig.shuffle: [true, false]\n"
                            "  my init: {gin_file: [prompts/uniform.gin]}\n")
  root = str(tmp_path / "root")
  rc, out, err = helpers.sweep_cli(["plan", spec, f"--root={root}"])
  assert rc == 0, err
  sweep = spec_lib.build(spec, root=root)
  assert [j.name for j in sweep.jobs] == [
      "train-prompt_jax.DatasetConfig.shuffle-True__my-init-uniform",
      "train-prompt_jax.DatasetConfig.shuffle-False__my-init-uniform"]
  assert all(os.path.dirname(j.model_dir) == root for j in sweep.jobs)
  assert all(j.values["train/prompt_jax.DatasetConfig.shuffle"] in ("True", "False")
             for j in sweep.jobs)  # the report's columns keep the axis' own name
  assert "--gin.train/prompt_jax.DatasetConfig.shuffle=True" in out


def test_gin_file_axis_labels_are_path_safe(tmp_path):
  with open(tmp_path / "my init.gin", "w") as f:
    f.write("# mine\n")
  spec = helpers.write_spec(tmp_path, BASE + "axes:\n  init: {gin_file: ['my init.gin']}\n")
  (job,) = spec_lib.build(spec, root=str(tmp_path / "root")).jobs
  assert job.name == "init-my-init" and job.gin_files[-1] == str(tmp_path / "my init.gin")


def test_axis_names_that_collide_once_path_safe(tmp_path):
  line = _error(tmp_path, BASE + "axes:\n  my/init: {gin_file: [prompts/uniform.gin]}\n"
                "  my init: {gin_file: [prompts/uniform.gin]}\n", "plan")
  assert "axes 'my/init' and 'my init' both appear as 'my-init' in job names" in line


@pytest.mark.parametrize("values,labels", [
    ("[-2, 3]", ["-2", "3"]),
    ("[-0.5, 0.5]", ["-0.5", "0.5"]),
    ("[-1.0e-3, 1.0e-3, '-7']", ["-0.001", "0.001", "-7"]),
])
def test_negative_values_keep_their_sign_in_labels(tmp_path, values, labels):
  spec = helpers.write_spec(tmp_path, BASE + f"axes:\n  DROPOUT_RATE: {values}\n")
  sweep = spec_lib.build(spec, root=str(tmp_path / "root"))
  assert sweep.axes[0].labels == labels
  assert [j.name for j in sweep.jobs] == [f"DROPOUT_RATE-{l}" for l in labels]


@pytest.mark.parametrize("report,expected", [
    ("{figures: [{x: [PROMPT_LENGTH]}]}", "report.figures[0].x: ['PROMPT_LENGTH'] is not an axis"),
    ("{figures: [{x: PROMPT_LENGTH, lines: {a: 1}}]}", "report.figures[0].lines: {'a': 1} is not"),
    ("{figures: [{x: PROMPT_LENGTH, x_values: [1, 2]}]}",
     "report.figures[0].x_values: expected a mapping label -> number"),
    ("{figures: [{x: PROMPT_LENGTH, x_values: {'4': 7.7e+7, '8': 250M}}]}",
     "report.figures[0].x_values.8: expected a number (e.g. 7.7e7), got '250M'"),
    ("{figures: [{x: PROMPT_LENGTH, x_values: {'4': 1}}]}",
     "report.figures[0].x_values: give a number for each label of axis 'PROMPT_LENGTH' (4, 8)"),
    ("{figures: [{x: PROMPT_LENGTH, log_x: true, x_values: {'4': 0, '8': 1}}]}",
     "report.figures[0].x_values.4: 0 cannot be drawn on log_x"),
    ("{figures: [{x: PROMPT_LENGTH, metric: [a]}]}", "report.figures[0].metric: expected a string"),
    ("{figures: [{x: PROMPT_LENGTH, log_x: 'yes'}]}", "report.figures[0].log_x: true or false"),
    ("{metric: ''}", "report.metric: expected a metric name or pattern"),
])
def test_bad_report_section_is_one_line_at_plan_time(tmp_path, report, expected):
  line = _error(tmp_path, BASE + f"axes:\n  PROMPT_LENGTH: [4, 8]\nreport: {report}\n", "plan")
  assert expected in line


def test_x_values_as_yaml_reads_them(tmp_path):
  """YAML reads 7.7e7 (no exponent sign) as a string: still a number to draw at."""
  spec = helpers.write_spec(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: [4, 8]\nreport: {figures: "
                            "[{x: PROMPT_LENGTH, x_values: {'4': 7.7e7, '8': 2.5e+8}}]}\n")
  sweep = spec_lib.build(spec, root=str(tmp_path / "root"))
  assert sweep.report["figures"][0]["x_values"] == {"4": 7.7e7, "8": 2.5e8}


def test_axis_templates_in_base_gin_files_and_eval(tmp_path):
  """`${axis}` in a base gin file and in the `eval:` section is the job's label there."""
  for size in ("small", "base"):
    with open(tmp_path / f"model_{size}.gin", "w") as f:
      f.write(f"# {size}\n")
  spec = helpers.write_spec(tmp_path, """\
      gin_files: [runs/embedded_default.gin, 'model_${size}.gin']
      bindings: {TRAIN_STEPS: 2}
      axes:
        size: {small: {PROMPT_LENGTH: 4}, base: {PROMPT_LENGTH: 8}}
      eval:
        gin_files: ['model_${size}.gin']
        bindings: {EVAL_SPLIT: "'validation_${size}'"}
      """)
  sweep = spec_lib.build(spec, root=str(tmp_path / "root"))
  for job in sweep.jobs:
    size = job.values["size"]
    assert job.gin_files[1] == str(tmp_path / f"model_{size}.gin")
    args = job.eval_args()
    assert f"--gin_file={tmp_path}/model_{size}.gin" in args
    assert f"--gin.EVAL_SPLIT='validation_{size}'" in args
  line = _error(tmp_path, BASE + "axes:\n  PROMPT_LENGTH: [4]\n"
                "eval: {bindings: {EVAL_SPLIT: \"'${lenght}'\"}}\n", "plan")
  assert "eval.bindings.EVAL_SPLIT: ${lenght} names no axis" in line


def test_relative_search_paths_become_absolute(tmp_path, monkeypatch):
  """Emitted scripts run from elsewhere (submit.sh cds to its directory): a relative
  gin_search_paths entry is made absolute, as your own gin files are."""
  (tmp_path / "mygin").mkdir()
  with open(tmp_path / "mygin" / "extra.gin", "w") as f:
    f.write("# extra\n")
  monkeypatch.chdir(tmp_path)
  spec = helpers.write_spec(tmp_path, BASE.replace(
      "gin_files: [", "gin_search_paths: [mygin]\ngin_files: [extra.gin, "))
  sweep = spec_lib.build(spec, root="root")
  (job,) = sweep.jobs
  assert job.search_paths == (str(tmp_path / "mygin"),)
  assert f"--gin_search_paths={tmp_path}/mygin" in job.train_args()
  assert "--gin_file=extra.gin" in job.train_args()


@pytest.mark.parametrize("where,hint", [
    ("bindings: {TRAIN_STEPS: 2, MIXTURE_OR_TASK_NAME: embedded_last_letter}\n",
     "MIXTURE_OR_TASK_NAME: \"'embedded_last_letter'\""),
    ("bindings: {TRAIN_STEPS: 2}\naxes:\n  MIXTURE_OR_TASK_NAME: [embedded_last_letter]\n",
     "MIXTURE_OR_TASK_NAME: [\"'embedded_last_letter'\", ...]")])
def test_a_string_without_gin_quotes_is_shown_quoted_as_yaml(tmp_path, where, hint):
  """The hint for a spec's value was the CLI's, `--gin.MIXTURE_OR_TASK_NAME="'...'"`: not what a
  user writes in a YAML file (a --gin.X flag of `sweep` keeps the flag's)."""
  line = _error(tmp_path, "gin_files: [runs/embedded_default.gin]\n" + where, "plan")
  assert line.endswith("a string value needs gin's quotes inside the YAML string: " + hint), line
  spec = helpers.write_spec(tmp_path, BASE)
  rc, _, err = helpers.sweep_cli(["plan", spec, "--gin.EVAL_SPLIT=validation"])
  assert rc == 2 and err.rstrip().endswith(
      "a string value needs quotes inside the flag: --gin.EVAL_SPLIT=\"'validation'\""), err
