"""`prompt-jax inspect`: nearest vocabulary rows by cosine, singular values and effective ranks,
the spectrum plot, and a DPT rank-probe run's positive-count curve from its TensorBoard events
(issue 9, item 4 and acceptance 3)."""
import contextlib
import io
import json
import os
import re

import jax
import numpy as np
import pytest

from prompt_jax import checkpoints
from prompt_jax import cli
from prompt_jax import run_setup
from prompt_jax.errors import ConfigError
from prompt_jax.evaluation import inspect as inspect_lib
from prompt_jax.models import get_config
from prompt_jax.prompts import initializers
from prompt_jax.prompts import specs
from prompt_jax.train import run_dir
from tests import numerics
from tests.train import common

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(list(argv))
  return code, out.getvalue(), err.getvalue()


def _is_png(path):
  with open(path, "rb") as f:
    return f.read(8) == PNG_MAGIC and os.path.getsize(path) > 1000


# ===== the numbers =====

def test_entropy_rank_is_one_for_rank_one_and_r_for_r_equal_singular_values():
  rng = np.random.RandomState(0)
  u, _ = np.linalg.qr(rng.randn(12, 12))
  v, _ = np.linalg.qr(rng.randn(20, 20))
  for r in (1, 3, 7):
    s = np.zeros(12)
    s[:r] = 2.5
    m = u @ np.diag(s) @ v[:12]  # [12, 20] with r equal singular values 2.5
    sv = inspect_lib.singular_values(m)
    assert inspect_lib.numerical_rank(sv, m.shape) == r
    # exp(H(uniform over r)) = r; the zero singular values (~1e-15) add ~1e-14 * log terms
    assert abs(inspect_lib.entropy_effective_rank(sv) - r) < 1e-9
  # Roy & Vetterli's definition on a worked case: s = (3, 1) -> p = (3/4, 1/4).
  expected = np.exp(-(0.75 * np.log(0.75) + 0.25 * np.log(0.25)))
  assert inspect_lib.entropy_effective_rank(np.array([3.0, 1.0])) == pytest.approx(expected,
                                                                                 rel=1e-15)


def test_cosine_neighbours_match_a_brute_force_ranking():
  rng = np.random.RandomState(1)
  table = rng.randn(300, 16).astype(np.float32)
  table[7] = 0.0  # an all-zero row: cosine 0 with anything, never NaN
  prompt = rng.randn(5, 16).astype(np.float32)
  prompt[2] = 3.0 * table[42]  # a scaled vocabulary row: cosine 1, first
  ids, cos = inspect_lib.cosine_neighbours(prompt, table, k=4)
  t64, p64 = table.astype(np.float64), prompt.astype(np.float64)
  norms = np.maximum(np.linalg.norm(t64, axis=1), 1e-30)
  brute = (p64 @ t64.T) / np.linalg.norm(p64, axis=1)[:, None] / norms[None, :]
  # inspect ranks in float32 (for speed on a 32k x 4096 table), the brute force in float64: two
  # programs. Each row's ids agree up to the first rank whose float64 gap to the next is within
  # twice the derived float32 bound (tests/numerics.py); here no gap is (asserted).
  unit_t = (t64 / norms[:, None]).astype(np.float32)
  sims32 = (p64 / np.linalg.norm(p64, axis=1)[:, None]).astype(np.float32) @ unit_t.T
  limit = numerics.bound(sims32, brute)
  ranked = -np.sort(-brute, axis=1)[:, :5]
  close = ranked[:, :4] - ranked[:, 1:] <= 2 * limit  # [P, 4]
  first = np.where(close.any(1), close.argmax(1), 4)
  want = np.argsort(-brute, axis=1, kind="stable")[:, :4]
  for row, upto in enumerate(first):
    np.testing.assert_array_equal(ids[row, :upto], want[row, :upto])
  assert (first == 4).all(), (first, limit)  # the check above was whole on this data
  np.testing.assert_allclose(cos, np.take_along_axis(brute, ids, axis=1), rtol=0, atol=1e-12)
  assert ids[2, 0] == 42 and cos[2, 0] == pytest.approx(1.0, abs=1e-12)


# ===== acceptance 3: class-label initialisation shows its labels (real T5 vocabulary) =====

