"""`prompt-jax export --output`: what the user names is what is written, or one line."""
import os

import numpy as np
import pytest

from tests.evaluation.test_ensemble import run_cli
from tests.train import common


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("export_output") / "run")
  code, _, err = run_cli(["train"] + common.flags(model_dir, 1))
  assert code == 0, err
  return model_dir


def test_npy_output_naming_a_directory_takes_the_array_under_its_default_name(trained_run,
                                                                              tmp_path):
  """`--output=DIR/` (new) or an existing directory: `<DIR>/prompt_step1.npy`, as under
  MODEL_DIR/export (it used to write a file named DIR, then was refused: a prefix run's several
  arrays could not be exported anywhere but MODEL_DIR/export)."""
  target = tmp_path / "exports"
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{trained_run}'",
                            f"--output={target}/"])
  assert code == 0, err
  assert out.startswith(f"wrote prompt [8, 64] float32 of checkpoint step 1 to {target}/"
                        f"prompt_step1.npy"), out
  np.testing.assert_array_equal(np.load(target / "prompt_step1.npy"),
                                common.prompt_at(trained_run, 1))
  # Again, into the directory that now exists (no slash): the file there is never replaced.
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{trained_run}'", f"--output={target}"])
  assert code == 2 and out == "", (out, err)
  assert err == (f"prompt-jax export: error: --output {target}: {target}/prompt_step1.npy "
                 f"already exists: export never replaces it; choose another directory or "
                 f"remove it first\n")
  assert os.listdir(target) == ["prompt_step1.npy"]


def test_several_arrays_go_into_an_output_directory_or_are_one_line(trained_run, tmp_path,
                                                                    monkeypatch):
  from prompt_jax.evaluation import export as export_lib  # pylint: disable=g-import-not-at-top
  stems = ("cross_prefix", "decoder_prefix", "prefix")  # deep prefix's
  monkeypatch.setattr(export_lib, "fold", lambda spec, config, params: {
      stem: np.full((2, 3), i, np.float32) for i, stem in enumerate(stems)})
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{trained_run}'",
                            f"--output={tmp_path / 'one.npy'}"])
  assert code == 2 and out == "" and os.listdir(tmp_path) == [], (out, err)
  assert err == (f"prompt-jax export: error: --output names one file but this method exports 3 "
                 f"arrays (cross_prefix, decoder_prefix, prefix): name a directory (--output="
                 f"{tmp_path / 'one.npy'}/) or leave --output out\n")
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{trained_run}'",
                            f"--output={tmp_path / 'kv'}/"])
  assert code == 0, err
  for i, stem in enumerate(stems):
    np.testing.assert_array_equal(np.load(tmp_path / "kv" / f"{stem}_step1.npy"),
                                  np.full((2, 3), i, np.float32))


def test_npy_output_naming_a_file_round_trips(trained_run, tmp_path):
  target = tmp_path / "sub" / "p.npy"
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{trained_run}'", f"--output={target}"])
  assert code == 0, err
  assert out.startswith("wrote prompt [8, 64] float32 of checkpoint step 1 to ")
  np.testing.assert_array_equal(np.load(target), common.prompt_at(trained_run, 1))
  assert os.listdir(target.parent) == ["p.npy"]


def test_peft_output_naming_a_new_directory_writes_the_adapter_there(trained_run, tmp_path):
  pytest.importorskip("safetensors")
  target = tmp_path / "adapter"
  code, _, err = run_cli(["export", "--format=peft", f"--gin.MODEL_DIR='{trained_run}'",
                          f"--output={target}/"])
  assert code == 0, err
  assert sorted(os.listdir(target)) == ["adapter_config.json", "adapter_model.safetensors"]


@pytest.mark.parametrize("name", ["x.npy", "adapter_model.safetensors"])
def test_peft_output_named_like_a_file_is_one_line_and_writes_nothing(trained_run, tmp_path,
                                                                      name):
  """`--format=peft --output=x.npy` wrote an adapter directory named x.npy."""
  target = tmp_path / name
  code, out, err = run_cli(["export", "--format=peft", f"--gin.MODEL_DIR='{trained_run}'",
                            f"--output={target}"])
  assert code == 2 and out == "", (code, out, err)
  suffix = os.path.splitext(name)[1]
  assert err.startswith(f"prompt-jax export: error: --output {target} names a {suffix} file, "
                        f"but --format=peft writes an adapter directory"), err
  assert err.count("\n") == 1 and ("--format=npy" in err) == (suffix == ".npy")
  assert os.listdir(tmp_path) == []


def test_a_failed_write_leaves_the_previous_export_set_whole(trained_run, monkeypatch):
  """Deep prefix exports several arrays (prefix, decoder_prefix, cross_prefix). A write that
  failed on the second one (a full disk) used to leave the first replaced by the new
  checkpoint's array beside the old second and third: a mix of two checkpoints."""
  from prompt_jax.evaluation import export as export_lib  # pylint: disable=g-import-not-at-top
  stems = ("cross_prefix", "decoder_prefix", "prefix")
  monkeypatch.setattr(export_lib, "fold", lambda spec, config, params: {
      stem: np.full((2, 3), i, np.float32) for i, stem in enumerate(stems)})
  code, _, err = run_cli(["export", f"--gin.MODEL_DIR='{trained_run}'"])
  assert code == 0, err
  export_dir = os.path.join(trained_run, "export")
  before = {f: np.load(os.path.join(export_dir, f)) for f in os.listdir(export_dir)
            if f.split("_step")[0] in stems}
  assert sorted(before) == [f"{stem}_step1.npy" for stem in stems]

  monkeypatch.setattr(export_lib, "fold", lambda spec, config, params: {
      stem: np.full((2, 3), 10 + i, np.float32) for i, stem in enumerate(stems)})
  saved = common.fill_the_disk_after_one_save(monkeypatch)
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{trained_run}'"])
  assert code == 1 and err.count("\n") == 1, (code, err)
  assert "No space left on device); nothing was replaced: free space" in err, err
  assert len(saved) == 1  # the first file was written before the second failed
  after = {f: np.load(os.path.join(export_dir, f)) for f in os.listdir(export_dir)
           if f.split("_step")[0] in stems}
  assert sorted(after) == sorted(before)  # no .tmp left behind
  for name, array in before.items():
    np.testing.assert_array_equal(after[name], array, err_msg=name)


def test_npy_output_named_neither_npy_nor_a_directory_is_one_line(trained_run, tmp_path):
  """`--output=out.txt` wrote an .npy array under a .txt name, exit 0."""
  target = tmp_path / "out.txt"
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{trained_run}'", f"--output={target}"])
  assert code == 2 and out == "" and os.listdir(tmp_path) == [], (code, out, err)
  assert err == (f"prompt-jax export: error: --output {target} names neither a .npy file nor a "
                 f"directory: give --output={target}.npy, or --output={target}/ for a "
                 f"directory\n")
