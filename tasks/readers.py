"""Parsers for the official local file formats, yielding examples shaped like the TFDS builders'.

Each reader takes a path and returns a list of example dicts with the same feature names, dtypes and
label indices as the corresponding TFDS dataset, so one preprocessing pipeline serves both sources.
Malformed input raises `DataFormatError` naming `file:line` and the fix; a label outside the label
set is an error, never a silently wrong label.
"""
import csv
import gzip
import json
import logging
import pathlib
import sys
from typing import Any, Dict, Iterator, List, Sequence, Tuple


Example = Dict[str, Any]

# The official test splits carry no label; TFDS stores -1 there.
NO_LABEL = -1


class DataFormatError(ValueError):
  """A local data file does not have the expected format."""


def _fail(path, line: int, message: str) -> DataFormatError:
  return DataFormatError(
      f"{path}:{line}: {message}; fix that line or replace the file with the official release.")


def unreadable(path, error: Exception) -> DataFormatError:
  """The DataFormatError for a file a reader could not decode: a byte that is not UTF-8 (named
  by its line), or a compressed file cut short (an interrupted download)."""
  if isinstance(error, UnicodeDecodeError):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
      for line_number, raw in enumerate(f, start=1):
        try:
          raw.decode("utf-8")
        except UnicodeDecodeError as e:
          return _fail(path, line_number, f"byte 0x{raw[e.start]:02x} at column {e.start + 1} is "
                                          f"not UTF-8 text (save the file as UTF-8)")
    return _fail(path, 1, f"not UTF-8 text ({error.reason}); save the file as UTF-8")
  return DataFormatError(f"{path}: the compressed file is cut short or damaged ({error}); "
                         f"download it again (an interrupted download?)")


def label_index(value: Any, label_names: Sequence[str], path, line: int) -> int:
  """Index of `value` in `label_names`; bools map to 'False'/'True' like TFDS."""
  if isinstance(value, bool):
    value = "True" if value else "False"
  if isinstance(value, str) and value in label_names:
    return label_names.index(value)
  raise _fail(path, line, f"label {value!r} is not in the label set {list(label_names)}")


def _field(row: Example, key: str, path, line: int) -> Any:
  if key not in row or row[key] is None:
    raise _fail(path, line, f"missing field {key!r}")
  return row[key]


def _int(value: Any, key: str, path, line: int) -> int:
  try:
    return int(value)
  except (TypeError, ValueError):
    raise _fail(path, line, f"field {key!r} is {value!r}, expected an integer") from None


def iter_jsonl(path) -> Iterator[Tuple[int, Example]]:
  """Yields (line number, record) for each non-blank line of a JSONL (optionally .gz) file."""
  opener = gzip.open if str(path).endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise _fail(path, line_number, f"malformed JSON ({e.msg}, column {e.colno})") from None
      if not isinstance(record, dict):
        raise _fail(path, line_number, f"expected a JSON object, got {type(record).__name__}")
      yield line_number, record


# ================================= SuperGLUE ======================================================
# Feature names and label classes of TFDS `super_glue/<config>:1.0.2`.
SUPER_GLUE_FEATURES = {
    "boolq": ("question", "passage"),
    "cb": ("premise", "hypothesis"),
    "copa": ("premise", "choice1", "choice2", "question"),
    "rte": ("premise", "hypothesis"),
    "wic": ("word", "sentence1", "sentence2", "start1", "start2", "end1", "end2"),
    "wsc.fixed": ("text", "span1_index", "span2_index", "span1_text", "span2_text"),
    "axb": ("sentence1", "sentence2"),
    "axg": ("premise", "hypothesis"),
}
SUPER_GLUE_LABELS = {
    "boolq": ("False", "True"),
    "cb": ("entailment", "contradiction", "neutral"),
    "copa": ("choice1", "choice2"),
    "multirc": ("False", "True"),
    "rte": ("entailment", "not_entailment"),
    "wic": ("False", "True"),
    "wsc.fixed": ("False", "True"),
    "axb": ("entailment", "not_entailment"),
    "axg": ("entailment", "not_entailment"),
}
INT_FEATURES = ("start1", "start2", "end1", "end2", "span1_index", "span2_index")


