"""A prompt bank serves a prompt per row: every row equals its prompt evaluated alone."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.models import decoding
from prompt_jax.prompts import PromptTuning, prompt_factory
from prompt_jax.prompts import bank as bank_lib
from tests import numerics
from tests.models.test_decoding import decodable
from tests.prompts import helpers

TINY = helpers.TINY
TOKENS = np.array([[5, 6, 7, 8, 1, 0, 0, 0], [10, 9, 1, 0, 0, 0, 0, 0],
                   [12, 13, 14, 1, 0, 0, 0, 0], [21, 22, 23, 24, 25, 26, 27, 1]], np.int32)
LABELS = np.array([[3, 1, 0], [4, 7, 1], [9, 1, 0]], np.int32)  # [C, L] candidate targets
# Three prompts of different lengths and placements (the longest sets P_max = 5).
PROMPTS = (("a", 3, "prefix"), ("b", 5, "suffix"), ("c", 2, "after_bos"))


def _entries(seed=0):
  rng = np.random.RandomState(seed)
  return [bank_lib.BankEntry(name, rng.randn(p, TINY.emb_dim).astype(np.float32), placement)
          for name, p, placement in PROMPTS]


@functools.lru_cache(maxsize=None)
def _frozen():
  # EOS output column (seed 2, scale 1.5): greedy rows end at different steps (asserted).
  return decodable(helpers.frozen(), eos=(2, 1.5))


def _alone(entry, dtype=jnp.float32):
  """The prompt evaluated alone: T5 with plain prompt tuning at its own length."""
  p = entry.prompt.shape[0]
  model = T5(TINY.replace(dtype=dtype), prompt=prompt_factory(
      functools.partial(PromptTuning, length=p), p, entry.placement))
  frozen = _frozen()
  params = dict(frozen, encoder=dict(frozen["encoder"], prompt={"prompt": {
      "prompt": entry.prompt}}))
  return model, numerics.cast(params, dtype)


def _bank_rows(entries, row_prompt, dtype=jnp.float32, length=6):
  table = bank_lib.build_table(entries)
  model = T5(TINY.replace(dtype=dtype))
  params = numerics.cast(_frozen(), dtype)
  dev = bank_lib.device_bank(table, dtype)
  args = (model, params, jnp.asarray(TOKENS), dev, jnp.asarray(row_prompt), table.layout)
  return (np.asarray(bank_lib.greedy(*args, length)),
          np.asarray(bank_lib.score(*args, jnp.asarray(LABELS))),
          bank_lib.beam(*args, length, 3, 0.6))


def _alone_rows(entry, dtype=jnp.float32, length=6):
  model, params = _alone(entry, dtype)
  tokens = jnp.asarray(TOKENS)
  return (np.asarray(decoding.greedy_decode(model, params, tokens, length)),
          np.asarray(decoding.score_targets(model, params, tokens, jnp.asarray(LABELS))),
          decoding.beam_decode(model, params, tokens, length, beam_size=3, alpha=0.6))


def test_ensemble_rows_equal_each_prompt_alone():
  """Batch = examples x N (row e * N + n is example e under prompt n); prompts of lengths 3, 5, 2
  padded to 5 and placed prefix / suffix / after_bos in one batch."""
  entries = _entries()
  n = len(entries)
  row_prompt = np.tile(np.arange(n, dtype=np.int32), (TOKENS.shape[0], 1))  # [E, N]
  _, scores, (_, beam_scores) = _bank_rows(entries, row_prompt)
  scores = scores.reshape(TOKENS.shape[0], n, -1)
  beam_scores = np.asarray(beam_scores).reshape(TOKENS.shape[0], n)
  # Greedy and beam tokens (argmax / top-k choices) compared in float64: the bank and the alone
  # run are programs of different shapes, whose float32 rounding may flip a near-tie; in float64
  # a flip needs a tie within ~1e-16 relative. The float32 scores are bounded below.
  with numerics.float64():
    greedy64, _, (beam64, _) = _bank_rows(entries, row_prompt, jnp.float64)
  greedy64 = greedy64.reshape(TOKENS.shape[0], n, -1)
  beam64 = np.asarray(beam64).reshape(TOKENS.shape[0], n, -1)
  lengths_seen = set()
  for i, entry in enumerate(entries):
    _, want32, (_, want_beam32) = _alone_rows(entry)
    with numerics.float64():
      want_greedy, want64, (want_beams, want_beam64) = _alone_rows(entry, jnp.float64)
      np.testing.assert_array_equal(greedy64[:, i], want_greedy)
      np.testing.assert_array_equal(beam64[:, i], np.asarray(want_beams)[:, 0])
      lengths_seen.update(int(r) for r in (want_greedy == 1).argmax(-1))
      # Scores: the bank row differs from the alone run only in summation order (more masked
      # positions), so its distance to the float64 alone run is bounded by numerics' bound.
      numerics.assert_close(scores[:, i], want32, want64, what=f"label scores of {entry.name}")
      numerics.assert_close(beam_scores[:, i], np.asarray(want_beam32)[:, 0],
                            np.asarray(want_beam64)[:, 0], what=f"beam scores of {entry.name}")
  assert len(lengths_seen) > 1, "greedy rows should end at different steps (a real test)"


def test_mixed_batch_rows_equal_their_prompt_alone_whatever_the_neighbours():
  """Each example names one prompt (K = 1); the shorter prompts sit in a batch padded to the
  longest, and the outputs equal the prompt alone."""
  entries = _entries(seed=1)
  row_prompt = np.array([[1], [0], [2], [0]], np.int32)
  _, scores, _ = _bank_rows(entries, row_prompt)
  with numerics.float64():  # tokens in float64: see test_ensemble_rows_equal_each_prompt_alone
    greedy64 = _bank_rows(entries, row_prompt, jnp.float64)[0]
  for row, (i,) in enumerate(row_prompt):
    _, want32, _ = _alone_rows(entries[i])
    with numerics.float64():
      want_greedy, want64, _ = _alone_rows(entries[i], jnp.float64)
    np.testing.assert_array_equal(greedy64[row], want_greedy[row])
    numerics.assert_close(scores[row], want32[row], want64[row], what=f"row {row}")


def test_padding_is_inert_a_longer_neighbour_changes_nothing():
  """The same prompt in a bank alone and in a bank with a 4x longer neighbour: same outputs (the
  padded positions are masked and moved behind the real ones)."""
  entries = _entries(seed=2)[:1]
  longer = bank_lib.BankEntry("long", np.ones((12, TINY.emb_dim), np.float32) * 7.0)
  row_prompt = np.zeros((TOKENS.shape[0], 1), np.int32)
  _, s2, _ = _bank_rows(entries + [longer], row_prompt)
  with numerics.float64():  # tokens in float64: the two banks pad to 3 and 12 (other shapes)
    g1 = _bank_rows(entries, row_prompt, jnp.float64)[0]
    g2 = _bank_rows(entries + [longer], row_prompt, jnp.float64)[0]
  np.testing.assert_array_equal(g1, g2)
  want32, want64 = _alone_rows(entries[0])[1], None
  with numerics.float64():
    want64 = _alone_rows(entries[0], jnp.float64)[1]
  numerics.assert_close(s2, want32, want64, what="scores with a padded neighbour")


def test_compact_moves_masked_positions_behind_in_order():
  values = jnp.arange(6, dtype=jnp.float32).reshape(1, 6, 1)
  mask = jnp.array([[False, True, False, True, True, False]])
  v, m = bank_lib.compact(values, mask)
  np.testing.assert_array_equal(np.asarray(v)[0, :, 0], [1, 3, 4, 0, 2, 5])
  np.testing.assert_array_equal(np.asarray(m)[0], [True, True, True, False, False, False])


def test_bad_banks_are_one_line_errors():
  entries = _entries()
  with pytest.raises(ConfigError, match="empty"):
    bank_lib.build_table([])
  wide = bank_lib.BankEntry("w", np.zeros((3, TINY.emb_dim + 1), np.float32))
  with pytest.raises(ConfigError, match="different widths"):
    bank_lib.build_table(entries + [wide])
  with pytest.raises(ConfigError, match="emb_dim is 32"):
    bank_lib.build_table(entries, width=32)
  with pytest.raises(ConfigError, match="twice"):
    bank_lib.build_table(entries + entries[:1])
  table = bank_lib.build_table(entries)
  with pytest.raises(ConfigError, match="'zz', which is not in the prompt bank"):
    table.index("zz")
  assert table.index("c") == 2
