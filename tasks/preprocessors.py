"""Text and token preprocessors, reproducing the `t5` package's text-to-text formats.

Text preprocessors run before tokenization and map raw (TFDS-shaped) examples to
{"inputs": str, "targets": str, ...}; token preprocessors run after it. The formats follow
`t5.data.preprocessors` exactly (same TF regexes, so the same strings), e.g.

  glue:        "rte hypothesis: <h> premise: <p>"  -> "not_entailment"
  wsc_simple:  "wsc: The boy ... *he* ..."         -> "the boy"
  record:      "record query: ... entities: a, b passage: ..." -> one example per answer
  squad/mrqa:  "question: <q> context: <c>"        (punctuation padded with spaces)
"""
from typing import Mapping, Optional, Sequence

import seqio
import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def _pad_punctuation(text: tf.Tensor) -> tf.Tensor:
  """Adds spaces around punctuation and collapses whitespace (T5's squad).

  T5's current regexes: `[[:punct:]]` (ASCII punctuation), not its old non-word class, which
  RE2 takes as ASCII-only, so that it split non-ASCII letters ("Frédéric" -> "Fr é d é ric").
  """
  text = tf.strings.regex_replace(text, r"([[:punct:]])", r" \1 ")
  return tf.strings.regex_replace(text, r"\s+", " ")


def _string_join(parts) -> tf.Tensor:
  """Joins on spaces and collapses consecutive whitespace."""
  return tf.strings.regex_replace(tf.strings.join(parts, separator=" "), r"\s+", " ")


def _label_name(label: tf.Tensor, label_names: Sequence[str], name: str) -> tf.Tensor:
  """The label's text; '<unk>' for unlabeled (-1) examples; an error outside the label set."""
  label = tf.cast(label, tf.int64)
  checks = [
      tf.debugging.assert_greater_equal(
          label, tf.constant(-1, tf.int64),
          message=f"{name}: label index below -1; labels must index {list(label_names)}"),
      tf.debugging.assert_less(
          label, tf.constant(len(label_names), tf.int64),
          message=f"{name}: label index outside the label set {list(label_names)}"),
  ]
  with tf.control_dependencies(checks):
    label = tf.identity(label)
  return tf.cond(
      tf.equal(label, -1),
      lambda: tf.constant("<unk>"),
      lambda: tf.gather(tf.constant(list(label_names)), tf.maximum(label, 0)))


@seqio.map_over_dataset
def glue(x, benchmark_name: str, label_names: Sequence[str],
         feature_names: Optional[Sequence[str]] = None, id_key: Optional[str] = "idx"):
  """T5's GLUE/SuperGLUE format: "<benchmark> <key>: <value> ..." -> label name.

  Args:
    x: a raw example.
    benchmark_name: the first word of the inputs (e.g. "rte").
    label_names: label index -> target text.
    feature_names: ordered input features; default all but 'label' and 'idx', sorted by name.
    id_key: feature copied to 'idx' for evaluation (None: no copy).

  Returns:
    {"inputs", "targets", "idx"} (MultiRC: "idx/paragraph", "idx/question", "idx/answer").
  """
  feature_keys = feature_names or sorted(set(x.keys()).difference(["label", "idx"]))
  strs_to_join = [benchmark_name]
  for key in feature_keys:
    strs_to_join += [f"{key}:", x[key]]
  joined = tf.strings.join(strs_to_join, separator=" ")
  ex = {}
  if benchmark_name == "multirc":
    # Remove HTML markup, as T5 does.
    joined = tf.strings.regex_replace(joined, "<br>", " ")
    joined = tf.strings.regex_replace(joined, "<(/)?b>", "")
    for k in ("paragraph", "question", "answer"):
      ex[f"idx/{k}"] = x["idx"][k]
  elif id_key:
    ex["idx"] = x[id_key]
  ex["inputs"] = joined
  ex["targets"] = _label_name(x["label"], label_names, benchmark_name)
  return ex


@seqio.map_over_dataset
def remove_first_text_token(x, key: str = "inputs"):
  """Drops the first word of `key`: the task name, for the `taskless_` variants (Lester et al.)."""
  x = dict(x)
  x[key] = tf.strings.regex_replace(x[key], r"^[^ ]* ", "", replace_global=False)
  return x


