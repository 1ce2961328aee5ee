"""GLUE, zero-shot QQP <-> MRPC and sentence classification: exact strings, label mapping."""
import csv

import pytest

from prompt_jax import tasks
from prompt_jax.tasks.inspect import text_examples


def _first(name, split="validation"):
  (ex,) = text_examples(name, split, 1)
  return ex["inputs"], ex["targets"]


def test_mrpc(data_root):
  assert _first("glue_mrpc_v002") == (
      "mrpc sentence1: He said the foodservice pie business doesn 't fit the company 's "
      "long-term growth strategy . sentence2: \" The foodservice pie business does not fit our "
      "long-term growth strategy .",
      "equivalent")
  assert text_examples("glue_mrpc_v002", "test", 1)[0]["targets"] == "<unk>"


def test_mrpc_train_has_the_official_example_count(data_root):
  assert tasks.get_task("glue_mrpc_v002").source.num_input_examples("train") == 3668


def _tsv_rows(path):
  with open(path, encoding="utf-8-sig", newline="") as f:
    return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _examples(split):
  ds = tasks.get_task("glue_mrpc_v002").source.get_dataset(split, shuffle=False)
  return list(ds.as_numpy_iterator())


def test_mrpc_idx_is_the_row_number_tfds_gives(data_root):
  """TFDS `glue/mrpc` (tensorflow_datasets/text/glue.py `_generate_example_mrpc_files`) numbers
  train and validation by their row in msr_paraphrase_train.txt (validation = the rows whose IDs
  dev_ids.tsv lists) and test by its row in msr_paraphrase_test.txt; T5's outputs carry that idx."""
  folder = data_root / "glue" / "MRPC"
  rows = _tsv_rows(folder / "msr_paraphrase_train.txt")  # 4076 pairs
  with open(folder / "dev_ids.tsv", encoding="utf-8") as f:
    dev_ids = {tuple(line.split()) for line in f if line.strip()}
  validation, train = _examples("validation"), _examples("train")
  assert (len(validation), len(train)) == (408, 3668)
  assert validation[0]["idx"] == 9  # msr_paraphrase_train.txt line 11 (header = line 1)
  assert text_examples("glue_mrpc_v002", "validation", 1)[0]["idx"] == 9  # reaches the task
  assert sorted(ex["idx"] for ex in validation + train) == list(range(len(rows)))
  for split, examples in (("validation", validation), ("train", train)):
    for ex in examples:
      row = rows[ex["idx"]]
      assert ((row["#1 ID"], row["#2 ID"]) in dev_ids) == (split == "validation")
      assert ex["sentence1"].decode() == row["#1 String"]
      assert ex["sentence2"].decode() == row["#2 String"]
      assert ex["label"] == int(row["Quality"])
  # GLUE's dev.tsv holds the validation rows in the same order and with the same text.
  assert [(r["#1 String"], r["#2 String"]) for r in _tsv_rows(folder / "dev.tsv")] == [
      (ex["sentence1"].decode(), ex["sentence2"].decode()) for ex in validation]
  test = _examples("test")
  assert [ex["idx"] for ex in test] == [int(r["index"]) for r in _tsv_rows(folder / "test.tsv")]
  assert {ex["label"] for ex in test} == {-1}


def test_mrpc_without_msr_paraphrase_files_says_what_to_add(tmp_path, write_file):
  write_file(tmp_path / "glue/MRPC/dev.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n")
  tasks.set_data_dir(tmp_path)
  with pytest.raises(FileNotFoundError,
                     match="needs .*glue/MRPC/msr_paraphrase_train.txt, which does not exist; put "
                           "the official MRPC files there: msr_paraphrase_train.txt, "
                           "msr_paraphrase_test.txt and GLUE's dev_ids.tsv") as error:
    _first("glue_mrpc_v002")
  assert "\n" not in str(error.value)
  write_file(tmp_path / "glue/MRPC/msr_paraphrase_train.txt",
             "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b .\tA c .\n")
  with pytest.raises(FileNotFoundError, match="MRPC: .*dev_ids.tsv does not exist; put GLUE's"):
    _first("glue_mrpc_v002")
  write_file(tmp_path / "glue/MRPC/dev_ids.tsv", "1\t2\n")
  assert _first("glue_mrpc_v002") == ("mrpc sentence1: A b . sentence2: A c .", "equivalent")


def test_sst2_keeps_the_file_text(data_root):
  assert _first("glue_sst2_v002") == (
      "sst2 sentence: it 's a charming and often affecting journey . ", "positive")


@pytest.fixture
def qqp_sample(shared_data, tmp_path):
  """A data dir whose glue/QQP/{train,dev}.tsv are LM-BFF's QQP sample (GLUE's TSV format)."""
  sample = shared_data("glue", "QQP", "lmbff_k-shot", "16-13")
  (tmp_path / "glue/QQP").mkdir(parents=True)
  for split in ("train", "dev"):
    (tmp_path / f"glue/QQP/{split}.tsv").symlink_to(sample / f"{split}.tsv")
  tasks.set_data_dir(tmp_path)


