"""MRQA tasks: T5's SQuAD format on the real MRQA SQuAD dev file, mixtures, metrics wiring."""
import pytest
import tensorflow as tf

from prompt_jax import tasks
from prompt_jax.tasks import preprocessors
from prompt_jax.tasks.inspect import text_examples


def test_squad_dev_example_in_t5_squad_format(data_root):
  first, second = text_examples("mrqa_squad_v001", "validation", 2)
  context = (
      "Super Bowl 50 was an American football game to determine the champion of the National "
      "Football League ( NFL ) for the 2015 season . The American Football Conference ( AFC ) "
      "champion Denver Broncos defeated the National Football Conference ( NFC ) champion "
      "Carolina Panthers 24\u201310 to earn their third Super Bowl title . The game was played "
      "on February 7 , 2016 , at Levi ' s Stadium in the San Francisco Bay Area at Santa Clara , "
      "California . As this was the 50th Super Bowl , the league emphasized the \" golden "
      "anniversary \" with various gold - themed initiatives , as well as temporarily suspending "
      "the tradition of naming each Super Bowl game with Roman numerals ( under which the game "
      "would have been known as \" Super Bowl L \" ) , so that the logo could prominently "
      "feature the Arabic numerals 50 . ")
  assert first["inputs"] == (
      "question: Which NFL team represented the AFC at Super Bowl 50 ? context: " + context)
  assert first["targets"] == "Denver Broncos"
  assert first["answers"] == ["Denver Broncos"] * 3
  assert first["id"] == "b0626b3af0764c80b1e6f22c114982c1"
  assert second["targets"] == "Carolina Panthers"


def test_punctuation_padding_keeps_non_ascii_letters_like_t5():
  """T5's current `_pad_punctuation` pads `[[:punct:]]` (ASCII punctuation) only: its old `\\W`,
  ASCII-only in RE2, split "Frédéric" into "Fr é d é ric" and padded the en dash of "24–10"."""
  raw = {
      "qid": "q0",
      "question": "Who is Frédéric Chopin's teacher?",
      "context": "Frédéric (1810–1849) studied in Warsaw, in Żelazowa Wola's school.",
      "answers": ["Józef Elsner", "Elsner's"],
      "detected_answers": {"text": ["Józef Elsner"]},
  }
  (ex,) = preprocessors.mrqa(tf.data.Dataset.from_tensors(raw)).as_numpy_iterator()
  assert ex["question"].decode() == "Who is Frédéric Chopin ' s teacher ? "
  assert ex["context"].decode() == (
      "Frédéric ( 1810–1849 ) studied in Warsaw , in Żelazowa Wola ' s school . ")
  assert ex["inputs"].decode() == (
      "question: Who is Frédéric Chopin ' s teacher ? context: Frédéric ( 1810–1849 ) studied "
      "in Warsaw , in Żelazowa Wola ' s school . ")
  assert ex["targets"].decode() == "Józef Elsner"
  assert [a.decode() for a in ex["answers"]] == ["Józef Elsner", "Elsner ' s"]


def test_squad_dev_has_every_question(data_root):
  assert tasks.get_task("mrqa_squad_v001").source.num_input_examples("validation") == 10507


def test_qa_postprocessing_and_squad_metric():
  task = tasks.get_task("mrqa_textbookqa_v001")
  example = {"answers": [b"the Sun", b"Sun"]}
  target = task.postprocess_fn(b"ignored", example=example, is_target=True)
  prediction = task.postprocess_fn("sun", example=example, is_target=False)
  assert target == ["the Sun", "Sun"]
  (squad,) = task.metric_fns
  assert squad([target], [prediction]) == {"em": 100.0, "f1": 100.0}


def test_out_of_domain_tasks_are_validation_only_and_mixed_with_squad():
  assert tasks.get_task("mrqa_bioasq_v001").splits == ("validation",)
  assert tasks.get_task("mrqa_squad_v001").splits == ("train", "validation")
  assert sorted(t.name for t in tasks.get_task("squad_to_duorc").tasks) == [
      "mrqa_duorc_v001", "mrqa_squad_v001"]
  assert len(tasks.get_task("squad_to_mrqa").tasks) == 7
  with pytest.raises(ValueError, match="generative"):
    tasks.label_set("mrqa_squad_v001")


def test_missing_out_of_domain_file_names_the_path(data_root):
  with pytest.raises(FileNotFoundError) as error:
    text_examples("mrqa_bioasq_v001", "validation", 1)
  message = str(error.value)
  assert f"{data_root}/mrqa/dev/BioASQ.jsonl.gz, which does not exist" in message
  assert "download_out_of_domain_dev.sh" in message
