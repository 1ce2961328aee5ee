"""`prompt-jax bench train_step` runs both sides and reports ratios (no wall-time assertions)."""
import re

import pytest

pytest.importorskip("torch")

from prompt_jax import bench, cli  # noqa: E402


def test_bench_reports_time_and_memory_ratios(capsys):
  assert cli.main(["bench", "train_step", "--num_layers=1", "--batch=2", "--inputs=16",
                   "--prompt_length=2", "--steps=1"]) == 0
  out = capsys.readouterr().out
  assert re.search(r"prompt_jax \(jit, attention einsum\): +[0-9.]+ s/step, peak RSS \d+ MB",
                   out)
  assert re.search(r"HF torch .*: [0-9.]+ s/step", out)
  assert re.search(r"ratio ours/reference: time [0-9.]+, memory [0-9.]+", out)
  mfu = re.search(r"MFU ([0-9.]+)%: the step's ([0-9.e+-]+) TFLOP .* the ([0-9.e+-]+) TFLOP/s",
                  out)
  assert mfu, out
  # A step of this tiny model does work (XLA counted it), and no more than the machine can do.
  assert float(mfu.group(2)) > 0 and float(mfu.group(3)) > 0 and 0 < float(mfu.group(1)) <= 100
  # The reference's MFU: the same FLOPs in its time, so the two MFUs are in the inverse ratio of
  # the times, within the printed numbers' rounding (half a unit of their last digit each).
  mfus = [float(mfu.group(1)),
          float(re.search(r"reference MFU ([0-9.]+)%: the same matmuls", out).group(1))]
  times = [float(t) for t in re.findall(r"([0-9.]+) s/step", out)[:2]]
  rounding = sum(0.05 / m for m in mfus) + sum(0.0005 / t for t in times)
  assert mfus[1] / mfus[0] == pytest.approx(times[0] / times[1], rel=rounding), out


