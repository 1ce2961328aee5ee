"""Wayward prompts (issue 16, acceptance 5): the regulariser's value, gamma = 0 is plain prompt
tuning exactly, and training on the embedded default pulls the prompt onto the discrete words."""
import functools
import io
import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.evaluation import inspect as inspect_lib
from prompt_jax.models import T5
from prompt_jax.prompts import seam, specs, wayward
from prompt_jax.prompts.tuning import PromptTuning
from prompt_jax.train import state as state_lib
from prompt_jax import trees
from tests import numerics
from tests.prompts import helpers

CFG = helpers.TINY
P = 4


class FakeVocab:
  def encode(self, text):
    return [ord(c) % CFG.vocab_size for c in text]


def _setup():
  model = T5(CFG, prompt=seam.prompt_factory(functools.partial(PromptTuning, length=P), P))
  params = helpers.init_prompted(model)
  trainable = {"encoder": {"prompt": params["encoder"]["prompt"]}}
  frozen = dict(params, encoder={k: v for k, v in params["encoder"].items() if k != "prompt"})
  enc, dec_in, tgt = helpers.batch()
  batch = {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in,
           "decoder_target_tokens": tgt}
  return model, trainable, frozen, batch


def test_regulariser_is_the_references_length_normalised_squared_distance():
  _, trainable, frozen, _ = _setup()
  params = trees.merge(trainable, frozen)
  ids = [3, 9, 9, 17]
  value = float(wayward.regulariser(ids, gamma=0.25)(params))
  prompt = np.asarray(params["encoder"]["prompt"]["prompt"]["prompt"], np.float64)
  table = np.asarray(params["token_embedder"]["embedding"], np.float64)
  expected = 0.25 * np.sum((prompt - table[ids]) ** 2) / P  # squared_l2_distance / P
  np.testing.assert_allclose(value, expected, rtol=1e-6)  # float32 sum of 64 terms vs float64


def test_gamma_zero_is_plain_prompt_tuning_and_gamma_moves_the_prompt():
  model, trainable, frozen, batch = _setup()
  tx = optax.adam(0.1)
  spec0 = specs.wayward_prompt(length=P, text="abcd", gamma=0.0)
  aux0 = spec0.auxiliary_loss(specs.Backbone(CFG, vocabulary=FakeVocab()))
  plain = jax.jit(state_lib.make_train_step(model, tx))
  zero = jax.jit(state_lib.make_train_step(model, tx, auxiliary_loss=aux0))
  start = state_lib.TrainState(jnp.int32(0), trainable, tx.init(trainable))
  rng = jax.random.PRNGKey(0)
  a, ma = plain(start, frozen, batch, rng)
  b, mb = zero(start, frozen, batch, rng)
  # gamma = 0 adds exact zeros, but the auxiliary term stays in the graph: another program, so
  # the step equals plain prompt tuning within the float32 bound derived against the plain step
  # in float64 (tests/numerics.py).
  with numerics.float64():
    model64, trainable64 = numerics.in_float64(model, trainable)
    start64 = state_lib.TrainState(jnp.int32(0), trainable64, tx.init(trainable64))
    a64, ma64 = jax.jit(state_lib.make_train_step(model64, tx))(
        start64, numerics.cast(frozen, np.float64), batch, rng)
  numerics.assert_close(mb["loss"], ma["loss"], ma64["loss"], what="loss")
  for x, y, z in zip(*(jax.tree_util.tree_leaves(t) for t in (b, a, a64))):
    numerics.assert_close(x, y, z, what="state after a step")
  assert float(mb["auxiliary_loss"]) == 0.0
  # gamma > 0 changes the update (the hook is live)
  spec1 = specs.wayward_prompt(length=P, text="abcd", gamma=1.0)
  aux1 = spec1.auxiliary_loss(specs.Backbone(CFG, vocabulary=FakeVocab()))
  c, mc = jax.jit(state_lib.make_train_step(model, tx, auxiliary_loss=aux1))(
      start, frozen, batch, rng)
  numerics.assert_close(mc["loss"], ma["loss"], ma64["loss"], what="task loss, gamma 1")
  assert float(mc["auxiliary_loss"]) > 0
  assert not np.array_equal(np.asarray(jax.tree_util.tree_leaves(c.params)[0]),
                            np.asarray(jax.tree_util.tree_leaves(a.params)[0]))


def test_bad_inputs():
  backbone = specs.Backbone(CFG, vocabulary=FakeVocab())
  with pytest.raises(ConfigError, match=r"has 5 tokens but PROMPT_LENGTH=4; "
                                        r"set PROMPT_LENGTH=5"):
    specs.wayward_prompt(length=P, text="abcde").auxiliary_loss(backbone)
  with pytest.raises(ConfigError, match="WAYWARD_GAMMA must be >= 0"):
    specs.wayward_prompt(length=P, text="abcd", gamma=-1.0).auxiliary_loss(backbone)
  # count and fold are plain prompt tuning's
  spec = specs.wayward_prompt(length=P, text="abcd")
  assert spec.num_trainable_params(CFG) == P * CFG.emb_dim


def test_cosine_neighbours_read_the_prompt():
  table = np.eye(6, 4)[:, :4] + 0.01  # rows 0-3 near the axes, 4-5 tiny
  prompt = np.array([[0, 2.0, 0, 0], [0, 0, 0, -1.0]])
  nn_ids, _ = inspect_lib.cosine_neighbours(prompt, table, k=2)
  assert nn_ids[0, 0] == 1


def _train(model_dir, gamma, steps):
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  from tests.train import common  # pylint: disable=g-import-not-at-top
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = cli.main(["train", *common.flags(
        model_dir, steps, "--gin_file=prompts/wayward.gin",
        "--gin.PROMPT_LENGTH=5", "--gin.WAYWARD_TEXT='last:'", f"--gin.WAYWARD_GAMMA={gamma}",
        "--gin.CHECKPOINT_PERIOD=1000")])
  assert code == 0, err.getvalue()
  return common.prompt_at(model_dir, steps)


def test_embedded_default_prompt_lands_on_the_discrete_words(tmp_path):
  """Acceptance 5: gamma > 0 pulls the prompt (initialised from the sampled vocabulary, the gin
  file's init) onto 'last:' (each position's 3 nearest vocabulary entries by cosine include its
  discrete token); the same run with gamma = 0 does not."""
  from prompt_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from prompt_jax.embedded import CHECKPOINT_DIR  # pylint: disable=g-import-not-at-top
  from prompt_jax.embedded.task import VOCABULARY  # pylint: disable=g-import-not-at-top
  _, params = checkpoints.load(CHECKPOINT_DIR)
  table = np.asarray(params["token_embedder"]["embedding"])
  ids = list(VOCABULARY.encode("last:"))
  assert len(ids) == 5
  steps = 40
  prompt = _train(str(tmp_path / "wayward"), 1.0, steps)
  near, _ = inspect_lib.cosine_neighbours(prompt, table, k=3)
  assert all(ids[p] in near[p] for p in range(5)), (near, ids)
  baseline = _train(str(tmp_path / "plain"), 0.0, steps)
  near0, _ = inspect_lib.cosine_neighbours(baseline, table, k=3)
  assert sum(ids[p] in near0[p] for p in range(5)) <= 1, (near0, ids)
