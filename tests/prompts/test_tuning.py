"""Prompt tuning: initialisers, the four positions, training through the seam, length checks."""
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax.errors import ConfigError
from prompt_jax.models import T5
from prompt_jax.prompts import initializers as inits
from prompt_jax.prompts import seam
from tests import numerics
from prompt_jax.prompts.tuning import PromptTuning
from tests.prompts import helpers

TABLE = np.random.RandomState(0).randn(6000, 16).astype(np.float32)


class FakeVocab:
  def __init__(self, pieces):
    self.pieces = pieces

  def encode(self, text):
    return self.pieces[text]


def test_random_initialisers_ranges():
  rng = jax.random.PRNGKey(0)
  u = np.asarray(inits.uniform_init(0.5)(rng, (50, 16)))
  s = np.asarray(inits.symmetric_uniform_init(0.5)(rng, (50, 16)))
  n = np.asarray(inits.normal_init(2.0)(rng, (200, 16)))
  assert u.min() >= 0 and u.max() < 0.5
  assert s.min() >= -0.5 and s.max() <= 0.5 and s.min() < -0.3
  assert 1.7 < n.std() < 2.3
  spec_u = inits.uniform(0.3)(embedding=None)(rng, (4, 3))
  assert np.asarray(spec_u).max() < 0.3


def test_sampled_vocab_without_then_with_replacement(caplog):
  init = inits.sampled_vocab_init(TABLE, population_size=5000)
  prompt = np.asarray(init(jax.random.PRNGKey(0), (100, 16)))
  rows = [int(np.argmin(np.abs(TABLE - p).sum(1))) for p in prompt]
  np.testing.assert_array_equal(TABLE[rows], prompt)
  assert max(rows) < 5000 and len(set(rows)) == 100  # first 5000 rows, no repeats
  small = inits.sampled_vocab_init(TABLE[:10], population_size=5000)
  with caplog.at_level(logging.WARNING):
    out = np.asarray(small(jax.random.PRNGKey(0), (12, 16)))
  assert "with replacement" in caplog.text and out.shape == (12, 16)


def test_class_labels_and_string_with_a_fake_vocab():
  vocab = FakeVocab({"yes": [3, 4], "no": [7], "a b c": [10, 11, 12]})
  init = inits.class_label_init(TABLE, vocab, ["yes", "no"])
  prompt = np.asarray(init(jax.random.PRNGKey(0), (5, 16)))
  # The mean of the label's subword rows; bound from numpy's float32 mean against float64.
  numerics.assert_close(prompt[0], TABLE[[3, 4]].mean(0), TABLE[[3, 4]].astype(np.float64).mean(0))
  np.testing.assert_array_equal(prompt[1], TABLE[7])  # one subword: its row, exactly
  with pytest.raises(ConfigError, match="3 class labels do not fit a prompt of length 2"):
    inits.class_label_init(TABLE, vocab, ["yes", "no", "yes"])(jax.random.PRNGKey(0), (2, 16))
  text = np.asarray(inits.string_init(TABLE, vocab, "a b c")(jax.random.PRNGKey(0), (2, 16)))
  np.testing.assert_array_equal(text, TABLE[[10, 11]])


def test_class_label_init_with_the_real_t5_vocabulary(shared_data):
  from prompt_jax.vocab import get_vocabulary
  vocab = get_vocabulary(str(shared_data("t5_spm", "spiece.model")))
  table = np.random.RandomState(1).randn(32128, 16).astype(np.float32)
  spec = inits.from_class_labels(["entailment", "not_entailment"])
  prompt = np.asarray(spec(embedding=table, vocabulary=vocab)(jax.random.PRNGKey(0), (8, 16)))
  for pos, label in enumerate(["entailment", "not_entailment"]):
    ids = vocab.encode(label)
    numerics.assert_close(prompt[pos], table[ids].mean(0), table[ids].astype(np.float64).mean(0),
                          what=label)
  assert len(vocab.encode("not_entailment")) > 1  # really a mean over several subwords


def test_prompt_file_shape_is_checked(tmp_path):
  path = tmp_path / "prompt.npy"
  np.save(path, np.ones((3, 16), np.float32))
  np.testing.assert_array_equal(inits.file_init(str(path))(None, (3, 16)), np.ones((3, 16)))
  with pytest.raises(ConfigError) as e:
    inits.from_file(str(path))()(None, (4, 16))
  assert str(e.value).endswith("has shape (3, 16), the parameter needs (4, 16): set "
                               "--gin.PROMPT_LENGTH=3, the file's length")
  with pytest.raises(ConfigError) as e:  # a prompt of another model
    inits.from_file(str(path))()(None, (3, 32))
  assert str(e.value).endswith("has shape (3, 16), the parameter needs (3, 32): its width 16 is "
                               "another model's embedding size (this one's is 32); use the model "
                               "the prompt was trained with (its models/*.gin and "
                               "INITIAL_CHECKPOINT_PATH)")
  with pytest.raises(ConfigError, match="does not exist"):
    inits.file_init(str(tmp_path / "missing.npy"))


