"""Sentence classification beyond GLUE: IMDB, AG News (TFDS or official files), MR, CR, SUBJ, MPQA.

  imdb_reviews_v100        "imdb text: <review>"                        -> negative / positive
  ag_news_subset_v100      "ag_news title: <t> description: <d>"        -> World / Sports / ...
  {mr,cr,mpqa}_v001        "<task> sentence: <s>"                       -> negative / positive
  subj_v001                "subj sentence: <s>"                         -> subjective / objective

Formats follow T5's GLUE convention (task name, then "<field>: <text>"). These datasets have no
validation split, so "validation" is their official test set. MR/CR/SUBJ/MPQA come only from files
(LM-BFF's `original/<task>/{train,test}.csv`). (+ taskless_* and *_sentinel variants.)
"""
import functools

import tensorflow as tf

from prompt_jax.tasks import metrics
from prompt_jax.tasks import postprocessors
from prompt_jax.tasks import preprocessors
from prompt_jax.tasks import readers
from prompt_jax.tasks import registration
from prompt_jax.tasks import sources

SENTIMENT = ("negative", "positive")
# Files-only tasks: name -> label words (index = the files' label column).
SENTENCE_TASKS = {
    "mr": SENTIMENT,
    "cr": SENTIMENT,
    "mpqa": SENTIMENT,
    "subj": ("subjective", "objective"),
}


def _imdb_source() -> sources.LocalOrTfdsSource:
  return sources.LocalOrTfdsSource(
      "IMDB", splits=("train", "validation"),
      tfds_name="imdb_reviews/plain_text:1.0.0", tfds_splits={"validation": "test"},
      local=sources.LocalFiles(
          folder="imdb", files={"train": "train", "validation": "test"},
          read=readers.read_imdb_folder, features={"text": tf.string, "label": tf.int64},
          how_to_get="copy aclImdb/train and aclImdb/test of the official release there"))


def _ag_news_source() -> sources.LocalOrTfdsSource:
  return sources.LocalOrTfdsSource(
      "AG News", splits=("train", "validation"),
      tfds_name="ag_news_subset:1.0.0", tfds_splits={"validation": "test"},
      local=sources.LocalFiles(
          folder="ag_news", files={"train": "train.csv", "validation": "test.csv"},
          read=readers.read_ag_news_csv,
          features={"title": tf.string, "description": tf.string, "label": tf.int64},
          how_to_get="put the official ag_news_csv train.csv and test.csv there"))


def _sentence_source(name: str) -> sources.LocalOrTfdsSource:
  return sources.LocalOrTfdsSource(
      name.upper(), splits=("train", "validation"),
      local=sources.LocalFiles(
          folder=name, files={"train": "train.csv", "validation": "test.csv"},
          read=functools.partial(readers.read_label_sentence_csv, labels=SENTENCE_TASKS[name]),
          features={"sentence": tf.string, "label": tf.int64, "idx": tf.int32},
          how_to_get=(f"put LM-BFF's data/original/{name}/train.csv and test.csv there "
                      f"(rows: label,sentence)")))


def _add(name: str, source, benchmark: str, labels, feature_names, id_key=None) -> None:
  registration.add_task(
      name,
      source=source,
      text_preprocessors=[functools.partial(
          preprocessors.glue, benchmark_name=benchmark, label_names=labels,
          feature_names=feature_names, id_key=id_key)],
      postprocess_fn=functools.partial(postprocessors.string_label_to_class_id,
                                       label_classes=labels),
      metric_fns=[metrics.accuracy],
      label_names=labels)


def register() -> None:
  """Registers IMDB, AG News, MR, CR, SUBJ and MPQA (+ variants)."""
  _add("imdb_reviews_v100", _imdb_source(), "imdb", SENTIMENT, ("text",))
  _add("ag_news_subset_v100", _ag_news_source(), "ag_news", readers.AG_NEWS_LABELS,
       ("title", "description"))
  for name, labels in SENTENCE_TASKS.items():
    _add(f"{name}_v001", _sentence_source(name), name, labels, ("sentence",), id_key="idx")
