"""seqio tasks of prompt_jax (installed as `prompt_jax.tasks`; always import it by that name).

Importing this package registers every task and mixture with seqio:

  super_glue    SuperGLUE (all eight tasks + AX-b/AX-g), T5's formats and metrics
  glue          MRPC, QQP, SST-2, MNLI, zero-shot QQP <-> MRPC
  mrqa          MRQA 2019 in-domain and out-of-domain QA, SQuAD -> out-of-domain mixtures
  classification  IMDB, AG News, MR, CR, SUBJ, MPQA
  c4            prefix LM for LM adaptation
  few_shot      <task>_<K>shot_seed<S> / <task>_<K>total_seed<S>, registered on demand

Most tasks also come as taskless_<task> (no task-name word) and <task>_sentinel (targets prefixed
with <extra_id_0>). Data comes from TFDS, or from official files when a data dir is set
(`set_data_dir`, gin `prompt_jax.tasks.local_data_dir.path`, or $PROMPT_JAX_DATA_DIR). Nothing here
touches the vocabulary or the data until a dataset is built.
"""
import seqio

from prompt_jax.tasks import c4
from prompt_jax.tasks import classification
from prompt_jax.tasks import few_shot
from prompt_jax.tasks import glue
from prompt_jax.tasks import mrqa
from prompt_jax.tasks import registration
from prompt_jax.tasks import sources
from prompt_jax.tasks import super_glue
from prompt_jax.tasks.few_shot import ensure_registered
from prompt_jax.tasks.few_shot import register_few_shot
from prompt_jax.tasks.readers import DataFormatError
from prompt_jax.tasks.registration import label_set
from prompt_jax.tasks.registration import UnknownTaskError
from prompt_jax.tasks.sources import DATA_DIR_ENV
from prompt_jax.tasks.sources import get_data_dir
from prompt_jax.tasks.sources import local_data_dir
from prompt_jax.tasks.sources import set_data_dir


def get_task(name: str):
  """The seqio Task or Mixture called `name` (few-shot names are registered on demand).

  Raises:
    UnknownTaskError: with the closest registered names.
  """
  ensure_registered(name)
  return seqio.get_mixture_or_task(name)


super_glue.register()
glue.register()
mrqa.register()
classification.register()
c4.register()
