"""Length grouping (issue 11, the CPU epoch): `prompt_jax.group_by_length.batches = k` sorts each
window of k batches' examples by length before batching, so length buckets pad less.

What must hold: every example of a window is trained on once (the same rows as without
grouping, window by window); within a window the rows come longest first; the grouped stream
processes fewer positions; the global batch does not depend on the process layout; the data
iterator state in a checkpoint resumes the grouped stream exactly (mid-window too), and so does
a killed training run.
"""
import collections
import contextlib
import io

import gin
import numpy as np
import pytest
import tensorflow as tf

from prompt_jax import cli
from prompt_jax.errors import ConfigError
from prompt_jax.train import data as data_lib
from tests.train import common

LENGTHS = {"inputs": 16, "targets": 4}  # the embedded task: 7-11 input tokens, 2 targets
BATCH = 8


def _cfg():
  return data_lib.DatasetConfig(mixture_or_task_name="embedded_last_letter",
                                task_feature_lengths=LENGTHS, batch_size=BATCH,
                                shuffle=True, seed=0, module="prompt_jax.embedded.task")


def _stream(group, num_buckets=4, shards=1, rows=(0, BATCH)):
  gin.clear_config()  # no bindings another test left (DatasetConfig is gin-configurable)
  with gin.unlock_config():
    gin.bind_parameter("prompt_jax.length_buckets.num_buckets", num_buckets)
    gin.bind_parameter("prompt_jax.group_by_length.batches", group)
  try:
    return data_lib.TrainStream(_cfg(), shards, rows)
  finally:
    gin.clear_config()


def _rows(batch):
  """The batch's rows as hashable (input tokens, target tokens) without padding."""
  return [(tuple(int(t) for t in e if t), tuple(int(t) for t in d if t))
          for e, d in zip(batch["encoder_input_tokens"], batch["decoder_target_tokens"])]


def test_sort_by_length_orders_a_window_longest_first_and_keeps_rows_together():
  enc = np.array([[5, 1, 0, 0], [5, 6, 7, 1], [5, 6, 1, 0], [8, 1, 0, 0], [9, 6, 1, 0]])
  tgt = np.array([[3, 1, 0], [3, 1, 0], [3, 4, 1], [3, 1, 0], [3, 1, 0]])
  ids = np.arange(5, dtype=np.int32)
  out = data_lib.sort_by_length({"encoder_input_tokens": tf.constant(enc),
                                 "decoder_target_tokens": tf.constant(tgt),
                                 "task_ids": tf.constant(ids)})
  # Longest input first; equal inputs by longer target; then (stable) the window's order.
  np.testing.assert_array_equal(out["task_ids"].numpy(), [1, 2, 4, 0, 3])
  np.testing.assert_array_equal(out["encoder_input_tokens"].numpy(), enc[[1, 2, 4, 0, 3]])
  np.testing.assert_array_equal(out["decoder_target_tokens"].numpy(), tgt[[1, 2, 4, 0, 3]])


def test_grouped_stream_trains_each_window_once_longest_first_on_fewer_positions():
  group = 4
  plain, grouped = _stream(0), _stream(group)
  sorted_batches = 0
  for _ in range(3):  # three windows of 4 batches
    want, got = [], []
    for _ in range(group):
      want += _rows(next(plain))
      got += _rows(next(grouped))
    assert collections.Counter(got) == collections.Counter(want)  # the same examples, once each
    assert [len(e) for e, _ in got] == sorted((len(e) for e, _ in got), reverse=True)
    sorted_batches += got != want
  assert sorted_batches == 3, "grouping changed nothing"
  assert grouped.tokens_real == plain.tokens_real
  assert grouped.tokens_processed < plain.tokens_processed
  print(f"real-token share: bucketed {plain.real_token_share:.3f}, "
        f"bucketed and grouped {grouped.real_token_share:.3f}")


def test_grouped_global_batch_does_not_depend_on_the_process_layout():
  for shards in (1, 4):
    whole = _stream(2, shards=shards)
    halves = [_stream(2, shards=shards, rows=rows) for rows in ((0, 4), (4, 8))]
    for _ in range(5):  # each half is cut to its own bucket here (one process): compare rows
      got, parts = next(whole), [next(h) for h in halves]
      assert _rows(got) == _rows(parts[0]) + _rows(parts[1])


