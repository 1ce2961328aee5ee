"""gin layering that cannot surprise (cli + layering), paths made absolute, our lines only."""
import os

import gin
import pytest

from prompt_jax import cli
from prompt_jax import console
from prompt_jax import layering
from prompt_jax import paths
from prompt_jax.errors import ConfigError
from prompt_jax.train import summaries


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


def _macro(name):
  return gin.query_parameter(f"%{name}")


@pytest.mark.parametrize("files", [["runs/embedded_default.gin", "runs/prompt_eval.gin"],
                                   ["runs/prompt_eval.gin", "runs/embedded_default.gin"],
                                   ["runs/embedded_default.gin", "runs/prompt_infer.gin",
                                    "runs/prompt_finetune.gin"]])
@pytest.mark.parametrize("command", [None, "eval"])  # None: no implied run file parsed first
def test_a_packaged_run_file_does_not_override_the_embedded_default(files, command):
  """The issue's trap: runs/prompt_eval.gin used to set PROMPT_LENGTH = 100 over the run's 8."""
  cli.parse_gin(files, [], [], command=command)
  assert _macro("PROMPT_LENGTH") == 8 and _macro("BATCH_SIZE") == 32
  assert _macro("MIXTURE_OR_TASK_NAME") == "embedded_last_letter"


def test_a_method_file_wins_over_run_files_in_any_order_and_keeps_the_run_values():
  for files in (["prompts/dpt.gin", "runs/embedded_default.gin", "runs/prompt_eval.gin"],
                ["runs/prompt_eval.gin", "runs/embedded_default.gin", "prompts/dpt.gin"]):
    cli.parse_gin(files, [], [], command="eval")
    from prompt_jax import run_setup  # pylint: disable=g-import-not-at-top
    spec = run_setup.model_spec().prompt
    # The method file's paper setting (DPT: P = 100, r = 10) beats the run file's prompt length;
    # the run's other values stay.
    assert type(spec).__name__ == "DPTSpec" and spec.length == 100 and spec.rank == 10
    assert _macro("BATCH_SIZE") == 32 and _macro("MIXTURE_OR_TASK_NAME") == "embedded_last_letter"
    gin.clear_config()


def test_including_a_run_file_after_your_values_cannot_clobber_them(tmp_path):
  mine = tmp_path / "mine.gin"
  # The method file first (it binds its paper's PROMPT_LENGTH, as a method should), then your
  # values, then run files: those cannot clobber what you set.
  mine.write_text("include 'prompts/prefix.gin'\n"
                  "PROMPT_LENGTH = 5\nBATCH_SIZE = 4\nDROPOUT_RATE = 0.3\n"
                  "include 'runs/prompt_finetune.gin'\ninclude 'runs/prompt_eval.gin'\n")
  cli.parse_gin(["models/embedded_tiny.gin", str(mine)], [], [], command="eval")
  assert (_macro("PROMPT_LENGTH"), _macro("BATCH_SIZE"), _macro("DROPOUT_RATE")) == (5, 4, 0.3)
  # prompts/prefix.gin's AdamW survives the run file included after it.
  assert repr(gin.query_parameter("prompt_jax.train.optimizer")) == "@prompt_jax.adamw()"


@pytest.mark.parametrize("run_file", ["prompt_finetune.gin", "prompt_eval.gin",
                                      "prompt_infer.gin"])
def test_packaged_run_files_bind_no_values_only_wiring(run_file):
  """What makes the layering safe: after runs/defaults.gin, a run file adds only references
  (%MACRO, @configurable) and rebinds nothing defaults.gin bound."""
  gin.add_config_file_search_path(paths.gin_dir())
  cli._register_configurables()  # pylint: disable=protected-access
  gin.parse_config_files_and_bindings([layering.DEFAULTS_FILE], [], finalize_config=False)
  before = layering.snapshot()
  gin.parse_config_files_and_bindings([f"runs/{run_file}"], [], finalize_config=False)
  after = layering.snapshot()
  added = layering.changed(before, after)
  assert added, "the run file wires something"
  for key in added:
    assert key not in before, f"{run_file} rebinds {layering.name(key)}"
    assert isinstance(after[key], gin.config.ConfigurableReference), (
        f"{run_file} binds a value: {layering.show(after, key)}; move it to runs/defaults.gin")


