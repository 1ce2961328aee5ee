"""Multi-task prompts (issue 16 items 2 and 3): each combination's shape and count, per-task
gradient isolation, the task index read from the batch, and the bad inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.prompts import mpt, multitask, specs
from tests.prompts import helpers

CFG = helpers.TINY  # H = 16
H = CFG.emb_dim
TASK_IDS = jnp.array([0, 0, 1, 1])  # the toy batch's 4 rows: two of task 0, two of task 1

COMBOS = {
    "add": (specs.multitask_prompt(length=3, num_tasks=2, combine="add"), 3, 3 * H + 2 * 3 * H),
    "concat_length": (specs.multitask_prompt(length=3, num_tasks=2, combine="concat_length",
                                             task_length=2), 5, 3 * H + 2 * 2 * H),
    "concat_features": (specs.multitask_prompt(length=3, num_tasks=2, combine="concat_features",
                                               shared_features=10), 3, 3 * 10 + 2 * 3 * 6),
    "project": (specs.multitask_prompt(length=3, num_tasks=2, combine="project",
                                       shared_features=4), 3, 3 * 4 + 2 * (4 * H + H)),
    "mpt": (specs.mpt_prompt(length=3, num_tasks=2, rank=2), 3, 3 * H + 2 * (3 * 2 + 2 * H)),
}


def _model(spec):
  return T5(CFG, **specs.model_kwargs(spec, CFG))


def _params(spec):
  model = _model(spec)
  return model, helpers.init_prompted(model)


def _method_params(params):
  return params["encoder"]["prompt"]["prompt"]


def _prompt(model, params, task_ids):
  """The method's prompt [B, P', H] for the toy batch (the encoder's seam module, unplaced)."""
  enc, _, _ = helpers.batch()

  def run(module):
    embedded = module.token_embedder(enc)
    ctx = module.encoder.context(enc, embedded, task_ids=task_ids)
    return module.encoder.prompt_module.prompt(enc, embedded, context=ctx)
  return model.apply({"params": params}, method=run)


@pytest.mark.parametrize("name", sorted(COMBOS))
def test_shape_and_count(name):
  spec, positions, formula = COMBOS[name]
  model, params = _params(spec)
  counted = sum(int(np.prod(v.shape)) for v in jax.tree_util.tree_leaves(_method_params(params)))
  assert counted == formula == spec.num_trainable_params(CFG)
  assert spec.input_positions == positions
  prompt = _prompt(model, params, TASK_IDS)
  assert prompt.shape == (4, positions, H)
  # Rows of the same task get the same prompt, the two tasks different ones.
  np.testing.assert_array_equal(prompt[0], prompt[1])
  assert not np.allclose(prompt[0], prompt[2])
  out = model.apply(
      {"params": params}, *helpers.batch(), enable_dropout=False, task_ids=TASK_IDS)
  assert out.shape == (4, 2, CFG.vocab_size) and np.isfinite(np.asarray(out)).all()


def test_combinations_compute_their_formula():
  """Each combination equals its definition on the shared and task parameters."""
  shared = jnp.arange(6.0).reshape(3, 2)
  tasks = jnp.arange(2 * 3 * 2.0).reshape(2, 3, 2) / 7
  np.testing.assert_allclose(multitask.combine_prompts("add", shared, tasks), shared + tasks)
  np.testing.assert_array_equal(multitask.combine_prompts("concat_length", shared, tasks)[1],
                                jnp.concatenate([shared, tasks[1]]))
  np.testing.assert_array_equal(multitask.combine_prompts("concat_features", shared, tasks)[1],
                                jnp.concatenate([shared, tasks[1]], axis=1))
  kernel_bias = jnp.arange(2 * 3 * 4.0).reshape(2, 3, 4)  # H_s = 2 kernel rows + bias row, H = 4
  out = multitask.combine_prompts("project", shared, kernel_bias)
  for k in range(2):
    np.testing.assert_allclose(out[k], shared @ kernel_bias[k, :2] + kernel_bias[k, 2],
                               rtol=1e-6)


@pytest.mark.parametrize("name", sorted(COMBOS))
def test_task_prompt_gets_zero_gradient_from_other_tasks(name):
  """A loss on task 1's rows only: task 0's parameters get exactly zero gradient, task 1's do
  not (gather by task id: no other path reaches them)."""
  spec, _, _ = COMBOS[name]
  model, params = _params(spec)
  enc, dec_in, tgt = helpers.batch()
  only_task1 = (TASK_IDS == 1)[:, None]

  def loss(method):
    full = dict(params, encoder=dict(params["encoder"], prompt={"prompt": method}))
    logits = model.apply({"params": full}, enc, dec_in, tgt, enable_dropout=False,
                         task_ids=TASK_IDS)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tgt)
    return jnp.sum(ce * (tgt > 0) * only_task1)

  grads = jax.grad(loss)(_method_params(params))
  per_task = ["task_cols", "task_rows"] if name == "mpt" else ["task_prompts"]
  for key in per_task:
    g = np.asarray(grads[key])
    assert np.all(g[0] == 0), (key, np.abs(g[0]).max())
    assert np.abs(g[1]).max() > 0, key