def test_class_label_prompt_shows_its_labels_among_nearest_neighbours(spm_path, tmp_path):
  from prompt_jax import vocab  # pylint: disable=g-import-not-at-top
  vocabulary = vocab.get_vocabulary(str(spm_path))
  # A random frozen table of T5's real shape [32128, H] (H = 256 keeps it cheap): with random
  # rows, a label's mean subword embedding is nearest to exactly its own subwords (cosine
  # ~1/sqrt(n) for n subwords, vs ~sqrt(2 ln V / H) ~ 0.2 for the best unrelated row).
  table = np.random.RandomState(0).randn(32128, 256).astype(np.float32)
  labels = ["entailment", "contradiction", "neutral", "yes", "no"]
  init = initializers.from_class_labels(labels)(embedding=table, vocabulary=vocabulary)
  prompt = np.asarray(init(jax.random.PRNGKey(0), (8, 256)))  # [P, H], rows 0..4 the labels
  path = tmp_path / "cb_prompt.npy"
  np.save(path, prompt)
  result = inspect_lib.inspect_prompt(np.load(path), table, vocabulary,
                                      str(tmp_path / "cb_prompt"), top_k=5)
  for position, label in enumerate(labels):
    pieces = list(vocabulary.encode(label))
    assert sorted(result.neighbour_ids[position, :len(pieces)]) == sorted(pieces), label
    texts = result.neighbour_texts[position][:len(pieces)]
    # The label word reads off its pieces ('▁' starts a word): '▁yes'; '▁', 'en', 'tail', 'ment'.
    in_order = [vocabulary.tokenizer.id_to_piece(p) for p in pieces]
    assert "".join(in_order) == "▁" + label and sorted(texts) == sorted(in_order), texts
    if len(pieces) == 1:  # a one-piece label is the word itself, cosine 1
      assert texts == ["▁" + label]
      assert result.neighbour_cosines[position, 0] == pytest.approx(1.0)
  assert sorted(os.listdir(tmp_path)) == ["cb_prompt.npy", "cb_prompt_inspect.json",
                                          "cb_prompt_inspect.md", "cb_prompt_spectrum.png"]
  assert _is_png(tmp_path / "cb_prompt_spectrum.png")
  report = json.loads((tmp_path / "cb_prompt_inspect.json").read_text())
  assert report["neighbours"][3][0] == {"id": vocabulary.encode("yes")[0], "text": "▁yes",
                                        "cosine": pytest.approx(1.0)}
  assert "| 3 | `▁yes`" in (tmp_path / "cb_prompt_inspect.md").read_text()


# ===== the CLI: a rank-probe run, a bare .npy =====

@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
  """3 steps of the DPT rank probe (P = 6) on the embedded default, stats every step."""
  model_dir = str(tmp_path_factory.mktemp("probe") / "run")
  code, _, err = run_cli(["train"] + common.flags(model_dir, 3, "--gin_file=prompts/dpt_rank_probe.gin",
                                                  "--gin.PROMPT_LENGTH=6"))
  assert code == 0, err
  return model_dir


def _events(model_dir, tag):
  """{step: value} read independently of inspect (TensorFlow's summary iterator)."""
  return common.tensorboard_scalars(model_dir, tag)


