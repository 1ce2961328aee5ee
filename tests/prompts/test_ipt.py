"""IPT: random / pretrained lookup and encoder IPT; training, masks, the table's vocab check."""
import functools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax import cli
from prompt_jax.errors import ConfigError, RunError
from prompt_jax.models import T5
from prompt_jax.prompts import ipt, ipt_pretrain, seam
from prompt_jax.prompts.tuning import PromptTuning
from tests.prompts import helpers
from tests.prompts.test_tuning import BAD_NPY_REASONS, _bad_npy

P = 3
V = helpers.TINY.vocab_size


def _prompted(method, length):
  model = T5(helpers.TINY, prompt=seam.prompt_factory(method, length))
  return model, helpers.init_prompted(model)


def test_random_ipt_reads_its_table_at_the_input_tokens_and_masks_padding():
  model, params = _prompted(functools.partial(ipt.IPT, length=P, vocab_size=V), P)
  table = params["encoder"]["prompt"]["prompt"]["table"]
  enc, _, _ = helpers.batch()
  out = model.apply({"params": params}, enc, method=lambda m, t: m.encoder.prompt_module.prompt(
      t, m.token_embedder(t)))
  np.testing.assert_array_equal(out, table[enc[:, :P]])
  mask = model.apply({"params": params}, enc, method=T5.encoder_input_mask)
  # Example 1 is [10, 9, 1, 0, ...]: all 3 prompt positions real; a 2-token input masks one.
  np.testing.assert_array_equal(mask[1, :P], [1, 1, 1])
  short = jnp.array([[7, 1, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(
      model.apply({"params": params}, short, method=T5.encoder_input_mask)[0, :P], [1, 1, 0])
  after, _ = helpers.assert_trains_only(model, params, ["encoder/prompt/prompt/table"])
  helpers.assert_masks_right(model, after)


def test_pretrained_ipt_table_must_match_the_model_vocab(tmp_path):
  good, bad = tmp_path / "good.npy", tmp_path / "bad.npy"
  np.save(good, np.ones((V, 16), np.float32))
  np.save(bad, np.ones((V + 5, 16), np.float32))
  init = ipt.table_init(str(good), V, 16)
  np.testing.assert_array_equal(init(None, (V, 16)), np.ones((V, 16)))
  with pytest.raises(ConfigError, match=r"vocabulary \(69 rows\) differs from the model's "
                                        r"vocab_size=64"):
    ipt.table_init(str(bad), V, 16)


@pytest.mark.parametrize("kind", ["textcnn", "lstm", "mlp"])
def test_encoder_ipt_trains_only_its_encoder(kind):
  method = functools.partial(ipt.IPT, length=2, vocab_size=V, mode="encoder", encoder=kind,
                             rate=0.5, widths=(2, 3), filters=4, hidden=8)
  model, params = _prompted(method, 2)
  regex = r"encoder/prompt/prompt/text_encoder/.*"
  if kind == "textcnn":  # one encoder trained (each step compiles): the others run forward
    params, _ = helpers.assert_trains_only(model, params, ["encoder/prompt/prompt/text_encoder/"],
                                           regex=regex)
  helpers.assert_masks_right(model, params, num_prompt=2)
  n = sum(v.size for v in jax.tree_util.tree_leaves(params["encoder"]["prompt"]["prompt"][
      "text_encoder"]))
  assert n == ipt.num_trainable_params(2, 16, V, "encoder", kind, (2, 3), 4, 8)
  # Only the first ceil(rate·n) rows matter: changing a later token leaves the prompt unchanged.
  enc, _, _ = helpers.batch()
  prompt_of = lambda tokens: model.apply({"params": params}, tokens, method=lambda m, t: (
      m.encoder.prompt_module.prompt(t, m.token_embedder(t))))
  later = enc.at[0, 3].set(30)  # example 0 has n = 5 real tokens: rows 0..2 are used
  # Unused rows are masked before the encoder reads them: the same arithmetic, bitwise equal.
  np.testing.assert_array_equal(prompt_of(later)[0], prompt_of(enc)[0])
  assert np.abs(np.asarray(prompt_of(enc.at[0, 1].set(30))[0] - prompt_of(enc)[0])).max() > 1e-6


def test_ipt_on_top_of_a_task_prompt():
  method = functools.partial(seam.Concat, methods=(
      functools.partial(PromptTuning, length=2),
      functools.partial(ipt.IPT, length=P, vocab_size=V)))
  model, params = _prompted(method, 2 + P)
  helpers.assert_masks_right(model, params, num_prompt=2 + P)
  assert set(params["encoder"]["prompt"]["prompt"]) == {"part_0", "part_1"}


def test_ipt_pretraining_learns_and_writes_a_table(tmp_path):
  rng = np.random.RandomState(0)
  rows = [{"text": " ".join(["a"] * 3 + [w] * 2), "label": w} for w in "xyz" for _ in range(8)]
  data = tmp_path / "cats.jsonl"
  data.write_text("\n".join(json.dumps(r) for r in rows))
  texts, labels = ipt_pretrain.read_jsonl(str(data))
  encode = lambda text: [2 + "axyz".index(w) for w in text.split()]
  tokens = ipt_pretrain.encode_batch(texts, encode, 6)
  table, metrics = ipt_pretrain.pretrain_table(tokens, labels, V, 16, steps=30, batch_size=8,
                                               learning_rate=0.05, widths=(2,), filters=4,
                                               dropout_rate=0.0, log_every=0)
  assert table.shape == (V, 16) and metrics["last_loss"] < metrics["first_loss"]
  assert metrics["train_accuracy"] == 1.0
  np.save(tmp_path / "t.npy", table)
  assert ipt.load_table(str(tmp_path / "t.npy"), V, 16).shape == (V, 16)
  del rng


@pytest.mark.parametrize("kind,reason", BAD_NPY_REASONS)
def test_a_bad_ipt_table_file_is_one_config_error_line(tmp_path, kind, reason):
  path = _bad_npy(tmp_path, kind)
  with pytest.raises(ConfigError) as e:
    ipt.load_table(path, V, 16)
  assert str(e.value).startswith(f"IPT_TABLE_FILE {path!r} ")
  assert reason in str(e.value) and "\n" not in str(e.value)
  assert "prompt-jax ipt-pretrain" in str(e.value)


def test_an_ipt_table_of_another_shape_is_a_config_error(tmp_path):
  path = str(tmp_path / "t.npy")
  for array, reason in ((np.float32(1), r"has shape \(\), not a table \[V, H\]"),
                        (np.ones((V + 1, 16)), "differs from the model's vocab_size"),
                        (np.ones((V, 8)), "has width 8, the model's emb_dim is 16")):
    np.save(path, array)
    with pytest.raises(ConfigError, match=reason):
      ipt.load_table(path, V, 16)


def _pretrain_cli(*argv, cwd):
  """`python -m prompt_jax ipt-pretrain ARGV` in a subprocess: (returncode, stderr)."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", "prompt_jax", "ipt-pretrain", *argv],
                        cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
  return proc.returncode, proc.stderr


def _one_error_line(err, prefix="prompt-jax ipt-pretrain: error: "):
  errors = [line for line in err.splitlines() if ": error:" in line]
  assert len(errors) == 1 and errors[0].startswith(prefix), err
  assert "Traceback" not in err, err
  return errors[0]


def test_ipt_pretrain_bad_data_is_one_line_exit_2_through_the_cli(tmp_path):
  """The CLI subcommand in a process of its own: a row without the label field and a missing --data are
  one line each and exit 2 (no traceback), and no table is written."""
  (tmp_path / "bad.jsonl").write_text('{"txt": "a", "label": "x"}\n')
  code, err = _pretrain_cli("--data=bad.jsonl", "--out=t.npy", "--emb_dim=8", cwd=tmp_path)
  assert code == 2, err
  assert "bad.jsonl:1 lacks 'text' or 'label'" in _one_error_line(err)
  code, err = _pretrain_cli("--data=nope.jsonl", "--out=t.npy", "--emb_dim=8", cwd=tmp_path)
  assert code == 2, err
  assert "--data nope.jsonl is not a file" in _one_error_line(err)
  assert not list(tmp_path.glob("t*")), list(tmp_path.iterdir())


@pytest.mark.parametrize("data,argv,message", [
    ('{"text": "a", "label": "x"}\nnot json\n', [], "bad.jsonl:2 is not JSON"),
    ('["a", "x"]\n', [], "bad.jsonl:1 lacks 'text' or 'label'"),
    ("", [], "has no examples"),
    ('{"text": "a", "label": "x"}\n', ["--out=bad.jsonl/t.npy"],
     "bad.jsonl is a file, not a directory"),
    ('{"text": "a", "label": "x"}\n', ["--emb_dim=0"], "--emb_dim must be positive"),
    ('{"text": "a", "label": "x"}\n', ["--encoder=cnn"], "argument --encoder: invalid choice"),
])
def test_ipt_pretrain_bad_inputs_are_one_line_exit_2(tmp_path, monkeypatch, capsys, data, argv,
                                                     message):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "bad.jsonl").write_text(data)
  flags = {"--data": "bad.jsonl", "--out": "t.npy", "--emb_dim": "8"}
  flags.update(a.split("=", 1) for a in argv)
  assert cli.main(["ipt-pretrain", *[f"{k}={v}" for k, v in flags.items()]]) == 2
  assert message in _one_error_line(capsys.readouterr().err)
  assert not list(tmp_path.glob("t*")) and not (tmp_path / "missing_dir").exists()


@pytest.mark.parametrize("existing", ["t.npy", "t.network.npz", "tdir/"])
def test_ipt_pretrain_never_replaces_a_trained_table(tmp_path, monkeypatch, capsys, existing):
  """Running ipt-pretrain again with the same --out replaced the table (and its network) trained
  before; --out naming a directory wrote <dir>.npy beside it."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "data.jsonl").write_text('{"text": "a", "label": "x"}\n')
  if existing.endswith("/"):
    (tmp_path / existing).mkdir()
  else:
    (tmp_path / existing).write_bytes(b"trained before")
  before = {p.name: (p.read_bytes() if p.is_file() else None) for p in tmp_path.iterdir()}
  out = existing.rstrip("/") if existing.endswith("/") else "t.npy"
  assert cli.main(["ipt-pretrain", "--data=data.jsonl", f"--out={out}", "--emb_dim=8"]) == 2
  line = _one_error_line(capsys.readouterr().err)
  assert ("is a directory" if existing.endswith("/") else
          f"{existing} already exists: ipt-pretrain never replaces a trained table") in line, line
  assert {p.name: (p.read_bytes() if p.is_file() else None)
          for p in tmp_path.iterdir()} == before


def test_ipt_pretrain_spm_that_is_not_a_sentencepiece_model_is_one_line(tmp_path, monkeypatch,
                                                                        capsys):
  """Was `RuntimeError: INTERNAL: unk is not defined.`, exit 1."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "data.jsonl").write_text('{"text": "a", "label": "x"}\n')
  (tmp_path / "notes.txt").write_text("not a model\n")
  assert cli.main(["ipt-pretrain", "--data=data.jsonl", "--out=t.npy", "--emb_dim=8",
                   "--spm=notes.txt"]) == 2
  line = _one_error_line(capsys.readouterr().err)
  assert "--spm notes.txt is not a SentencePiece model that can be read" in line, line
  assert not list(tmp_path.glob("t*"))


def test_ipt_pretrain_of_token_ids_beyond_the_table_says_which_flags_to_match():
  """It said only "token id 14677 >= vocab_size=260" (T5's tokenizer, a 260-row table)."""
  with pytest.raises(ConfigError) as e:
    ipt_pretrain.pretrain(np.full((2, 4), 300, np.int32), ["x", "y"], V, 8, steps=1,
                          log_every=0)
  assert str(e.value) == (f"the tokenizer gives token id 300, beyond the table's --vocab_size={V} "
                          f"rows: give the --vocab_size of the model the table is for (its "
                          f"embedding rows, e.g. 32128 for T5) and the --spm that model uses")


def test_ipt_pretrain_of_one_label_is_refused():
  """One label: the loss is 0 from the first step and the table learns nothing (it trained
  without a word)."""
  with pytest.raises(ConfigError, match=r"^the data has one label \('x' for all 3 examples\)"):
    ipt_pretrain.pretrain(np.ones((3, 4), np.int32), ["x"] * 3, V, 8, steps=1, log_every=0)


def test_ipt_pretrain_verbose_adds_the_traceback(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert cli.main(["ipt-pretrain", "--data=nope.jsonl", "--out=t.npy", "--emb_dim=8",
                   "--verbose"]) == 2
  err = capsys.readouterr().err
  assert "Traceback" in err and err.splitlines()[-1].startswith("prompt-jax ipt-pretrain: error:")


def test_ipt_pretrain_writes_table_and_network_whole_or_not_at_all(tmp_path, monkeypatch):
  table = np.ones((V, 4), np.float32)
  network = {"conv2_kernel": np.ones((2, 4, 3), np.float32)}
  meta = dict(encoder="textcnn", widths=(2,), filters=3, hidden=8)
  out = str(tmp_path / "t.npy")
  assert ipt_pretrain._save(out, table, network, **meta) == ipt.network_path(out)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["t.network.npz", "t.npy"]
  np.testing.assert_array_equal(np.load(out), table)
  # --out in a directory not made yet: checked before training, made for the table (it was
  # refused, "create it first", where recycle makes its --output_dir)
  new = str(tmp_path / "new" / "dir" / "v.npy")
  assert ipt_pretrain._out_path(new) == new and not (tmp_path / "new").exists()
  ipt_pretrain._save(new, table, network, **meta)
  assert sorted(p.name for p in (tmp_path / "new" / "dir").iterdir()) == ["v.network.npz",
                                                                         "v.npy"]
  shutil.rmtree(tmp_path / "new")  # (the rest of the test lists tmp_path)

  def full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(ipt, "save_network", full_disk)
  with pytest.raises(RunError, match="no partial file was left"):
    ipt_pretrain._save(str(tmp_path / "u.npy"), table, network, **meta)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["t.network.npz", "t.npy"]


@pytest.mark.parametrize("damage,reason", [
    ("truncated", "is not a readable .npz archive"),
    ("npy", "is not an .npz archive of arrays (a .npy array)"),
    ("no meta", "has no readable __meta__ record"),
    ("other meta", "does not name its encoder, widths, filters and hidden"),
])
def test_a_damaged_ipt_network_is_one_config_error_line(tmp_path, damage, reason):
  """The pretrained network beside an IPT table, damaged: one line saying to pretrain again."""
  table = str(tmp_path / "t.npy")
  path = ipt.network_path(table)
  meta = dict(encoder="mlp", widths=[2], filters=3, hidden=8)
  ipt.save_network(table, {"dense/kernel": np.ones((4, 8))}, **meta)
  if damage == "truncated":
    with open(path, "rb") as f:
      data = f.read()
    with open(path, "wb") as f:
      f.write(data[:-40])
  elif damage == "npy":
    with open(path, "wb") as f:
      np.save(f, np.ones(3))
  elif damage == "no meta":
    np.savez(path, **{"dense/kernel": np.ones((4, 8))})
  else:
    np.savez(path, __meta__=np.asarray('["mlp"]'))
  with pytest.raises(ConfigError) as e:
    ipt.load_network(table, encoder="mlp", widths=[2], filters=3, hidden=8)
  assert reason in str(e.value) and "\n" not in str(e.value)
  assert "prompt-jax ipt-pretrain --encoder=mlp" in str(e.value)
