"""Encoder IPT keeps the network pretrained with its table (ipt_pretrain), trains it with the
table frozen; a network of another kind is a one-line error; prefix tuning + IPT."""
import contextlib
import io
import json

import gin
import numpy as np
import pytest

from prompt_jax import cli
from prompt_jax import partitioning
from prompt_jax import run_setup
from prompt_jax import trees
from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.prompts import ipt, ipt_pretrain, specs
from tests.prompts import helpers

CFG = helpers.TINY
V, H = CFG.vocab_size, CFG.emb_dim


def _pretrained_table(tmp_path, encoder, hidden=6, vocab_size=V, emb_dim=H, name="t"):
  """A table + network from ipt_pretrain's `main` on a 3-category toy corpus."""
  rows = [{"text": " ".join(["a"] * 3 + [w] * 2), "label": w} for w in "xyz" for _ in range(4)]
  data = tmp_path / f"{name}.jsonl"
  data.write_text("\n".join(json.dumps(r) for r in rows))
  texts, labels = ipt_pretrain.read_jsonl(str(data))
  tokens = ipt_pretrain.encode_batch(texts, lambda t: [2 + "axyz".index(w) for w in t.split()], 6)
  table, network, metrics = ipt_pretrain.pretrain(
      tokens, labels, vocab_size, emb_dim, steps=3, batch_size=8, encoder=encoder,
      widths=(2, 3), filters=4, hidden=hidden, dropout_rate=0.0, log_every=0)
  assert metrics["last_loss"] > 0 and network
  path = str(tmp_path / f"{name}.npy")
  np.save(path, table)
  ipt.save_network(path, network, encoder=encoder, widths=(2, 3), filters=4, hidden=hidden)
  return path, table, network


@pytest.mark.parametrize("encoder", ["textcnn", "lstm", "mlp"])
def test_encoder_ipt_starts_from_the_pretrained_network_with_the_table_frozen(tmp_path, encoder):
  path, table, network = _pretrained_table(tmp_path, encoder)
  spec = specs.ipt_prompt(length=2, mode="encoder", table_file=path, encoder=encoder,
                          widths=(2, 3), filters=4, hidden=6)
  run = run_setup.prepare(config=CFG, prompt=spec, feature_lengths={"inputs": 8, "targets": 2},
                          initial_checkpoint_path=None, trainable_regex=spec.trainable_regex,
                          mesh=partitioning.create_mesh(1))
  trainable = trees.flatten(run.trainable)
  root = "encoder/prompt/prompt/text_encoder/"
  # Every pretrained network parameter is trainable and starts at its pretrained value.
  for name, value in network.items():
    np.testing.assert_array_equal(np.asarray(trainable[root + name]), value, err_msg=name)
  # The rest of what trains is the new prompt head (no classes: k·H outputs).
  assert set(trainable) == {root + n for n in network} | {root + "out_kernel", root + "out_bias"}
  assert trainable[root + "out_bias"].shape == (2 * H,)
  frozen = trees.flatten(run.frozen)
  np.testing.assert_array_equal(np.asarray(frozen["encoder/prompt/prompt/frozen_table"]), table)
  if encoder == "lstm":  # three LSTM layers + three linear layers, as the paper
    assert {n.split("_")[0] for n in network if n.startswith("lstm/")} == {
        "lstm/layer0", "lstm/layer1", "lstm/layer2"}
    assert {"hidden_1_kernel", "hidden_2_kernel"} <= set(network)
  if encoder == "mlp":  # three linear layers: hidden_1, hidden_2, and the output layer
    assert {n for n in network if n.endswith("_kernel")} == {"hidden_1_kernel", "hidden_2_kernel"}
  # Training moves the network, never the table (only the regex's parameters get updates).
  params = trees.unflatten({**trees.flatten(run.frozen), **trainable})
  after, _ = helpers.assert_trains_only(run.model, _numpy(params), [root],
                                        regex=spec.trainable_regex, steps=3)
  np.testing.assert_array_equal(
      np.asarray(after["encoder"]["prompt"]["prompt"]["frozen_table"]), table)


def _numpy(tree):
  return {k: _numpy(v) if isinstance(v, dict) else np.asarray(v) for k, v in tree.items()}


def test_a_network_of_another_kind_or_shape_is_a_one_line_error(tmp_path):
  path, _, _ = _pretrained_table(tmp_path, "lstm")
  spec = specs.ipt_prompt(length=2, mode="encoder", table_file=path, encoder="textcnn",
                          widths=(2, 3), filters=4)
  with pytest.raises(ConfigError) as e:
    specs.model_kwargs(spec, CFG, embedding=np.zeros((V, H), np.float32))
  assert str(e.value) == (f"IPT table {path!r}'s pretrained network is a lstm but "
                          "IPT_ENCODER='textcnn'; set IPT_ENCODER='lstm' or pretrain a "
                          "textcnn table")
  spec = specs.ipt_prompt(length=2, mode="encoder", table_file=path, encoder="lstm", hidden=7)
  with pytest.raises(ConfigError, match="has hidden=6, the IPT encoder is configured with "
                                        "hidden=7; use hidden=6"):
    specs.model_kwargs(spec, CFG, embedding=np.zeros((V, H), np.float32))
  missing = str(tmp_path / "no_network.npy")
  np.save(missing, np.zeros((V, H), np.float32))
  with pytest.raises(ConfigError, match="needs the pretrained network saved beside the table"):
    specs.model_kwargs(specs.ipt_prompt(length=2, mode="encoder", table_file=missing), CFG,
                       embedding=np.zeros((V, H), np.float32))


