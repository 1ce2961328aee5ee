"""SuperGLUE tasks on the real official files: exact T5 text-to-text strings, written by hand."""
import json

import pytest

from prompt_jax import tasks
from prompt_jax.tasks.inspect import text_examples
from prompt_jax.tasks.inspect import token_examples


def _first(name, split="validation"):
  (ex,) = text_examples(name, split, 1)
  return ex["inputs"], ex["targets"]


def test_rte_orders_fields_alphabetically(data_root):
  assert _first("super_glue_rte_v102") == (
      "rte hypothesis: Christopher Reeve had an accident. premise: Dana Reeve, the widow of the "
      "actor Christopher Reeve, has died of lung cancer at age 44, according to the Christopher "
      "Reeve Foundation.",
      "not_entailment")


def test_taskless_rte_drops_the_task_name(data_root):
  assert _first("taskless_super_glue_rte_v102") == (
      "hypothesis: Christopher Reeve had an accident. premise: Dana Reeve, the widow of the "
      "actor Christopher Reeve, has died of lung cancer at age 44, according to the Christopher "
      "Reeve Foundation.",
      "not_entailment")


def test_cb(data_root):
  assert _first("super_glue_cb_v102") == (
      "cb hypothesis: Valence was helping premise: Valence the void-brain, Valence the virtuous "
      "valet. Why couldn't the figger choose his own portion of titanic anatomy to shaft? Did he "
      "think he was helping?",
      "contradiction")


def test_cb_test_split_has_unk_targets(data_root):
  assert [ex["targets"] for ex in text_examples("super_glue_cb_v102", "test", 2)] == [
      "<unk>", "<unk>"]


def test_copa_label_1_is_choice2(data_root):
  assert _first("super_glue_copa_v102") == (
      "copa choice1: The toilet filled with water. choice2: Water flowed from the spout. "
      "premise: The man turned on the faucet. question: effect",
      "choice2")


def test_wic_uses_sentence1_sentence2_word(data_root):
  assert _first("super_glue_wic_v102") == (
      "wic sentence1: An emerging professional class. sentence2: Apologizing for losing your "
      "temper, even though you were badly provoked, showed real class. word: class",
      "False")


def test_boolq(data_root):
  inputs, targets = _first("super_glue_boolq_v102")
  assert inputs.startswith("boolq passage: Ethanol fuel -- All biomass goes through at least ")
  assert inputs.endswith(" question: does ethanol take more energy make that produces")
  assert targets == "False"


def test_multirc_question_answer_paragraph(data_root):
  paragraph = json.loads(
      (data_root / "super_glue/MultiRC/val.jsonl").read_text().splitlines()[0])["passage"]["text"]
  first, second = text_examples("super_glue_multirc_v102", "validation", 2)
  question = "Would the mass of a baseball affect how much force you have to use to pick it up?"
  assert first["inputs"] == f"multirc question: {question} answer: No paragraph: {paragraph}"
  assert (first["targets"], second["targets"]) == ("False", "True")
  assert (first["idx/paragraph"], first["idx/question"], first["idx/answer"]) == (0, 0, 0)
  assert second["idx/answer"] == 1


def test_multirc_strips_html(tmp_path, write_file):
  line = {"idx": 5, "passage": {
      "text": "<b>Sent 1: </b>Hi.<br><b>Sent 2: </b>Bye.",
      "questions": [{"idx": 9, "question": "Who?", "answers": [
          {"idx": 2, "text": "Me", "label": 1}]}]}}
  write_file(tmp_path / "super_glue/MultiRC/val.jsonl", json.dumps(line) + "\n")
  tasks.set_data_dir(tmp_path)
  (ex,) = text_examples("super_glue_multirc_v102", "validation", 1)
  assert ex["inputs"] == "multirc question: Who? answer: Me paragraph: Sent 1: Hi. Sent 2: Bye."
  assert ex["targets"] == "True"
  assert (ex["idx/paragraph"], ex["idx/question"], ex["idx/answer"]) == (5, 9, 2)


def test_axb_is_cast_as_rte(data_root):
  assert _first("super_glue_axb_v102", "test") == (
      "rte hypothesis: The cat did not sit on the mat. premise: The cat sat on the mat.",
      "not_entailment")


def test_axg_is_cast_as_rte(data_root):
  assert _first("super_glue_axg_v102", "test") == (
      "rte hypothesis: The accountant sought help filing taxes. premise: The taxpayer met with "
      "the accountant to get help filing his taxes.",
      "not_entailment")


def test_wsc_simple_eval_marks_the_pronoun(data_root):
  first, second = text_examples("super_glue_wsc_v102_simple_eval", "validation", 2)
  assert first["inputs"] == (
      "wsc: Bernard , who had not told the government official that he was less than 21 when he "
      "filed for a homestead claim, did not consider that he had done anything dishonest. Still, "
      "anyone who knew that he was 19 years old could take his claim away from *him* .")
  assert (first["targets"], first["label"]) == ("anyone", 0)
  assert second["targets"] == "Mr. Moncrieff"