_WSC_SPECIAL_CASES = {
    # Texts where span2_index does not point at the pronoun; T5 hard-codes their inputs.
    ("The boy continued to whip the pony , and eventually the pony threw him over. John laughed "
     "out quite loud. \"Good for him,\" he said. "):
        ("The boy continued to whip the pony , and eventually the pony threw him over. John "
         "laughed out quite loud. \"Good for X ,\" he said."),
    ("When they had eventually calmed down a bit , and had gotten home, Mr. Farley put the magic "
     "pebble in an iron safe . Some day they might want to use it , but really for now, what more "
     "could they wish for?"):
        ("When they had eventually calmed down a bit , and had gotten home, Mr. Farley put the "
         "magic pebble in an iron safe . Some day they might want to use X , but really for now, "
         "what more could they wish for?"),
}


def _wsc_inputs(x) -> tf.Tensor:
  """The WSC text with the pronoun at span2_index replaced by 'X' (T5's `_wsc_inputs`)."""
  words = tf.strings.split(x["text"], sep=" ")
  index = tf.cast(x["span2_index"], tf.int32)

  def blank_pronoun():
    checks = [
        tf.debugging.assert_greater(index, 0, message="wsc: span2_index must be > 0"),
        tf.debugging.assert_less(index, tf.size(words),
                                 message="wsc: span2_index is past the end of the text"),
    ]
    with tf.control_dependencies(checks):
      safe = tf.clip_by_value(index, 0, tf.size(words) - 1)
    check = tf.debugging.assert_equal(
        words[safe], x["span2_text"],
        message="wsc: the word at span2_index is not span2_text")
    with tf.control_dependencies([check]):
      return tf.strings.join([
          tf.strings.reduce_join(words[:safe], separator=" "), "X",
          tf.strings.reduce_join(words[safe + 1:], separator=" ")], separator=" ")

  def special_cases_or(cases):
    if not cases:
      return blank_pronoun()
    (text, fixed), rest = cases[0], cases[1:]
    return tf.cond(tf.equal(x["text"], text), lambda: tf.constant(fixed),
                   lambda: special_cases_or(rest))

  return special_cases_or(list(_WSC_SPECIAL_CASES.items()))


def wsc_simple(dataset: tf.data.Dataset, label: str = "wsc:",
               correct_referent_only: bool = False) -> tf.data.Dataset:
  """T5's simple WSC: "wsc: ... *pronoun* ..." -> the candidate referent (span1_text).

  Targets are the candidate regardless of the label, so training tasks keep only correct
  referents (`correct_referent_only=True`); evaluation compares the generated referent with the
  candidate and the label (see `postprocessors.wsc_simple`).
  """

  def map_fn(x):
    inputs = tf.strings.regex_replace(_wsc_inputs(x), r" X ", " *" + x["span2_text"] + "* ")
    return {
        "inputs": tf.strings.join([label, inputs], separator=" "),
        "targets": tf.reshape(x["span1_text"], []),
        "label": tf.cast(x.get("label", 0), tf.int64),
        "idx": x["idx"],
    }

  if correct_referent_only:
    dataset = dataset.filter(lambda x: tf.equal(tf.cast(x.get("label", 0), tf.int64), 1))
  return dataset.map(map_fn, num_parallel_calls=AUTOTUNE)