def test_relative_paths_become_absolute_urls_stay(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  from prompt_jax import paths  # pylint: disable=g-import-not-at-top
  # As on a machine that reaches GCS (offline, see tests/test_gcs_reachable.py).
  monkeypatch.setattr(paths, "unreachable_gcs", lambda *args, **kwargs: None)
  cli.parse_gin(["runs/embedded_default.gin"],
                ["MODEL_DIR = 'runs/exp1'", "PROMPT_FILE = '~/p.npy'",
                 "CHECKPOINT_PATH = 'gs://bucket/run/checkpoints/3'", "DATA_DIR = 'data'"],
                [], command="train")
  assert _macro("MODEL_DIR") == str(tmp_path / "runs" / "exp1")
  assert _macro("PROMPT_FILE") == os.path.expanduser("~/p.npy")
  assert _macro("CHECKPOINT_PATH") == "gs://bucket/run/checkpoints/3"
  assert _macro("DATA_DIR") == str(tmp_path / "data")
  assert os.listdir(tmp_path) == []  # parsing writes nothing


@pytest.mark.parametrize("command,macro", [("train", "MODEL_DIR"), ("eval", "MODEL_DIR"),
                                           ("eval", "PROMPT_FILE")])
def test_an_empty_path_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys,
                                                                command, macro):
  monkeypatch.chdir(tmp_path)
  flags = ["--gin_file=runs/embedded_default.gin", "--gin.MODEL_DIR='run'", f"--gin.{macro}=''"]
  assert cli.main([command, *flags]) == 2
  captured = capsys.readouterr()
  assert captured.err == (f"prompt-jax {command}: error: {macro} is empty (an unset shell "
                          f"variable?): set --gin.{macro}=\"'/a/path'\""
                          + ("" if macro == "MODEL_DIR" else " or None") + "\n")
  assert captured.out == "" and os.listdir(tmp_path) == []