def test_qqp(qqp_sample):
  assert _first("glue_qqp_v002") == (
      "qqp question1: What, according to you, is the best Disney film? "
      "question2: What is the best Disney movie?",
      "duplicate")
  targets = [ex["targets"] for ex in text_examples("glue_qqp_v002", "train", None)]
  assert (targets.count("duplicate"), targets.count("not_duplicate")) == (16, 16)


def test_mrpc_from_qqp_translates_qqp_words(data_root):
  task = tasks.get_task("glue_mrpc_from_qqp_v002")
  assert task.splits == ("validation",)
  assert _first("glue_mrpc_from_qqp_v002")[0].startswith("mrpc sentence1: He said the ")
  predict = lambda text: task.postprocess_fn(text, example={}, is_target=False)
  assert [predict("duplicate"), predict("not_duplicate"), predict("maybe")] == [1, 0, -1]
  assert task.postprocess_fn("equivalent", example={}, is_target=True) == 1
  assert tasks.label_set("glue_mrpc_from_qqp_v002") == ["not_duplicate", "duplicate"]
  assert tasks.label_set("glue_qqp_from_mrpc_v002") == ["not_equivalent", "equivalent"]
  mixture = tasks.get_task("taskless_glue_mrpc_from_qqp_zeroshot_v002")
  assert sorted(t.name for t in mixture.tasks) == [
      "taskless_glue_mrpc_from_qqp_v002", "taskless_glue_qqp_v002"]


def test_mnli_from_tsv(tmp_path, write_file):
  header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
  write_file(tmp_path / "glue/MNLI/dev_matched.tsv",
             header + "0\t1\t1n\tfiction\tA man sleeps.\tA man dreams.\tneutral\tneutral\n")
  tasks.set_data_dir(tmp_path)
  assert _first("glue_mnli_v002", "validation_matched") == (
      "mnli hypothesis: A man dreams. premise: A man sleeps.", "neutral")
  assert _first("glue_mnli_matched_v002") == (
      "mnli hypothesis: A man dreams. premise: A man sleeps.", "neutral")


def test_sentence_classification_from_lmbff_csv(tmp_path, write_file):
  write_file(tmp_path / "mr/test.csv", '1,"a gorgeous , witty , seductive movie ."\n0,dull .\n')
  write_file(tmp_path / "subj/test.csv", "0,i loved it .\n")
  tasks.set_data_dir(tmp_path)
  assert [(ex["inputs"], ex["targets"]) for ex in text_examples("mr_v001", "validation")] == [
      ("mr sentence: a gorgeous , witty , seductive movie .", "positive"),
      ("mr sentence: dull .", "negative")]
  assert _first("taskless_subj_v001") == ("sentence: i loved it .", "subjective")
  assert tasks.label_set("mpqa_v001") == ["negative", "positive"]


def test_ag_news_and_imdb_from_official_files(tmp_path, write_file):
  write_file(tmp_path / "ag_news/test.csv",
             '"3","Wall St. Bears Claw Back","Short-sellers are seeing green again."\n')
  write_file(tmp_path / "imdb/test/pos/0_9.txt", "A fine film.")
  write_file(tmp_path / "imdb/test/neg/1_2.txt", "Dreadful.")
  tasks.set_data_dir(tmp_path)
  assert _first("ag_news_subset_v100") == (
      "ag_news title: Wall St. Bears Claw Back description: Short-sellers are seeing green "
      "again.", "Business")
  assert [(ex["inputs"], ex["targets"]) for ex in text_examples("imdb_reviews_v100")] == [
      ("imdb text: Dreadful.", "negative"), ("imdb text: A fine film.", "positive")]


def test_a_skipped_row_is_said_without_verbose(tmp_path, write_file):
  """A TSV row with missing fields is skipped, as TFDS does; the line saying so went through
  absl's logger, which the quiet console holds at ERROR: the user saw fewer examples, no word."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  path = write_file(tmp_path / "glue/QQP/dev.tsv",
                    "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n0\t1\t2\tA?\tB?\t0\n"
                    "1\t3\t4\tonly one\n2\t5\t6\tC?\tD?\t1\n")
  proc = subprocess.run(  # a process of its own: pytest's log handlers would hide the console's
      [sys.executable, "-m", "prompt_jax", "tasks", "glue_qqp_v002", f"--data_dir={tmp_path}",
       "-n", "5"], capture_output=True, text=True, timeout=300,
      env={k: v for k, v in os.environ.items()  # importing TF here set it to 1: a user's shell
           if k != "TF_CPP_MIN_LOG_LEVEL"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.count("--- example") == 2
  assert proc.stderr.splitlines() == [
      f"warning: {path}: skipped 1 row(s) with missing fields (lines 3)"], proc.stderr
