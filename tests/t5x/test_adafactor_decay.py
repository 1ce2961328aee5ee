"""Adafactor's second-moment decay under `t5x.train` and `prompt-jax train`.

t5x's Adafactor (gin/t5x/models/prompt.gin, as google-research/prompt-tuning: step_offset = 0)
sets its decay from the global step, which continues the initial checkpoint's; prompt-jax's
(`prompt_jax.adafactor`, optax) counts from the prompt's first step. From a checkpoint at step S
the two agree only with `prompt_jax.adafactor.decay_offset = -S` (or t5x's `step_offset = S`),
which is what README's t5x section and `optimizers.adafactor` say. Checked on 20 updates of a
[8, 16] prompt from S = 2000 (the embedded checkpoint) and S = 1,100,000 (lm100k).

Bound (tests/numerics.py): both sides compute in float32; each must be within 8x prompt-jax's own
error against a float64 NumPy Adafactor of the same updates. The mismatched pairing (t5x from S,
prompt-jax counting from 0) must be far outside that bound, so the test can fail.
"""
import json

from tests.t5x import common

SCRIPT = r'''
import json
import jax, jax.numpy as jnp, numpy as np, optax
from t5x import adafactor
from t5x.optimizers import OptimizerState
from prompt_jax.train import optimizers
from tests import numerics

rng = np.random.default_rng(0)
p0 = rng.uniform(-0.5, 0.5, (8, 16)).astype(np.float32)
grads = [(rng.normal(0, 1e-2, (8, 16)) + 1e-2).astype(np.float32) for _ in range(20)]
LR, WD, DECAY = 0.3, 1e-5, 0.8

def t5x_updates(global_step, step_offset):
  # gin/t5x/models/prompt.gin's Adafactor; t5x's MultiOptimizer passes it the global step.
  opt = adafactor.Adafactor(decay_rate=DECAY, step_offset=step_offset,
                            multiply_by_parameter_scale=False, weight_decay_rate=WD,
                            factored=False, clipping_threshold=1.0)
  p = {"prompt": jnp.asarray(p0)}
  st = opt.init_state(p)
  st = OptimizerState(jnp.asarray(global_step, jnp.int32), st.param_states)
  hp = opt.hyper_params.replace(learning_rate=LR)
  for g in grads:
    p, st = opt.apply_gradient(hp, p, st, {"prompt": jnp.asarray(g)})
  return np.asarray(p["prompt"])

def prompt_jax_updates(**kw):
  tx = optimizers.adafactor(**kw).tx  # runs/defaults.gin's values are its defaults
  p = {"prompt": jnp.asarray(p0)}
  s = tx.init(p)
  for g in grads:
    u, s = tx.update({"prompt": jnp.asarray(g)}, s, p)
    p = optax.apply_updates(p, u)
  return np.asarray(p["prompt"])

def float64_updates(first_step):
  # Adafactor, unfactored, no parameter scaling, updates clipped to RMS 1, decoupled decay.
  p, v = p0.astype(np.float64), np.zeros(p0.shape)
  for k, g in enumerate(grads):
    g = g.astype(np.float64)
    t = float(first_step + k + 1)
    beta = 1.0 - t ** -DECAY
    v = beta * v + (1.0 - beta) * (g * g + 1e-30)
    u = g / np.sqrt(v)
    u = u / max(1.0, float(np.sqrt(np.mean(u * u))))
    p = (1.0 - WD) * p - LR * u
  return p

out = {}
for S in (2000, 1_100_000):
  t5x_global = t5x_updates(S, 0)          # t5x.train from a checkpoint at S
  t5x_offset = t5x_updates(S, S)          # ... with step_offset = S
  ours_offset = prompt_jax_updates(decay_offset=-S)
  ours = prompt_jax_updates()
  ref_global, ref_own = float64_updates(S), float64_updates(0)
  out[S] = {
      "bound_global": numerics.bound(ours_offset, ref_global),
      "bound_own": numerics.bound(ours, ref_own),
      "t5x_global_vs_ref": float(np.abs(t5x_global - ref_global).max()),
      "t5x_offset_vs_ref": float(np.abs(t5x_offset - ref_own).max()),
      "ours_offset_vs_ref": float(np.abs(ours_offset - ref_global).max()),
      "ours_vs_ref": float(np.abs(ours - ref_own).max()),
      "t5x_global_vs_ours": float(np.abs(t5x_global - ours).max()),
  }
print("RESULT " + json.dumps(out))
'''


def test_t5x_adafactor_equals_prompt_jax_with_the_checkpoints_step_as_decay_offset():
  proc = common.run_python(SCRIPT, timeout=600)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert proc.returncode == 0 and lines, proc.stdout[-6000:]
  for step, r in json.loads(lines[-1][len("RESULT "):]).items():
    # t5x from the checkpoint's step == prompt-jax with decay_offset = -step.
    assert r["t5x_global_vs_ref"] <= r["bound_global"], (step, r)
    assert r["ours_offset_vs_ref"] <= r["bound_global"], (step, r)
    # t5x with step_offset = step == prompt-jax's default (counting from the prompt's step 0).
    assert r["t5x_offset_vs_ref"] <= r["bound_own"], (step, r)
    assert r["ours_vs_ref"] <= r["bound_own"], (step, r)
    # Without either, the two runs part: the offset is not a no-op.
    assert r["t5x_global_vs_ours"] > 100 * max(r["bound_global"], r["bound_own"]), (step, r)
