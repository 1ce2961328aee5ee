"""Prompt recycling (issue 16, acceptance 6 and the different-vocabularies bad input)."""
import io
import contextlib
import json
import os

import numpy as np
import pytest

from prompt_jax import checkpoints
from prompt_jax import cli
from prompt_jax.models import T5, T5Config
from prompt_jax.prompts import recycling
from tests.prompts import helpers
from tests.train import common

VOCAB = 96
SOURCE = T5Config(vocab_size=VOCAB, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                  num_encoder_layers=1, num_decoder_layers=1, mlp_activations=("gelu", "linear"),
                  logits_via_embedding=False, dropout_rate=0.0)
TARGET = SOURCE.replace(emb_dim=24, num_heads=3)


def _params(config, seed, embedding=None):
  params = helpers.init(T5(config), seed=seed, enc=np.ones((1, 4), np.int32))
  if embedding is not None:
    params = dict(params, token_embedder={"embedding": embedding.astype(np.float32)})
  return params


def _cli(argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(["recycle", *argv])
  return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """Two small T5s sharing a vocabulary: the target's embedding table is source @ M."""
  root = tmp_path_factory.mktemp("recycle")
  rng = np.random.RandomState(0)
  source = _params(SOURCE, 0)
  table = np.asarray(source["token_embedder"]["embedding"], np.float64)  # [V, 16]
  m = rng.randn(16, 24)  # the known linear map
  mapped = _params(TARGET, 1, table @ m)
  unrelated = _params(TARGET, 2)
  paths = {name: checkpoints.save(str(root / name), p) for name, p in
           (("source", source), ("mapped", mapped), ("unrelated", unrelated))}
  other_vocab = _params(SOURCE.replace(vocab_size=VOCAB + 32), 3)
  paths["other_vocab"] = checkpoints.save(str(root / "other_vocab"), other_vocab)
  prompt = rng.randn(5, 16).astype(np.float32)
  np.save(root / "prompt.npy", prompt)
  return root, paths, table, m, prompt


def test_vec2vec_linear_recovers_a_known_map(models):
  """Acceptance 6: the target table is a known linear map of the source's, so vec2vec-linear
  recovers it and the recycled prompt is the mapped prompt (1e-4), through `prompt-jax recycle`."""
  root, paths, table, m, prompt = models
  out_dir = root / "out_mapped"
  code, out, err = _cli([f"--prompt={root / 'prompt.npy'}", f"--source={paths['source']}",
                         f"--target={paths['mapped']}", f"--output_dir={out_dir}",
                         "--num_words=80", "--word_offset=10"])
  assert code == 0, err
  assert out.strip().splitlines()[-1].startswith("recycled prompts and fit errors in ")
  report = json.loads((out_dir / "recycle.json").read_text())
  assert report["rows"] == [10, 89]
  recycled = np.load(out_dir / "vec2vec_linear.npy")
  expected = prompt.astype(np.float64) @ m  # [5, 24]
  assert recycled.shape == (5, 24) and recycled.dtype == np.float32
  np.testing.assert_allclose(recycled, expected, atol=1e-4, rtol=0)
  # The tables were saved as float32: the map holds to float32 rounding, so the fit is ~0.
  assert report["vec2vec_linear"]["fit_error"] < 1e-9
  for method in recycling.METHODS:
    assert os.path.exists(report[method]["path"]) and report[method]["shape"] == [5, 24]
    assert np.isfinite(report[method]["fit_error"])
  # A linear combination of source rows mapped by M is the mapped prompt as well when the rows
  # span the source space (80 rows >= 16 dims): the prompt is reconstructed exactly.
  np.testing.assert_allclose(np.load(out_dir / "linear_combination.npy"), expected, atol=1e-4)
  assert report["linear_combination"]["fit_error"] < 1e-9
  # The MLP learns an approximation: its error is reported, far above the exact linear fit.
  assert report["vec2vec_mlp"]["fit_error"] > report["vec2vec_linear"]["fit_error"]


def test_unrelated_tables_run_and_report_the_fit_error(models):
  root, paths, _, _, _ = models
  out_dir = root / "out_unrelated"
  code, out, err = _cli([f"--prompt={root / 'prompt.npy'}", f"--source={paths['source']}",
                         f"--target={paths['unrelated']}", f"--output_dir={out_dir}",
                         "--num_words=80", "--word_offset=10",
                         "--methods=vec2vec_linear,linear_combination"])
  assert code == 0, err
  report = json.loads((out_dir / "recycle.json").read_text())
  assert report["vec2vec_linear"]["fit_error"] > 0.05  # no linear map between random tables
  assert "vec2vec_linear" in out and "fit error" in out
  assert not os.path.exists(out_dir / "vec2vec_mlp.npy")


def test_different_vocabularies_are_refused_in_one_line(models):
  root, paths, _, _, _ = models
  out_dir = root / "out_bad"
  code, _, err = _cli([f"--prompt={root / 'prompt.npy'}", f"--source={paths['source']}",
                       f"--target={paths['other_vocab']}", f"--output_dir={out_dir}",
                       "--num_words=80", "--word_offset=10"])
  assert code == 2
  lines = err.strip().splitlines()
  assert len(lines) == 1, lines
  assert lines[0] == ("prompt-jax recycle: error: the source model's vocabulary has 96 entries "
                      "and the target's 128: recycling needs two models that share one "
                      "vocabulary")
  assert not os.path.exists(out_dir)  # nothing written


def test_other_bad_inputs(models, tmp_path):
  root, paths, _, _, _ = models
  base = [f"--prompt={root / 'prompt.npy'}", f"--source={paths['source']}",
          f"--target={paths['mapped']}", f"--output_dir={tmp_path / 'o'}"]
  code, _, err = _cli(base)  # the reference's 1000 + 4000 rows do not fit a 96-entry vocabulary
  assert code == 2 and "exceeds the vocabulary's 96 entries" in err
  code, _, err = _cli(base + ["--num_words=80", "--methods=vec2vec_cubic"])
  assert code == 2 and "unknown recycler 'vec2vec_cubic'" in err
  code, _, err = _cli(base + ["--num_words=80", "--methods=vec2vec_linear,vec2vec_linear"])
  assert code == 2 and "--methods names vec2vec_linear twice" in err, err  # (ran it twice)
  assert not os.path.exists(tmp_path / "o")
  wide = tmp_path / "wide.npy"
  np.save(wide, np.zeros((3, 7), np.float32))
  code, _, err = _cli([f"--prompt={wide}"] + base[1:] + ["--num_words=80"])
  assert code == 2 and "expected [P, 16]" in err
  spm_a, spm_b = tmp_path / "a.model", tmp_path / "b.model"
  spm_a.write_bytes(b"one"), spm_b.write_bytes(b"two")
  code, _, err = _cli(base + ["--num_words=80", f"--source_vocabulary={spm_a}",
                              f"--target_vocabulary={spm_b}"])
  assert code == 2 and "differ: recycling needs two models that share one vocabulary" in err


def _bad_arrays(tmp_path):
  pickled = tmp_path / "pickled.npy"
  np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
  archive = tmp_path / "p.npz"
  np.savez(archive, prompt=np.zeros((5, 16), np.float32))
  text = tmp_path / "text.npy"
  text.write_text("not an array")
  words = tmp_path / "words.npy"
  np.save(words, np.array([["a", "b"]]))
  return [(pickled, "is not a readable .npy array (it holds pickled Python objects)"),
          (archive, "is an .npz archive"),
          (text, "is not a .npy array file"), (words, "holds <U1 values, not numbers")]


def _one_error_line(err):
  lines = [line for line in err.splitlines() if ": error:" in line]
  assert len(lines) == 1 and lines[0].startswith("prompt-jax recycle: error: "), err
  assert "Traceback" not in err, err
  return lines[0]


def test_unreadable_prompt_or_table_is_one_line_exit_2(models, tmp_path):
  """A --prompt (or a .npy --source / --target) that is a pickled object array, an .npz, no .npy
  at all or not numbers: one actionable line, exit 2, nothing written."""
  root, paths, _, _, _ = models
  out_dir = tmp_path / "o"
  for bad, message in _bad_arrays(tmp_path):
    code, out, err = _cli([f"--prompt={bad}", f"--source={paths['source']}",
                           f"--target={paths['mapped']}", f"--output_dir={out_dir}",
                           "--num_words=80"])
    assert code == 2, err
    line = _one_error_line(err)
    assert f"--prompt {bad} {message}" in line and "[P, H] prompt" in line, line
    assert "allow_pickle" not in line and not out and not out_dir.exists()
    if str(bad).endswith(".npz"):  # a --source / --target not ending .npy is a checkpoint
      continue
    for flag in ("source", "target"):
      argv = {"prompt": root / "prompt.npy", "source": paths["source"],
              "target": paths["mapped"], flag: bad}
      code, _, err = _cli([f"--{k}={v}" for k, v in argv.items()]
                          + [f"--output_dir={out_dir}", "--num_words=80"])
      assert code == 2, err
      line = _one_error_line(err)
      assert f"--{flag} {bad} {message}" in line and "[V, H] embedding table" in line, line
      assert not out_dir.exists()


def test_missing_vocabulary_file_and_a_file_in_the_way_are_one_line(models, tmp_path):
  root, paths, _, _, _ = models
  base = [f"--prompt={root / 'prompt.npy'}", f"--source={paths['source']}",
          f"--target={paths['mapped']}", "--num_words=80", "--word_offset=10"]
  code, _, err = _cli(base + [f"--output_dir={tmp_path / 'o'}",
                              f"--source_vocabulary={tmp_path / 'nope.model'}",
                              f"--target_vocabulary={tmp_path / 'nope.model'}"])
  assert code == 2 and "--source_vocabulary" in _one_error_line(err)
  in_the_way = tmp_path / "a_file"
  in_the_way.write_text("")
  code, _, err = _cli(base + [f"--output_dir={in_the_way}"])
  assert code == 2 and f"--output_dir {in_the_way} is a file" in _one_error_line(err)
  code, _, err = _cli(base + [f"--output_dir={in_the_way}/sub"])  # was a NotADirectoryError
  assert code == 2 and "cannot create the directory" in _one_error_line(err)


def test_recyclers_directly():
  rng = np.random.RandomState(1)
  s = rng.randn(50, 8)
  with pytest.raises(ValueError, match="share one vocabulary"):
    recycling.recycle(rng.randn(2, 8), s, rng.randn(49, 8), "vec2vec_linear", np.arange(40))
  with pytest.raises(ValueError, match="exceeds"):
    recycling.select_rows(50, 45, 10)


def _contents(out_dir) -> dict:
  return {p: (out_dir / p).read_bytes() for p in os.listdir(out_dir)}


def _argv(models, name: str, methods: str, target: str = "mapped"):
  root, paths, _, _, _ = models
  return [f"--prompt={root / 'prompt.npy'}", f"--source={paths['source']}",
          f"--target={paths[target]}", f"--output_dir={root / name}", "--num_words=80",
          "--word_offset=10", f"--methods={methods}"]


def test_a_failing_method_writes_nothing(models, monkeypatch):
  """A recycle run stopped by its second method (Ctrl-C during the MLP's fit) used to leave the
  first method's .npy without a recycle.json describing it. Nothing is written now."""
  real = recycling.recycle

  def interrupted(prompt, source, target, method, rows):
    if method == "vec2vec_mlp":
      raise KeyboardInterrupt
    return real(prompt, source, target, method, rows)

  monkeypatch.setattr(recycling, "recycle", interrupted)
  code, _, err = _cli(_argv(models, "out_interrupted", "vec2vec_linear,vec2vec_mlp"))
  assert code == 130 and "interrupted" in err, (code, err)
  assert _contents(models[0] / "out_interrupted") == {}


def test_a_failed_write_writes_nothing(models, monkeypatch):
  """The write of the second method's .npy failing (a full disk) used to leave the first
  method's prompt without a recycle.json."""
  saved = common.fill_the_disk_after_one_save(monkeypatch)
  code, _, err = _cli(_argv(models, "out_disk_full", "vec2vec_linear,linear_combination"))
  assert code == 1 and "No space left on device); nothing was replaced" in err, (code, err)
  assert len(saved) == 1
  assert _contents(models[0] / "out_disk_full") == {}


def test_an_output_dir_of_another_recycle_is_refused(models):
  """A second recycle into the same OUTPUT_DIR from other inputs (here another --target) used to
  replace the first one's prompts. It is refused in one line, before any fit; the same inputs
  again (e.g. with one more method) add to the directory and its recycle.json."""
  out_dir = models[0] / "out_twice"
  assert _cli(_argv(models, "out_twice", "vec2vec_linear"))[0] == 0
  before = _contents(out_dir)
  code, _, err = _cli(_argv(models, "out_twice", "vec2vec_linear", target="unrelated"))
  assert code == 2 and _one_error_line(err) == (
      f"prompt-jax recycle: error: --output_dir {out_dir} already holds vec2vec_linear.npy "
      f"of another recycle (recycle.json records other --prompt/--source/--target/"
      f"--num_words/--word_offset); recycle never replaces it: pass another --output_dir"), err
  assert _contents(out_dir) == before
  # A file of the user's own in the way, with no recycle.json, is refused as well.
  mine = models[0] / "out_mine"
  mine.mkdir()
  (mine / "linear_combination.npy").write_bytes(b"mine")
  code, _, err = _cli(_argv(models, "out_mine", "linear_combination"))
  assert code == 2 and "holds linear_combination.npy that recycle did not write" in err, err
  assert (mine / "linear_combination.npy").read_bytes() == b"mine"
  # The same inputs with one more method: both in recycle.json, the first file the same.
  code, _, err = _cli(_argv(models, "out_twice", "vec2vec_linear,linear_combination"))
  assert code == 0, err
  report = json.loads((out_dir / "recycle.json").read_text())
  assert {"vec2vec_linear", "linear_combination"} <= set(report)
  assert (out_dir / "vec2vec_linear.npy").read_bytes() == before["vec2vec_linear.npy"]
