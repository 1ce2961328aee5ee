"""MPT against PEFT's MultitaskPromptTuning (issue 16, acceptance 2): on an HF T5 with random
weights and our T5 loaded from the same weights, the same trainable count for the same
configuration, and with PEFT's prompt-encoder weights copied in, the same prompt embeddings and
the same logits for a batch mixing tasks."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import jax.numpy as jnp  # noqa: E402

from prompt_jax import checkpoints  # noqa: E402
from prompt_jax.models import T5  # noqa: E402
from prompt_jax.prompts import mpt, specs  # noqa: E402
from tests import numerics  # noqa: E402
from tests.checkpoints import hf_models  # noqa: E402

VOCAB, D_MODEL, P, TASKS, RANK = 120, 32, 5, 3, 2


def _hf_t5(seed=0):
  return hf_models.random_hf_t5(vocab=VOCAB, d_model=D_MODEL, gated=False, seed=seed)


def _peft_mpt(hf):
  config = peft.MultitaskPromptTuningConfig(
      task_type=peft.TaskType.SEQ_2_SEQ_LM, num_virtual_tokens=P, num_tasks=TASKS,
      num_ranks=RANK, token_dim=D_MODEL, num_transformer_submodules=1,  # encoder prompt only
      prompt_tuning_init=peft.MultitaskPromptTuningInit.RANDOM)
  model = peft.get_peft_model(hf, config).eval()
  encoder = model.prompt_encoder["default"]
  torch.manual_seed(1)
  with torch.no_grad():  # PEFT's N(0, 0.02) task factors make u v^T ~ 1e-3: use larger ones
    encoder.prefix_task_cols.normal_()
    encoder.prefix_task_rows.normal_()
  return model, encoder


def _batch():
  rng = np.random.RandomState(3)
  enc = rng.randint(2, VOCAB, (4, 12))
  enc[1, 7:] = 0
  enc[3, 4:] = 0
  tgt = rng.randint(2, VOCAB, (4, 6))
  tgt[2, 3:] = 0
  dec_in = np.concatenate([np.zeros((4, 1), int), tgt[:, :-1]], axis=1)
  dec_in[tgt == 0] = 0
  task_ids = np.array([0, 2, 1, 2])
  return enc, dec_in, tgt, task_ids


def test_mpt_matches_peft(tmp_path):
  hf = _hf_t5()
  hf.save_pretrained(tmp_path)
  config, frozen = checkpoints.load(str(tmp_path))
  config = config.replace(dtype=jnp.float32)
  peft_model, encoder = _peft_mpt(hf)

  spec = specs.mpt_prompt(length=P, num_tasks=TASKS, rank=RANK)
  trainable, _ = peft_model.get_nb_trainable_parameters()
  assert trainable == spec.num_trainable_params(config) == P * D_MODEL + TASKS * (P * RANK
                                                                                  + RANK * D_MODEL)

  ours = {"prompt": encoder.embedding.weight.detach().numpy(),
          "task_cols": encoder.prefix_task_cols.detach().numpy(),
          "task_rows": encoder.prefix_task_rows.detach().numpy()}
  assert set(mpt.peft_state(ours)) == set(type(encoder)._get_adapter_state_dict(  # pylint: disable=protected-access
      peft_model, None, "default", None, None))
  params = dict(frozen, encoder=dict(frozen["encoder"], prompt={"prompt": ours}))
  model = T5(config, **specs.model_kwargs(spec, config))
  enc, dec_in, tgt, task_ids = _batch()

  # Prompt embeddings: PEFT's get_prompt vs our method's output (one elementwise product of the
  # same float32 numbers, a rank-2 matmul: the float64 bound of tests/numerics.py).
  with torch.no_grad():
    ref_prompt = peft_model.get_prompt(batch_size=4, task_ids=torch.tensor(task_ids)).numpy()

  def our_prompt(dtype, p=params):
    def run(module):
      embedded = module.token_embedder(jnp.asarray(enc))
      ctx = module.encoder.context(jnp.asarray(enc), embedded, task_ids=jnp.asarray(task_ids))
      return module.encoder.prompt_module.prompt(jnp.asarray(enc), embedded, context=ctx)
    return np.asarray(model.clone(config=config.replace(dtype=dtype)).apply(
        {"params": numerics.cast(p, dtype)}, method=run))
  prompt32 = our_prompt(jnp.float32)
  with numerics.float64():
    prompt64 = our_prompt(jnp.float64)
  assert prompt32.shape == ref_prompt.shape == (4, P, D_MODEL)
  numerics.assert_close(ref_prompt, prompt32, prompt64, what="PEFT MPT prompt")
  np.testing.assert_allclose(ref_prompt, prompt32, rtol=0, atol=1e-5)

  # Logits, with the task of each row from the batch. PEFT's MPT forward for seq2seq with the
  # encoder prompt only builds the decoder input from `labels` (it drops decoder_input_ids):
  # shifted right, as ours; they differ at padded target positions only, which are not compared.
  with torch.no_grad():
    ref = peft_model(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                     labels=torch.tensor(tgt), task_ids=torch.tensor(task_ids)).logits.numpy()

  def our_logits(dtype):
    return np.asarray(model.clone(config=config.replace(dtype=dtype)).apply(
        {"params": numerics.cast(params, dtype)}, enc, dec_in, tgt, enable_dropout=False,
        task_ids=task_ids))
  logits32 = our_logits(jnp.float32)
  with numerics.float64():
    logits64 = our_logits(jnp.float64)
  valid = tgt > 0  # HF computes padded target positions differently; they carry no loss
  # PEFT's float32 logits are as close to the exact function as float32 allows: the bound is
  # our float32 error against our float64 evaluation (tests/numerics.py).
  distance = numerics.assert_close(ref[valid], logits32[valid], logits64[valid],
                                   what="PEFT MPT logits")
  assert distance <= 1e-5 * max(1.0, float(np.abs(logits64[valid]).max())), distance
  # The task matters: another task for row 1 changes its logits.
  other = np.asarray(model.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False,
                                 task_ids=np.array([0, 0, 1, 2])))
  assert np.abs(other[1] - logits32[1]).max() > 1e-3