def _fix_wsc_spans(ex: Example) -> Example:
  """TFDS `wsc.fixed`: makes span texts substrings of the text (same rules as the builder)."""
  for k in ("span1", "span2"):
    text, index = ex[k + "_text"], ex[k + "_index"]
    if text in ex["text"] or text in ("Kamenev and Zinoviev", "Kamenev, Zinoviev, and Stalin"):
      continue
    if "theyscold" in text:
      ex["span2_index"] = 10  # TFDS sets only the index here (its text replace is a no-op).
    first_word = ex["text"].split()[index]
    text = (text[0].lower() if first_word[0].islower() else text[0].upper()) + text[1:]
    ex[k + "_text"] = text.rstrip(".").replace("\n", " ")
  return ex


def read_super_glue(path, config: str) -> List[Example]:
  """Reads an official SuperGLUE JSONL file as TFDS `super_glue/<config>` examples."""
  if config == "multirc":
    return _read_multirc(path)
  if config == "record":
    return _read_record(path)
  features, labels = SUPER_GLUE_FEATURES[config], SUPER_GLUE_LABELS[config]
  examples = []
  labelled = _Labelled(path)
  for line, row in iter_jsonl(path):
    labelled.check("label" in row, line)
    if config.startswith("wsc"):
      row = {**row, **_field(row, "target", path, line)}
    ex = {}
    for key in features:
      value = _field(row, key, path, line)
      ex[key] = _int(value, key, path, line) if key in INT_FEATURES else str(value)
    if config == "wsc.fixed":
      ex = _fix_wsc_spans(ex)
    ex["idx"] = _int(_field(row, "idx", path, line), "idx", path, line)
    if "label" not in row:
      ex["label"] = NO_LABEL
    elif config == "copa":
      if row["label"] not in (0, 1):
        raise _fail(path, line, f"label {row['label']!r} is not in the label set [0, 1]")
      ex["label"] = int(row["label"])
    else:
      ex["label"] = label_index(row["label"], labels, path, line)
    examples.append(ex)
  return examples


class _Labelled:
  """A file is labelled throughout (train, val) or not at all (the official test files): a row
  without its label in a labelled file is an error, not an example with no label (seqio would
  train on the target '<unk>')."""

  def __init__(self, path):
    self.path, self.first = path, None

  def check(self, has_label: bool, line: int) -> None:
    if self.first is None:
      self.first = (has_label, line)
    elif has_label != self.first[0]:
      if has_label:
        raise _fail(self.path, line, f"has a label, but line {self.first[1]} has none: a "
                                     f"file is labelled throughout (train, val) or not at all "
                                     f"(test)")
      raise _fail(self.path, line, f"missing field 'label' (line {self.first[1]} has one)")


def _read_multirc(path) -> List[Example]:
  """One example per (paragraph, question, answer), as TFDS `super_glue/multirc`."""
  examples = []
  labelled = _Labelled(path)
  for line, row in iter_jsonl(path):
    passage = _field(row, "passage", path, line)
    for question in _field(passage, "questions", path, line):
      for answer in _field(question, "answers", path, line):
        label = answer.get("label")
        labelled.check(label is not None, line)
        if label is not None and label not in (0, 1, True, False):
          raise _fail(path, line, f"label {label!r} is not in the label set [0, 1]")
        examples.append({
            "paragraph": _field(passage, "text", path, line),
            "question": _field(question, "question", path, line),
            "answer": _field(answer, "text", path, line),
            "idx": {
                "paragraph": _int(row.get("idx"), "idx", path, line),
                "question": _int(question.get("idx"), "question idx", path, line),
                "answer": _int(answer.get("idx"), "answer idx", path, line),
            },
            "label": NO_LABEL if label is None else int(bool(label)),
        })
  return examples


