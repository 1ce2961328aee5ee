"""What gin/t5x/ binds, resolved as t5x's binaries resolve it, without training.

t5x's run files bind `train_script.train` (`evaluate`, `infer`): the script below stands in for
t5x's `train` / `evaluate` / `infer` (as test_first_step_loss.py does), parses the gin files with
t5x on the path and calls it, so `MODEL` (the prompted network, built by
`prompt_jax.t5x.prompt_network`) and t5x's `learning_rate_fn` are what t5x.train would get.

1. The prompt must fit the task's inputs length (TASK_FEATURE_LENGTHS['inputs']), as under
   `prompt-jax train`: every method file of gin/t5x/prompts/ is built with PROMPT_LENGTH = 32 >
   the embedded task's 16; the methods that read their prompt off the input tokens (IPT, prefix +
   IPT) are refused with prompt-jax's one-line ConfigError (also by a real `t5x.train`), the
   others build.
2. The learning rate t5x logs (its scheduler's, which `OptaxWrapper` does not apply) is the rate
   the method's own optax optimizer applies (`prompt_optim.masked_optax`: DPT_LR, PREFIX_LR,
   IDPG_LR, RESIDUAL_LR), in either order of the method and run files.
"""
import glob
import json
import os

import numpy as np
import pytest

from tests.t5x import common

SCRIPT = r'''
import json, sys
import gin, jax, numpy as np
from t5x import gin_utils, optimizers as t5x_optimizers
import prompt_jax.t5x  # registers prompt_jax's gin names
from prompt_jax import run_setup

def train(*, model, **unused):  # stand-ins for t5x's scripts' functions
  # The learning_rate_fn gin gives t5x's Trainer (trainer_cls), whose rate t5x logs.
  ref = gin.query_parameter("t5x.trainer.Trainer.learning_rate_fn")
  return model, ref.scoped_configurable_fn()
def evaluate(*, model, **unused):
  return model, None
def infer(*, model, **unused):
  return model, None
SCRIPTS = {"train": gin.configurable(train), "evaluate": gin.configurable(evaluate),
           "infer": gin.configurable(infer)}

def applied_rate(optimizer_def):
  """-update / sign(gradient) of the first step on a prompt-like tree at 0 (AdamW's first step
  is -lr * g / |g|; weight decay is 0 at 0): the rate the optimizer applies; and whether the
  frozen leaf (the embedding) moved."""
  tx = optimizer_def.optax_optimizer
  leaf = lambda: {"w": np.zeros(4, np.float32)}
  params = {"encoder": {"prompt": {"p": leaf()}, "layer_prompts": {"p": leaf()}},
            "decoder": {"layer_prompts": {"p": leaf()}}, "token_embedder": leaf()}
  grads = jax.tree_util.tree_map(lambda x: np.full_like(x, 0.1), params)
  updates, _ = tx.update(grads, tx.init(params), params)
  flat = {jax.tree_util.keystr(k): np.asarray(v) for k, v in
          jax.tree_util.tree_flatten_with_path(updates)[0]}
  frozen = flat.pop("['token_embedder']['w']")
  moved = [-v for v in flat.values() if np.any(v != 0)]
  return [float(x) for v in moved for x in v], bool(np.any(frozen != 0))

gin_dir, t5x_src, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for case in cases:
  gin.clear_config()
  out = {"name": case["name"]}
  try:
    gin_utils.parse_gin_flags([gin_dir, t5x_src], case["files"], case["bindings"],
                              finalize_config=False)
    out["batch_size"] = gin.query_parameter("%BATCH_SIZE")
    prompt = run_setup.model_spec().prompt
    try:
      prompt.check_fits(16)
      out["fits"] = True
    except Exception as e:
      out["fits"] = False
    model, lr_fn = SCRIPTS[case.get("script", "train")]()
    out["built"] = True
    if lr_fn is not None:
      out["logged"] = [float(lr_fn(s)) for s in (2000, 2001, 2300)]
      out["optimizer"] = type(model.optimizer_def).__name__
      if isinstance(model.optimizer_def, t5x_optimizers.OptaxWrapper):
        out["applied"], out["frozen_moved"] = applied_rate(model.optimizer_def)
  except Exception as e:
    out["built"] = False
    out["error"] = f"{type(e).__module__}.{type(e).__name__}: " + str(e).splitlines()[0]
  print("RESULT " + json.dumps(out), flush=True)
'''