def test_verbose_adds_the_traceback_to_the_one_line(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  flags = ["--gin_file=runs/embedded_default.gin", "--gin.MODEL_DIR=''"]
  assert cli.main(["train", *flags]) == 2
  assert "Traceback" not in capsys.readouterr().err
  assert cli.main(["train", *flags, "--verbose"]) == 2
  err = capsys.readouterr().err
  assert "Traceback (most recent call last)" in err
  assert err.splitlines()[-1].startswith("prompt-jax train: error: MODEL_DIR is empty")


def test_an_unexpected_error_is_one_line_exit_1_traceback_with_verbose(monkeypatch, capsys):
  def boom(args):
    raise RuntimeError("boom\nsecond line")
  monkeypatch.setitem(cli._COMMANDS, "describe", boom)  # pylint: disable=protected-access
  argv = ["describe", "--gin_file=models/embedded_tiny.gin"]
  assert cli.main(argv) == 1
  assert capsys.readouterr().err == ("prompt-jax describe: error: RuntimeError: boom "
                                     "(--verbose shows the traceback)\n")
  assert cli.main(argv + ["--verbose"]) == 1
  err = capsys.readouterr().err
  assert "Traceback" in err and err.splitlines()[-1] == "prompt-jax describe: error: RuntimeError: boom"


def test_progress_meter_lines_and_eta():
  now = [0.0]
  lines = []
  meter = summaries.Meter("eval", 100, period_s=10.0, clock=lambda: now[0], emit=lines.append)
  now[0] = 5.0
  assert meter.update(10) is None  # less than period_s since the start: silent
  now[0] = 10.0
  # 20 examples in 10 s = 2.0/s; 80 left -> 40 s.
  assert meter.update(20) == "eval: 20/100 examples (20%) 2.0 examples/s ETA 00:00:40"
  now[0] = 15.0
  assert meter.update(30) is None  # 5 s after the last line
  now[0] = 40.0
  assert meter.update(100) is None  # done: the command's own last line follows
  assert lines == ["eval: 20/100 examples (20%) 2.0 examples/s ETA 00:00:40"]


def test_progress_times_past_a_day_do_not_wrap():
  """An ETA of 30 h read '06:00:00' when the clock was formatted by time.gmtime."""
  now = [0.0]
  meter = summaries.Meter("train", 1000, unit="steps", period_s=1.0, clock=lambda: now[0],
                          emit=lambda text: None)
  now[0] = 108.0  # 1 step in 108 s; 999 left -> 107,892 s = 29 h 58 min 12 s
  assert meter.update(1).endswith("ETA 29:58:12")
  assert console.clock_text(0.4) == "00:00:00" and console.clock_text(-5) == "00:00:00"
  assert console.clock_text(86400 * 3 + 61) == "72:01:01"


def test_eval_of_a_directory_without_a_run_says_so(tmp_path, capsys):
  assert cli.main(["eval", f"--gin.MODEL_DIR='{tmp_path}/nothing_here'"]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"prompt-jax eval: error: MODEL_DIR {tmp_path}/nothing_here does not "
                        f"exist: point it at a run's directory, or set "
                        f"MIXTURE_OR_TASK_NAME, TASK_FEATURE_LENGTHS, INITIAL_CHECKPOINT_PATH")
  assert err.count("\n") == 1 and not os.path.exists(tmp_path / "nothing_here")


@pytest.mark.parametrize("flag,expected", [
    # gin's message spans two lines and quotes an `<ast.Name object at 0x..>`.
    ("--gin.MODEL_DIR=run", "gin: cannot parse the binding `MODEL_DIR = run` (Failed to parse "
                            "token 'run'); a string value needs quotes inside the flag: "
                            "--gin.MODEL_DIR=\"'run'\""),
    # Not a string without its quotes: no advice to quote `= 3`; a number, as bound so far.
    ("--gin_bindings=TRAIN_STEPS = = 3", "gin: cannot parse the binding `TRAIN_STEPS = = 3` "
                                         "(Unable to parse value); TRAIN_STEPS takes a number, "
                                         "e.g. --gin.TRAIN_STEPS=300"),
    # A number's macro: the advice to quote it was wrong (then 'must be an integer').
    ("--gin.TRAIN_STEPS=abc", "gin: cannot parse the binding `TRAIN_STEPS = abc` (Failed to "
                              "parse token 'abc'); TRAIN_STEPS takes a number, e.g. "
                              "--gin.TRAIN_STEPS=300"),
    ("--gin.LEARNING_RATE=3e-1x", "gin: cannot parse the binding `LEARNING_RATE = 3e-1x` "
                                  "(Expected newline); LEARNING_RATE takes a number, e.g. "
                                  "--gin.LEARNING_RATE=0.3"),
    # gin said ('EOF in multi-line statement', (3, 0)).
    ("--gin.TASK_FEATURE_LENGTHS={'inputs': 3", "gin: the binding `TASK_FEATURE_LENGTHS = "
                                                "{'inputs': 3` opens a bracket it never "
                                                "closes; close it "
                                                "(--gin.TASK_FEATURE_LENGTHS=...)"),
])
def test_a_binding_gin_cannot_parse_is_one_line_naming_it(tmp_path, monkeypatch, capsys, flag,
                                                          expected):
  monkeypatch.chdir(tmp_path)
  assert cli.main(["train", "--gin_file=runs/embedded_default.gin", flag]) == 2
  captured = capsys.readouterr()
  assert captured.err == f"prompt-jax train: error: {expected}\n", captured.err
  assert captured.out == "" and os.listdir(tmp_path) == []


@pytest.mark.parametrize("flag,line", [
    ("--gin.MODEL_DIR=", "--gin.MODEL_DIR= has no value (an unset shell variable?): give it one, "
                         "--gin.MODEL_DIR=\"'/a/path'\""),
    ("--gin.TRAIN_STEPS= ", "--gin.TRAIN_STEPS= has no value (an unset shell variable?): give "
                            "it one, --gin.TRAIN_STEPS=<value>"),
])
def test_a_gin_flag_without_a_value_is_one_line(tmp_path, monkeypatch, capsys, flag, line):
  """`--gin.MODEL_DIR=$DIR` with DIR unset was gin's "Unable to parse value. (line 1)"."""
  monkeypatch.chdir(tmp_path)
  assert cli.main(["train", "--gin_file=runs/embedded_default.gin", flag]) == 2
  captured = capsys.readouterr()
  assert captured.err == f"prompt-jax train: error: {line}\n"
  assert captured.out == "" and os.listdir(tmp_path) == []


@pytest.mark.parametrize("command,gin_file,instead", [
    ("eval", "t5x/runs/embedded_default.gin", "--gin_file=runs/embedded_default.gin"),
    ("train", "t5x/runs/prompt_finetune.gin", "--gin_file=runs/prompt_finetune.gin"),
])
def test_a_t5x_run_file_is_one_line_naming_prompt_jax_s_own(tmp_path, monkeypatch, capsys,
                                                            command, gin_file, instead):
  """`prompt-jax eval --gin_file=t5x/runs/embedded_default.gin` (a t5x user's run file) was
  "error: AttributeError: Couldn't resolve selector train_script.train", exit 1."""
  monkeypatch.chdir(tmp_path)
  assert cli.main([command, f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{tmp_path}/m'"]) == 2
  captured = capsys.readouterr()
  assert captured.err == (f"prompt-jax {command}: error: gin file {gin_file} is for t5x's "
                          f"binaries (python -m t5x.train / eval / infer); prompt-jax takes its "
                          f"own run files: {instead}\n"), captured.err
  assert os.listdir(tmp_path) == []


def test_flags_before_the_command_are_its_flags_and_tasks_honours_verbose(capsys):
  """`prompt-jax --verbose tasks NAME` printed the whole usage, exit 2; `prompt-jax tasks NAME
  --verbose` printed no traceback (tasks ignored --verbose)."""
  for argv in (["--verbose", "tasks", "no_such_task"], ["tasks", "no_such_task", "--verbose"]):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "usage:" not in err, err
    assert err.splitlines()[-1].startswith(
        "prompt-jax tasks: error: unknown task or mixture 'no_such_task'"), err
  assert cli.main(["tasks", "no_such_task"]) == 2
  assert "Traceback" not in capsys.readouterr().err


def test_a_model_dir_one_level_off_names_the_run(tmp_path, capsys):
  """eval of a run's checkpoints/ (or checkpoints/<step>) or of a sweep's root said only that it
  holds no trained run."""
  for name in ("a", "b"):
    (tmp_path / name / "checkpoints" / "4").mkdir(parents=True)
    (tmp_path / name / "config.gin").write_text("MODEL_DIR = 'x'\n")
  run = f"(did you mean {tmp_path / 'a'}?)"
  for model_dir, near in ((tmp_path / "a" / "checkpoints", run),
                          (tmp_path / "a" / "checkpoints" / "4", run),
                          (tmp_path, "(it holds runs: a, b: a sweep's root?)")):
    assert cli.main(["eval", f"--gin.MODEL_DIR='{model_dir}'"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prompt-jax eval: error: MODEL_DIR {model_dir} holds no trained run "
                          f"(no config.gin) {near}: point it at a run's directory"), err
  assert cli.main(["eval", f"--gin.MODEL_DIR='{tmp_path / 'c'}'"]) == 2
  err = capsys.readouterr().err  # (it said "holds no trained run")
  assert err.startswith(f"prompt-jax eval: error: MODEL_DIR {tmp_path / 'c'} does not exist: "
                        f"point it at a run's directory"), err


def test_ensemble_eval_without_settings_says_how_to_take_a_member_s(tmp_path, capsys):
  """ensemble-eval reads no run's config.gin (its members may differ): given run members and
  no settings it named the missing macros only."""
  (tmp_path / "a").mkdir()
  (tmp_path / "a" / "config.gin").write_text("MODEL_DIR = 'x'\n")
  assert cli.main(["ensemble-eval", f"--gin.MODEL_DIR='{tmp_path}/ens'",
                   f"--gin.ENSEMBLE_PROMPTS=['{tmp_path}/a']"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("prompt-jax ensemble-eval: error: missing required macros "), err
  assert err.endswith(f"(ensemble-eval reads no run's config.gin: "
                      f"--gin_file={tmp_path}/a/config.gin gives that run's)\n"), err
  assert not os.path.exists(tmp_path / "ens")


@pytest.mark.parametrize("method,init_of", [
    ("residual", lambda spec: spec.init), ("wayward", lambda spec: spec.init),
    ("per_layer", lambda spec: spec.init), ("multitask", lambda spec: spec.init),
    ("mpt", lambda spec: spec.init), ("dpt_rank_probe", lambda spec: spec.init),
    ("idpg", lambda spec: spec.prompt_init), ("idpg_multilayer", lambda spec: spec.prompt_init)])
@pytest.mark.parametrize("initialiser", ["from_class_labels", "uniform"])
def test_an_initialiser_file_starts_every_methods_prompt_in_either_order(method, init_of,
                                                                         initialiser):
  """prompts/from_class_labels.gin (or uniform.gin) with residual.gin trained residual's own
  sampled-vocabulary P0 without a word (only plain prompt tuning read the file's init); a sweep
  over initialisers of such a method changed nothing."""
  from prompt_jax import run_setup  # pylint: disable=g-import-not-at-top
  for files in ([f"prompts/{method}.gin", f"prompts/{initialiser}.gin"],
                [f"prompts/{initialiser}.gin", f"prompts/{method}.gin"]):
    cli.parse_gin(["runs/embedded_default.gin", *files], ["CLASS_LABELS = ['a', 'b']"], [])
    init = init_of(run_setup.model_spec().prompt)
    assert init is not None and init.__qualname__ == f"{initialiser}.<locals>.spec", files


@pytest.mark.parametrize("files,expected", [
    (["prompts/dpt.gin", "prompts/residual.gin"],  # (residual trained with DPT's clip_norm)
     "--gin_file=prompts/dpt.gin and --gin_file=prompts/residual.gin each choose the prompt "
     "method"),
    (["prompts/from_class_labels.gin", "prompts/dpt.gin"],
     "--gin_file=prompts/from_class_labels.gin starts a [P, H] prompt, which prompts/dpt.gin's "
     "dpt does not have (it would be ignored)"),
    (["prompts/prefix.gin", "prompts/uniform.gin"],
     "--gin_file=prompts/uniform.gin starts a [P, H] prompt, which prompts/prefix.gin's "
     "deep_prefix does not have"),
    # prefix_ipt.gin binds no method itself (it includes prefix.gin): it was not seen as one
    (["prompts/prefix_ipt.gin", "prompts/from_class_labels.gin"],
     "--gin_file=prompts/from_class_labels.gin starts a [P, H] prompt, which "
     "prompts/prefix_ipt.gin's deep_prefix does not have"),
    (["prompts/prefix_ipt.gin", "prompts/residual.gin"],
     "--gin_file=prompts/prefix_ipt.gin and --gin_file=prompts/residual.gin each choose the "
     "prompt method")])
def test_method_files_that_cannot_go_together_are_one_line(files, expected):
  with pytest.raises(ConfigError) as e:
    layering.split_files(["runs/embedded_default.gin", *files], [])
  assert str(e.value).startswith(expected), e.value


def test_a_copied_runs_config_gin_needs_a_model_dir_and_a_users_own_does_not(tmp_path, capsys):
  """A run's config.gin (gin's resolved config, beside its checkpoints) names its MODEL_DIR: from
  a copy, without --gin.MODEL_DIR, eval read and wrote the original. A file of the user's own
  named config.gin that says where its run goes is not a run's."""
  own = tmp_path / "mine" / "config.gin"
  own.parent.mkdir()
  own.write_text(f"include 'runs/embedded_default.gin'\nMODEL_DIR = '{tmp_path / 'run'}'\n")
  assert cli.main(["describe", f"--gin_file={own}"]) == 0
  capsys.readouterr()
  copy = tmp_path / "copy"
  (copy / "checkpoints").mkdir(parents=True)
  (copy / "config.gin").write_text(f"# Macros:\n# ===\nMODEL_DIR = '{tmp_path / 'original'}'\n")
  assert cli.main(["describe", f"--gin_file={copy / 'config.gin'}"]) == 2
  err = capsys.readouterr().err
  assert err == (f"prompt-jax describe: error: --gin_file={copy / 'config.gin'} is the config.gin "
                 f"of a run in {tmp_path / 'original'} (MODEL_DIR), not of {copy}, where it lies "
                 f"(a moved or copied run): give --gin.MODEL_DIR=\"'{copy}'\" for this one, or a "
                 f"MODEL_DIR of your own for the results (with --gin.CHECKPOINT_PATH=\"'{copy}/"
                 f"checkpoints/<step>'\")\n"), err