def test_bench_bfloat16_runs_both_sides_in_bfloat16(capsys):
  """--dtype=bfloat16: our activations and frozen weights, and the whole torch model, in
  bfloat16; the prompt stays float32 (the optimizer updates a float32 prompt on both sides).
  Frozen weights are held as `prompt-jax train` holds them: T5 1.1's output projection, which
  the model uses in float32 (as t5x), in float32."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from prompt_jax import bench, trees  # pylint: disable=g-import-not-at-top
  argv = ["train_step", "--num_layers=1", "--batch=2", "--inputs=16", "--prompt_length=2",
          "--steps=1", "--dtype=bfloat16"]
  args = bench._parser().parse_args(argv)
  config = bench._config(args)
  assert config.dtype == jnp.bfloat16
  model = bench._our_model(args, config)
  trainable, frozen = bench._split(args, bench._our_params(
      model, bench._batch(args, config.vocab_size)))
  dtypes = {path: x.dtype for path, x in trees.flatten(frozen).items()}
  # Each float32 original is freed once cast: the bench's peak is the step's, not f32 + bf16.
  params = bench._our_params(model, bench._batch(args, config.vocab_size))
  originals = trees.flatten(params)
  bench._split(args, params)
  assert {p: x.is_deleted() for p, x in originals.items() if p.startswith("encoder/layers_0/")
          } == {p: True for p in originals if p.startswith("encoder/layers_0/")}
  assert not originals["decoder/logits_dense/kernel"].is_deleted()  # kept in float32
  assert dtypes.pop("decoder/logits_dense/kernel") == jnp.float32
  assert set(dtypes.values()) == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(trainable)} == {jnp.dtype(jnp.float32)}
  hf = bench._hf_model(args)
  assert {p.dtype for p in hf.parameters()} == {torch.bfloat16}
  # T5 1.1 on the torch side too: its own output projection, not the tied (T5 1.0) embedding.
  assert hf.lm_head.weight.data_ptr() != hf.shared.weight.data_ptr()
  assert cli.main(["bench", *argv]) == 0
  out = capsys.readouterr().out
  assert "x 8 targets, bfloat16" in out
  assert re.search(r"ratio ours/reference: time [0-9.]+, memory [0-9.]+", out)
  assert cli.main(["bench", "ensemble", "--dtype=bfloat16"]) == 2
  assert "bench ensemble runs float32 only" in capsys.readouterr().err


@pytest.mark.parametrize("flag,message", [
    ("--preset=t5_1_1_smal", "--preset=t5_1_1_smal is not a T5 preset (one of embedded_tiny, "
                             "t5_1_0_11b, "
                             "t5_1_0_3b, t5_1_0_base, t5_1_0_large, t5_1_0_small, t5_1_1_base, "
                             "t5_1_1_large, t5_1_1_small, t5_1_1_xl, t5_1_1_xxl); did you mean "
                             "t5_1_1_small?"),
    ("--batch=0", "--batch must be >= 1, got 0"),
    ("--inputs=-1", "--inputs must be >= 1, got -1"),
    ("--steps=0", "--steps must be >= 1, got 0"),
    ("--num_layers=0", "--num_layers must be >= 1, got 0"),
    # a step with no prompt trains nothing: it printed MFU 149% (no backward pass at all)
    ("--prompt_length=0", "--prompt_length must be >= 1, got 0"),
    # --record / --profile were found unusable only after the measuring
    ("--record=/", "--record / is a directory: name the markdown file to append to"),
    ("--record=/no/such/dir/bench.md", "--record /no/such/dir/bench.md: directory /no/such/dir "
                                       "does not exist; create it first"),
    (f"--profile={__file__}", f"--profile {__file__} is a file: name a directory for the "
                              f"trace"),
    # XLA's own fatal log line, exit 1, once the bench had started printing
    ("--xla_flags=--xla_cpu_no_such_flag=true", "--xla_flags: XLA has no flag "
                                                "--xla_cpu_no_such_flag=true (this jaxlib's"),
    ("--xla_flags=--xla_cpu_enable_fast_math=maybe", "--xla_flags: maybe is not a value of "
                                                     "--xla_cpu_enable_fast_math (")])
def test_bench_refuses_a_shape_no_side_can_run_before_either_starts(flag, message, capsys):
  """An unknown preset or a batch of 0 was found inside a side (exit 1; --batch=0 after our
  side had run for half a minute): one line, exit 2, nothing measured."""
  assert cli.main(["bench", "train_step", flag]) == 2
  captured = capsys.readouterr()
  assert captured.out == "" and captured.err.startswith(f"prompt-jax bench: error: {message}")
  assert len(captured.err.splitlines()) == 1


def test_bench_records_and_reports_a_rejected_flag(tmp_path, capsys, monkeypatch):
  """--record appends the command line and the printed lines; a flag set XLA rejects is reported
  as not run instead of stopping the sweep."""
  from prompt_jax import bench  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(bench, "CPU_FLAG_SETS", (("default", ""),
                                               ("bogus", "--xla_cpu_no_such_flag=true")))
  # The environment that changes figures is recorded before the command (it was left out).
  monkeypatch.setenv("PROMPT_JAX_CPU_BFLOAT16_PRODUCTS", "plain")
  monkeypatch.setenv("PROMPT_JAX_SPM_PATH", "/x/spiece.model")  # changes no figure: left out
  record = tmp_path / "bench.md"
  record.write_text("# earlier\n")
  argv = ["bench", "train_step", "--num_layers=1", "--batch=2", "--inputs=16",
          "--prompt_length=2", "--steps=1", "--reference=none", "--flag_sweep",
          f"--record={record}"]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  assert re.search(r"bogus +--xla_cpu_no_such_flag=true: not run", out)
  # The allocators not run yet are swept too (PROMPT_JAX_MALLOC=glibc needs no library).
  assert re.search(r"glibc malloc +PROMPT_JAX_MALLOC=glibc: [0-9.]+ s/step", out), out
  text = record.read_text()
  assert text.startswith("# earlier\n")  # appended, nothing earlier changed
  header = [line for line in text.splitlines() if line.startswith("### `")]
  assert len(header) == 1 and header[0].endswith(f" prompt-jax {' '.join(argv)}`"), header
  assert "PROMPT_JAX_CPU_BFLOAT16_PRODUCTS=plain " in header[0]
  assert "PROMPT_JAX_SPM_PATH" not in header[0]
  assert "xla_cpu_enable_concurrency_optimized_scheduler" not in header[0]  # our default
  assert "jax 0." in text
  assert re.search(r"prompt_jax \(jit, attention einsum\): +[0-9.]+ s/step", text)
  assert "not run" in text


def test_bench_train_step_against_the_peft_library(capsys):
  pytest.importorskip("peft")
  assert cli.main(["bench", "train_step", "--num_layers=1", "--batch=2", "--inputs=16",
                   "--prompt_length=2", "--steps=1", "--reference=peft"]) == 0
  out = capsys.readouterr().out
  assert re.search(r"HF PEFT [0-9.]+ \(prompt tuning\): [0-9.]+ s/step, peak RSS \d+ MB", out)
  assert re.search(r"ratio ours/reference: time [0-9.]+, memory [0-9.]+", out)


def _rte_argv(what, shared_data, *extra):
  shared_data("super_glue", "RTE")  # skips without ../shared/data
  data_dir = shared_data()
  return ["bench", what, f"--data_dir={data_dir}", f"--vocab={data_dir / 't5_spm' / 'spiece.model'}",
          "--num_layers=1", "--batch=4", "--max_steps=3", "--prompt_length=4", "--inputs=256",
          "--targets=8", *extra]


def test_bench_epoch_on_real_rte_trains_both_sides_on_the_same_rows(shared_data, capsys):
  """Both sides read the same 3 batches of real RTE: the same real tokens; PEFT pads each batch
  to its longest row, ours to the smallest of 4 buckets holding it (so at least as many
  positions, and fewer than padding to --inputs)."""
  pytest.importorskip("peft")
  assert cli.main(_rte_argv("epoch", shared_data)) == 0
  out = capsys.readouterr().out
  pattern = r"real tokens (\d+) of (\d+) processed \(share [0-9.]+\)"
  ours = re.search(r"prompt_jax \(jit, 4 length buckets\): 3 steps in ([0-9.]+) s \(of which "
                   r"([0-9.]+) s compiling ([1-3]) programs, once per run; the steps alone "
                   r"([0-9.]+) s, each program's first step [+-][0-9.]+ s in all against the "
                   r"later steps of its shape\), " + pattern, out)
  peft = re.search(r"HF PEFT .*dynamic padding\): 3 steps in [0-9.]+ s, " + pattern, out)
  assert ours and peft, out
  total, compiling, alone = (float(ours.group(i)) for i in (1, 2, 4))
  # Compiling is timed apart from the steps (each figure rounded to 0.1 s).
  assert compiling > 0 and alone > 0 and abs(total - compiling - alone) <= 0.15, out
  real, processed = int(ours.group(5)), int(ours.group(6))
  assert real == int(peft.group(1)) > 0
  assert int(peft.group(2)) <= processed < 3 * 4 * (256 + 8)
  ratio = re.search(r"ratio ours/reference: time [0-9.]+ \(speed ([0-9.]+)x\), memory [0-9.]+; "
                    r"our steps alone \(each further epoch of a run, its programs compiled\): "
                    r"speed ([0-9.]+)x", out)
  assert ratio and float(ratio.group(2)) > float(ratio.group(1)), out


def test_bench_epoch_grouped_by_length_processes_fewer_positions(shared_data, capsys):
  """--group=3 over 3 steps: one window, so the same rows as ungrouped, sorted before they are
  batched and cut to buckets: fewer processed positions for the same real tokens."""
  counts = {}
  for group in (0, 3):
    assert cli.main(_rte_argv("epoch", shared_data, f"--group={group}", "--reference=none")) == 0
    out = capsys.readouterr().out
    how = "4 length buckets" + (", grouped by length in windows of 3 batches" if group else "")
    found = re.search(re.escape(f"prompt_jax (jit, {how}): 3 steps") +
                      r".* real tokens (\d+) of (\d+) processed", out)
    assert found, out
    counts[group] = int(found.group(1)), int(found.group(2))
  assert counts[3][0] == counts[0][0] and counts[3][1] < counts[0][1], counts
  assert cli.main(_rte_argv("epoch", shared_data, "--buckets=0", "--group=2")) == 2
  err = capsys.readouterr().err
  assert "--group=2: pass a number of batches >= 0, and --buckets > 0" in err
  assert len(err.strip().splitlines()) == 1, err


def test_bench_eval_on_real_rte(shared_data, capsys):
  pytest.importorskip("peft")
  assert cli.main(_rte_argv("eval", shared_data)) == 0
  out = capsys.readouterr().out
  assert re.search(r"prompt_jax rank classification \(2 labels, 4 length buckets\): 12 examples "
                   r"in [0-9.]+ s", out), out
  assert re.search(r"prompt_jax greedy decoding .*: 12 examples in [0-9.]+ s", out)
  assert re.search(r"HF PEFT .* generate .*: 12 examples in [0-9.]+ s", out)
  assert re.search(r"speed vs PEFT generate: rank classification [0-9.]+x, greedy [0-9.]+x", out)


@pytest.mark.parametrize("argv, message", [
    (["bench", "epoch"], "bench epoch reads the official RTE files: pass --data_dir=DIR"),
    (["bench", "eval", "--data_dir=/nonexistent"], "/nonexistent/super_glue/RTE/train.jsonl is "
                                                   "missing"),
    (["bench", "epoch", "--data_dir=/x", "--reference=torch"],
     "bench epoch compares with the peft library: use --reference=peft"),
])
def test_bench_rte_bad_inputs_are_one_line_errors(argv, message, capsys):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_bench_remat_counts_only_useful_flops_in_mfu(capsys):
  """--remat=full: our side recomputes the forward pass in the backward; MFU counts the FLOPs of
  the step without remat, and the line says how many the remat program ran (more)."""
  assert cli.main(["bench", "train_step", "--num_layers=1", "--batch=2", "--inputs=16",
                   "--prompt_length=2", "--steps=1", "--remat=full", "--reference=none"]) == 0
  out = capsys.readouterr().out
  assert "float32, our side with remat 'full'" in out
  number = r"([0-9.]+(?:e[+-]?\d+)?)"
  m = re.search(rf"the step's {number} TFLOP \(its matmuls without remat\)"
                rf".*with the recomputation {number} TFLOP run", out)
  assert m, out
  assert float(m.group(2)) > float(m.group(1)) > 0


@pytest.mark.parametrize("flags, form", [
    ([], "attention einsum"),  # 'auto' off GPU
    (["--attention=xla"], "attention xla, padding as lengths"),
    (["--attention=xla", "--padding_as_lengths=false"],
     "attention xla, padding as a [batch, heads, T, T] bias"),
])
def test_bench_says_which_attention_form_our_side_ran(flags, form, capsys):
  """--attention / --padding_as_lengths reach our side's model (the side reports the encoder's
  kernel and padding form from the config it built), and the first line names them."""
  assert cli.main(["bench", "train_step", "--num_layers=1", "--batch=2", "--inputs=16",
                   "--prompt_length=2", "--steps=1", "--reference=none"] + flags) == 0
  out = capsys.readouterr().out
  assert f"prompt_jax (jit, {form}):" in out, out
  assert ("our side with attention 'xla'" in out) == ("--attention=xla" in flags)


_ABSENT = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "seqio", "clu",
           "importlib_resources")
# Makes the packages above look uninstalled in a child process (the accelerator image has none
# of them; gin-config travels as a wheel): importing one raises ModuleNotFoundError and
# importlib.util.find_spec, which transformers probes, returns None.
_SITECUSTOMIZE = f'''
import importlib.util, sys
ABSENT = {_ABSENT!r}
class _Absent:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ABSENT:
      raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Absent())
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if name.split(".")[0] in ABSENT else _find_spec(name, package))
'''


def test_bench_and_plan_run_without_tensorflow_or_seqio(tmp_path):
  """Issue 11: the GPU machines' image has no TensorFlow, seqio, TFDS or clu. `bench
  train_step` (both sides), `bench startup`, `bench attention` and `plan` run there: a
  module-level `import seqio` or `import tensorflow` anywhere on their path (vocab.py had one),
  or clu's writers on the way to the startup timer, fails this."""
  import os  # pylint: disable=g-import-not-at-top
  from tests.train.common import cli_subprocess  # pylint: disable=g-import-not-at-top
  (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
  env = {"PYTHONPATH": os.pathsep.join(
      [str(tmp_path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
  probe = cli_subprocess([], python_code="import seqio", env=env)
  assert probe.returncode != 0 and "No module named 'seqio'" in probe.stdout, probe.stdout
  for argv in (["bench", "train_step", "--num_layers=1", "--batch=2", "--inputs=16",
                "--prompt_length=2", "--steps=1"],
               ["bench", "startup", "--num_layers=1", "--batch=2", "--inputs=16",
                "--targets=4", "--prompt_length=2"],
               ["bench", "attention", "--batch=2", "--inputs=16", "--prompt_length=2",
                "--steps=1"],
               ["plan", "--model=models/t5_1_1_small.gin", "--mesh=1x1", "--batch=2",
                "--inputs=16", "--targets=4"]):
    run = cli_subprocess(argv, timeout=600, env=env)
    assert run.returncode == 0, (argv, run.stdout[-4000:])
    expected = {"train_step": "ratio ours/reference", "startup": "ratio restart/first start",
                "attention": "xla ", "--model=models/t5_1_1_small.gin": "per-device peak"}
    assert expected[argv[1]] in run.stdout, run.stdout[-4000:]


def test_matmul_flops_through_scan_remat_and_cond():
  """bench.matmul_flops (the MFU numerator): 2 x output x contracted per product, a scan's body
  times its length, a remat'd function's recomputation in the backward pass, a cond's costliest
  branch, batch dimensions counted once."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  x, w = jnp.ones((4, 8)), jnp.ones((8, 8))
  one = 2 * 4 * 8 * 8  # x @ w

  def scanned(x):
    return jax.lax.scan(lambda c, _: (c @ w, None), x, None, length=3)[0]

  assert bench.matmul_flops(jax.make_jaxpr(scanned)(x)) == 3 * one
  # Forward, then in the backward the recomputed forward and dx (w is not differentiated).
  remat = jax.grad(lambda x: jnp.sum(jax.checkpoint(lambda x: jnp.tanh(x @ w))(x)))
  assert bench.matmul_flops(jax.make_jaxpr(remat)(x)) == 3 * one
  cond = lambda p, x: jax.lax.cond(p, lambda x: (x @ w) @ w, lambda x: x @ w, x)
  assert bench.matmul_flops(jax.make_jaxpr(cond)(True, x)) == 2 * one
  batched = jnp.ones((5, 4, 8))
  assert bench.matmul_flops(jax.make_jaxpr(lambda b: jnp.einsum("bij,bjk->bik", b, b.transpose(
      0, 2, 1)))(batched)) == 2 * 5 * 4 * 4 * 8


def test_memory_ratio_is_the_accelerators_where_both_sides_ran_on_one():
  """On a GPU the sides' host RSS is mostly their libraries' (an H100 run: ours 3523 MB RSS
  with 5555 MB on the device, PEFT 2076 MB with 17879 MB): the ratio compares device peaks."""
  gpu_ours = {"peak_rss_mb": 3523.0, "peak_device_mb": 5555.0}
  gpu_peft = {"peak_rss_mb": 2076.0, "peak_device_mb": 17879.0}
  assert bench._memory_ratio(gpu_ours, gpu_peft) == "device memory 0.31"
  cpu_ours, cpu_torch = {"peak_rss_mb": 1000.0}, {"peak_rss_mb": 2000.0}
  assert bench._memory_ratio(cpu_ours, cpu_torch) == "memory 0.50"


# A side that reports progress, then waits (up to 60 s) until the bench has shown it: only a
# runner that relays progress while the side runs lets it finish with its result.
_WAITING_SIDE = r'''
import json, os, sys, time
print("BENCH_PROGRESS epoch: 1/2 steps (50%) 0.5 steps/s ETA 00:00:02", flush=True)
sys.stderr.write("x" * 1_000_000 + "\n")  # more than a pipe holds: stderr must be drained
for _ in range(600):
  if os.path.exists(sys.argv[1]):
    print("BENCH_RESULT " + json.dumps({"seconds": 1.0}), flush=True)
    sys.exit(0)
  time.sleep(0.1)
sys.exit(3)
'''


def test_a_sides_progress_is_shown_while_it_runs(tmp_path):
  import sys  # pylint: disable=g-import-not-at-top
  shown = tmp_path / "shown"
  reports = []

  def report(text):
    reports.append(text)
    shown.write_text(text)

  code, results, errors = bench.stream_side(
      [sys.executable, "-c", _WAITING_SIDE, str(shown)], {}, report)
  assert (code, results) == (0, ['{"seconds": 1.0}']), errors[-300:]
  assert reports == ["epoch: 1/2 steps (50%) 0.5 steps/s ETA 00:00:02"]
  assert len(errors) == 1_000_001


def test_side_meter_lines_reach_the_bench_marked(capsys):
  meter = bench.side_meter("epoch", 4, period_s=0.0)
  meter.update(1)
  meter.update(4)  # done: the bench's own result line follows, no progress line
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 1, out
  assert re.fullmatch(re.escape(bench.PROGRESS) + r"epoch: 1/4 steps \(25%\) [0-9.]+ steps/s "
                      r"ETA \d\d:\d\d:\d\d", out[0]), out


def test_progress_goes_to_stderr_and_not_into_the_record(tmp_path, monkeypatch, capsys):
  """The figures are printed and recorded; a side's progress only shows on stderr, labelled
  with its side, and a failed side's last stderr line is the one-line error."""
  def fake_side(cmd, env, report):
    del env
    report("timed steps: 1/3 steps (33%) 0.5 steps/s ETA 00:00:04")
    return 0, ['{"seconds_per_step": 2.0, "peak_rss_mb": 100.0, "flops_per_step": 1.0, '
               '"matmul_peak_flops": 1.0, "attention": "einsum"}'], ""

  monkeypatch.setattr(bench, "stream_side", fake_side)
  record = tmp_path / "record.md"
  assert bench.main(["train_step", "--reference=torch", f"--record={record}"]) == 0
  captured = capsys.readouterr()
  progress = "timed steps: 1/3 steps (33%) 0.5 steps/s ETA 00:00:04"
  assert f"  (ours) {progress}" in captured.err and f"  (torch) {progress}" in captured.err
  assert progress not in captured.out and progress not in record.read_text()
  assert "ratio ours/reference: time 1.00" in record.read_text()
  monkeypatch.setattr(bench, "stream_side",
                      lambda cmd, env, report: (1, [], "a traceback\nValueError: no\n"))
  assert bench.main(["train_step", "--reference=torch"]) == 1
  assert capsys.readouterr().err == ("prompt-jax bench: error: the ours side of the benchmark "
                                     "failed: ValueError: no\n")


def test_an_interrupted_bench_leaves_no_side_running():
  """A failure while a side runs (here in the progress report; Ctrl-C alike) kills the side."""
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  side = ("import os, time; print('BENCH_PROGRESS', os.getpid(), flush=True); time.sleep(600)")
  pids = []

  def report(text):
    pids.append(int(text))
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    bench.stream_side([sys.executable, "-c", side], {}, report)
  with pytest.raises(ProcessLookupError):  # killed and reaped
    os.kill(pids[0], 0)