def test_inspect_of_a_rank_probe_run_plots_its_spectrum_and_positive_count(probe_run):
  model_dir = probe_run
  code, out, err = run_cli(["inspect", f"--gin.MODEL_DIR='{model_dir}'", "--top_k=3"])
  assert code == 0, err
  stem = os.path.join(model_dir, "inspect", "prompt_step3")
  files = [stem + s for s in ("_spectrum.png", "_rank_probe.png", "_inspect.json",
                              "_inspect.md")]
  assert out.splitlines()[-1] == "wrote " + ", ".join(files)
  assert all(_is_png(f) for f in files[:2])
  report = json.loads(open(stem + "_inspect.json").read())
  # The curve is the tag the probe logs, at every step (read here by another reader).
  logged = _events(model_dir, "dpt_rank_probe/positive_singular_values")
  assert sorted(logged) == [1, 2, 3]
  assert report["rank_probe"]["steps"] == [1, 2, 3]
  assert report["rank_probe"]["positive_singular_values"] == [logged[s] for s in (1, 2, 3)]
  assert report["rank_probe"]["tag"] in specs.dpt_rank_probe(length=6).summaries(
      {"encoder": {"prompt": {"prompt": _probe_params(model_dir)}}})
  # The spectrum is the folded prompt's (export --format=npy writes the same fold).
  code, _, err = run_cli(["export", f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 0, err
  prompt = np.load(os.path.join(model_dir, "export", "prompt_step3.npy"))
  s = np.linalg.svd(prompt.astype(np.float64), compute_uv=False)
  # The same float64 SVD of the same float32 array: the same program, so equal.
  np.testing.assert_array_equal(report["singular_values"], s)
  assert report["numerical_rank"] == int((s > s[0] * 64 * np.finfo(np.float32).eps).sum())
  assert len(report["neighbours"]) == 6 and all(len(n) == 3 for n in report["neighbours"])
  assert "effective rank: " in out and "(Roy & Vetterli entropy rank) of min(P, H) = 6" in out
  assert "rank probe: positive singular values " in out


def _probe_params(model_dir):
  run = run_dir.resolve(model_dir)
  from prompt_jax.evaluation import run as run_lib  # pylint: disable=g-import-not-at-top
  flat = run_lib.checkpoint_params(run.checkpoint)
  prefix = "encoder/prompt/prompt/"
  return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}


def test_inspect_of_a_prompt_file_writes_beside_it(tmp_path):
  table = checkpoints.load_array(_embedded_path(), "token_embedder/embedding")  # [260, 64]
  letters = "prompt"
  ids = [ord(c) + 3 for c in letters]  # the embedded task's byte vocabulary: id = byte + 3
  path = tmp_path / "letters.npy"
  np.save(path, 2.0 * table[ids])  # rows that are scaled vocabulary rows: cosine 1
  code, out, err = run_cli(["inspect", f"--prompt={path}", "--gin_file=runs/embedded_default.gin"])
  assert code == 0, err
  report = json.loads((tmp_path / "letters_inspect.json").read_text())
  assert [n[0]["text"] for n in report["neighbours"]] == list(letters)
  assert [n[0]["id"] for n in report["neighbours"]] == ids
  assert out.splitlines()[-1].startswith(f"wrote {tmp_path}/letters_spectrum.png, ")
  assert "  0  'p' 1.000" in out


def _embedded_path():
  from prompt_jax.embedded import embedded_checkpoint_path  # pylint: disable=g-import-not-at-top
  return embedded_checkpoint_path()


# ===== bad input: one line, nothing written =====

CONFIG = get_config("t5_1_1_small", emb_dim=64, num_heads=4, head_dim=16, mlp_dim=256,
                    num_encoder_layers=2, num_decoder_layers=2, vocab_size=260)


@pytest.mark.parametrize("spec,message", [
    (specs.idpg_prompt(length=4, bottleneck=8), "IDPG generates its prompt from each input"),
    (specs.deep_prefix(length=3, hidden=16), "DeepPrefix trains key/value prefixes"),
    (specs.per_layer_prompt(length=4), "PerLayer has one prompt per encoder layer"),
    (specs.mpt_prompt(length=4, num_tasks=2), r"MPT has one prompt per task \(NUM_TASKS=2\)"),
], ids=["idpg", "deep_prefix", "per_layer", "mpt"])
def test_inspect_refuses_methods_without_an_input_embedding_prompt(probe_run, spec, message):
  model = run_setup.ModelSpec(config=CONFIG, prompt=spec, trainable_regex=spec.trainable_regex)
  before = sorted(os.listdir(probe_run))
  with pytest.raises(ConfigError, match=f"^{message}"):
    inspect_lib.inspect(model_dir=probe_run, initial_checkpoint_path=_embedded_path(),
                        model=model, output_dir=os.path.join(probe_run, "refused"))
  assert sorted(os.listdir(probe_run)) == before


@pytest.mark.parametrize("argv,message", [
    ([], "nothing to inspect: give --prompt=FILE.npy or --gin.MODEL_DIR"),
    (["--prompt=/nonexistent/p.npy"], "--prompt /nonexistent/p.npy does not exist"),
    (["--top_k=0", "--prompt=/x.npy"], "--top_k must be >= 1, got 0"),
], ids=["nothing", "missing_file", "top_k"])
def test_cli_bad_input_is_one_line(argv, message):
  code, out, err = run_cli(["inspect", "--gin_file=runs/embedded_default.gin"] + argv)
  _assert_one_line(code, out, err, message)


def _assert_one_line(code, out, err, message):
  assert code == 2 and out == ""
  assert err == f"prompt-jax inspect: error: {message}" + err[len(
      f"prompt-jax inspect: error: {message}"):] and err.count("\n") == 1, err


def test_an_output_dir_under_a_file_is_one_line(tmp_path):
  prompt, in_the_way = tmp_path / "p.npy", tmp_path / "a_file"
  np.save(prompt, np.ones((4, 64), np.float32))
  in_the_way.write_text("")
  code, out, err = run_cli(["inspect", f"--prompt={prompt}", f"--output_dir={in_the_way}/sub",
                            "--gin_file=runs/embedded_default.gin"])
  _assert_one_line(code, out, err, f"inspect output {in_the_way}/sub/p_*: cannot create the "
                                   f"directory {in_the_way}/sub")


def test_a_prompt_of_another_width_is_refused(tmp_path):
  path = tmp_path / "wide.npy"
  np.save(path, np.ones((4, 32), np.float32))
  code, _, err = run_cli(["inspect", f"--prompt={path}", "--gin_file=runs/embedded_default.gin"])
  assert code == 2 and err == ("prompt-jax inspect: error: the prompt is [4, 32] but the frozen "
                               "model's embeddings are 64-d: inspect it with the model it was "
                               "trained for\n")
  assert os.listdir(tmp_path) == ["wide.npy"]


def test_vocabulary_flag_decodes_with_a_sentencepiece_model(spm_path, tmp_path):
  """No run, no task: --prompt, INITIAL_CHECKPOINT_PATH and --vocabulary are all it needs."""
  from prompt_jax import vocab  # pylint: disable=g-import-not-at-top
  table = np.random.RandomState(0).randn(32128, 8).astype(np.float32)  # T5's padded rows
  backbone = checkpoints.save(str(tmp_path / "t5"), {"token_embedder/embedding": table})
  path = tmp_path / "p.npy"
  np.save(path, table[[100, 7]])
  code, out, err = run_cli(["inspect", f"--prompt={path}", f"--vocabulary={spm_path}",
                            f"--gin.INITIAL_CHECKPOINT_PATH='{backbone}'",
                            f"--output_dir={tmp_path / 'out'}"])
  assert code == 0, err
  pieces = vocab.get_vocabulary(str(spm_path)).tokenizer
  report = json.loads((tmp_path / "out" / "p_inspect.json").read_text())
  assert [n[0]["text"] for n in report["neighbours"]] == [pieces.id_to_piece(100),
                                                          pieces.id_to_piece(7)]
  assert out.splitlines()[-1].startswith(f"wrote {tmp_path / 'out' / 'p_spectrum.png'}, ")
  assert not any(l.startswith("note:") for l in out.splitlines())  # the macros it reads are used


def test_a_vocabulary_larger_than_the_embedding_table_is_refused(spm_path, tmp_path):
  """T5's 32k SentencePiece model with the embedded model's 260-row table decoded its byte rows
  as SentencePiece pieces ('▁1', '▁și'): wrong neighbours, exit 0."""
  table = checkpoints.load_array(_embedded_path(), "token_embedder/embedding")  # [260, 64]
  path = tmp_path / "p.npy"
  np.save(path, table[[100, 7]])
  code, out, err = run_cli(["inspect", f"--prompt={path}", f"--vocabulary={spm_path}",
                            f"--gin.INITIAL_CHECKPOINT_PATH='{_embedded_path()}'"])
  _assert_one_line(code, out, err, "the vocabulary has 32100 entries but the frozen model's "
                                   "embedding table only 260 rows: it is not this model's "
                                   "vocabulary")
  assert os.listdir(tmp_path) == ["p.npy"]


@pytest.mark.parametrize("shape", [(0, 64), (4, 0)])
def test_an_empty_prompt_is_refused(tmp_path, shape):
  path = tmp_path / "p.npy"
  np.save(path, np.zeros(shape, np.float32))
  code, out, err = run_cli(["inspect", f"--prompt={path}", "--gin_file=runs/embedded_default.gin"])
  _assert_one_line(code, out, err, f"--prompt {path} has shape {shape}: an empty prompt has "
                                   f"nothing to inspect")
  assert os.listdir(tmp_path) == ["p.npy"]


def test_an_all_zero_prompt_is_refused(tmp_path):
  """Every cosine is 0: it listed arbitrary rows as the nearest words, exit 0."""
  path = tmp_path / "p.npy"
  np.save(path, np.zeros((8, 64), np.float32))
  code, out, err = run_cli(["inspect", f"--prompt={path}", "--gin_file=runs/embedded_default.gin"])
  _assert_one_line(code, out, err, "the prompt [8, 64] is all zeros: it has no direction to "
                                   "compare with the vocabulary (was it trained?)")
  assert os.listdir(tmp_path) == ["p.npy"]


def test_top_k_below_three_says_how_many_it_shows(tmp_path):
  """--top_k=1 showed one neighbour per position under a '(top 3 per position)' header."""
  table = checkpoints.load_array(_embedded_path(), "token_embedder/embedding")
  path = tmp_path / "p.npy"
  np.save(path, table[[100, 7]])
  code, out, err = run_cli(["inspect", f"--prompt={path}", "--top_k=1",
                            "--gin_file=runs/embedded_default.gin"])
  assert code == 0, err
  assert "prompt [2, 64]: nearest vocabulary rows by cosine (top 1 per position)" in out
  assert re.search(r"^ +0  '\S+' 1\.000$", out, re.M), out


def test_a_prompt_file_without_a_vocabulary_is_refused(tmp_path, monkeypatch):
  monkeypatch.delenv("PROMPT_JAX_SPM_PATH", raising=False)
  path = tmp_path / "p.npy"
  np.save(path, np.ones((2, 64), np.float32))
  code, out, err = run_cli(["inspect", f"--prompt={path}",
                            f"--gin.INITIAL_CHECKPOINT_PATH='{_embedded_path()}'"])
  _assert_one_line(code, out, err, "inspect decodes the neighbours with a vocabulary: give "
                                   "--vocabulary=spiece.model")
  assert os.listdir(tmp_path) == ["p.npy"]
  # A missing file is said first (it was said only once the vocabulary was given).
  code, out, err = run_cli(["inspect", f"--prompt={tmp_path / 'q.npy'}",
                            f"--gin.INITIAL_CHECKPOINT_PATH='{_embedded_path()}'"])
  _assert_one_line(code, out, err, f"--prompt {tmp_path / 'q.npy'} does not exist")


@pytest.mark.parametrize("kind", ["corrupt_file", "directory"])
def test_a_vocabulary_that_is_not_a_sentencepiece_model_is_one_line(tmp_path, kind):
  """seqio reads the .model lazily: a bad one was an exit-1 DecodeError / FailedPrecondition at
  the first decoded neighbour; it is one line (exit 2) and nothing is written."""
  prompt = tmp_path / "p.npy"
  np.save(prompt, np.ones((2, 64), np.float32))
  bad = tmp_path / "bad.model"
  if kind == "directory":
    bad.mkdir()
  else:
    bad.write_bytes(b"not a sentencepiece model\n")
  code, out, err = run_cli(["inspect", f"--prompt={prompt}", f"--vocabulary={bad}",
                            f"--gin.INITIAL_CHECKPOINT_PATH='{_embedded_path()}'"])
  _assert_one_line(code, out, err, f"--vocabulary {bad} is not a SentencePiece model that can "
                                   f"be read (")
  assert sorted(os.listdir(tmp_path)) == ["bad.model", "p.npy"]


def test_a_title_the_font_cannot_draw_prints_no_warning(tmp_path):
  """A run dir named 模型: matplotlib printed four 'UserWarning: Glyph 27169 ... missing from
  font(s)' lines with their source lines; the figure is written (the title in boxes)."""
  import warnings  # pylint: disable=g-import-not-at-top
  from prompt_jax.evaluation import inspect as inspect_lib  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "s.png")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    inspect_lib.plot_spectrum(np.array([3.0, 1.0, 0.1]), 0.5, path, "模型 prompt")
  assert not [w for w in caught if "Glyph" in str(w.message)], [str(w.message) for w in caught]
  assert os.path.getsize(path) > 0