METHODS = sorted(os.path.basename(p)[:-len(".gin")]
                 for p in glob.glob(str(common.GIN_DIR / "t5x" / "prompts" / "*.gin")))
READ_INPUT_TOKENS = {"ipt", "prefix_ipt"}  # the prompt is read off the first P input tokens
# (encoder IPT reads the whole input: any P fits)
TOO_LONG = ("prompt_jax.errors.ConfigError: prompt length P=32 is larger than the inputs "
            "feature length 16 it is read from; use P <= 16")
DEFAULT = "t5x/runs/embedded_default.gin"
# (case name, gin files, bindings, method's rate): the methods with their own optimizer.
LR_CASES = [
    ("dpt", [DEFAULT, "t5x/prompts/dpt.gin"], ["PROMPT_LENGTH = 16", "DPT_RANK = 4"], 0.3),
    ("dpt_lr", [DEFAULT, "t5x/prompts/dpt.gin"],
     ["PROMPT_LENGTH = 16", "DPT_RANK = 4", "DPT_LR = 0.02"], 0.02),
    ("prefix", [DEFAULT, "t5x/prompts/prefix.gin"], ["PROMPT_LENGTH = 4"], 5e-5),
    ("prefix_ipt", [DEFAULT, "t5x/prompts/prefix_ipt.gin"], [], 5e-5),
    ("prefix_lr", [DEFAULT, "t5x/prompts/prefix.gin"], ["PREFIX_LR = 1e-3"], 1e-3),
    ("idpg", [DEFAULT, "t5x/prompts/idpg.gin"], ["PROMPT_LENGTH = 4"], 5e-4),
    ("idpg_multilayer", [DEFAULT, "t5x/prompts/idpg_multilayer.gin"], ["PROMPT_LENGTH = 4"],
     5e-4),
    ("residual", [DEFAULT, "t5x/prompts/residual.gin"], ["PROMPT_LENGTH = 4"], 0.3),
    # The method file before the run file (t5x/runs/prompt_finetune.gin's usage line's order).
    ("prefix_first", ["t5x/models/embedded_tiny_prompt.gin", "t5x/prompts/prefix.gin",
                      "t5x/runs/prompt_finetune.gin"],
     ["MIXTURE_OR_TASK_NAME = 'embedded_last_letter'",
      "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 4}",
      "INITIAL_CHECKPOINT_PATH = @prompt_jax.embedded_checkpoint_path()",
      "TRAIN_STEPS = 2001", "PROMPT_LENGTH = 4"], 5e-5),
]
EMBEDDED_TASK = ["MIXTURE_OR_TASK_NAME = 'embedded_last_letter'",
                 "MIXTURE_OR_TASK_MODULE = 'prompt_jax.embedded.task'", "PROMPT_LENGTH = 32",
                 "CHECKPOINT_PATH = @prompt_jax.embedded_checkpoint_path()"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  """{case name: what the script found}, one subprocess for every case."""
  common.require_t5x()
  tmp = tmp_path_factory.mktemp("gin_bindings")
  rng = np.random.default_rng(0)
  np.save(tmp / "prompt.npy", rng.uniform(-0.5, 0.5, (32, 64)).astype(np.float32))
  np.save(tmp / "table.npy", rng.uniform(-0.5, 0.5, (260, 64)).astype(np.float32))
  extra = ["CLASS_LABELS = ['a', 'b', 'c', 'd']", f"PROMPT_FILE = '{tmp / 'prompt.npy'}'",
           f"IPT_TABLE_FILE = '{tmp / 'table.npy'}'"]
  cases = [{"name": f"fits/{m}", "files": [DEFAULT, f"t5x/prompts/{m}.gin"],
            "bindings": ["MODEL_DIR = '/tmp/unused'", "PROMPT_LENGTH = 32", *extra]}
           for m in METHODS]
  cases += [{"name": f"lr/{name}", "files": files,
             "bindings": ["MODEL_DIR = '/tmp/unused'", *bindings]}
            for name, files, bindings, _ in LR_CASES]
  model = "t5x/models/embedded_tiny_prompt.gin"
  cases += [  # t5x.eval's TASK_FEATURE_LENGTHS is None (from the data): nothing to check
      {"name": "eval/ipt", "script": "evaluate", "files": [
          model, "t5x/runs/prompt_eval.gin", "t5x/prompts/ipt.gin"],
       "bindings": [*EMBEDDED_TASK, "EVAL_OUTPUT_DIR = '/tmp/unused'"]},
      {"name": "infer/ipt", "script": "infer", "files": [
          model, "t5x/runs/prompt_infer.gin", "t5x/prompts/ipt.gin"],
       "bindings": [*EMBEDDED_TASK, "INFER_OUTPUT_DIR = '/tmp/unused'",
                    "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 4}"]}]
  proc = common.run_python(SCRIPT, str(common.GIN_DIR), str(common.T5X_DIR / "src"),
                           json.dumps(cases))
  found = [json.loads(l[len("RESULT "):]) for l in proc.stdout.splitlines()
           if l.startswith("RESULT ")]
  assert proc.returncode == 0 and len(found) == len(cases), proc.stdout[-6000:]
  return {r["name"]: r for r in found}


def test_prompt_longer_than_inputs_is_refused_iff_the_method_reads_them(results):
  assert READ_INPUT_TOKENS | {"dpt", "prefix", "uniform", "ipt_encoder"} <= set(METHODS), METHODS
  wrong = {}
  for method in METHODS:
    r = results[f"fits/{method}"]
    if method in READ_INPUT_TOKENS:
      ok = not r["fits"] and not r["built"] and r["error"] == TOO_LONG
    elif method == "ipt_encoder":  # past the check, its text encoder's weights are needed
      ok = r["fits"] and not r["built"] and "table.network.npz' does not exist" in r["error"]
    else:
      ok = r["fits"] and r["built"]
    if not ok:
      wrong[method] = r
  assert not wrong, wrong


def test_inputs_length_is_checked_by_infer_and_not_by_eval_without_lengths(results):
  assert not results["infer/ipt"]["built"], results["infer/ipt"]
  assert results["infer/ipt"]["error"] == TOO_LONG, results["infer/ipt"]
  assert results["eval/ipt"]["built"], results["eval/ipt"]


def test_t5x_train_refuses_a_prompt_longer_than_the_inputs_in_one_line(tmp_path):
  proc = common.run_t5x("train", common.embedded_train_args(
      str(tmp_path / "m"), 1, "--gin_file=t5x/prompts/ipt.gin", "--gin.PROMPT_LENGTH=32"),
      check=False, timeout=300)
  assert proc.returncode != 0
  errors = [l for l in proc.stdout.splitlines() if l.startswith("prompt_jax.errors.ConfigError:")]
  assert errors == [TOO_LONG], proc.stdout[-3000:]
  assert not os.path.exists(tmp_path / "m" / f"checkpoint_{common.EMBEDDED_STEP + 1}")


def test_logged_learning_rate_is_the_applied_one(results):
  wrong = {}
  for name, _, _, rate in LR_CASES:  # the method's own AdamW in t5x's OptaxWrapper
    r = results[f"lr/{name}"]
    ok = (r["built"] and r["optimizer"] == "OptaxWrapper" and r["applied"]
          and not r["frozen_moved"] and np.allclose(r["applied"], rate, rtol=1e-5)
          and np.allclose(r["logged"], rate, rtol=1e-6))
    if not ok:
      wrong[name] = (rate, r)
  for method in ("uniform", "from_class_labels"):  # t5x's Adafactor applies what t5x logs: 0.3
    r = results[f"fits/{method}"]
    if not (r["optimizer"] == "MultiOptimizer" and np.allclose(r["logged"], 0.3, rtol=1e-6)):
      wrong[method] = (0.3, r)
  assert not wrong, wrong


def test_the_run_file_trains_at_lester_et_al_s_batch_size(results):
  """t5x/runs/prompt_finetune.gin includes t5x's finetune.gin (BATCH_SIZE = 128); prompt tuning's
  main setting (Lester et al. 2021, as `prompt-jax train`'s runs/defaults.gin) is 32."""
  assert results["lr/prefix_first"]["batch_size"] == 32
