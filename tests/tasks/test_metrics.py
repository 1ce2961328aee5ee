"""Each task's postprocessor + metrics against values computed by hand."""
import pytest

from prompt_jax import tasks
from prompt_jax.tasks import metrics


def _score(task_name, targets, predictions, examples=None):
  """Runs targets and predictions through the task's postprocessor and all its metrics."""
  task = tasks.get_task(task_name)
  examples = examples or [{}] * len(targets)
  t = [task.postprocess_fn(x, example=ex, is_target=True) for x, ex in zip(targets, examples)]
  p = [task.postprocess_fn(x, example=ex, is_target=False) for x, ex in zip(predictions, examples)]
  scores = {}
  for fn in task.metric_fns:
    scores.update(fn(t, p))
  return scores


def test_cb_mean_f1_and_accuracy():
  targets = ["entailment", "entailment", "contradiction", "neutral", "neutral", "neutral"]
  predictions = ["entailment", "contradiction", "contradiction", "neutral", "entailment", "maybe"]
  # entailment: tp 1, fp 1, fn 1 -> 2/4; contradiction: tp 1, fp 1 -> 2/3; neutral: tp 1, fn 2 ->
  # 2/4. Mean (1/2 + 2/3 + 1/2) / 3 = 5/9. Accuracy 3/6 ("maybe" is wrong).
  assert _score("super_glue_cb_v102", targets, predictions) == pytest.approx(
      {"mean_3class_f1": 500 / 9, "accuracy": 50.0})


def test_multirc_f1a_over_answers_and_exact_match_per_question():
  examples = [{"idx/question": q} for q in (0, 0, 0, 1, 1)]
  targets = ["True", "False", "True", "False", "True"]
  predictions = ["True", "False", "False", "False", "True"]
  # Over answers: tp 2, fp 0, fn 1 -> F1 4/5. Question 0 has a wrong answer, question 1 none.
  assert _score("super_glue_multirc_v102", targets, predictions, examples) == pytest.approx(
      {"f1": 80.0, "exact_match": 50.0})
  # An invalid prediction counts as the wrong class: for a False target it becomes a false positive.
  predictions[1] = "perhaps"
  assert _score("super_glue_multirc_v102", targets, predictions, examples) == pytest.approx(
      {"f1": 200 * 2 / 6, "exact_match": 50.0})


def test_record_scores_each_query_once_with_max_over_answers():
  examples = [
      {"answers": [b"Obama", b"Barack Obama"], "idx/passage": 0, "idx/query": 0},
      {"answers": [b"Obama", b"Barack Obama"], "idx/passage": 0, "idx/query": 0},
      {"answers": [b"the United States"], "idx/passage": 0, "idx/query": 1},
  ]
  predictions = ["barack obama", "nonsense", "United Kingdom"]
  # Query 0: exact match with "Barack Obama" (its duplicate row is skipped). Query 1: normalized
  # "united kingdom" vs "united states" shares 1 of 2 tokens -> F1 1/2.
  assert _score("super_glue_record_v102", [b"Obama"] * 3, predictions, examples) == pytest.approx(
      {"em": 50.0, "f1": 75.0})


def test_squad_em_f1_max_over_answers():
  targets = [["Denver Broncos"] * 3, ["Carolina Panthers"], ["Carolina Panthers", "Panthers"]]
  predictions = ["Denver Broncos", "the Panthers", "Carolina"]
  # 2: "panthers" vs "carolina panthers": P 1, R 1/2 -> 2/3. 3: "carolina" likewise 2/3.
  assert metrics.squad(targets, predictions) == pytest.approx({"em": 100 / 3, "f1": 700 / 9})


def test_mrpc_f1_counts_invalid_predictions_as_wrong():
  targets = ["equivalent", "equivalent", "not_equivalent", "not_equivalent"]
  predictions = ["equivalent", "what", "equivalent", "not_equivalent"]
  # "what" on a positive becomes a false negative: tp 1, fp 1, fn 1 -> F1 1/2; accuracy 2/4.
  assert _score("glue_mrpc_v002", targets, predictions) == pytest.approx(
      {"f1": 50.0, "accuracy": 50.0})


def test_wsc_simple_matches_referents_like_t5():
  task = tasks.get_task("super_glue_wsc_v102_simple_eval")
  example = {"targets_pretokenized": b"the young gentleman", "label": 1}
  assert task.postprocess_fn("Young gentleman", example=example, is_target=False) == 1
  assert task.postprocess_fn("gentleman's horse", example=example, is_target=False) == 0
  assert task.postprocess_fn("the pony", example=example, is_target=False) == 0
  assert task.postprocess_fn("", example=example, is_target=True) == 1


def test_wsc_simple_empty_prediction_is_invalid_like_t5():
  """T5 returns -1 for a prediction that is empty once cleaned: 0 would match a negative label."""
  example = {"targets_pretokenized": b"the boy", "label": 0}
  task = tasks.get_task("super_glue_wsc_v102_simple_eval")
  assert [task.postprocess_fn(p, example=example, is_target=False)
          for p in ["", "the", "  The ", "the boy", "pony"]] == [-1, -1, -1, 1, 0]
  # An empty prediction is never right, whatever the label.
  target = task.postprocess_fn("", example=example, is_target=True)
  prediction = task.postprocess_fn("the", example=example, is_target=False)
  assert metrics.accuracy([target], [prediction]) == {"accuracy": 0.0}


def test_metrics_reject_unpaired_inputs():
  with pytest.raises(ValueError, match="2 targets but 1 predictions"):
    metrics.accuracy([0, 1], [0])
