"""Bad inputs fail with one actionable line, never with a silently wrong label."""
import json

import pytest

from prompt_jax import tasks
from prompt_jax.tasks.inspect import text_examples

RTE_LINE = {"premise": "A man sleeps.", "hypothesis": "A man is awake.", "idx": 0,
            "label": "not_entailment"}


def test_unknown_task_suggests_close_names():
  with pytest.raises(tasks.UnknownTaskError,
                     match="unknown task or mixture 'super_glue_rte_v2'; did you mean "
                           "super_glue_rte_v102"):
    tasks.get_task("super_glue_rte_v2")
  with pytest.raises(tasks.UnknownTaskError):
    tasks.label_set("no_such_task")
  with pytest.raises(tasks.UnknownTaskError):
    tasks.get_task("no_such_task_16shot_seed0")


def test_missing_data_dir_names_it(tmp_path):
  missing = tmp_path / "nowhere"
  tasks.set_data_dir(missing)
  with pytest.raises(FileNotFoundError,
                     match=f"data dir {missing} \\(from --data_dir / set_data_dir\\(\\)\\) does "
                           "not exist; point it at a folder laid out like ../shared/data"):
    text_examples("super_glue_rte_v102")


def test_a_data_dir_that_is_a_file_is_not_called_missing(tmp_path):
  a_file = tmp_path / "data.zip"
  a_file.write_bytes(b"PK")
  tasks.set_data_dir(a_file)
  with pytest.raises(FileNotFoundError, match=f"data dir {a_file} .* is a file, not a folder; "):
    text_examples("super_glue_rte_v102")


def test_missing_task_folder_says_how_to_fill_it(tmp_path, monkeypatch):
  monkeypatch.setenv(tasks.DATA_DIR_ENV, str(tmp_path))
  with pytest.raises(FileNotFoundError) as error:
    text_examples("super_glue_rte_v102")
  assert str(error.value) == (
      f"SuperGLUE RTE: folder {tmp_path}/super_glue/RTE does not exist; unzip the official "
      "SuperGLUE RTE.zip (super.gluebenchmark.com/tasks) so that it holds train.jsonl, "
      "val.jsonl, test.jsonl, or unset the data dir to read TFDS super_glue/rte:1.0.2.")


def test_files_only_task_without_data_dir():
  with pytest.raises(FileNotFoundError,
                     match="MR is read from local files only and no data dir is set; set one "
                           "\\(--data_dir, .* to a folder containing mr/train.csv, mr/test.csv"):
    text_examples("mr_v001")


def test_malformed_jsonl_names_file_and_line(tmp_path, write_file):
  path = write_file(tmp_path / "super_glue/RTE/val.jsonl",
                    json.dumps(RTE_LINE) + "\n" + '{"premise": "oops",\n')
  tasks.set_data_dir(tmp_path)
  with pytest.raises(tasks.DataFormatError, match=f"^{path}:2: malformed JSON"):
    text_examples("super_glue_rte_v102")


def test_a_byte_that_is_not_utf8_names_file_and_line(tmp_path, write_file):
  """A latin-1 'é' was `'utf-8' codec can't decode byte 0xe9 ...` with no file or line (and a
  UnicodeDecodeError, exit 1, under train)."""
  path = write_file(tmp_path / "glue/SST-2/dev.tsv", "sentence\tlabel\ngood .\t1\n")
  with open(path, "ab") as f:
    f.write("caf\u00e9 .\t0\n".encode("latin-1"))
  tasks.set_data_dir(tmp_path)
  with pytest.raises(tasks.DataFormatError,
                     match=f"^{path}:3: byte 0xe9 at column 4 is not UTF-8 text \\(save the file "
                           f"as UTF-8\\)"):
    text_examples("glue_sst2_v002")