def _read_record(path) -> List[Example]:
  """One example per query, entities and answers deduplicated and sorted (TFDS `record`)."""
  examples = []
  for line, row in iter_jsonl(path):
    passage = _field(row, "passage", path, line)
    text = _field(passage, "text", path, line)
    spans = _field(passage, "entities", path, line)
    entities = sorted({text[e["start"]:e["end"] + 1] for e in spans})
    for qa in _field(row, "qas", path, line):
      examples.append({
          "passage": text,
          "query": _field(qa, "query", path, line),
          "entities": entities,
          "answers": sorted({a["text"] for a in qa.get("answers", [])}),
          "idx": {
              "passage": _int(row.get("idx"), "idx", path, line),
              "query": _int(qa.get("idx"), "query idx", path, line),
          },
      })
  return examples


# ==================================== GLUE ========================================================
# TFDS `glue/<config>`: feature -> TSV column, label column, label classes.
GLUE_COLUMNS = {
    "mrpc": ({"sentence1": "#1 String", "sentence2": "#2 String"}, "Quality",
             ("not_equivalent", "equivalent")),
    "qqp": ({"question1": "question1", "question2": "question2"}, "is_duplicate",
            ("not_duplicate", "duplicate")),
    "sst2": ({"sentence": "sentence"}, "label", ("negative", "positive")),
    "mnli": ({"premise": "sentence1", "hypothesis": "sentence2"}, "gold_label",
             ("entailment", "neutral", "contradiction")),
}


def read_glue(path, config: str) -> List[Example]:
  """Reads a GLUE TSV (header row; test files have no label column) as TFDS `glue/<config>`.

  Like TFDS, rows with missing fields are skipped (the official QQP train file has a few); each
  skipped row is logged with its line number.
  """
  columns, label_column, labels = GLUE_COLUMNS[config]
  examples, skipped = [], []
  csv.field_size_limit(sys.maxsize)
  with open(path, encoding="utf-8-sig", newline="") as f:
    reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    missing = [c for c in columns.values() if c not in (reader.fieldnames or ())]
    if missing:
      raise _fail(path, 1, f"header lacks column(s) {missing} (it has {reader.fieldnames})")
    for n, row in enumerate(reader):
      line = reader.line_num
      ex = {feature: row.get(column) for feature, column in columns.items()}
      if any(v is None for v in ex.values()):
        skipped.append(line)
        continue
      ex["idx"] = n
      if label_column in row:
        value = row[label_column]
        if not value:  # TFDS drops rows whose label cell is empty.
          skipped.append(line)
          continue
        if value not in labels and value.strip().isdigit():
          value = labels[int(value)] if int(value) < len(labels) else value
        ex["label"] = label_index(value, labels, path, line)
      else:
        ex["label"] = NO_LABEL
      examples.append(ex)
  if skipped:
    logging.warning("%s: skipped %d row(s) with missing fields (lines %s)", path, len(skipped),
                    ", ".join(map(str, skipped[:10])))
  return examples


MRPC_DEV_IDS = "dev_ids.tsv"


def read_mrpc(path, split: str) -> List[Example]:
  """MRPC from the files TFDS `glue/mrpc` builds it from, numbered as TFDS numbers it.

  train / validation: the rows of `msr_paraphrase_train.txt` whose (#1 ID, #2 ID) are (validation)
  or are not (train) listed in `dev_ids.tsv` beside it; test: `msr_paraphrase_test.txt` (label
  -1, as TFDS) or GLUE's `test.tsv` (the same rows in the same order). `idx` is the row number
  in the file read (header excluded), so predictions join with TFDS's and T5's outputs.
  """
  path = pathlib.Path(path)
  dev_ids = None
  if split != "test":
    ids_path = path.parent / MRPC_DEV_IDS
    if not ids_path.exists():
      raise FileNotFoundError(
          f"GLUE MRPC: {ids_path} does not exist; put GLUE's MRPC {MRPC_DEV_IDS} beside "
          f"{path.name} (it says which rows are the validation split)")
    with open(ids_path, encoding="utf-8", newline="") as f:
      dev_ids = {tuple(row[:2]) for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
                 if row}
  examples = []
  with open(path, encoding="utf-8-sig", newline="") as f:  # the official files start with a BOM
    reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    missing = [c for c in ("#1 ID", "#2 ID", "#1 String", "#2 String")
               if c not in (reader.fieldnames or ())]
    if missing:
      raise _fail(path, 1, f"header lacks column(s) {missing} (it has {reader.fieldnames})")
    for n, row in enumerate(reader):
      line = reader.line_num
      ex = {"sentence1": _field(row, "#1 String", path, line),
            "sentence2": _field(row, "#2 String", path, line), "idx": n}
      if dev_ids is None:
        ex["label"] = NO_LABEL
      else:
        is_dev = (_field(row, "#1 ID", path, line), _field(row, "#2 ID", path, line)) in dev_ids
        if is_dev != (split == "validation"):
          continue
        quality = _int(_field(row, "Quality", path, line), "Quality", path, line)
        if quality not in (0, 1):
          raise _fail(path, line, f"Quality is {quality}, expected 0 or 1")
        ex["label"] = quality  # 0 not_equivalent, 1 equivalent
      examples.append(ex)
  return examples


