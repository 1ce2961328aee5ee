"""Sharded and multi-process training equal single-device training (fake CPU devices).

Each run is `python -m prompt_jax train` in a subprocess, because XLA_FLAGS (the number of
fake devices) must be set before jax is imported.
"""
import os
import socket

import numpy as np
import pytest

from tests import numerics
from tests.train import common


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """1 process x 1 device, 5 steps."""
  d = str(tmp_path_factory.mktemp("ref1"))
  proc = common.cli_subprocess(["train"] + common.flags(d, 5), devices=1)
  assert proc.returncode == 0, proc.stdout[-3000:]
  return d


@pytest.fixture(scope="module")
def reference64(tmp_path_factory):
  """The same run in float64 (64-bit JAX, model and frozen weights in float64): the exact
  result against which float32 runs' rounding errors are measured (tests/numerics.py)."""
  d = str(tmp_path_factory.mktemp("ref64"))
  proc = common.cli_subprocess(
      ["train"] + common.flags(d, 5, "--gin.prompt_jax.t5_config.dtype='float64'",
                               "--gin.FROZEN_DTYPE='float64'"),
      devices=1, env={"JAX_ENABLE_X64": "1"})
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert common.prompt_at(d, 5).dtype == np.float64
  return d


def assert_same_training(variant: str, reference: str, reference64: str, step: int,
                         what: str) -> None:
  """A float32 run that computes the same steps in another summation order (another mesh or
  process layout) is as close to the float64 run as the single-device float32 run, up to
  numerics.FACTOR: 5 Adafactor steps at lr 0.3 amplify rounding (the normalised update divides
  by the gradient's own scale), so no fixed tolerance holds on every CPU; the ratio does."""
  numerics.assert_close(common.prompt_at(variant, step), common.prompt_at(reference, step),
                        common.prompt_at(reference64, step), what=what)


def test_4x2_mesh_equals_one_device(reference, reference64, tmp_path):
  # NUM_PARTITIONS=2 splits contractions across the 'model' axis: float32 partial sums run in
  # another order, so equality holds up to rounding (bounded as in assert_same_training).
  d = str(tmp_path / "mesh")
  proc = common.cli_subprocess(["train"] + common.flags(d, 5, "--gin.NUM_PARTITIONS=2"),
                               devices=8)
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert "training steps 0 -> 5" in proc.stdout
  assert_same_training(d, reference, reference64, 5, "4 x 2 mesh")
  # Read back on 1 device (export on another machine): not the 8 devices' saved shardings.
  proc = common.cli_subprocess(["export", f"--gin.MODEL_DIR='{d}'"], devices=1)
  assert proc.returncode == 0, proc.stdout[-3000:]
  np.testing.assert_array_equal(np.load(os.path.join(d, "export", "prompt_step5.npy")),
                                common.prompt_at(d, 5))


def test_batch_not_divisible_by_data_parallel_size(tmp_path):
  d = str(tmp_path / "bad")
  proc = common.cli_subprocess(["train"] + common.flags(d, 3, "--gin.NUM_PARTITIONS=2",
                                                        "--gin.BATCH_SIZE=6"), devices=8)
  assert proc.returncode == 2
  errors = [l for l in proc.stdout.splitlines() if l.startswith("prompt-jax train: error")]
  assert len(errors) == 1 and "BATCH_SIZE=6 is not divisible by the data-parallel size 4" in \
      errors[0], proc.stdout[-2000:]
  assert not (tmp_path / "bad").exists()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_processes(model_dir: str, steps: int, devices_each: int, *extra: str,
                   processes: int = 2) -> list:
  """`processes` training processes on 127.0.0.1 (gloo collectives); returns their outputs."""
  return _cli_processes(["train"] + common.flags(model_dir, steps, *extra), devices_each,
                        processes)


def _cli_processes(argv: list, devices_each: int, processes: int = 2) -> list:
  """`prompt-jax <argv>` as `processes` processes of one job; returns their outputs."""
  codes, outputs, _ = _started_together(argv, devices_each, [processes] * processes)
  for code, out in zip(codes, outputs):
    assert code == 0, out[-3000:]
  return outputs


def _started_together(argv: list, devices_each: int, counts: list, *extra: str):
  """`prompt-jax <argv>` as processes 0, 1, ... on one coordinator, process i told
  --process_count=counts[i]; (their exit codes, their outputs, the port)."""
  port = _free_port()
  procs = [common.cli_subprocess(
      argv + [f"--coordinator_address=127.0.0.1:{port}", f"--process_count={count}",
              f"--process_index={i}", *extra], devices=devices_each, wait=False)
           for i, count in enumerate(counts)]
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=300)[0])  # external timeout per process
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  return [p.returncode for p in procs], outputs, port