def test_missing_task_ids_is_a_config_error():
  spec, _, _ = COMBOS["add"]
  model, params = _params(spec)
  with pytest.raises(ConfigError, match="no `task_ids`.*register_multitask_mixture"):
    model.apply({"params": params}, *helpers.batch(), enable_dropout=False)
  with pytest.raises(ConfigError, match="no `task_ids`"):
    spec.check_batch({"encoder_input_tokens": np.zeros((4, 8), np.int32)})
  # One-task MPT (a target run) needs no task ids.
  target, _, _ = COMBOS["mpt"]
  target = specs.mpt_prompt(length=3, num_tasks=1, rank=2)
  t_model, t_params = _params(target)
  assert t_model.apply({"params": t_params}, *helpers.batch(), enable_dropout=False).shape[0] == 4
  target.check_batch({"encoder_input_tokens": np.zeros((4, 8), np.int32)})


def test_task_index_out_of_range_is_a_config_error():
  spec = specs.multitask_prompt(length=3, num_tasks=2)
  ok = {"task_ids": np.array([0, 1, 1, 0]), "decoder_loss_weights": np.ones((4, 2))}
  spec.check_batch(ok)
  with pytest.raises(ConfigError, match="task index 2 .* NUM_TASKS=2"):
    spec.check_batch(dict(ok, task_ids=np.array([0, 2, 1, 0])))
  with pytest.raises(ConfigError, match="task index -1"):
    specs.mpt_prompt(length=3, num_tasks=3).check_batch(dict(ok, task_ids=np.array([0, -1, 1, 0])))
  # All-padding rows (zero loss weight, e.g. a padded eval batch) are not checked.
  weights = np.ones((4, 2))
  weights[1] = 0
  spec.check_batch(dict(ok, task_ids=np.array([0, 7, 1, 0]), decoder_loss_weights=weights))


@pytest.mark.parametrize("shared_features", [None, 0, 16, 20])
def test_concat_features_sizes_must_add_up_to_the_model_width(shared_features):
  spec = specs.multitask_prompt(length=3, num_tasks=2, combine="concat_features",
                                shared_features=shared_features)
  with pytest.raises(ConfigError, match="MULTITASK_SHARED_FEATURES") as e:
    spec.check(CFG)
  assert "\n" not in str(e.value)


def test_other_bad_configs():
  with pytest.raises(ConfigError, match="MULTITASK_COMBINE='sum' is not one of"):
    specs.multitask_prompt(combine="sum").check(CFG)
  with pytest.raises(ConfigError, match="NUM_TASKS must be >= 1"):
    specs.multitask_prompt(num_tasks=0).check(CFG)
  with pytest.raises(ConfigError, match="MPT_RANK"):
    specs.mpt_prompt(rank=0).check(CFG)
  with pytest.raises(ConfigError, match="MPT_SOURCE_INIT"):
    specs.mpt_prompt(source="/x", source_init="average").check(CFG)
  with pytest.raises(ConfigError, match="both MPT_SOURCE"):
    specs.mpt_prompt(source_init="average_source_tasks").check(CFG)


