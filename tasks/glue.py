"""GLUE tasks (MRPC, QQP, SST-2, MNLI) and zero-shot QQP <-> MRPC transfer.

  glue_{mrpc,qqp,sst2,mnli,mnli_matched,mnli_mismatched}_v002     T5's format and metrics
  glue_mrpc_from_qqp_v002, glue_qqp_from_mrpc_v002               validation only; predictions in
                                                                  the source task's label words
  glue_mrpc_from_qqp_zeroshot_v002, glue_qqp_from_mrpc_zeroshot_v002
                                                                  mixtures: train on the source,
                                                                  evaluate on the target

(+ taskless_* and *_sentinel variants; names as in prompt-tuning's `glue_transfer`).
"""
import functools

import tensorflow as tf

from prompt_jax.tasks import metrics
from prompt_jax.tasks import postprocessors
from prompt_jax.tasks import preprocessors
from prompt_jax.tasks import readers
from prompt_jax.tasks import registration
from prompt_jax.tasks import sources

TFDS_VERSION = "2.0.0"

# TFDS config -> (benchmark name, local folder under glue/, split -> file).
# MRPC: the files TFDS builds it from (GLUE's train.tsv / dev.tsv lose the row numbers of
# msr_paraphrase_train.txt, which are TFDS's and T5's `idx`).
_CONFIGS = {
    "mrpc": ("mrpc", "MRPC", {"train": "msr_paraphrase_train.txt",
                              "validation": "msr_paraphrase_train.txt",
                              "test": ("msr_paraphrase_test.txt", "test.tsv")}),
    "qqp": ("qqp", "QQP", {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}),
    "sst2": ("sst2", "SST-2", {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}),
    "mnli": ("mnli", "MNLI", {
        "train": "train.tsv",
        "validation_matched": "dev_matched.tsv",
        "validation_mismatched": "dev_mismatched.tsv",
        "test_matched": "test_matched.tsv",
        "test_mismatched": "test_mismatched.tsv",
    }),
    "mnli_matched": ("mnli", "MNLI", {"validation": "dev_matched.tsv",
                                      "test": "test_matched.tsv"}),
    "mnli_mismatched": ("mnli", "MNLI", {"validation": "dev_mismatched.tsv",
                                         "test": "test_mismatched.tsv"}),
}

LABELS = {config: readers.GLUE_COLUMNS[benchmark][2]
          for config, (benchmark, _, _) in _CONFIGS.items()}

METRICS = {
    "mrpc": [metrics.f1_score_with_invalid, metrics.accuracy],
    "qqp": [metrics.f1_score_with_invalid, metrics.accuracy],
    "sst2": [metrics.accuracy],
    "mnli": [metrics.accuracy],
}

# Zero-shot transfer: (source, target) -> predicted source label word -> target label word.
TRANSLATIONS = {
    ("qqp", "mrpc"): {"duplicate": "equivalent", "not_duplicate": "not_equivalent"},
    ("mrpc", "qqp"): {"equivalent": "duplicate", "not_equivalent": "not_duplicate"},
}


def source(config: str, splits=None) -> sources.LocalOrTfdsSource:
  """TFDS `glue/<config>:2.0.0`, or `<data_dir>/glue/<TASK>/*.tsv` (official GLUE files)."""
  benchmark, folder, files = _CONFIGS[config]
  if splits is not None:
    files = {split: files[split] for split in splits}
  columns = readers.GLUE_COLUMNS[benchmark][0]
  if benchmark == "mrpc":
    read = {split: functools.partial(readers.read_mrpc, split=split) for split in files}
    how_to_get = ("put the official MRPC files there: msr_paraphrase_train.txt, "
                  f"msr_paraphrase_test.txt and GLUE's {readers.MRPC_DEV_IDS} (what GLUE's "
                  "download_glue_data.py fetches; TFDS numbers `idx` by their rows)")
  else:
    read = functools.partial(readers.read_glue, config=benchmark)
    how_to_get = (f"put the official GLUE {folder} files ({', '.join(files.values())}) there "
                  f"(gluebenchmark.com/tasks)")
  return sources.LocalOrTfdsSource(
      f"GLUE {folder}",
      splits=tuple(files),
      tfds_name=f"glue/{config}:{TFDS_VERSION}",
      local=sources.LocalFiles(
          folder=f"glue/{folder}",
          files=files,
          read=read,
          features={**{feature: tf.string for feature in columns},
                    "label": tf.int64, "idx": tf.int32},
          how_to_get=how_to_get))


def _text_preprocessor(config: str):
  benchmark = _CONFIGS[config][0]
  return functools.partial(preprocessors.glue, benchmark_name=benchmark,
                           label_names=LABELS[config])


def register() -> None:
  """Registers the GLUE tasks, the QQP <-> MRPC transfer tasks and their mixtures."""
  registered = {}
  for config, (benchmark, _, _) in _CONFIGS.items():
    registered[config] = registration.add_task(
        f"glue_{config}_v002",
        source=source(config),
        text_preprocessors=[_text_preprocessor(config)],
        postprocess_fn=functools.partial(postprocessors.string_label_to_class_id,
                                         label_classes=LABELS[config]),
        metric_fns=METRICS[benchmark],
        label_names=LABELS[config])

  for (src, tgt), translation in TRANSLATIONS.items():
    transfer = registration.add_task(
        f"glue_{tgt}_from_{src}_v002",
        source=source(tgt, splits=("validation",)),
        text_preprocessors=[_text_preprocessor(tgt)],
        postprocess_fn=postprocessors.sequential(
            postprocessors.translate_labels(translation),
            functools.partial(postprocessors.string_label_to_class_id,
                              label_classes=LABELS[tgt])),
        metric_fns=METRICS[tgt],
        # The model answers in the source task's words; rank classification scores those.
        label_names=LABELS[src])
    registration.add_mixture(
        f"glue_{tgt}_from_{src}_zeroshot_v002",
        {variant: [registered[src][variant], name] for variant, name in transfer.items()})