def test_a_process_count_other_than_the_coordinators_is_refused(tmp_path):
  """Process 1 told --process_count=3 joined process 0's job of 2 and both trained (the
  coordinator's count won silently): process 1 refuses in one line; process 0, left alone,
  fails at its first collective instead of training."""
  codes, outputs, port = _started_together(["train"] + common.flags(str(tmp_path / "m"), 2), 1,
                                           [2, 3], "--initialization_timeout=20")
  assert codes[1] == 2, outputs[1][-3000:]
  assert (f"prompt-jax train: error: --process_count=3, but the coordinator at 127.0.0.1:{port} "
          f"runs 2 processes: give every process the same --process_count") in outputs[1]
  assert codes[0] != 0, outputs[0][-3000:]
  assert not (tmp_path / "m" / "checkpoints").exists()


def test_two_processes_match_one_process(tmp_path):
  """2 processes x 2 devices = 1 process x 4 devices, bit for bit: the same global batches row
  for row (train/data.py: the layout does not depend on the topology), and the prompt's
  gradient is summed over the batch in the same order on both (partitioning.broadcast_batch:
  per-shard sums, all-gathered, added in shard order), not by the all-reduce, whose order
  differs between XLA in one process and gloo across processes
  (test_gloo_all_reduce_sums_in_another_order)."""
  single = str(tmp_path / "single")
  proc = common.cli_subprocess(["train"] + common.flags(single, 3), devices=4)
  assert proc.returncode == 0, proc.stdout[-3000:]
  multi = str(tmp_path / "multi")
  outputs = _run_processes(multi, 3, 2)
  assert common.prompt_at(multi, 3).tobytes() == common.prompt_at(single, 3).tobytes()
  assert "restored" not in outputs[0]


def test_two_single_device_processes_match_bitwise(tmp_path):
  """2 processes x 1 device = 1 process x 2 devices, bit for bit: the same rows in the same
  order (2 data shards, one per process here, both read by the single process), and an
  all-reduce of two operands is exact in any order (a + b == b + a in IEEE arithmetic)."""
  shards = "--gin.prompt_jax.train.num_data_shards=2"
  single = str(tmp_path / "single")
  proc = common.cli_subprocess(["train"] + common.flags(single, 3, shards), devices=2)
  assert proc.returncode == 0, proc.stdout[-3000:]
  multi = str(tmp_path / "multi")
  _run_processes(multi, 3, 1, shards)
  assert common.prompt_at(multi, 3).tobytes() == common.prompt_at(single, 3).tobytes()
  # Each process saved the iterator state of its own data shard.
  iterators = sorted(os.listdir(os.path.join(multi, "checkpoints", "3", "data_iterators")))
  assert [f for f in iterators if f.endswith(".index")] == [
      "shard-00000-of-00002.index", "shard-00001-of-00002.index"]


def _eval_lines(output: str) -> dict:
  """{'training_eval step 2': {'loss': 1.57, ...}, 'inference_eval step 2': {...}, ...}."""
  found = {}
  for line in output.splitlines():
    if line.startswith(("training_eval step ", "inference_eval step ")):
      head, values = line.split(": ", 1)
      words = values.split()
      found[head] = {k: float(v) for k, v in zip(words[::2], words[1::2])}
  return found


def test_model_axis_across_processes_matches_one_process(tmp_path):
  """NUM_PARTITIONS=4 on 2 processes x 2 devices: the `model` axis spans both processes, whose
  devices hold the same rows (a data axis of 1). Each must feed those rows to training_eval and
  inference_eval (as 1 process x 4 devices does), and only one of them saves data shard 0's
  iterator state (two writers of the same file failed the first checkpoint)."""
  extra = ("--gin.NUM_PARTITIONS=4", "--gin.EVAL_PERIOD=2", "--gin.CHECKPOINT_PERIOD=2")
  single = str(tmp_path / "single")
  proc = common.cli_subprocess(["train"] + common.flags(single, 2, *extra), devices=4)
  assert proc.returncode == 0, proc.stdout[-3000:]
  multi = str(tmp_path / "multi")
  outputs = _run_processes(multi, 2, 2, *extra)
  want, got = _eval_lines(proc.stdout), _eval_lines(outputs[0])
  assert "training_eval step 2" in want and "inference_eval step 2" in want, proc.stdout[-3000:]
  assert sorted(got) == sorted(want), outputs[0][-3000:]
  for head, metrics in want.items():  # printed to 4 decimals; the all-reduce order differs
    assert sorted(got[head]) == sorted(metrics), (head, got[head], metrics)
    for name, value in metrics.items():
      assert abs(got[head][name] - value) <= 2e-4, (head, name, got[head][name], value)
  iterators = os.listdir(os.path.join(multi, "checkpoints", "2", "data_iterators"))
  assert [f for f in iterators if f.endswith(".index")] == ["shard-00000-of-00001.index"]


