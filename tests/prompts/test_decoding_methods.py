"""Beam search with every prompt method: the encoder output (prompt positions and their mask
included) computed once and repeated to the beams, decoder key/value prefixes on the beam rows."""
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax import run_setup
from prompt_jax.models import decoding
from prompt_jax.prompts import specs
from tests import numerics
from tests.models import test_decoding
from tests.prompts import helpers
from tests.prompts.test_specs import SPECS  # every method, as the spec tests build them

METHODS = dict(SPECS, prompt_tuning=specs.prompt_tuning(length=4),
               # all three prefix sets: the decoder's cross-attention prefixes on the beam rows
               prefix_with_cross=specs.deep_prefix(length=2, hidden=5, cross=True))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_beam_scores_equal_the_teacher_forced_model(name):
  model = run_setup.build_model(helpers.TINY, METHODS[name])
  # Method parameters moved off their initialisation, so the prompt changes the outputs.
  params = helpers.perturbed(helpers.init(model), regex=r".*(prompt|layer_prompts).*")
  params = test_decoding.decodable(params, eos=(0, 1.0))
  test_decoding.check_scores_are_penalised_log_likelihoods(model, params, alpha=0.6,
                                                           beam_size=3, check_float64=False)


@pytest.mark.parametrize("name", ["prefix_encoder_and_decoder", "prefix_with_cross"])
def test_decoder_prefixes_beam_1_is_greedy(name):
  """Deep prefix tuning's decoder hooks: their prefixes reach all B * K decoder rows."""
  model = run_setup.build_model(helpers.TINY, METHODS[name])
  params = helpers.perturbed(helpers.init(model), regex=r".*layer_prompts.*")
  params = test_decoding.decodable(params, eos=(0, 1.0))
  enc = helpers.batch()[0]
  # In float64 (greedy and beam 1 are different programs; see test_decoding's beam-1 test).
  with numerics.float64():
    model, params = test_decoding._in(jnp.float64, model, params)  # pylint: disable=protected-access
    greedy = np.asarray(decoding.greedy_decode(model, params, enc, 6))
    tokens, _ = decoding.beam_decode(model, params, enc, 6, beam_size=1, alpha=0.0)
  np.testing.assert_array_equal(np.asarray(tokens)[:, 0], greedy)
