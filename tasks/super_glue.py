"""SuperGLUE tasks in T5's text-to-text formats (`t5.data.glue_utils`).

  super_glue_{boolq,cb,copa,multirc,record,rte,wic,axb,axg}_v102
  super_glue_wsc_v102_simple_train / _simple_eval  (+ mixture super_glue_wsc_and_dev_v102_simple)
  super_glue_v102_proportional                     (all of them, T5's example-count rates)

each also as taskless_*, *_sentinel and taskless_*_sentinel (see `registration`). Inputs list a
task's fields alphabetically after the task name, except MultiRC (question, answer, paragraph) and
WiC (sentence1, sentence2, word); AX-b and AX-g are cast as RTE. Labels are TFDS's label names.
"""
import functools

import seqio
import tensorflow as tf

from prompt_jax.tasks import metrics
from prompt_jax.tasks import postprocessors
from prompt_jax.tasks import preprocessors
from prompt_jax.tasks import readers
from prompt_jax.tasks import registration
from prompt_jax.tasks import sources

TFDS_VERSION = "1.0.2"
# TFDS config -> folder (and zip) name of the official release.
FOLDERS = {
    "boolq": "BoolQ", "cb": "CB", "copa": "COPA", "multirc": "MultiRC", "record": "ReCoRD",
    "rte": "RTE", "wic": "WiC", "wsc.fixed": "WSC", "axb": "AX-b", "axg": "AX-g",
}
_SPLIT_FILES = {"train": "train.jsonl", "validation": "val.jsonl", "test": "test.jsonl"}
LABELS = readers.SUPER_GLUE_LABELS

# Rates of T5's super_glue_v102_proportional mixture (training examples per task).
WEIGHTS = {
    "super_glue_wsc_v102_simple_train": 259., "super_glue_wsc_v102_simple_eval": 0.,
    "super_glue_boolq_v102": 9_427., "super_glue_cb_v102": 250., "super_glue_copa_v102": 400.,
    "super_glue_multirc_v102": 27_243., "super_glue_record_v102": 138_854.,
    "super_glue_rte_v102": 2_490., "super_glue_wic_v102": 5_428., "super_glue_axb_v102": 0.,
    "super_glue_axg_v102": 0.,
}


def _feature_spec(config: str) -> sources.FeatureSpec:
  """The dtypes of TFDS `super_glue/<config>` (and of `readers.read_super_glue`'s examples)."""
  if config == "multirc":
    return {"paragraph": tf.string, "question": tf.string, "answer": tf.string,
            "idx": {"paragraph": tf.int32, "question": tf.int32, "answer": tf.int32},
            "label": tf.int64}
  if config == "record":
    return {"passage": tf.string, "query": tf.string,
            "entities": sources.Ragged(tf.string), "answers": sources.Ragged(tf.string),
            "idx": {"passage": tf.int32, "query": tf.int32}}
  spec = {key: tf.int32 if key in readers.INT_FEATURES else tf.string
          for key in readers.SUPER_GLUE_FEATURES[config]}
  spec.update(idx=tf.int32, label=tf.int64)
  return spec


def source(config: str, splits=("train", "validation", "test")) -> sources.LocalOrTfdsSource:
  """TFDS `super_glue/<config>:1.0.2`, or `<data_dir>/super_glue/<Folder>/*.jsonl`."""
  folder = FOLDERS[config]
  if config in ("axb", "axg"):
    files = {"test": f"{folder}.jsonl"}
  else:
    files = {split: _SPLIT_FILES[split] for split in splits}
  return sources.LocalOrTfdsSource(
      f"SuperGLUE {folder}",
      splits=tuple(files),
      tfds_name=f"super_glue/{config}:{TFDS_VERSION}",
      local=sources.LocalFiles(
          folder=f"super_glue/{folder}",
          files=files,
          read=functools.partial(readers.read_super_glue, config=config),
          features=_feature_spec(config),
          how_to_get=(f"unzip the official SuperGLUE {folder}.zip (super.gluebenchmark.com/tasks) "
                      f"so that it holds {', '.join(files.values())}")))


