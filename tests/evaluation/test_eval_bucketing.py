"""Length bucketing at evaluation (issue 11, item 4): with `prompt_jax.length_buckets` on, eval /
infer cut each batch's inputs to the smallest fixed length holding its longest row
(`evaluation.inference._batches`), as training does, and the scores and predictions are those of
the inputs padded to TASK_FEATURE_LENGTHS.

The cut removes trailing padding only and the model adds the prompt after it; padding keys are
masked and relative position biases depend on distances only, so each cut batch computes the
same function on the same real tokens. The programs differ in shape, so float32 rounding may
differ: scores are bounded against the padded scores run in float64 (tests/numerics.py: 8x the
padded float32 scores' own error), choices may differ only at float32 near-ties.
"""
import types

import gin
import jax.numpy as jnp
import numpy as np
import pytest

from prompt_jax import partitioning, run_setup, trees
from prompt_jax.embedded import embedded_checkpoint_path
from prompt_jax.embedded import task
from prompt_jax.evaluation import inference
from prompt_jax.models import decoding
from prompt_jax.prompts import specs
from prompt_jax.train import data as data_lib
from tests import numerics
from tests.train import common

LENGTHS = {"inputs": 32, "targets": 4}
BATCH = 4


def _inputs() -> np.ndarray:
  """[10, 32] rows of the embedded task: batches of 4, 4 and 2; the last batch has a long row."""
  texts = [text for text, _ in task.examples("validation")[:10]]
  texts[-1] = texts[-1] * 4  # needs more than the shorter buckets
  out = np.zeros((len(texts), LENGTHS["inputs"]), np.int32)
  for i, text in enumerate(texts):
    ids = (list(task.VOCABULARY.encode(text)) + [1])[:LENGTHS["inputs"]]
    out[i, :len(ids)] = ids
  return out


@pytest.fixture(params=["prefix", "suffix"])
def runs(request):
  """(float32 run, float64 run) of the embedded backbone with a 4-token prompt at `placement`."""
  config = common.embedded_tiny_config(dtype="float32", dropout_rate=0.0)
  spec = specs.prompt_tuning(length=4, placement=request.param)
  run = run_setup.prepare(config=config, prompt=spec, feature_lengths=LENGTHS,
                          initial_checkpoint_path=embedded_checkpoint_path(),
                          trainable_regex=spec.trainable_regex, mesh=partitioning.create_mesh(1))
  run64 = types.SimpleNamespace(
      model=run_setup.build_model(config.replace(dtype=jnp.float64), spec, params=None),
      trainable=numerics.cast(run.trainable, np.float64),
      frozen=numerics.cast(run.frozen, np.float64), mesh=run.mesh)
  return run, run64


def _buckets(num_buckets: int) -> None:
  gin.clear_config()
  with gin.unlock_config():
    gin.bind_parameter("prompt_jax.length_buckets.num_buckets", num_buckets)


def test_bucketed_eval_scores_and_predictions_equal_the_padded_ones(runs, monkeypatch):
  run, run64 = runs
  inputs = _inputs()
  label_ids = inference.label_tokens(list("abcdefgh"), task.VOCABULARY)  # [8, 2]
  try:
    _buckets(0)
    padded = inference.label_scores(run, inputs, label_ids, batch_size=BATCH)
    padded_greedy, _ = inference.decode_rows(run, inputs, batch_size=BATCH, max_decode_length=4)
    with numerics.float64():
      ref64 = inference.label_scores(run64, inputs, label_ids, batch_size=BATCH)

    _buckets(4)
    widths = []
    score_targets = decoding.score_targets
    monkeypatch.setattr(decoding, "score_targets", lambda model, params, enc, *a, **k: (
        widths.append(enc.shape[1]), score_targets(model, params, enc, *a, **k))[1])
    bucketed = inference.label_scores(run, inputs, label_ids, batch_size=BATCH)
    bucketed_greedy, _ = inference.decode_rows(run, inputs, batch_size=BATCH,
                                               max_decode_length=4)
  finally:
    gin.clear_config()

  # Each batch ran at the smallest bucket holding its longest row, the long row's at more.
  buckets = data_lib.bucket_lengths(LENGTHS["inputs"], 4)
  assert buckets == (8, 16, 24, 32)
  want = [next(b for b in buckets if b >= data_lib.used_length(inputs[i:i + BATCH]))
          for i in range(0, len(inputs), BATCH)]
  assert widths == want and min(want) < LENGTHS["inputs"] and want[-1] > want[0], widths

  assert bucketed.shape == padded.shape == (10, 8)
  numerics.assert_close(bucketed, padded, ref64, what="bucketed label scores")
  # Rank classification: the same label but for float32 near-ties of the scores.
  ties = numerics.near_ties(padded, ref64)
  numerics.assert_same_choices(np.argmax(bucketed, -1), np.argmax(padded, -1), ties,
                               what="bucketed rank classification", max_near_tie_share=0.2)
  # Greedy decoding: the same tokens but for greedy near-ties.
  greedy_ties = numerics.greedy_near_ties(run.model, trees.merge(run.trainable, run.frozen),
                                          inputs, 4)
  numerics.assert_same_choices(np.array([str(r) for r in bucketed_greedy]),
                               np.array([str(r) for r in padded_greedy]), greedy_ties,
                               what="bucketed greedy decoding", max_near_tie_share=0.2)


def test_eval_is_padded_without_buckets(runs, monkeypatch):
  run, _ = runs
  widths = []
  score_targets = decoding.score_targets
  monkeypatch.setattr(decoding, "score_targets", lambda model, params, enc, *a, **k: (
      widths.append(enc.shape[1]), score_targets(model, params, enc, *a, **k))[1])
  gin.clear_config()
  inference.label_scores(run, _inputs(), inference.label_tokens(list("ab"), task.VOCABULARY),
                         batch_size=BATCH)
  assert widths == [LENGTHS["inputs"]] * 3