def test_network_mismatch_through_the_cli_is_one_line(tmp_path):
  # The embedded default's tiny T5: V = 260, H = 64.
  path, _, _ = _pretrained_table(tmp_path, "mlp", vocab_size=260, emb_dim=64, name="emb")
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = cli.main(["train", "--gin_file=runs/embedded_default.gin",
                     "--gin_file=prompts/ipt_encoder.gin", f"--gin.MODEL_DIR='{tmp_path}/run'",
                     f"--gin.IPT_TABLE_FILE='{path}'", "--gin.IPT_ENCODER='textcnn'"])
  gin.clear_config()
  lines = [l for l in err.getvalue().splitlines() if l.startswith("prompt-jax")]
  assert code == 2
  assert lines == [f"prompt-jax train: error: IPT table {path!r}'s pretrained network is a mlp "
                   "but IPT_ENCODER='textcnn'; set IPT_ENCODER='mlp' or pretrain a textcnn "
                   "table"]


def test_encoder_ipt_without_its_table_names_the_macro(tmp_path):
  """ipt_encoder.gin's `IPT_TABLE_FILE = %gin.REQUIRED` reached os.stat: 'TypeError: stat: path
  should be string ... not object', exit 1."""
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = cli.main(["train", "--gin_file=runs/embedded_default.gin",
                     "--gin_file=prompts/ipt_encoder.gin", f"--gin.MODEL_DIR='{tmp_path}/run'"])
  gin.clear_config()
  assert code == 2
  assert err.getvalue().strip().splitlines() == [
      "prompt-jax train: error: missing required macro IPT_TABLE_FILE: set "
      "--gin.IPT_TABLE_FILE=... or bind it in a gin file"]
  assert not (tmp_path / "run").exists()


def test_prefix_tuning_plus_ipt_gives_each_example_its_prefixes():
  spec = specs.deep_prefix(length=3, hidden=6, decoder=False,
                           source=specs.ipt_prompt(length=3))
  model = T5(CFG, **specs.model_kwargs(spec, CFG))
  params = helpers.init_prompted(model)
  layer = params["encoder"]["layer_prompts"]
  assert layer["source"]["table"].shape == (V, H) and "embedding" not in layer
  n = sum(v.size for v in trees.flatten(layer).values())
  assert n == spec.num_trainable_params(CFG) == V * H + H * 6 + 6 + 2 * 2 * 16 * 6 + 2 * 2 * 16
  after, _ = helpers.assert_trains_only(model, params, ["encoder/layer_prompts/"],
                                        regex=spec.trainable_regex)
  helpers.assert_masks_right(model, after, num_prompt=0)
  enc, _, _ = helpers.batch()
  prefixes = lambda m, t: m.encoder.layer_prompt_module.prefixes(
      m.encoder.context(t, m.token_embedder(t)))
  keys = model.apply({"params": after}, enc, method=prefixes)[0]  # [B, L, P, D]
  assert keys.shape == (4, 2, 3, 16)
  assert np.abs(np.asarray(keys[0] - keys[1])).max() > 1e-4  # per example
  # The frozen table of an encoder-IPT source is excluded from what trains.
  enc_spec = specs.deep_prefix(length=3, hidden=6, source=specs.ipt_prompt(
      length=3, mode="encoder", table_file="x.npy"))
  assert trees.is_trainable("encoder/layer_prompts/source/text_encoder/out_bias",
                            enc_spec.trainable_regex)
  assert not trees.is_trainable("encoder/layer_prompts/source/frozen_table",
                                enc_spec.trainable_regex)
  assert trees.is_trainable("decoder/layer_prompts/wo_bias", enc_spec.trainable_regex)


def test_prefix_ipt_gin_file_binds_an_ipt_source(capsys):
  assert cli.main(["describe", "--gin_file=models/t5_1_1_small.gin",
                   "--gin_file=prompts/prefix_ipt.gin"]) == 0
  spec = run_setup.model_spec().prompt
  gin.clear_config()
  assert isinstance(spec.source, specs.IPTSpec) and spec.length == spec.source.length == 10
  out = capsys.readouterr().out
  count = int(out.split("trainable parameters: ")[1].split()[0].replace(",", ""))
  assert count == spec.num_trainable_params(run_setup.t5_config(preset="t5_1_1_small"))