def record(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """T5's ReCoRD: "record query: <q> entities: <e1>, <e2> passage: <p>" -> one example per answer.

  Keeps "answers" (all of them, for max-over-answers metrics) and "idx/passage", "idx/query".
  """

  def per_answer(x):
    num_answers = tf.size(x["answers"])
    n = tf.maximum(num_answers, 1)
    repeat = lambda t: tf.broadcast_to(t, tf.concat([[n], tf.shape(t)], axis=0))
    return {
        "passage": repeat(x["passage"]),
        "query": repeat(x["query"]),
        "entities": repeat(x["entities"]),
        "answers": repeat(x["answers"]),
        "targets": tf.cond(num_answers > 0, lambda: x["answers"], lambda: tf.constant(["<unk>"])),
        "idx/passage": repeat(x["idx"]["passage"]),
        "idx/query": repeat(x["idx"]["query"]),
    }

  def to_text(x):
    passage = tf.strings.regex_replace(x["passage"], r"(\.|\?|\!|\"|\')\n@highlight\n", r"\1 ")
    passage = tf.strings.regex_replace(passage, r"\n@highlight\n", ". ")
    inputs = tf.strings.join([
        "record query:", x["query"], "entities:",
        tf.strings.reduce_join(x["entities"], separator=", "), "passage:", passage
    ], separator=" ")
    return {
        "inputs": inputs,
        "targets": x["targets"],
        "answers": x["answers"],
        "idx/passage": x["idx/passage"],
        "idx/query": x["idx/query"],
    }

  dataset = dataset.map(per_answer, num_parallel_calls=AUTOTUNE).unbatch()
  return dataset.map(to_text, num_parallel_calls=AUTOTUNE)


@seqio.map_over_dataset
def mrqa(x):
  """MRQA/SQuAD as T5's `squad`: "question: <q> context: <c>" -> answer, punctuation padded.

  The target is the first answer span found in the context (MRQA's `detected_answers`, as in
  prompt-tuning's MRQA tasks), else the first answer; "answers" keeps all of them for SQuAD EM/F1.
  """
  answers = _pad_punctuation(x["answers"])
  detected = x["detected_answers"]["text"]
  target = tf.cond(tf.size(detected) > 0, lambda: detected[0], lambda: x["answers"][0])
  question = _pad_punctuation(x["question"])
  context = _pad_punctuation(x["context"])
  return {
      "inputs": _string_join(["question:", question, "context:", context]),
      "targets": _pad_punctuation(target),
      "id": x["qid"],
      "question": question,
      "context": context,
      "answers": answers,
  }


# ===================================== Token preprocessors ========================================
def add_sentinel_to_targets(dataset: tf.data.Dataset,
                            output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """Prepends <extra_id_0> (the vocabulary's last id) to the targets' tokens.

  The "span corruption + sentinel" setting of Lester et al. (2021): targets look like span
  corruption outputs, which suits a span-corruption checkpoint. Run before append_eos_after_trim.
  """
  vocab = output_features["targets"].vocabulary

  def prepend(x):
    x = dict(x)
    sentinel = tf.constant([vocab.vocab_size - 1], dtype=x["targets"].dtype)
    x["targets"] = tf.concat([sentinel, x["targets"]], axis=0)
    return x

  return dataset.map(prepend, num_parallel_calls=AUTOTUNE)


def split_tokens(dataset: tf.data.Dataset, max_tokens_per_segment: int,
                 feature_key: str = "targets") -> tf.data.Dataset:
  """Splits each token sequence into consecutive segments of at most `max_tokens_per_segment`."""

  def to_segments(x):
    tokens = x[feature_key]
    n = tf.size(tokens)
    num = (n + max_tokens_per_segment - 1) // max_tokens_per_segment
    lengths = tf.concat(
        [tf.fill([num - 1], max_tokens_per_segment), [n - max_tokens_per_segment * (num - 1)]],
        axis=0)
    return tf.data.Dataset.from_tensor_slices(
        {feature_key: tf.RaggedTensor.from_row_lengths(tokens, lengths)})

  dataset = dataset.filter(lambda x: tf.size(x[feature_key]) > 0)
  dataset = dataset.flat_map(to_segments)
  return dataset.map(lambda x: {feature_key: tf.identity(x[feature_key])})


def prefix_lm(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
              output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """T5's prefix LM objective on tokenized text: a random prefix -> its continuation.

  The text's tokens are cut into segments that fit the inputs (leaving room for EOS); each segment
  is split at a position drawn uniformly from [1, n - 1] (inputs = the prefix, targets = the rest),
  as `t5.data.preprocessors.prefix_lm` with its random_prefix_noise_mask. Used for the LM
  adaptation of span-corruption T5 1.1 checkpoints (Lester et al., 2021).
  """
  max_tokens = sequence_length["inputs"]
  if output_features["inputs"].add_eos:
    max_tokens -= 1
  dataset = split_tokens(dataset, max_tokens, feature_key="targets")

  @seqio.map_over_dataset(num_seeds=1)
  def split_at_random_point(x, seed):
    tokens = x["targets"]
    n = tf.size(tokens)
    max_prefix = n - 1
    prefix = tf.random.stateless_uniform(
        [], seed=seed, minval=tf.minimum(max_prefix, 1), maxval=max_prefix + 1, dtype=tf.int32)
    return {"inputs": tokens[:prefix], "targets": tokens[prefix:]}

  return split_at_random_point(dataset)