def test_saved_iterator_state_resumes_the_grouped_stream_mid_window(tmp_path):
  stream = _stream(3)
  for _ in range(4):  # 4 batches: one window of 3 and one batch into the next
    next(stream)
  tf.train.Checkpoint(ds=stream.iterators[0]).write(str(tmp_path / "shard"))
  want = [next(stream) for _ in range(5)]
  fresh = _stream(3)
  tf.train.Checkpoint(ds=fresh.iterators[0]).read(str(tmp_path / "shard")).assert_consumed()
  for w in want:
    got = next(fresh)
    assert got.keys() == w.keys()
    for k in w:
      np.testing.assert_array_equal(got[k], w[k])


def test_grouping_without_buckets_is_a_config_error():
  with pytest.raises(ConfigError, match="needs length buckets"):
    _stream(4, num_buckets=0)
  with pytest.raises(ConfigError, match="batches must be >= 0"):
    _stream(-1)


def _train(model_dir, steps, *extra):
  out = io.StringIO()
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
      code = cli.main(["train"] + common.flags(
          model_dir, steps, "--gin.train/prompt_jax.DatasetConfig.shuffle=True",
          "--gin.prompt_jax.length_buckets.num_buckets=4", *extra))
  finally:
    gin.clear_config()  # the run's bindings must not reach the next test in this process
  assert code == 0
  return out.getvalue()


def test_killed_grouped_run_resumes_bitwise(tmp_path):
  group = "--gin.prompt_jax.group_by_length.batches=3"
  full, resumed, ungrouped = (str(tmp_path / n) for n in ("full", "resumed", "ungrouped"))
  _train(full, 5, group)
  _train(ungrouped, 5)
  # The first launch stops right after checkpointing step 2 (mid-window); the same command
  # then resumes from the saved iterator state.
  _train(resumed, 5, group, "--gin.prompt_jax.train.stop_after_step=2")
  log = _train(resumed, 5, group)
  assert "restored step 2" in log and "replaying" not in log
  assert common.prompt_at(full, 5).tobytes() == common.prompt_at(resumed, 5).tobytes()
  # Grouping took effect: other batches, another prompt, fewer padded positions (the share
  # TensorBoard shows, over the 5 steps).
  assert common.prompt_at(full, 5).tobytes() != common.prompt_at(ungrouped, 5).tobytes()
  shares = [common.tensorboard_scalars(d, "data/real_token_share") for d in (full, ungrouped)]
  assert sorted(shares[0]) == sorted(shares[1]) == [1, 2, 3, 4, 5]
  assert 0 < shares[1][5] < shares[0][5] <= 1, shares


def test_each_new_bucket_program_is_logged_once(tmp_path):
  """A bucketed run compiles a program in the loop for each batch shape it meets first after
  step 1; `train` logs that wait once per shape, at the step it happens, with the count so far
  (the shapes read off the same stream, outside the run)."""
  import re  # pylint: disable=g-import-not-at-top
  stream = _stream(3)
  seen, expected = set(), []
  for step in range(1, 7):
    batch = next(stream)
    shape = (batch["encoder_input_tokens"].shape[1], batch["decoder_target_tokens"].shape[1])
    if shape not in seen:
      seen.add(shape)
      if step > 1:  # step 1's program is in the start-up line
        expected.append((step, *shape, len(seen)))
  assert expected, "the stream met one shape only: nothing to check"
  log = _train(str(tmp_path / "run"), 6, "--gin.prompt_jax.group_by_length.batches=3")
  most = len(stream.buckets["inputs"]) * len(stream.buckets["targets"])  # (8, 16) x (4,)
  found = re.findall(r"step (\d+): a new length bucket \(inputs (\d+), targets (\d+)\): "
                     rf"compiled and ran in [0-9.]+ s; (\d+) of at most {most} programs", log)
  assert [tuple(int(x) for x in f) for f in found] == expected, log
  unbucketed = io.StringIO()
  with contextlib.redirect_stdout(unbucketed), contextlib.redirect_stderr(io.StringIO()):
    assert cli.main(["train"] + common.flags(str(tmp_path / "padded"), 3)) == 0
  gin.clear_config()
  assert "first step done" in unbucketed.getvalue()
  assert "length bucket" not in unbucketed.getvalue()
