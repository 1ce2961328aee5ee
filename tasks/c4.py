"""C4 prefix language modeling, for the LM adaptation of span-corruption T5 1.1 checkpoints.

  c4_v220_prefix_lm   T5's name and TFDS version (c4/en:2.2.0)
  c4_v301_prefix_lm   the same objective on c4/en:3.0.1 (a commonly prepared TFDS version)
  c4_v310_prefix_lm   ... on c4/en:3.1.0 (the version tensorflow-datasets 4.9 prepares)

Each document's tokens are cut into input-length segments, and each segment is split at a random
point into inputs (prefix) and targets (continuation). Train the full model on it (the trainer's
`model_finetune.gin`) for N steps to sweep the "LM adaptation steps" design decision.
"""
import functools

import seqio

from prompt_jax.tasks import features
from prompt_jax.tasks import preprocessors
from prompt_jax.tasks import sources

VERSIONS = {"v220": "2.2.0", "v301": "3.0.1", "v310": "3.1.0"}


def register() -> None:
  for name, version in VERSIONS.items():
    seqio.TaskRegistry.add(
        f"c4_{name}_prefix_lm",
        source=sources.LocalOrTfdsSource(f"C4 (en, {version})", ("train", "validation"),
                                         tfds_name=f"c4/en:{version}"),
        preprocessors=[
            functools.partial(seqio.preprocessors.rekey,
                              key_map={"inputs": None, "targets": "text"}),
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            preprocessors.prefix_lm,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=features.DEFAULT_OUTPUT_FEATURES,
        metric_fns=[])
