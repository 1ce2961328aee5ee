"""`prompt-jax bench attention` (issue 11): every attention kernel against a float64 einsum
computation on the bench's device, reported beside the einsum path's own error."""
import re

from prompt_jax import cli


def test_fused_kernel_errors_are_those_of_the_reference_path(capsys):
  """On CPU the kernels are 'einsum', 'chunked', 'xla' (jax.nn's) and 'xla+lengths' (jax.nn's
  given the padding as sequence lengths). All compute the same float32 math, so each kernel's
  errors against float64 stay within a few times the einsum path's own (measured 0.6-1.0x;
  'chunked' up to 2.5x at 8 x 612, its products summing in another order): a bias the kernel
  dropped, or padded query rows in the comparison (-1e10 swamps the relative-position bias in
  float32), would put them orders above."""
  assert cli.main(["bench", "attention", "--batch=4", "--inputs=40", "--prompt_length=5",
                   "--steps=1"]) == 0
  out = capsys.readouterr().out
  assert "attention: t5_1_1_small, batch 4 x 40 inputs (+5 prompt), float32" in out
  rows = {}
  for kernel, rest in re.findall(r"^  (einsum|chunked|xla|xla\+lengths) +(out .*)$", out, re.M):
    errors = dict(re.findall(r"(out|dq|dk|dv) ([0-9.e+-]+) \(x", rest))
    ratios = dict(re.findall(r"(out|dq|dk|dv) [0-9.e+-]+ \(x([0-9.]+)\)", rest))
    assert re.search(r"forward [0-9.]+ ms, forward\+backward [0-9.]+ ms", rest), rest
    rows[kernel] = ({k: float(v) for k, v in errors.items()},
                    {k: float(v) for k, v in ratios.items()})
  assert set(rows) == {"einsum", "chunked", "xla", "xla+lengths"}, out
  einsum_errors, einsum_ratios = rows["einsum"]
  assert set(einsum_ratios.values()) == {1.0}
  # float32 against float64: the reference path does round (an error of 0 would mean the
  # "float64" side ran in float32 too), and by float32-sized amounts.
  assert all(0 < e < 1e-3 for e in einsum_errors.values()), einsum_errors
  for kernel in ("chunked", "xla", "xla+lengths"):  # chunks; the padding in the bias, or lengths
    _, ratios = rows[kernel]
    assert all(r <= 4.0 for r in ratios.values()), (kernel, ratios)


def test_a_reference_is_a_one_line_error(capsys):
  assert cli.main(["bench", "attention", "--reference=torch"]) == 2
  err = capsys.readouterr().err
  assert "bench attention has no library reference" in err and len(err.strip().splitlines()) == 1


def test_a_kernel_that_fails_is_reported_and_the_others_run(monkeypatch):
  """A kernel the device or jax version rejects (cuDNN with some bias shape, say) costs its own
  row only: the GPU run that measures it must not lose the others."""
  from prompt_jax import bench, bench_attention  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(bench_attention, "kernels", lambda dtype: ["einsum", "bogus", "xla"])
  args = bench._parser().parse_args(["attention", "--batch=4", "--inputs=16",
                                     "--prompt_length=2", "--steps=1"])
  lines = []
  bench_attention.report(args, bench_attention.measure(args, bench._config(args)), lines.append)
  assert re.search(r"^  bogus +not run: ValueError: attention_implementation must be one of",
                   lines[2]), lines
  assert lines[1].startswith("  einsum ") and lines[3].startswith("  xla "), lines