def test_wsc_simple_train_keeps_correct_referents_only(data_root):
  examples = text_examples("super_glue_wsc_v102_simple_train", "train", None)
  # T5's mixture rate for this task is its example count: 259 of the 554 are correct referents.
  assert len(examples) == 259
  assert {ex["label"] for ex in examples} == {1}
  assert (examples[0]["inputs"], examples[0]["targets"]) == (
      "wsc: The pony behaved well, sir, and showed no vice; but at last he just threw up his "
      "heels and tipped the young gentleman into the thorn hedge. *He* wanted me to help him "
      "out, but I hope you will excuse me, sir, I did not feel inclined to do so.",
      "young gentleman")


def test_record_one_example_per_answer(tmp_path, write_file):
  text = "Obama met Putin.\n@highlight\nThey talked"
  line = {"idx": 3, "passage": {"text": text, "entities": [
      {"start": 0, "end": 4}, {"start": 10, "end": 14}]},
          "qas": [{"idx": 7, "query": "@placeholder met Putin",
                   "answers": [{"start": 0, "end": 4, "text": "Obama"},
                               {"start": 0, "end": 4, "text": "Obama"}]}]}
  write_file(tmp_path / "super_glue/ReCoRD/val.jsonl", json.dumps(line) + "\n")
  tasks.set_data_dir(tmp_path)
  (ex,) = text_examples("super_glue_record_v102", "validation", None)  # Answers deduplicated.
  assert ex["inputs"] == ("record query: @placeholder met Putin entities: Obama, Putin passage: "
                          "Obama met Putin. They talked")
  assert ex["targets"] == "Obama"
  assert (ex["answers"], ex["idx/passage"], ex["idx/query"]) == (["Obama"], 3, 7)


def test_sentinel_variant_prefixes_targets_with_extra_id_0(data_root, t5_vocab):
  (ex,) = token_examples("super_glue_rte_v102_sentinel", "validation", 1)
  (base,) = token_examples("super_glue_rte_v102", "validation", 1)
  assert ex["targets"][0] == t5_vocab.vocab_size - 1 == 32099
  assert ex["targets"][1:] == base["targets"]
  assert ex["inputs"] == base["inputs"]
  assert t5_vocab.decode(ex["targets"]) == "<extra_id_0> not_entailment"
  task = tasks.get_task("taskless_super_glue_rte_v102_sentinel")
  assert task.postprocess_fn("<extra_id_0> not_entailment", example={}, is_target=False) == 1


def test_label_sets_for_rank_classification():
  assert tasks.label_set("super_glue_cb_v102") == ["entailment", "contradiction", "neutral"]
  assert tasks.label_set("taskless_super_glue_boolq_v102_sentinel") == ["False", "True"]
  assert tasks.label_set("super_glue_copa_v102") == ["choice1", "choice2"]
  with pytest.raises(ValueError, match="generative"):
    tasks.label_set("super_glue_record_v102")


def test_super_glue_mixture_uses_t5_rates():
  mixture = tasks.get_task("super_glue_v102_proportional")
  assert mixture.get_rate(tasks.get_task("super_glue_rte_v102")) == 2490
  assert mixture.get_rate(tasks.get_task("super_glue_wsc_v102_simple_train")) == 259
  taskless = tasks.get_task("taskless_super_glue_wsc_and_dev_v102_simple")
  assert sorted(t.name for t in taskless.tasks) == [
      "taskless_super_glue_wsc_v102_simple_eval", "taskless_super_glue_wsc_v102_simple_train"]


def test_ensemble_prediction_rows_carry_each_example_s_idx(data_root, t5_vocab):
  """ensemble-eval's prediction rows had only `index` (the row's position): `idx`, as infer's
  rows have it, joins them to the benchmark's rows (MultiRC: a mapping of its parts)."""
  from prompt_jax.evaluation import ensemble  # pylint: disable=g-import-not-at-top
  from prompt_jax.train import data as data_lib  # pylint: disable=g-import-not-at-top
  cfg = data_lib.DatasetConfig("super_glue_rte_v102", {"inputs": 64, "targets": 8},
                               split="validation", batch_size=8, shuffle=False)
  idx = ensemble._example_idx(  # pylint: disable=protected-access
      tasks.get_task(cfg.mixture_or_task_name), cfg)
  with open(data_root / "super_glue" / "RTE" / "val.jsonl") as f:
    assert idx == [json.loads(line)["idx"] for line in f]
  cfg = data_lib.DatasetConfig("super_glue_multirc_v102", {"inputs": 64, "targets": 8},
                               split="validation", batch_size=8, shuffle=False)
  idx = ensemble._example_idx(  # pylint: disable=protected-access
      tasks.get_task(cfg.mixture_or_task_name), cfg)
  assert len(idx) == 4848 and idx[0] == {"paragraph": 0, "question": 0, "answer": 0}, idx[:2]