def test_a_cut_short_gzip_file_says_to_download_it_again(tmp_path):
  """An interrupted download of an MRQA .jsonl.gz: `EOFError: Compressed file ended before the
  end-of-stream marker was reached`, exit 1, naming no file."""
  import gzip  # pylint: disable=g-import-not-at-top
  path = tmp_path / "mrqa" / "dev" / "SQuAD.jsonl.gz"
  path.parent.mkdir(parents=True)
  whole = gzip.compress(b'{"header": {"dataset": "SQuAD"}}\n' + json.dumps(
      {"context": "c " * 500, "qas": []}).encode() + b"\n")
  path.write_bytes(whole[:len(whole) // 2])
  tasks.set_data_dir(tmp_path)
  with pytest.raises(tasks.DataFormatError,
                     match=f"^{path}: the compressed file is cut short or damaged .*; download "
                           f"it again"):
    text_examples("mrqa_squad_v001")


def test_missing_field_names_file_and_line(tmp_path, write_file):
  line = dict(RTE_LINE)
  del line["hypothesis"]
  path = write_file(tmp_path / "super_glue/RTE/val.jsonl", json.dumps(line) + "\n")
  tasks.set_data_dir(tmp_path)
  with pytest.raises(tasks.DataFormatError, match=f"^{path}:1: missing field 'hypothesis'"):
    text_examples("super_glue_rte_v102")


def test_a_row_without_its_label_in_a_labelled_file_names_file_and_line(tmp_path,
                                                                        write_file):
  """A train/val row that lost its label was read as unlabelled (-1): `tasks` showed the target
  '<unk>' and `train` trained on it, exit 0. A file is labelled throughout or not at all."""
  rows = [dict(RTE_LINE, idx=i) for i in range(3)]
  del rows[2]["label"]
  path = write_file(tmp_path / "super_glue/RTE/train.jsonl",
                    "".join(json.dumps(r) + "\n" for r in rows))
  tasks.set_data_dir(tmp_path)
  with pytest.raises(tasks.DataFormatError,
                     match=f"^{path}:3: missing field 'label' \\(line 1 has one\\)"):
    text_examples("super_glue_rte_v102", "train")
  # The other way round (a labelled row in an unlabelled file) as well; a test file whose rows
  # all lack labels is read as before (label -1).
  rows = [{k: v for k, v in dict(RTE_LINE, idx=i).items() if k != "label"} for i in range(3)]
  write_file(tmp_path / "super_glue/RTE/test.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
  assert len(text_examples("super_glue_rte_v102", "test")) == 3
  rows[1]["label"] = "entailment"
  path = write_file(tmp_path / "super_glue/RTE/test.jsonl",
                    "".join(json.dumps(r) + "\n" for r in rows))
  with pytest.raises(tasks.DataFormatError, match=f"^{path}:2: has a label, but line 1 has none"):
    text_examples("super_glue_rte_v102", "test")


def test_label_outside_label_set_in_jsonl(tmp_path, write_file):
  line = {"premise": "p", "hypothesis": "h", "idx": 0, "label": "entailed"}
  path = write_file(tmp_path / "super_glue/CB/val.jsonl", json.dumps(line) + "\n")
  tasks.set_data_dir(tmp_path)
  with pytest.raises(tasks.DataFormatError,
                     match=f"^{path}:1: label 'entailed' is not in the label set "
                           r"\['entailment', 'contradiction', 'neutral'\]"):
    text_examples("super_glue_cb_v102")


def test_label_outside_label_set_in_tsv(tmp_path, write_file):
  path = write_file(tmp_path / "glue/SST-2/dev.tsv", "sentence\tlabel\ngood .\t1\nbad .\t7\n")
  tasks.set_data_dir(tmp_path)
  with pytest.raises(tasks.DataFormatError, match=f"^{path}:3: label '7' is not in the label set"):
    text_examples("glue_sst2_v002")


def test_target_outside_label_set_is_not_scored_silently():
  task = tasks.get_task("super_glue_rte_v102")
  assert task.postprocess_fn("maybe", example={}, is_target=False) == -1
  with pytest.raises(tasks.DataFormatError, match="target '<unk>' is not in the label set"):
    task.postprocess_fn("<unk>", example={}, is_target=True)


def test_an_unlabelled_split_is_the_clis_one_line_and_exit_2(capsys):
  """`prompt-jax eval --gin.EVAL_SPLIT="'test'"` (SuperGLUE's test labels are -1): seqio wraps the
  postprocessor's error in 'ValueError: Failed to evaluate task ...', which was exit 1 with the
  exception's class name."""
  from prompt_jax import cli  # pylint: disable=g-import-not-at-top
  task = tasks.get_task("super_glue_rte_v102")
  try:
    try:
      task.postprocess_fn("<unk>", example={}, is_target=True)
    except ValueError as e:  # as seqio.Evaluator.evaluate raises it
      raise ValueError(f"Failed to evaluate task {task.name}: {e}") from e
  except ValueError as seqio_error:
    assert cli._error("eval", seqio_error, verbose=False) == 2  # pylint: disable=protected-access
  err = capsys.readouterr().err
  assert err.startswith("prompt-jax eval: error: target '<unk>' is not in the label set "
                        "['entailment', 'not_entailment']; the evaluation split has no (or "
                        "wrong) labels: evaluate on a labeled split such as 'validation'"), err
  assert len(err.splitlines()) == 1 and "ValueError" not in err


def test_unknown_split(data_root):
  with pytest.raises(ValueError, match="has no split 'dev'; use one of train, validation, test"):
    text_examples("super_glue_rte_v102", "dev")
