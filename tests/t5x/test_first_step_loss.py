"""Acceptance 4: the first training step's loss is the same under `t5x.train` and `prompt-jax
train`, from the same checkpoint, prompt and batch.

The t5x side is the model t5x's binaries build from gin/t5x/runs/embedded_default.gin (parsed
by t5x's own gin_utils, `MODEL` taken from t5x's `train` bindings) and its `loss_fn`, the one
t5x's trainer differentiates; the prompt-jax side is `train.state.make_train_step`'s loss on the
same parameters (the shipped tiny checkpoint + one freshly initialised prompt) and batch. Both
run in a subprocess (t5x is imported only there).

Bound (tests/numerics.py): the two are different float32 programs (t5x's cross entropy vs
ours), so |t5x - float64 reference| must be within 8x the float32 reference's own error (floored
at one float32 ulp of the loss); the issue's 1e-5 is checked as well.
"""
import json

from tests.t5x import common

SCRIPT = r'''
import json, sys
import gin, jax, jax.numpy as jnp, numpy as np
from t5x import gin_utils
from prompt_jax import checkpoints, run_setup, trees
from prompt_jax.embedded import task as embedded_task
from prompt_jax.t5x import models as t5x_models
from prompt_jax.train import optimizers, state as state_lib
from tests import numerics

def train(*, model, **unused):  # stands in for t5x.train's `train` (its gin names it so)
  return model
train_using_gin = gin.configurable(train)
gin_utils.parse_gin_flags([sys.argv[1], sys.argv[2]], ["t5x/runs/embedded_default.gin"],
                          ["MODEL_DIR = '/tmp/unused'"])
t5x_model = train_using_gin()
spec = run_setup.model_spec()
from prompt_jax import embedded
ckpt = checkpoints.load(embedded.CHECKPOINT_DIR, spec.config)[1]  # INITIAL_CHECKPOINT_PATH

# One batch of the task's training examples, as seqio's EncDecFeatureConverter lays it out.
vocab = embedded_task.VOCABULARY
def pad(ids, n):
  ids = list(ids)[: n - 1] + [1]
  return ids + [0] * (n - len(ids))
pairs = embedded_task.examples("train")[:8]
enc = np.array([pad(vocab.encode(i), 16) for i, _ in pairs], np.int32)
tgt = np.array([pad(vocab.encode(t), 4) for _, t in pairs], np.int32)
dec_in = np.concatenate([np.zeros_like(tgt[:, :1]), tgt[:, :-1]], axis=1)
batch = {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in,
         "decoder_target_tokens": tgt, "decoder_loss_weights": (tgt > 0).astype(np.int32)}

# The parameters: t5x's initial variables (the prompt, initialised as t5x.train does) with the
# backbone restored from the checkpoint, as t5x's RestoreCheckpointConfig does.
shapes = {k: v.shape for k, v in batch.items()}
init = t5x_model.get_initial_variables(jax.random.PRNGKey(0), shapes,
                                       {k: jnp.int32 for k in batch})
params = trees.flatten(jax.device_get(init["params"]))
params.update(trees.flatten(ckpt))
params = trees.unflatten({k: np.asarray(v, np.float32) for k, v in params.items()})
assert set(trees.flatten(params)) - set(trees.flatten(ckpt)) == {"encoder/prompt/prompt/prompt"}

def t5x_loss(dtype):
  module = run_setup.build_model(spec.config.__class__(**{**spec.config.__dict__, "dtype": dtype}),
                                 spec.prompt)
  model = t5x_models.PromptEncoderDecoderModel(
      module=module, input_vocabulary=t5x_model.input_vocabulary,
      output_vocabulary=t5x_model.output_vocabulary, optimizer_def=None,
      z_loss=t5x_model._z_loss, label_smoothing=t5x_model._label_smoothing,
      loss_normalizing_factor=t5x_model._loss_normalizing_factor)
  loss, _ = jax.jit(model.loss_fn)(numerics.cast(params, dtype), batch, jax.random.PRNGKey(1))
  return loss

def prompt_jax_loss(dtype):
  module = run_setup.build_model(spec.config.__class__(**{**spec.config.__dict__, "dtype": dtype}),
                                 spec.prompt)
  trainable, frozen = trees.split(numerics.cast(params, dtype), spec.trainable_regex)
  tx = optimizers.adafactor().tx
  step = jax.jit(state_lib.make_train_step(module, tx, z_loss=1e-4))
  st = state_lib.TrainState(jnp.int32(0), trainable, tx.init(trainable))
  _, metrics = step(st, frozen, batch, jax.random.PRNGKey(1))
  return metrics["loss"]

t5x32, ours32 = float(t5x_loss(jnp.float32)), float(prompt_jax_loss(jnp.float32))
with numerics.float64():
  ref64 = float(prompt_jax_loss(jnp.float64))
bound = numerics.bound(ours32, ref64)
print("RESULT " + json.dumps({"t5x": t5x32, "prompt_jax": ours32, "ref64": ref64,
                              "bound": bound, "normalizing": str(t5x_model._loss_normalizing_factor)}))
'''


def test_first_step_loss_is_the_same_under_both_trainers():
  proc = common.run_python(SCRIPT, str(common.GIN_DIR), str(common.T5X_DIR / "src"))
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert proc.returncode == 0 and lines, proc.stdout[-6000:]
  r = json.loads(lines[-1][len("RESULT "):])
  # Both trainers normalise by the number of real target tokens (prompt-jax's default).
  assert "NUM_REAL_TARGET_TOKENS" in r["normalizing"], r
  assert abs(r["t5x"] - r["ref64"]) <= r["bound"], r
  assert abs(r["t5x"] - r["prompt_jax"]) <= 1e-5 * max(1.0, abs(r["prompt_jax"])), r