def test_ensemble_with_the_model_axis_across_processes_matches_one_process(tmp_path):
  """ensemble-eval with NUM_PARTITIONS=4 on 2 processes x 2 devices: the frozen embedding is
  split over devices of both processes (it used to fail fetching it for the bank: "Fetching
  value for `jax.Array` that spans non-addressable devices"). Each label's log-likelihood is
  as close to the float64 run's as the one-process float32 run's (the model-axis all-reduce
  sums in another order across processes), and the answers agree away from near-ties."""
  import json  # pylint: disable=g-import-not-at-top
  from tests.evaluation import test_ensemble  # pylint: disable=g-import-not-at-top
  prompts = {}
  for seed, length in enumerate((4, 6)):
    prompts[f"p{seed}"] = str(tmp_path / f"p{seed}.npy")
    np.save(prompts[f"p{seed}"], (3.0 * np.random.RandomState(seed).randn(
        length, test_ensemble.EMB)).astype(np.float32))
  argv = lambda d, *extra: ["ensemble-eval", f"--gin.MODEL_DIR='{tmp_path / d}'",
                            f"--gin.ENSEMBLE_PROMPTS={prompts!r}", "--gin.NUM_PARTITIONS=4",
                            *test_ensemble.COMMON, *extra]
  for d, extra, env in (("one", (), None),
                        ("one64", ("--gin.prompt_jax.t5_config.dtype='float64'",),
                         {"JAX_ENABLE_X64": "1"})):
    proc = common.cli_subprocess(argv(d, *extra), devices=4, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
  _cli_processes(argv("two"), 2)

  def rows(d):
    with open(tmp_path / d / "ensemble" / f"{test_ensemble.TASK}-validation-predictions.jsonl") as f:
      rows = [json.loads(line) for line in f]
    labels = sorted(rows[0]["label_log_likelihood"]["p0"])
    scores = np.array([[[r["label_log_likelihood"][p][l] for l in labels] for p in prompts]
                       for r in rows])  # [examples, prompts, labels]
    return rows, scores, np.array(labels)

  (one, one32, labels), (_, one64, _), (two, two32, _) = rows("one"), rows("one64"), rows("two")
  numerics.assert_close(two32, one32, one64, what="2 processes' label log-likelihoods")
  ties = numerics.near_ties(one32, one64)
  numerics.assert_same_choices(labels[two32.argmax(-1)], labels[one32.argmax(-1)], ties,
                               what="2 processes' answers")
  assert [r["targets"] for r in two] == [r["targets"] for r in one]


def test_sigterm_to_one_process_stops_both_at_one_checkpoint(tmp_path):
  """Multi-host preemption: SIGTERM reaches one process (as a TPU VM or SLURM may deliver it);
  JAX's preemption service makes both save the same step and stop."""
  d = str(tmp_path / "preempted")
  port = _free_port()
  # Process 1 sends itself SIGTERM after step 3 (common.SIGTERM_AT_STEP), process 0 gets none.
  # JAX's coordination service agrees on the stopping step asynchronously (a fraction of a
  # second, ~100 steps of this tiny model here): TOTAL leaves room for that on any machine.
  total = 3000
  procs = [common.cli_subprocess(
      ["train"] + common.flags(d, total, "--gin.prompt_jax.train.eval_before_training=False",
                               "--gin.CHECKPOINT_PERIOD=100") +
      [f"--coordinator_address=127.0.0.1:{port}", "--process_count=2", f"--process_index={i}"],
      devices=1, wait=False, python_code=common.SIGTERM_AT_STEP.format(step=3) if i else None)
      for i in range(2)]
  try:
    outputs = [p.communicate(timeout=300)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  steps = []
  for p, out in zip(procs, outputs):
    assert p.returncode == 143, out[-3000:]
    line = [l for l in out.splitlines() if "preempted (SIGTERM) at step" in l]
    assert len(line) == 1, out[-3000:]
    steps.append(int(line[0].split("at step ")[1].split(":")[0]))
  assert steps[0] == steps[1] < total
  assert os.listdir(os.path.join(d, "checkpoints")) == [str(steps[0])]


# The minimal experiment: one jitted sum over a batch sharded on 4 devices, as the gradient of a
# replicated parameter is, in 1 process x 4 devices and in 2 processes x 2 devices.
ALL_REDUCE = """
import sys
import numpy as np
processes, index, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
import jax
if processes > 1:
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=processes,
                             process_id=index)
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devices = np.array(jax.devices())
mesh = Mesh(devices, ("data",))
rng = np.random.default_rng(0)
x = (rng.standard_normal((4 * 16, 512)) * np.exp(3 * rng.standard_normal((4 * 16, 1))))
x = x.astype(np.float32)
mine = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
local = np.concatenate([x[16 * i:16 * (i + 1)] for i in mine])
array = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local, x.shape)
total = jax.jit(lambda a: a.sum(0), out_shardings=NamedSharding(mesh, P()))(array)
partial = jax.jit(lambda a: a.reshape(4, 16, -1).sum(1), out_shardings=NamedSharding(mesh, P()))(
    array)  # each device's own sum: no cross-device arithmetic
if jax.process_index() == 0:
  np.save(out, np.stack([np.asarray(total.addressable_data(0)),
                         *np.asarray(partial.addressable_data(0))]))
"""


def test_gloo_all_reduce_sums_in_another_order(tmp_path):
  """Why 2 x 2 is not bitwise 1 x 4: XLA's in-process all-reduce adds the 4 devices' partial
  sums in rank order ((p0 + p1) + p2) + p3; gloo's ring all-reduce across processes adds each
  quarter of the vector in another rotation of the ring, so float32 results differ in the last
  bits. This is why partitioning.broadcast_batch sums a shared prompt's gradient itself (per
  shard, all-gathered, in shard order) instead of leaving it to the all-reduce. Should a later
  JAX make the two orders equal, this test fails: then the workaround can go."""
  single = str(tmp_path / "single.npy")
  proc = common.cli_subprocess(["1", "0", "0", single], devices=4, python_code=ALL_REDUCE)
  assert proc.returncode == 0, proc.stdout[-3000:]
  multi = str(tmp_path / "multi.npy")
  port = str(_free_port())
  procs = [common.cli_subprocess(["2", str(i), port, multi], devices=2, python_code=ALL_REDUCE,
                                 wait=False) for i in range(2)]
  try:
    for p in procs:
      out = p.communicate(timeout=120)[0]
      assert p.returncode == 0, out[-3000:]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  one, two = np.load(single), np.load(multi)
  partial = one[1:]
  assert partial.tobytes() == two[1:].tobytes()  # the same operands on both topologies
  in_rank_order = ((partial[0] + partial[1]) + partial[2]) + partial[3]
  assert one[0].tobytes() == in_rank_order.tobytes()
  assert two[0].tobytes() != one[0].tobytes()
  # gloo's ring: each quarter of the vector is summed around the ring of 4 ranks from its own
  # starting rank (here quarter q from rank q + 3, downwards), never all in rank order.
  quarter = partial.shape[1] // 4
  rings = [[(start + step * i) % 4 for i in range(4)] for start in range(4) for step in (1, -1)]
  for q in range(4):
    part = slice(q * quarter, (q + 1) * quarter)
    sums = {tuple(r): (((partial[r[0]] + partial[r[1]]) + partial[r[2]]) + partial[r[3]])[part]
            for r in rings}
    assert any(two[0][part].tobytes() == v.tobytes() for v in sums.values()), q


KILL_AFTER_EXPORT = """
import os, signal, sys
from prompt_jax import cli
from prompt_jax.train import checkpointing
_export = checkpointing.export_numpy
def export_then_die(model_dir, step, trainable, **kw):
  out = _export(model_dir, step, trainable, **kw)
  if step == {step}:
    os.kill(os.getpid(), signal.SIGKILL)  # killed right after step {step} was saved
  return out
checkpointing.export_numpy = export_then_die
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sigkilled_run_resumes_bitwise(reference, tmp_path):
  d = str(tmp_path / "killed")
  argv = ["train"] + common.flags(d, 5)
  killed = common.cli_subprocess(argv, python_code=KILL_AFTER_EXPORT.format(step=2))
  assert killed.returncode == -9, killed.stdout[-2000:]
  assert not (tmp_path / "killed" / "numpy_checkpoints" / "checkpoint_3").exists()
  resumed = common.cli_subprocess(argv)  # the same command again
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  assert "restored step 2" in resumed.stdout and "training steps 2 -> 5" in resumed.stdout
  assert common.prompt_at(d, 5).tobytes() == common.prompt_at(reference, 5).tobytes()
