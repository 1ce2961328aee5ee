"""MRQA 2019 shared-task QA tasks and the "train on SQuAD, evaluate out of domain" mixtures.

  mrqa_{squad,newsqa,triviaqa,searchqa,hotpotqa,naturalquestions}_v001   train, validation
  mrqa_{bioasq,drop,duorc,race,relation_extraction,textbookqa}_v001     validation (out of domain)
  squad_to_<out-of-domain name>, squad_to_mrqa                          mixtures (prompt-tuning's)

Format (T5's SQuAD): "question: <q> context: <c>" -> the answer, punctuation padded; metrics are
SQuAD EM/F1 maximized over all reference answers. (+ *_sentinel variants.)
"""
import tensorflow as tf

from prompt_jax.tasks import metrics
from prompt_jax.tasks import postprocessors
from prompt_jax.tasks import preprocessors
from prompt_jax.tasks import readers
from prompt_jax.tasks import registration
from prompt_jax.tasks import sources

TFDS_VERSION = "1.0.0"

# Task name -> (TFDS config, official file names: the first is the shared task's).
IN_DOMAIN = {
    "squad": ("squad", ("SQuAD.jsonl.gz",)),
    "newsqa": ("news_qa", ("NewsQA.jsonl.gz",)),
    "triviaqa": ("trivia_qa", ("TriviaQA-web.jsonl.gz", "TriviaQA.jsonl.gz")),
    "searchqa": ("search_qa", ("SearchQA.jsonl.gz",)),
    "hotpotqa": ("hotpot_qa", ("HotpotQA.jsonl.gz",)),
    "naturalquestions": ("natural_questions",
                         ("NaturalQuestionsShort.jsonl.gz", "NaturalQuestions.jsonl.gz")),
}
OUT_OF_DOMAIN = {
    "bioasq": ("bio_asq", ("BioASQ.jsonl.gz",)),
    "drop": ("drop", ("DROP.jsonl.gz",)),
    "duorc": ("duo_rc", ("DuoRC.ParaphraseRC.jsonl.gz", "DuoRC.jsonl.gz")),
    "race": ("race", ("RACE.jsonl.gz",)),
    "relation_extraction": ("relation_extraction", ("RelationExtraction.jsonl.gz",)),
    "textbookqa": ("textbook_qa", ("TextbookQA.jsonl.gz",)),
}

_FEATURES = {
    "qid": tf.string,
    "question": tf.string,
    "context": tf.string,
    "answers": sources.Ragged(tf.string),
    "detected_answers": {"text": sources.Ragged(tf.string)},
}
_HOW_TO_GET = ("download the MRQA 2019 files (github.com/mrqa/MRQA-Shared-Task-2019: "
               "download_train.sh, download_in_domain_dev.sh, download_out_of_domain_dev.sh) into "
               "mrqa/train and mrqa/dev, keeping their .jsonl.gz names")


def source(name: str) -> sources.LocalOrTfdsSource:
  """TFDS `mrqa/<config>:1.0.0`, or `<data_dir>/mrqa/{train,dev}/<Name>.jsonl.gz`.

  Out-of-domain sets are MRQA dev sets (TFDS calls that split "test"); here they are "validation".
  """
  if name in IN_DOMAIN:
    config, files = IN_DOMAIN[name]
    split_files = {"train": [f"train/{f}" for f in files],
                   "validation": [f"dev/{f}" for f in files]}
    tfds_splits = None
  else:
    config, files = OUT_OF_DOMAIN[name]
    split_files = {"validation": [f"dev/{f}" for f in files]}
    tfds_splits = {"validation": "test"}
  return sources.LocalOrTfdsSource(
      f"MRQA {files[0].split('.')[0]}",
      splits=tuple(split_files),
      tfds_name=f"mrqa/{config}:{TFDS_VERSION}",
      tfds_splits=tfds_splits,
      local=sources.LocalFiles(folder="mrqa", files=split_files, read=readers.read_mrqa,
                               features=_FEATURES, how_to_get=_HOW_TO_GET))


def register() -> None:
  """Registers the twelve MRQA tasks (+ sentinel variants) and the zero-shot mixtures."""
  registered = {}
  for name in (*IN_DOMAIN, *OUT_OF_DOMAIN):
    registered[name] = registration.add_task(
        f"mrqa_{name}_v001",
        source=source(name),
        text_preprocessors=[preprocessors.mrqa],
        postprocess_fn=postprocessors.qa,
        metric_fns=[metrics.squad],
        variants=("", "sentinel"))

  # Mixtures train on SQuAD (the only one with a train split) and evaluate out of domain.
  for name in OUT_OF_DOMAIN:
    registration.add_mixture(
        f"squad_to_{name}",
        {variant: [registered["squad"][variant], registered[name][variant]]
         for variant in ("", "sentinel")})
  registration.add_mixture(
      "squad_to_mrqa",
      {variant: [registered["squad"][variant]] + [registered[n][variant] for n in OUT_OF_DOMAIN]
       for variant in ("", "sentinel")})
