"""The TFDS path (no data dir), with `tfds.testing.mock_data`: never a real download."""
import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

from prompt_jax import tasks
from prompt_jax.tasks.inspect import text_examples

pytestmark = pytest.mark.usefixtures("networked")  # TFDS is mocked


def _mock(examples, seen=None):
  """mock_data serving `examples` (a dict of columns) for any builder and split."""

  def as_dataset_fn(builder, split, **unused_kwargs):
    if seen is not None:
      seen.append((builder.info.full_name, str(split)))
    return tf.data.Dataset.from_tensor_slices(examples)

  return tfds.testing.mock_data(as_dataset_fn=as_dataset_fn)


RTE = {"premise": ["A man sleeps."], "hypothesis": ["A man is awake."],
       "idx": tf.constant([7], tf.int32), "label": tf.constant([1], tf.int64)}


def test_rte_reads_tfds_without_a_data_dir(t5_vocab):
  seen = []
  with _mock(RTE, seen):
    (text,) = text_examples("super_glue_rte_v102", "validation")
    task = tasks.get_task("super_glue_rte_v102")
    # seqio's in-memory cache asks TFDS for split sizes, which mock data lacks.
    (ex,) = task.get_dataset(None, split="validation", shuffle=False,
                             try_in_mem_cache=False).as_numpy_iterator()
  assert seen[0] == ("super_glue/rte/1.0.2", "validation")
  assert (text["inputs"], text["targets"], text["idx"]) == (
      "rte hypothesis: A man is awake. premise: A man sleeps.", "not_entailment", 7)
  assert t5_vocab.decode(ex["inputs"]) == "rte hypothesis: A man is awake. premise: A man sleeps."
  assert ex["targets"].tolist() == t5_vocab.encode("not_entailment") + [1]  # EOS appended.


def test_out_of_domain_mrqa_maps_validation_to_tfds_test():
  seen = []
  squad_like = {
      "qid": ["q1"], "question": ["Who?"], "context": ["Ann ran."],
      "answers": tf.ragged.constant([["Ann"]]),
      "detected_answers": {"text": tf.ragged.constant([["Ann"]])},
  }
  with _mock(squad_like, seen):
    (ex,) = text_examples("mrqa_bioasq_v001", "validation")
  assert seen[0] == ("mrqa/bio_asq/1.0.0", "test")
  assert (ex["inputs"], ex["targets"]) == ("question: Who ? context: Ann ran . ", "Ann")


def test_tfds_label_outside_label_set_is_an_error():
  bad = dict(RTE, label=tf.constant([5], tf.int64))
  with _mock(bad), pytest.raises(tf.errors.InvalidArgumentError,
                                 match="rte: label index outside the label set"):
    text_examples("super_glue_rte_v102", "validation")


def test_a_failed_tfds_download_is_one_line_naming_the_local_files():
  """Offline, with no data dir, TFDS tried to download RTE for minutes and the command ended in
  `ConnectionError: HTTPSConnectionPool(...)`, exit 1: now one line saying what to pass."""
  import requests  # pylint: disable=g-import-not-at-top

  def offline(builder, split, **unused_kwargs):
    raise requests.exceptions.ConnectionError(
        "HTTPSConnectionPool(host='dl.fbaipublicfiles.com', port=443): Max retries exceeded")

  with tfds.testing.mock_data(as_dataset_fn=offline), pytest.raises(FileNotFoundError) as e:
    text_examples("super_glue_rte_v102", "validation")
  message = str(e.value)
  assert message.startswith("SuperGLUE RTE: TFDS super_glue/rte:1.0.2 could not be read or "
                            "downloaded (ConnectionError: HTTPSConnectionPool("), message
  assert "without network, pass --data_dir=DIR with the official files (super_glue/RTE/" in message
  assert message.endswith("or pass --tfds_data_dir=DIR where it is prepared") and "\n" not in message


def test_an_unprepared_dataset_offline_is_one_line_at_once(monkeypatch):
  """Offline, with no data dir, `prompt-jax tasks super_glue_rte_v102` took 210 s (TFDS's
  download retries, progress bars, partial folders under ~/tensorflow_datasets) before its one
  line. When the dataset is not prepared and GCS's name does not resolve, the line comes at once
  and TFDS is not asked (the other tests here: a prepared, or reachable, dataset is read)."""
  from prompt_jax import paths  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(paths, "unreachable_gcs",
                      lambda *a, **k: "storage.googleapis.com does not resolve")
  monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: False)
  asked = []
  with _mock(RTE, asked), pytest.raises(FileNotFoundError) as e:  # it would serve any builder
    text_examples("super_glue_rte_v102", "validation")
  assert asked == []
  message = str(e.value)
  assert message.startswith(
      "SuperGLUE RTE: TFDS super_glue/rte:1.0.2 is not prepared (no "), message
  assert message.endswith("/super_glue/rte/1.0.2) and cannot be downloaded (storage.googleapis.com "
                          "does not resolve); without network, pass --data_dir=DIR with the "
                          "official files (super_glue/RTE/: unzip the official SuperGLUE RTE.zip "
                          "(super.gluebenchmark.com/tasks) so that it holds train.jsonl, "
                          "val.jsonl, test.jsonl), or pass --tfds_data_dir=DIR where it is "
                          "prepared"), message


def test_tasks_takes_the_tfds_data_dir_its_error_names(monkeypatch, tmp_path, capsys):
  """`prompt-jax tasks` ended that line with "pass --tfds_data_dir=DIR" and then refused the flag
  (unrecognized arguments). It now reads TFDS there, as train does."""
  from prompt_jax import paths  # pylint: disable=g-import-not-at-top
  from prompt_jax.tasks import inspect as tasks_inspect  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(paths, "unreachable_gcs",
                      lambda *a, **k: "storage.googleapis.com does not resolve")
  monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: False)
  try:
    code = tasks_inspect.main(["taskless_super_glue_rte_v102", "-n", "1",
                               f"--tfds_data_dir={tmp_path}"])
  finally:
    seqio.set_tfds_data_dir_override(None)
  err = capsys.readouterr().err
  assert code == 2 and f"is not prepared (no {tmp_path}/super_glue/rte/1.0.2)" in err, err
