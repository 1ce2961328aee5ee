"""`prompt-jax tasks` (tasks.inspect.main): listing and showing examples."""
import pytest
import seqio
import tensorflow as tf

from prompt_jax import vocab as vocab_lib
from prompt_jax.tasks import inspect


def test_lists_tasks_with_splits_and_labels(capsys):
  assert inspect.main(["--filter", "rte_v102"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert ("super_glue_rte_v102  splits=train,validation,test  labels=entailment|not_entailment"
          in out)
  assert ("taskless_super_glue_rte_v102_sentinel  splits=train,validation,test  "
          "labels=entailment|not_entailment" in out)
  assert all("rte_v102" in line for line in out)


def test_shows_preprocessed_examples(shared_data, capsys):
  root = shared_data("super_glue").parent
  assert inspect.main(["super_glue_copa_v102", "-n", "1", "--data_dir", str(root)]) == 0
  out = capsys.readouterr().out
  assert out.splitlines()[:3] == [
      "--- example 0",
      "inputs: copa choice1: The toilet filled with water. choice2: Water flowed from the spout. "
      "premise: The man turned on the faucet. question: effect",
      "targets: choice2",
  ]


def test_shows_tokens(shared_data, spm_path, capsys):
  root = shared_data("super_glue").parent
  argv = ["super_glue_cb_v102_sentinel", "-n", "1", "--data_dir", str(root), "--tokens",
          "--spm_path", str(spm_path)]
  assert inspect.main(argv) == 0
  assert "targets decoded: <extra_id_0> contradiction" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("model", ["missing", "not_sentencepiece"])
def test_tokens_with_an_unusable_spm_model_is_one_line(shared_data, tmp_path, capsys, model):
  """It was exit 1 with TensorFlow's "in user code:" (the model loaded inside tf.data)."""
  root = shared_data("super_glue").parent
  path = tmp_path / "spiece.model"
  if model == "not_sentencepiece":
    path.write_text("garbage\n")
  assert inspect.main(["super_glue_rte_v102", "-n", "1", "--data_dir", str(root), "--tokens",
                       "--spm_path", str(path)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1, err
  assert (f"SentencePiece model '{path}' does not exist" if model == "missing"
          else "cannot load T5's SentencePiece model (Error parsing message") in err, err
  assert err.startswith("prompt-jax tasks: error: ") and "user code" not in err


def test_unknown_task_is_a_one_line_error(capsys):
  assert inspect.main(["super_glue_rte"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("prompt-jax tasks: error: unknown task or mixture 'super_glue_rte'")
  assert "\n" not in err
  assert inspect.main(["super_glue_rte_v102", "-n", "-1"]) == 2  # it printed every example
  assert capsys.readouterr().err == ("prompt-jax tasks: error: -n/--num_examples must be >= 1, "
                                     "got -1\n")


BYTE_TASK = "inspect_test_byte_vocabulary"


@pytest.fixture
def byte_task(monkeypatch):
  """A registered task on seqio's ByteVocabulary; T5's vocabulary points at a missing file, so
  any use of it fails at once (and offline) instead of showing T5 pieces."""
  monkeypatch.setenv(vocab_lib.SPM_PATH_ENV, "/nonexistent/t5_spiece.model")

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices({"inputs": ["ab"], "targets": ["c"]})

  vocab = seqio.ByteVocabulary()
  seqio.TaskRegistry.add(
      BYTE_TASK, source=seqio.FunctionDataSource(dataset_fn, splits=("validation",)),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
      output_features={k: seqio.Feature(vocab, add_eos=True) for k in ("inputs", "targets")})
  yield BYTE_TASK
  seqio.TaskRegistry.remove(BYTE_TASK)


def test_tokens_use_the_tasks_own_vocabulary(byte_task, capsys):
  assert inspect.main([byte_task, "-n", "1", "--tokens"]) == 0
  # ByteVocabulary: id = byte + 3 ("a" = 97 -> 100), EOS 1; T5's model would show other pieces.
  assert capsys.readouterr().out.splitlines() == [
      "--- example 0",
      "inputs (3 tokens): [100, 101, 1]",
      "inputs decoded: ab",
      "targets (2 tokens): [102, 1]",
      "targets decoded: c",
  ]


def test_spm_path_is_ignored_for_a_task_with_its_own_vocabulary(byte_task, capsys):
  argv = [byte_task, "-n", "1", "--tokens", "--spm_path", "/nonexistent/other.model"]
  assert inspect.main(argv) == 0
  captured = capsys.readouterr()
  assert "inputs decoded: ab" in captured.out.splitlines()
  assert captured.err.strip() == (f"prompt-jax tasks: note: --spm_path is not used; {byte_task} "
                                  "has its own vocabulary (ByteVocabulary)")


@pytest.mark.parametrize("argv, message", [
    (["super_glue_rte"], "unknown task or mixture 'super_glue_rte'"),
    ([BYTE_TASK, "--split", "train"], f"task '{BYTE_TASK}' has no split 'train'"),
    (["super_glue_rte_v102", "--data_dir", "/nonexistent/data"], "data dir /nonexistent/data"),
])
def test_bad_input_exits_2(byte_task, argv, message, capsys):
  del byte_task
  assert inspect.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(f"prompt-jax tasks: error: {message}")
  assert "\n" not in err


def test_a_failing_pipeline_is_not_bad_input(capsys):
  """A TensorFlow op that fails while reading (not the user's input) stays exit 1."""

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices({"targets": ["c"]}).map(
        lambda ex: {"targets": tf.strings.to_number(ex["targets"])})

  name = "inspect_test_failing_pipeline"
  seqio.TaskRegistry.add(
      name, source=seqio.FunctionDataSource(dataset_fn, splits=("validation",)),
      preprocessors=[], output_features={"targets": seqio.Feature(seqio.ByteVocabulary())})
  try:
    assert inspect.main([name, "-n", "1"]) == 1
  finally:
    seqio.TaskRegistry.remove(name)
  assert capsys.readouterr().err.startswith("prompt-jax tasks: error: ")


def test_a_reader_that_leaves_ends_it_quietly():
  """`prompt-jax tasks ... | head -1`: the write after head left was `error: BrokenPipeError`,
  exit 1; now nothing is said and the exit is a SIGPIPE death's (141), as for other commands."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  proc = subprocess.Popen(
      [sys.executable, "-m", "prompt_jax", "tasks", "embedded_last_letter", "-n", "100000",
       "--split=train"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3"))
  first = proc.stdout.readline()  # the first line, then the reader leaves (200 KB follow)
  proc.stdout.close()
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=300) == 141 and first, err
  assert "BrokenPipe" not in err and "prompt-jax" not in err, err
