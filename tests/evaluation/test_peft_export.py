"""`prompt-jax export --format=peft`: a trained prompt as a Hugging Face PEFT prompt-tuning
adapter, loaded by `peft.PeftModel.from_pretrained` onto the HF T5 whose weights the run was
trained on, gives our logits (issue 9, acceptance 4); what PEFT cannot represent is refused in one
line with nothing written (acceptance 6, export part)."""
import contextlib
import dataclasses
import io
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

import jax.numpy as jnp  # noqa: E402

from prompt_jax import checkpoints  # noqa: E402
from prompt_jax import cli  # noqa: E402
from prompt_jax import run_setup  # noqa: E402
from prompt_jax.errors import ConfigError  # noqa: E402
from prompt_jax.evaluation import export  # noqa: E402
from prompt_jax.evaluation import peft_export  # noqa: E402
from prompt_jax.models import T5, get_config  # noqa: E402
from prompt_jax.prompts import specs  # noqa: E402
from tests import numerics  # noqa: E402
from tests.checkpoints import hf_models  # noqa: E402
from tests.train import common  # noqa: E402

# The embedded default's model shape (gin/models/embedded_tiny.gin: T5 1.1, 64-d, 2+2 layers,
# byte vocabulary of 260), so its task trains on this HF checkpoint.
VOCAB, D_MODEL, D_KV, HEADS, D_FF, LAYERS = 260, 64, 16, 4, 256, 2
PROMPT_LENGTH = 8  # runs/embedded_default.gin