def test_mpt_target_initialisations_follow_peft(tmp_path):
  """average / exact task / shared only, from a source run's exported .npy directory."""
  rng = np.random.default_rng(0)
  source = {"prompt": rng.normal(size=(3, H)).astype(np.float32),
            "task_cols": rng.normal(size=(4, 3, 2)).astype(np.float32),
            "task_rows": rng.normal(size=(4, 2, H)).astype(np.float32)}
  for k, v in source.items():
    np.save(tmp_path / f"encoder.prompt.prompt.{k}.npy", v)
  for mode, cols, rows in [
      ("average_source_tasks", source["task_cols"].mean(0), source["task_rows"].mean(0)),
      ("exact_source_task", source["task_cols"][2], source["task_rows"][2])]:
    spec = specs.mpt_prompt(length=3, num_tasks=1, rank=2, source=str(tmp_path),
                            source_init=mode, source_task=2)
    _, params = _params_with_backbone(spec)
    got = _method_params(params)
    np.testing.assert_array_equal(got["prompt"], source["prompt"])
    np.testing.assert_allclose(got["task_cols"][0], cols, rtol=1e-6)
    np.testing.assert_allclose(got["task_rows"][0], rows, rtol=1e-6)
    # One task: the folded prompt is P* ∘ (u v^T).
    np.testing.assert_allclose(spec.fold(params, CFG)["prompt"],
                               source["prompt"] * (cols @ rows), rtol=1e-5, atol=1e-6)
  spec = specs.mpt_prompt(length=3, num_tasks=1, rank=2, source=str(tmp_path),
                          source_init="only_source_shared")
  _, params = _params_with_backbone(spec)
  np.testing.assert_array_equal(_method_params(params)["prompt"], source["prompt"])
  assert np.abs(np.asarray(_method_params(params)["task_cols"])).max() < 0.2  # N(0, 0.02)
  bad = specs.mpt_prompt(length=3, num_tasks=1, rank=2, source=str(tmp_path),
                         source_init="exact_source_task", source_task=9)
  with pytest.raises(ConfigError, match="MPT_SOURCE_TASK=9 is outside the source's 4 tasks"):
    _params_with_backbone(bad)
  with pytest.raises(ConfigError, match="MPT source .* does not exist"):
    _params_with_backbone(specs.mpt_prompt(length=3, source=str(tmp_path / "none.npz"),
                                           source_init="only_source_shared"))
  assert mpt.peft_state(source).keys() == {"prompt_embeddings", "prefix_task_cols",
                                           "prefix_task_rows"}


def _params_with_backbone(spec):
  """Params of a model whose spec sees a loaded backbone (so source files are read)."""
  frozen = helpers.frozen()
  embedding = np.asarray(frozen["token_embedder"]["embedding"])
  model = T5(CFG, **specs.model_kwargs(spec, CFG, embedding=embedding))
  return model, helpers.init_prompted(model)


@pytest.mark.parametrize("name", ["add", "mpt"])
def test_one_batch_serves_every_task(name):
  """Decoding a batch that mixes tasks: each row's encoding is exactly that row's encoding in a
  batch of its task alone (same program, rows independent), and the tasks' encodings differ."""
  from prompt_jax.models import decoding  # pylint: disable=g-import-not-at-top
  spec, _, _ = COMBOS[name]
  model, params = _params(spec)
  enc, _, _ = helpers.batch()
  mixed = np.asarray(decoding.encode(model, params, enc, TASK_IDS))
  for task in (0, 1):
    alone = np.asarray(decoding.encode(model, params, enc, jnp.full((4,), task)))
    rows = np.asarray(TASK_IDS) == task
    np.testing.assert_array_equal(mixed[rows], alone[rows])
    assert not np.allclose(mixed[~rows], alone[~rows])
  tokens = decoding.greedy_decode(model, params, enc, 3, task_ids=TASK_IDS)
  assert tokens.shape == (4, 3)


@pytest.mark.parametrize("damage,reason", [
    ("truncated.npz", "is not a readable .npz archive"),
    ("text.npz", "is not an .npz archive of arrays (not a zip)"),
    ("truncated.safetensors", "is not a readable .safetensors file"),
    ("dir", "is not a readable .npy array"),
])
def test_a_damaged_mpt_source_is_one_config_error_line(tmp_path, damage, reason):
  """Every MPT_SOURCE form, damaged, names the file and what to do; never a traceback."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  arrays = {"prompt_embeddings": np.ones((3, H), np.float32)}
  path = tmp_path / damage
  if damage == "dir":
    path.mkdir()
    for k in mpt.PEFT_NAMES:
      np.save(path / f"encoder.prompt.prompt.{k}.npy", np.ones((2, 2), np.float32))
    bad = path / "encoder.prompt.prompt.task_rows.npy"
    bad.write_bytes(bad.read_bytes()[:100])
  elif damage == "text.npz":
    path.write_text("prompt\n")
  elif damage.endswith(".npz"):
    np.savez(path, **arrays)
    path.write_bytes(path.read_bytes()[:-8])
  else:
    save_file(arrays, str(path))
    path.write_bytes(path.read_bytes()[:-8])
  with pytest.raises(ConfigError) as e:
    mpt.load_source(str(path))
  assert reason in str(e.value) and "\n" not in str(e.value)
  assert "MPT source" in str(e.value)
