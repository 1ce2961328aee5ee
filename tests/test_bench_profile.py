"""`bench train_step --profile=DIR` and `python -m prompt_jax.bench_profile DIR`: a trace of our
step and its kernels summed per name (how the H200 profile of T5 1.1 base was read,
docs/benchmarks.md)."""
import re

import pytest

from prompt_jax import bench_profile, cli


def _space(xplane_pb2):
  """A device plane with two streams: kernel 'a' 3 + 1 ms, 'b' 2 ms, over a 10 ms span; and a
  host plane, which is not summed."""
  space = xplane_pb2.XSpace()
  host = space.planes.add(name="/host:CPU")
  host.event_metadata[1].name = "python"
  host.lines.add(name="python").events.add(metadata_id=1, offset_ps=0, duration_ps=10**12)
  plane = space.planes.add(name="/device:GPU:0")
  plane.event_metadata[1].name = "a"
  plane.event_metadata[2].name = "b"
  ms = 10**9  # picoseconds
  one = plane.lines.add(name="Stream #1", timestamp_ns=1000)
  one.events.add(metadata_id=1, offset_ps=0, duration_ps=3 * ms)
  one.events.add(metadata_id=2, offset_ps=4 * ms, duration_ps=2 * ms)
  two = plane.lines.add(name="Stream #2", timestamp_ns=1000 + 9 * 10**6)  # starts 9 ms later
  two.events.add(metadata_id=1, offset_ps=0, duration_ps=1 * ms)
  return space


def test_kernels_are_summed_per_name_and_step():
  xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
  lines = bench_profile.summarise(_space(xplane_pb2), steps=2,
                                  types={"a": ("bf16[8,4]{1,0}", "")})
  assert lines[0] == ("/device:GPU:0: 3.00 ms of kernels per step over a span of 5.00 ms per "
                      "step (2 steps traced; 60% busy)")
  assert re.fullmatch(r" +2\.000 ms/step +66\.7% +x1 +a  -> bf16\[8,4\]\{1,0\}  \[\]",
                      lines[1]), lines[1]
  assert re.fullmatch(r" +1\.000 ms/step +33\.3% +x0\.5 +b", lines[2]), lines[2]
  assert len(lines) == 3  # the host plane is not summed; nothing named: no table by where


def test_kernels_are_summed_by_where_in_the_model():
  """Two kernels from the same module and pass (different layers) add up; a kernel the program
  does not name (cuBLAS's 'b' here) stays out of the table."""
  xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
  space = _space(xplane_pb2)
  plane = space.planes[1]
  plane.event_metadata[3].name = "loop_add_fusion_2"
  plane.lines[0].events.add(metadata_id=3, offset_ps=7 * 10**9, duration_ps=2 * 10**9)
  hlo = "\n".join([
      '  %a = bf16[8,4]{1,0} fusion(%p), kind=kLoop, calls=%c, metadata={op_name='
      '"jit(step)/transpose(jvp(T5))/T5.encode/encoder/layers_0/pre_mlp_layer_norm/mul" '
      'stack_frame_id=3}',
      '  ROOT %loop_add_fusion.2 = bf16[8,4]{1,0} fusion(%q), kind=kLoop, calls=%d, '
      'metadata={op_name="jit(step)/transpose(jvp(T5))/T5.encode/encoder/layers_11/'
      'pre_mlp_layer_norm/add_any"}'])
  types = bench_profile.instructions(hlo)
  assert types["loop_add_fusion_2"] == types["loop_add_fusion.2"]
  lines = bench_profile.summarise(space, steps=2, types=types)
  table = lines[lines.index(next(l for l in lines if "by where" in l)):]
  assert "3.00 ms/step of kernels the program names" in table[0], table
  assert re.fullmatch(r" +3\.000 ms/step +75\.0%  encoder/layers_\*/pre_mlp_layer_norm "
                      r"\(backward\)", table[1]), table
  assert len(table) == 2


def test_where_reads_flax_module_paths_and_the_pass():
  where = bench_profile.where
  assert where("jit(step)/jvp(T5)/T5.decode/decoder/layers_0/self_attention/"
               "bqhd,bkhd->bhqk/dot_general") == "decoder/layers_*/self_attention (forward)"
  assert where("jit(step)/transpose(jvp(T5))/T5.encode/encoder/encoder.self_attention_bias/"
               "relpos_bias/jit(_take)/gather") == "encoder/relpos_bias (backward)"
  assert where("jit(step)/jvp()/reduce_sum") == "(step) (forward)"


def test_result_types_name_instructions_as_the_trace_spells_kernels():
  """XLA names an instruction `name.N` and its kernel `name_N`: both find the result type."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  text = jax.jit(lambda x: jnp.sin(x).astype(jnp.bfloat16)).lower(
      jnp.ones((3, 5), jnp.float32)).compile().as_text()
  types = bench_profile.result_types(text)
  converts = {n: t for n, t in types.items() if "convert" in n}
  assert converts and all(t.startswith(("bf16[3,5]", "f32[3,5]")) for t in converts.values())
  dotted = [n for n in types if "." in n]
  assert dotted and all(types[n.replace(".", "_")] == types[n] for n in dotted)


def test_bench_writes_a_trace_the_summary_reads(tmp_path, capsys):
  pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
  trace = tmp_path / "trace"
  assert cli.main(["bench", "train_step", "--num_layers=1", "--batch=2", "--inputs=16",
                   "--prompt_length=2", "--steps=1", "--reference=none",
                   f"--profile={trace}"]) == 0
  assert f"a trace of two of our steps: {trace}" in capsys.readouterr().out
  hlo = (trace / bench_profile.HLO_FILE).read_text()
  assert "fusion" in hlo  # the step's program
  # jax's op_name metadata as this jax writes it: the step's instructions are placed by module
  # and pass (the prompt's gradient flows back through every encoder layer's MLP).
  places = {w for _, w in bench_profile.instructions(hlo).values()}
  for place in ("encoder/layers_*/pre_mlp_layer_norm (forward)",
                "encoder/layers_*/mlp (backward)", "decoder/layers_*/self_attention (forward)"):
    assert place in places, sorted(places)
  assert bench_profile.main([str(trace)]) == 0
  out = capsys.readouterr().out
  assert re.search(r"trace: .*\.xplane\.pb \(instructions: .*step\.hlo\.txt\)", out)
  assert "no device kernels in this trace" in out  # this CPU: host threads only


def test_a_directory_without_a_trace_is_one_line_error(tmp_path, capsys):
  pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
  assert bench_profile.main([str(tmp_path)]) == 1
  err = capsys.readouterr().err
  assert err.startswith("error: no *.xplane.pb under") and err.count("\n") == 1