def run_cli(argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(list(argv))
  return code, out.getvalue(), err.getvalue()


def _hf_t5():
  """A random HF T5 1.1 (gated gelu, untied) of the embedded model's shape."""
  return hf_models.random_hf_t5(vocab=VOCAB, d_model=D_MODEL, gated=True, seed=7, d_kv=D_KV,
                                d_ff=D_FF, num_heads=HEADS, num_layers=LAYERS,
                                num_decoder_layers=LAYERS)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
  """2 steps of the embedded default's prompt tuning with a random HF T5 as the frozen model."""
  root = tmp_path_factory.mktemp("peft")
  hf_dir = str(root / "hf_t5")
  _hf_t5().save_pretrained(hf_dir)
  model_dir = str(root / "run")
  code, _, err = run_cli(["train"] + common.flags(
      model_dir, 2, f"--gin.INITIAL_CHECKPOINT_PATH='{hf_dir}'"))
  assert code == 0, err
  return hf_dir, model_dir


def _batch(seed: int):
  rng = np.random.RandomState(seed)
  batch, enc_len, dec_len = 3, 14, 6
  enc = rng.randint(2, VOCAB, (batch, enc_len))
  enc[1, 9:] = 0  # padded inputs: PEFT extends the attention mask, we mask by tokens
  enc[2, 4:] = 0
  tgt = rng.randint(2, VOCAB, (batch, dec_len))
  tgt[2, 3:] = 0
  dec_in = np.concatenate([np.zeros((batch, 1), int), tgt[:, :-1]], axis=1)
  dec_in[tgt == 0] = 0
  return enc, dec_in, tgt


def test_peft_adapter_gives_our_logits_on_the_hf_t5(hf_run):
  hf_dir, model_dir = hf_run
  code, out, err = run_cli(["export", "--format=peft", f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 0, err
  adapter = os.path.join(model_dir, "export", "peft_step2")
  assert out.splitlines()[-1] == (
      f"wrote PEFT prompt-tuning adapter ({PROMPT_LENGTH} virtual tokens x {D_MODEL}, "
      f"PromptTuning of checkpoint step 2) to {adapter}")
  assert sorted(os.listdir(adapter)) == ["adapter_config.json", "adapter_model.safetensors"]
  config = json.loads(open(os.path.join(adapter, "adapter_config.json")).read())
  assert (config["peft_type"], config["task_type"], config["num_virtual_tokens"],
          config["token_dim"], config["num_transformer_submodules"],
          config["base_model_name_or_path"]) == (
              "PROMPT_TUNING", "SEQ_2_SEQ_LM", PROMPT_LENGTH, D_MODEL, 1, hf_dir)
  code, _, err = run_cli(["export", "--format=npy", f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 0, err
  prompt = np.load(os.path.join(model_dir, "export", "prompt_step2.npy"))  # [P, H]
  assert prompt.shape == (PROMPT_LENGTH, D_MODEL)

  # PEFT loads our adapter as its own: a prompt-tuning encoder holding exactly our prompt.
  hf = transformers.T5ForConditionalGeneration.from_pretrained(hf_dir).eval()
  tuned = peft.PeftModel.from_pretrained(hf, adapter).eval()
  assert tuned.active_peft_config.peft_type == peft.PeftType.PROMPT_TUNING
  np.testing.assert_array_equal(
      tuned.prompt_encoder["default"].embedding.weight.detach().numpy(), prompt)

  enc, dec_in, tgt = _batch(seed=3)
  with torch.no_grad():
    theirs = tuned(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                   decoder_input_ids=torch.tensor(dec_in),
                   decoder_attention_mask=torch.tensor(tgt > 0)).logits.numpy()

  # Ours: the same HF weights through our loader, plain prompt tuning (prefix) with that prompt.
  t5_config, params = checkpoints.load(hf_dir)
  spec = specs.prompt_tuning(length=PROMPT_LENGTH)

  def ours(dtype):
    model = run_setup.build_model(t5_config.replace(dtype=dtype), spec)
    full = numerics.cast({**params, "encoder": {**params["encoder"], "prompt": {
        "prompt": {"prompt": prompt}}}}, dtype)
    return np.asarray(model.apply({"params": full}, enc, dec_in, tgt, enable_dropout=False))

  ours32 = ours(jnp.float32)
  with numerics.float64():
    ours64 = ours(jnp.float64)
  assert theirs.shape == ours32.shape == (3, 6, VOCAB)
  valid = tgt > 0  # HF computes padded target positions differently; they carry no loss
  # PEFT's float32 logits must be as close to the exact (float64) function as float32 allows:
  # the bound is 8x our own float32 error against our float64 evaluation (tests/numerics.py).
  distance = numerics.assert_close(theirs[valid], ours32[valid], ours64[valid],
                                   what="PEFT + HF T5 logits")
  assert distance < 1e-4  # the tolerance, implied by the derived bound here
  # A wrong placement or a missing mask moves them far more than that bound.
  no_prompt = np.asarray(T5(t5_config.replace(dtype=jnp.float32)).apply(
      {"params": params}, enc, dec_in, tgt, enable_dropout=False))
  assert np.abs(no_prompt - theirs)[valid].max() > 1e-2


def test_the_adapter_files_get_a_new_files_usual_mode(tmp_path):
  """safetensors writes its file 0600: an adapter others should load (a shared models dir, the
  hub) was readable by its writer only, while adapter_config.json had the umask's mode."""
  umask = os.umask(0o022)
  try:
    paths = peft_export.write_adapter(np.zeros((5, D_MODEL), np.float32), str(tmp_path / "a"),
                                      _CONFIG)
  finally:
    os.umask(umask)
  assert [oct(os.stat(p).st_mode & 0o777) for p in paths] == ["0o644", "0o644"]


def test_an_interrupted_export_leaves_no_adapter_directory(tmp_path, monkeypatch):
  """Ctrl-C between the two files left the weights and adapter_config.json.tmp in the --output
  directory, and the rerun refused it as existing. A new adapter directory appears whole (mode
  of the umask, not mkdtemp's 0700) or not at all; nothing is left beside it."""
  out = tmp_path / "adapter"

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt
  with monkeypatch.context() as m:
    m.setattr(peft_export.json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
      peft_export.write_adapter(np.zeros((5, D_MODEL), np.float32), str(out), _CONFIG)
  assert os.listdir(tmp_path) == []
  umask = os.umask(0o022)
  try:
    peft_export.write_adapter(np.zeros((5, D_MODEL), np.float32), str(out), _CONFIG)
  finally:
    os.umask(umask)
  assert sorted(os.listdir(tmp_path)) == ["adapter"]
  assert sorted(os.listdir(out)) == ["adapter_config.json", "adapter_model.safetensors"]
  assert oct(os.stat(out).st_mode & 0o777) == "0o755"


def test_export_writes_prompt_embeddings_under_peft_key(tmp_path):
  """The file PEFT's own save_pretrained writes for a prompt-tuning model holds one tensor,
  `prompt_embeddings`; ours has the same keys, shape and dtype, and the same config fields."""
  hf = _hf_t5()
  peft_config = peft.PromptTuningConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=5,
                                        token_dim=D_MODEL, num_transformer_submodules=1,
                                        num_attention_heads=HEADS, num_layers=LAYERS)
  theirs = peft.get_peft_model(hf, peft_config)
  theirs.save_pretrained(str(tmp_path / "theirs"))
  prompt = np.random.RandomState(0).randn(5, D_MODEL).astype(np.float32)
  peft_export.write_adapter(prompt, str(tmp_path / "ours"), _CONFIG)
  load = lambda d: safetensors_torch.load_file(str(tmp_path / d / "adapter_model.safetensors"))
  a, b = load("theirs"), load("ours")
  assert sorted(a) == sorted(b) == ["prompt_embeddings"]
  assert a["prompt_embeddings"].shape == b["prompt_embeddings"].shape
  assert a["prompt_embeddings"].dtype == b["prompt_embeddings"].dtype
  read = lambda d: json.loads((tmp_path / d / "adapter_config.json").read_text())
  theirs_cfg, ours_cfg = read("theirs"), read("ours")
  theirs_cfg.pop("peft_version", None)  # the writer's version: ours is not peft
  assert sorted(ours_cfg) == sorted(theirs_cfg)
  for key in ("peft_type", "task_type", "num_virtual_tokens", "token_dim",
              "num_transformer_submodules", "num_attention_heads", "num_layers"):
    assert ours_cfg[key] == theirs_cfg[key], key


# ===== what PEFT cannot represent: one line, nothing written =====

@pytest.mark.parametrize("spec,message", [
    (specs.idpg_prompt(length=4, bottleneck=8),
     "PEFT cannot represent IDPG: IDPG generates its prompt from each input"),
    (specs.ipt_prompt(length=4), "PEFT cannot represent IPT: IPT generates its prompt from each"),
    # (these two were said to generate their prompt from each input)
    (specs.per_layer_prompt(length=4),
     "PEFT cannot represent PerLayer: PerLayer has one prompt per encoder layer"),
    (specs.multitask_prompt(length=4, num_tasks=2),
     "PEFT cannot represent MultiTask: MultiTask has one prompt per task (NUM_TASKS=2)"),
    (specs.deep_prefix(length=4), "PEFT's prompt tuning cannot represent DeepPrefix's per-layer "
                                  "key/value prefixes"),
    (specs.deep_prefix(length=4, input_prompt=specs.prompt_tuning(length=4)),
     "PEFT's prompt tuning cannot represent DeepPrefix's per-layer"),
    (specs.prompt_tuning(length=8, placement="suffix"),
     "PEFT prepends its virtual tokens to the input, this run places its prompt as 'suffix'"),
    (dataclasses.replace(specs.prompt_tuning(length=8),
                         visibility="input->prompt,prompt->prompt;causal"),
     "PEFT's virtual tokens and the input always see each other, this run trained with "
     "PROMPT_VISIBILITY="),
], ids=["idpg", "ipt", "per_layer", "multitask", "deep_prefix", "deep_prefix_with_prompt",
        "suffix", "visibility"])
def test_export_refuses_what_peft_cannot_represent_and_writes_nothing(hf_run, spec, message):
  _, model_dir = hf_run
  before = sorted(os.listdir(model_dir))
  model = run_setup.ModelSpec(config=_CONFIG, prompt=spec, trainable_regex=spec.trainable_regex)
  with pytest.raises(ConfigError) as e:
    export.export("peft", model_dir, model=model, output=os.path.join(model_dir, "refused"))
  assert str(e.value).startswith(message) and "\n" not in str(e.value)
  assert sorted(os.listdir(model_dir)) == before


def test_cli_refuses_a_suffix_prompt_in_one_line(hf_run):
  _, model_dir = hf_run
  out_dir = os.path.join(model_dir, "suffix_adapter")
  code, out, err = run_cli(["export", "--format=peft", f"--gin.MODEL_DIR='{model_dir}'",
                            "--gin.prompt_jax.prompt_tuning.placement='suffix'",
                            f"--output={out_dir}"])
  assert code == 2
  assert err.count("\n") == 1 and err.startswith(
      "prompt-jax export: error: PEFT prepends its virtual tokens"), err
  assert not os.path.exists(out_dir)


_CONFIG = get_config("t5_1_1_small", emb_dim=D_MODEL, num_heads=HEADS, head_dim=D_KV,
                     mlp_dim=D_FF, num_encoder_layers=LAYERS, num_decoder_layers=LAYERS,
                     vocab_size=VOCAB)


# ===== what a prompt file cannot hold, and what export never replaces =====

def test_a_run_that_trained_more_than_its_prompt_is_refused_for_peft_and_noted_for_npy(
    tmp_path):
  """TRAINABLE_REGEX wider than the method's (here the encoder's final norm too): the prompt
  alone gives other outputs. PEFT: refused in one line, nothing written; npy: written, with a
  note naming what it leaves out."""
  model_dir = str(tmp_path / "run")
  code, _, err = run_cli(["train"] + common.flags(
      model_dir, 1, "--gin.TRAINABLE_REGEX='encoder/(prompt/.*|encoder_norm/.*)'"))
  assert code == 0, err
  code, _, err = run_cli(["export", "--format=peft", f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 2 and err.count("\n") == 1, err
  assert "also trained encoder/encoder_norm/scale (TRAINABLE_REGEX)" in err
  assert not os.path.exists(os.path.join(model_dir, "export"))
  code, out, err = run_cli(["export", f"--gin.MODEL_DIR='{model_dir}'"])
  assert code == 0, err
  assert "note: the run also trained encoder/encoder_norm/scale" in out
  assert os.path.isfile(os.path.join(model_dir, "export", "prompt_step1.npy"))
  # Told to take the prompt alone, PEFT export writes it; the backbone (the embedded t5x
  # checkpoint, not an HF dir transformers could load) is not named as the base model.
  code, _, err = run_cli(["export", "--format=peft", f"--gin.MODEL_DIR='{model_dir}'",
                          "--gin.TRAINABLE_REGEX='encoder/prompt/.*'"])
  assert code == 0, err
  with open(os.path.join(model_dir, "export", "peft_step1", "adapter_config.json")) as f:
    assert json.load(f)["base_model_name_or_path"] is None


def test_export_never_replaces_an_existing_output(hf_run, tmp_path):
  """An explicit --output that exists (a prompt or an adapter trained elsewhere) is refused in
  one line and left as it was; one under a file is one line too (it was an OSError, exit 1)."""
  _, model_dir = hf_run
  precious = tmp_path / "precious.npy"
  np.save(precious, np.arange(10.0))
  adapter = tmp_path / "adapter"
  adapter.mkdir()
  (adapter / "adapter_config.json").write_text("{}")
  for fmt, output in (("npy", precious), ("peft", adapter)):
    code, _, err = run_cli(["export", f"--format={fmt}", f"--gin.MODEL_DIR='{model_dir}'",
                            f"--output={output}"])
    assert code == 2 and err.count("\n") == 1, err
    assert f"--output {output} already exists: export never replaces it" in err
  np.testing.assert_array_equal(np.load(precious), np.arange(10.0))
  assert os.listdir(adapter) == ["adapter_config.json"]
  for fmt in ("npy", "peft"):
    code, _, err = run_cli(["export", f"--format={fmt}", f"--gin.MODEL_DIR='{model_dir}'",
                            f"--output={precious}/sub/out"])
    assert code == 2 and err.count("\n") == 1, err
    assert "cannot create the directory" in err and "Traceback" not in err


def test_a_cross_attention_prefix_hook_is_refused_like_a_decoder_hook():
  """A spec whose only per-layer part is the decoder's cross-attention hook (prefix tuning's
  third set) holds key/value prefixes PEFT's prompt tuning cannot hold: one line, as for the
  encoder and decoder hooks."""

  @dataclasses.dataclass(frozen=True)
  class WithCrossHook(type(specs.prompt_tuning(length=4))):
    def decoder_cross_hook(self, backbone):
      return specs.deep_prefix(length=4, cross=True).decoder_cross_hook(backbone)

  spec = WithCrossHook(length=4)
  assert spec.layer_hook(specs.Backbone(_CONFIG)) is None
  peft_export.check_representable(specs.prompt_tuning(length=4), _CONFIG)  # without: exports
  with pytest.raises(ConfigError, match="PEFT's prompt tuning cannot represent .*per-layer "
                                        "key/value prefixes") as e:
    peft_export.check_representable(spec, _CONFIG)
  assert "\n" not in str(e.value)
