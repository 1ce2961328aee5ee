"""The train step `train` runs is built from `run_setup.step_model` (no backbone values) and
`run_setup.layout` (shapes, dtypes, shardings), so it can be compiled while the checkpoint is
read (tests/train/test_compile_ahead.py). For every method's gin file, and a placement that
reads the vocabulary in the forward pass ('between:<text>'), it must lower to the same program
as the step of the model `prepare` built with the embedding table, vocabulary and backbone
parameters (which only initialisers read), and the layout must be that of `prepare`'s arrays."""
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax import cli, partitioning, run_setup
from prompt_jax.prompts import specs
from prompt_jax.train import guards, optimizers, state as state_lib

LENGTHS = {"inputs": 32, "targets": 4}
# Every gin/prompts/ file but those that need a file of the user's: ipt_encoder.gin (a
# pretrained IPT_TABLE_FILE; 'ipt' is the same module without the encoder network) and
# from_file.gin (a prompt file; an init, like from_sampled_vocab).
METHODS = ["dpt", "dpt_rank_probe", "from_class_labels", "from_sampled_vocab", "idpg",
           "idpg_multilayer", "ipt", "mpt", "multitask", "p_tuning", "per_layer", "prefix",
           "prefix_ipt", "residual", "uniform", "visibility", "wayward"]


class _Vocabulary:
  """What the specs read of a seqio vocabulary: ids of a text (a fixed piece per word)."""
  vocab_size = 100
  eos_id = 1

  def encode(self, text):
    return [3 + len(word) % 90 for word in text.split()] or [3]


# Macros a method's gin file leaves to the user.
BINDINGS = {"from_class_labels": ["CLASS_LABELS=['yes', 'no']"]}


def _spec(method):
  files = ["models/embedded_tiny.gin", f"prompts/{method}.gin", "runs/prompt_finetune.gin"]
  bindings = ["PROMPT_LENGTH=12", *BINDINGS.get(method, [])]
  assert cli.main(["describe", *[f"--gin_file={f}" for f in files],
                   *[f"--gin.{b}" for b in bindings]]) == 0
  try:
    return run_setup.model_spec()
  finally:
    gin.clear_config()


def _lowered(model, run, tx, mesh):
  state, state_shardings = state_lib.initial_state(run.trainable, run.trainable_shardings, tx,
                                                   mesh)
  step = state_lib.jit_guarded_train_step(model, tx, state_shardings, run.frozen_shardings, mesh)
  rows = 2
  batch = {"encoder_input_tokens": np.full((rows, LENGTHS["inputs"]), 5, np.int32),
           "decoder_input_tokens": np.full((rows, LENGTHS["targets"]), 5, np.int32),
           "decoder_target_tokens": np.full((rows, LENGTHS["targets"]), 5, np.int32),
           "decoder_loss_weights": np.ones((rows, LENGTHS["targets"]), np.int32),
           state_lib.TASK_IDS: np.zeros((rows,), np.int32)}
  replicated = partitioning.replicated(mesh)
  with partitioning.axis_rules(mesh):
    return step.lower(state, run.frozen, batch, jax.random.PRNGKey(0),
                      guards.initial_flag(replicated)).as_text()


@pytest.mark.parametrize("method", METHODS + ["between"])
def test_step_model_lowers_to_the_step_of_prepares_model(method, capsys):
  if method == "between":  # in bfloat16 too: frozen weights held in it, some in float32
    model = _spec("uniform")
    prompt = specs.prompt_tuning(length=4, placement="between:a separator")
    model = run_setup.ModelSpec(model.config.replace(dtype=jnp.bfloat16), prompt,
                                prompt.trainable_regex, model.frozen_dtype)
  else:
    model = _spec(method)
  capsys.readouterr()
  mesh = partitioning.create_mesh(1)
  vocabulary = _Vocabulary()
  run = run_setup.prepare(config=model.config, prompt=model.prompt, feature_lengths=LENGTHS,
                          initial_checkpoint_path=None, trainable_regex=model.trainable_regex,
                          mesh=mesh, vocabulary=vocabulary, frozen_dtype=model.frozen_dtype)
  assert run.model.prompt is not None or run.model.layer_prompts is not None
  # The layout the step is compiled for before the read is what `prepare` made.
  planned = run_setup.layout(config=model.config, prompt=model.prompt, feature_lengths=LENGTHS,
                             trainable_regex=model.trainable_regex, mesh=mesh,
                             frozen_dtype=model.frozen_dtype)
  placed = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), tree)
  assert placed(planned.trainable) == placed(run.trainable)
  assert placed(planned.frozen) == placed(run.frozen)
  tx = optimizers.adafactor().tx
  built = run_setup.step_model(model.config, model.prompt, vocabulary)
  assert _lowered(built, run, tx, mesh) == _lowered(run.model, run, tx, mesh)


def test_a_trainable_regex_matching_nothing_fails_before_anything_is_read():
  """`layout` (which `train` calls before it reads the checkpoint or compiles) refuses it."""
  from prompt_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  model = _spec("uniform")
  with pytest.raises(ConfigError, match=r"TRAINABLE_REGEX 'nothing/here' matches no parameter; "
                                        r"parameters include .*encoder/prompt"):
    run_setup.layout(config=model.config, prompt=model.prompt, feature_lengths=LENGTHS,
                     trainable_regex="nothing/here", mesh=partitioning.create_mesh(1))