def _text_preprocessors(config: str):
  """T5's text preprocessors for one SuperGLUE config (`glue_utils.get_glue_text_preprocessor`)."""
  if config == "record":
    return [preprocessors.record]
  glue = functools.partial(preprocessors.glue, label_names=LABELS[config])
  if config == "axb":
    # Cast as RTE: sentence1/sentence2 become premise/hypothesis.
    return [
        functools.partial(seqio.preprocessors.rekey, key_map={
            "premise": "sentence1", "hypothesis": "sentence2", "label": "label", "idx": "idx"}),
        functools.partial(glue, benchmark_name="rte"),
    ]
  if config == "axg":
    return [functools.partial(glue, benchmark_name="rte")]
  if config == "multirc":
    return [functools.partial(glue, benchmark_name="multirc",
                              feature_names=("question", "answer", "paragraph"))]
  if config == "wic":
    # T5 ignores the start/end indices of the word.
    return [functools.partial(glue, benchmark_name="wic",
                              feature_names=("sentence1", "sentence2", "word"))]
  return [functools.partial(glue, benchmark_name=config)]


METRICS = {
    "boolq": [metrics.accuracy],
    "cb": [metrics.mean_multiclass_f1(num_classes=3), metrics.accuracy],
    "copa": [metrics.accuracy],
    "multirc": [metrics.multirc_f1_over_all_answers, metrics.mean_group_metric(metrics.all_match)],
    "record": [metrics.deduplicate_metric(metrics.squad)],
    "rte": [metrics.accuracy],
    "wic": [metrics.accuracy],
    # T5 registers none (labels are hidden on its TFDS copy); the released diagnostics are labeled.
    "axb": [metrics.accuracy],
    "axg": [metrics.accuracy],
}


def _postprocess_fn(config: str):
  if config == "multirc":
    return postprocessors.multirc
  if config == "record":
    return postprocessors.record
  return functools.partial(postprocessors.string_label_to_class_id, label_classes=LABELS[config])


def register() -> None:
  """Registers every SuperGLUE task, its variants and mixtures."""
  names = {variant: [] for variant in registration.VARIANTS}
  for config in ("boolq", "cb", "copa", "multirc", "record", "rte", "wic", "axb", "axg"):
    registered = registration.add_task(
        f"super_glue_{config}_v102",
        source=source(config),
        text_preprocessors=_text_preprocessors(config),
        postprocess_fn=_postprocess_fn(config),
        metric_fns=METRICS[config],
        label_names=None if config == "record" else LABELS[config])
    for variant, name in registered.items():
      names[variant].append(name)

  # WSC as T5's "simple" referent generation: train on correct referents only, evaluate all.
  train = registration.add_task(
      "super_glue_wsc_v102_simple_train",
      source=source("wsc.fixed", splits=("train",)),
      text_preprocessors=[functools.partial(preprocessors.wsc_simple,
                                            correct_referent_only=True)])
  evaluate = registration.add_task(
      "super_glue_wsc_v102_simple_eval",
      source=source("wsc.fixed", splits=("validation", "test")),
      text_preprocessors=[functools.partial(preprocessors.wsc_simple,
                                            correct_referent_only=False)],
      postprocess_fn=postprocessors.wsc_simple,
      metric_fns=[metrics.accuracy])
  registration.add_mixture(
      "super_glue_wsc_and_dev_v102_simple",
      {variant: [train[variant], evaluate[variant]] for variant in registration.VARIANTS})
  for variant in registration.VARIANTS:
    names[variant] += [train[variant], evaluate[variant]]

  base_names = names[""]
  registration.add_mixture(
      "super_glue_v102_proportional", names, rates=[WEIGHTS[name] for name in base_names])