# ============================== Text classification ===============================================
def read_label_sentence_csv(path, labels: Sequence[str]) -> List[Example]:
  """LM-BFF's `original/<task>/{train,test}.csv`: rows `label,sentence`, no header."""
  examples = []
  with open(path, encoding="utf-8", newline="") as f:
    reader = csv.reader(f)
    for n, row in enumerate(reader):
      if len(row) != 2:
        raise _fail(path, reader.line_num, f"expected 2 columns (label,sentence), got {len(row)}")
      label = _int(row[0], "label", path, reader.line_num)
      if not 0 <= label < len(labels):
        raise _fail(path, reader.line_num,
                    f"label {label} is not in the label set {list(range(len(labels)))}")
      examples.append({"sentence": row[1], "label": label, "idx": n})
  return examples


AG_NEWS_LABELS = ("World", "Sports", "Business", "Sci/Tech")


def read_ag_news_csv(path) -> List[Example]:
  """The official AG News `{train,test}.csv`: rows `class (1-4),title,description`."""
  examples = []
  with open(path, encoding="utf-8", newline="") as f:
    reader = csv.reader(f)
    for row in reader:
      if len(row) != 3:
        raise _fail(path, reader.line_num, f"expected 3 columns, got {len(row)}")
      label = _int(row[0], "class", path, reader.line_num) - 1
      if not 0 <= label < len(AG_NEWS_LABELS):
        raise _fail(path, reader.line_num, f"class {row[0]!r} is not in the label set [1, 4]")
      examples.append({"title": row[1], "description": row[2], "label": label})
  return examples


def read_imdb_folder(path) -> List[Example]:
  """The official `aclImdb/<split>/{neg,pos}/*.txt` layout (label 0 = neg, 1 = pos)."""
  path = pathlib.Path(path)
  examples = []
  for label, name in enumerate(("neg", "pos")):
    folder = path / name
    if not folder.is_dir():
      raise FileNotFoundError(f"{folder} does not exist; copy aclImdb/{path.name}/{name} there.")
    for file in sorted(folder.glob("*.txt")):
      examples.append({"text": file.read_text(encoding="utf-8"), "label": label})
  return examples


# ==================================== MRQA ========================================================
def read_mrqa(path) -> List[Example]:
  """MRQA 2019 `.jsonl.gz`: a header line, then one context per line with its questions.

  Yields one example per question with the TFDS `mrqa` features that the preprocessor reads.
  """
  examples = []
  header_seen = False
  for line, row in iter_jsonl(path):
    if not header_seen and "header" in row:
      header_seen = True
      continue
    context = str(_field(row, "context", path, line)).strip()
    for qa in _field(row, "qas", path, line):
      answers = [str(a) for a in _field(qa, "answers", path, line)]
      detected = [str(a["text"]).strip() for a in qa.get("detected_answers", [])]
      if not answers and not detected:
        raise _fail(path, line, f"question {qa.get('qid')!r} has no answers")
      examples.append({
          "qid": str(_field(qa, "qid", path, line)),
          "question": str(_field(qa, "question", path, line)).strip(),
          "context": context,
          "answers": answers,
          "detected_answers": {"text": detected},
      })
  return examples