# What npy.load says of each damage `_bad_npy` makes (every .npy a user names is read by it).
BAD_NPY_REASONS = [
    ("truncated", "is not a readable .npy array"),
    ("npz", "is an .npz archive, not one .npy array"),
    ("text", "is not a .npy array file"),
    ("pickled", "it holds pickled Python objects"),
    ("missing", "does not exist"),
    ("nan", "holds 2 NaN or Inf value(s) of 800, not usable numbers"),
]


def _bad_npy(tmp_path, kind):
  """A file that is not one numeric .npy array: truncated, .npz, text, pickled, 1-D, missing, or
  one holding NaN / Inf."""
  path = tmp_path / f"{kind}.npy"
  if kind == "truncated":
    np.save(path, TABLE[:50])
    path.write_bytes(path.read_bytes()[:200])
  elif kind == "npz":
    with open(path, "wb") as f:
      np.savez(f, table=TABLE[:50])
  elif kind == "text":
    path.write_text("not an array\n")
  elif kind == "pickled":
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
  elif kind == "1d":
    np.save(path, TABLE[0])
  elif kind == "nan":  # a diverged run's export
    table = TABLE[:50].copy()
    table[3, 4], table[7, 0] = np.nan, np.inf
    np.save(path, table)
  return str(path)


def test_embedding_file_is_read_as_one_npy_array(tmp_path):
  path = tmp_path / "table.npy"
  np.save(path, TABLE[:50].astype(np.float64))
  spec = inits.from_sampled_vocab(population_size=50, embedding_file=str(path))
  got = np.asarray(spec(embedding=None)(jax.random.PRNGKey(0), (4, 16)))
  want = np.asarray(inits.sampled_vocab_init(TABLE[:50], 50)(jax.random.PRNGKey(0), (4, 16)))
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind,reason", BAD_NPY_REASONS + [
    ("1d", "has shape (16,), not an embedding table [V, H]")])
def test_a_bad_embedding_file_is_one_config_error_line(tmp_path, kind, reason):
  path = _bad_npy(tmp_path, kind)
  with pytest.raises(ConfigError) as e:
    inits.from_sampled_vocab(embedding_file=path)(embedding=None)
  assert str(e.value).startswith(f"EMBEDDING_FILE {path!r} ")
  assert reason in str(e.value) and "\n" not in str(e.value)
  assert str(e.value).endswith("save the embedding table [V, H] with numpy.save")


def _virtual_tokens_reference(placement, start_fn):
  """A prompt equal to the embeddings of tokens V placed at a position == V inserted there."""
  plain = T5(helpers.TINY)
  frozen = helpers.frozen()
  virtual = np.array([40, 41, 42])
  table = frozen["token_embedder"]["embedding"]
  method = functools.partial(PromptTuning, length=3, init=lambda rng, shape: table[virtual])
  model = T5(helpers.TINY, prompt=seam.prompt_factory(method, 3, placement))
  params = helpers.init_prompted(model)
  enc, dec_in, tgt = helpers.batch()
  ref_enc = []
  for row in np.asarray(enc):
    s = start_fn(row)
    ref_enc.append(np.concatenate([row[:s], virtual, row[s:]]))
  # Bound derived from float32's own error (tests/numerics.py).
  numerics.check_equivalent(helpers.logits_fn(model, params),
                            helpers.logits_fn(plain, frozen, enc=jnp.asarray(np.stack(ref_enc))))
  helpers.assert_masks_right(model, params, num_prompt=3)


@pytest.mark.parametrize("placement,start_fn", [
    ("prefix", lambda row: 0),
    ("after_bos", lambda row: 1),
    ("suffix", lambda row: int((row > 0).sum()) - 1),  # before the EOS
    (seam.between_segments([7, 8]), lambda row: 4 if 7 in row else int((row > 0).sum()) - 1),
])
def test_positions_equal_inserted_virtual_tokens(placement, start_fn):
  _virtual_tokens_reference(placement, start_fn)


def test_unknown_position_is_a_clear_error():
  with pytest.raises(ValueError, match="unknown prompt position 'middle'"):
    seam.get_placement("middle")


def test_prompt_tuning_trains_only_its_prompt():
  frozen = helpers.frozen()
  method = functools.partial(PromptTuning, length=4)
  model = T5(helpers.TINY, prompt=seam.prompt_factory(method, 4))
  params = helpers.init_prompted(model)
  helpers.assert_trains_only(model, params, ["encoder/prompt/prompt/prompt"])


def test_prompt_length_check():
  seam.check_prompt_length(100, 412, max_encoder_length=512)
  with pytest.raises(ValueError, match=r"P=100 \+ inputs length 500 exceeds the encoder length"):
    seam.check_prompt_length(100, 500, max_encoder_length=512)
  with pytest.raises(ValueError, match="P=20 is larger than the inputs feature length 16"):
    seam.check_prompt_length(20, 16, reads_input_tokens=True)
