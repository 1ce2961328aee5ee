"""paths.label: the one label result files (eval's PROMPT_FILE results, results on another frozen
model) give a path."""
import os

from prompt_jax import paths


def test_label_tells_apart_paths_of_one_name_and_names_a_path_one_way(tmp_path, monkeypatch):
  a, b = tmp_path / "a" / "prompt.npy", tmp_path / "b" / "prompt.npy"
  assert paths.label(str(a)).startswith("prompt.npy-")
  assert paths.label(str(a), keep_extension=False).startswith("prompt-")
  assert paths.label(str(a)) != paths.label(str(b))  # one name, two files: two results
  # One directory written three ways is one label (a result is found again, not duplicated).
  monkeypatch.chdir(tmp_path)
  assert paths.label("a/ckpt/") == paths.label("a/ckpt") == paths.label(str(tmp_path / "a/ckpt"))
  label = paths.label("gs://bucket/t5.1.1.lm100k.base")  # a URL as it is; its dots kept
  assert label.startswith("t5.1.1.lm100k.base-") and len(label.split("-")[-1]) == 8
  assert os.sep not in label
