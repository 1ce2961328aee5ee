"""The local-files data dir is one setting: --data_dir or DATA_DIR, honoured by every task."""
import re

import pytest

import prompt_jax.tasks
from prompt_jax import cli

DESCRIBE = ["describe", "--gin_file=models/t5_1_1_small.gin", "--gin_file=runs/prompt_finetune.gin"]


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
  monkeypatch.delenv(prompt_jax.tasks.DATA_DIR_ENV, raising=False)
  yield
  prompt_jax.tasks.set_data_dir(None)


def test_gin_macro_sets_the_data_dir(tmp_path):
  assert cli.main(DESCRIBE + [f"--gin.DATA_DIR='{tmp_path}'"]) == 0
  assert prompt_jax.tasks.get_data_dir() == str(tmp_path)


def test_flag_wins_over_the_macro(tmp_path):
  flag_dir = tmp_path / "flag"
  assert cli.main(DESCRIBE + [f"--gin.DATA_DIR='{tmp_path}'", f"--data_dir={flag_dir}"]) == 0
  assert prompt_jax.tasks.get_data_dir() == str(flag_dir)


def test_data_dir_reaches_a_task(shared_data):
  super_glue = shared_data("super_glue")
  assert cli.main(DESCRIBE + [f"--data_dir={super_glue.parent}"]) == 0
  task = prompt_jax.tasks.get_task("super_glue_cb_v102")
  ex = next(iter(task.source.get_dataset("validation", shuffle=False).as_numpy_iterator()))
  assert ex["premise"].decode().startswith("Valence the void-brain")


def test_a_run_records_its_data_dir(tmp_path):
  """--data_dir is part of the run: eval / infer given only MODEL_DIR read the same files."""
  from tests.train import common  # pylint: disable=g-import-not-at-top
  data_dir, model_dir = tmp_path / "data", tmp_path / "run"
  data_dir.mkdir()
  assert cli.main(["train", *common.flags(str(model_dir), 1), f"--data_dir={data_dir}"]) == 0
  # gin wraps a long value onto the next line (xdist's longer tmp paths: popen-gw0/...)
  recorded = re.sub(r"\\\n\s*", "", (model_dir / "config.gin").read_text())
  assert f"DATA_DIR = '{data_dir}'" in recorded
  prompt_jax.tasks.set_data_dir(None)
  assert cli.main(["describe", f"--gin.MODEL_DIR='{model_dir}'"]) == 0
  assert prompt_jax.tasks.get_data_dir() == str(data_dir)
