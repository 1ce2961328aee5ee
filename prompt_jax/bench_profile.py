"""Where a step's device time goes: the kernels of a `jax.profiler` trace, summed per kernel.

`prompt-jax bench train_step --profile=DIR` traces two of our steps after the timed ones (on a
GPU: every kernel the step launched, with its device time); then, on any machine with
TensorFlow (whose `tsl` protos read the trace; the accelerator images here have none):

  python -m prompt_jax.bench_profile DIR [--top=40]

prints, per kernel name, the device milliseconds per step, the share of the device's busy time
and the launches per step, and for a kernel XLA generated, the result type of its instruction in
the step's compiled program (`step.hlo.txt`, which the bench writes beside the trace) and where
in the model it comes from; the span between the first kernel's start and the last one's end
says how busy the device was. Then the kernels' time summed by where they come from: the Flax
module path in the instruction's `op_name` metadata (layer numbers folded:
`encoder/layers_*/pre_mlp_layer_norm`) and the pass (`transpose(...)` in the name: backward),
e.g. how much of the step the layer norms' backward takes. Kernels the program does not name
(cuBLAS's, cuDNN's) are not in that table. On a CPU the trace holds host threads only: no
kernels to sum. TensorBoard's profile plugin (xprof) reads the same directory for the full
picture.
"""
import argparse
import collections
import glob
import os
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

HLO_FILE = "step.hlo.txt"
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?) [\w\-]+\(", re.M)
_OP_NAME = re.compile(r'metadata=\{[^}]*?op_name="([^"]*)"')
_MODULE = re.compile(r"^[a-z_][\w]*$")  # a Flax module's name (not 'T5.encode', 'jit(_take)')


def _xplane_pb2():
  for name in ("tsl.profiler.protobuf.xplane_pb2",
               "tensorflow.tsl.profiler.protobuf.xplane_pb2"):
    try:
      return __import__(name, fromlist=["XSpace"])
    except ImportError:
      continue
  raise ImportError("reading a trace needs TensorFlow (its tsl profiler protos): "
                    "pip install tensorflow, or open DIR with TensorBoard's profile plugin")


def newest_trace(directory: str) -> str:
  """The newest *.xplane.pb under `directory` (jax.profiler writes one per trace)."""
  found = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)
  if not found:
    raise FileNotFoundError(f"no *.xplane.pb under {directory}: is it a jax.profiler trace "
                            f"directory (bench train_step --profile=DIR)?")
  return max(found, key=os.path.getmtime)


def result_types(hlo_text: str) -> Dict[str, str]:
  """Instruction name -> its result type, from a compiled program's text; names also as the
  trace spells XLA's kernels ('.' as '_': `loop_convert_fusion.23` runs as
  `loop_convert_fusion_23`)."""
  return {name: result for name, (result, _) in instructions(hlo_text).items()}


def instructions(hlo_text: str) -> Dict[str, Tuple[str, str]]:
  """Instruction name -> (result type, `where` of its op_name metadata; '' without), names also
  as the trace spells XLA's kernels (see `result_types`)."""
  found = {}
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    op_name = _OP_NAME.search(line)
    info = (m.group(2), where(op_name.group(1)) if op_name else "")
    found[m.group(1)] = found[m.group(1).replace(".", "_")] = info
  return found


def where(op_name: str) -> str:
  """Where an instruction comes from, from its op_name metadata: the Flax module path with the
  layer numbers folded, and the pass. 'jit(step)/transpose(jvp(T5))/T5.encode/encoder/layers_3/
  pre_mlp_layer_norm/mul' -> 'encoder/layers_*/pre_mlp_layer_norm (backward)'; an operation
  outside the model (the loss, the optimizer) -> '(step) (forward)' etc."""
  parts = op_name.split("/")
  modules = [re.sub(r"^layers_\d+$", "layers_*", p) for p in parts[1:-1] if _MODULE.match(p)]
  backward = any(p.startswith("transpose(") for p in parts)
  return f"{'/'.join(modules) or '(step)'} ({'backward' if backward else 'forward'})"


def summarise(space, steps: int, top: int = 40,
              types: Optional[Dict[str, Tuple[str, str]]] = None) -> List[str]:
  """Lines: each device plane's kernels (events of its stream lines), summed per kernel name,
  in ms per step (of `steps` traced), busiest first; with `types` (`instructions`), an XLA
  kernel's result type and where it comes from after its name, then the kernels' time summed
  by where they come from (the `top` largest)."""
  types = types or {}
  lines = []
  for plane in space.planes:
    if not plane.name.startswith("/device:"):
      continue
    names = {key: meta.name for key, meta in plane.event_metadata.items()}
    total, count = collections.Counter(), collections.Counter()
    first, last = None, None
    for line in plane.lines:
      for event in line.events:
        start = line.timestamp_ns * 1000 + event.offset_ps  # picoseconds
        first = start if first is None else min(first, start)
        last = max(last or 0, start + event.duration_ps)
        name = names.get(event.metadata_id, "?")
        total[name] += event.duration_ps
        count[name] += 1
    if not total:
      continue
    busy = sum(total.values())
    lines.append(f"{plane.name}: {busy / steps / 1e9:.2f} ms of kernels per step over a span of "
                 f"{(last - first) / steps / 1e9:.2f} ms per step ({steps} steps traced; "
                 f"{busy / (last - first):.0%} busy)")
    for name, ps in total.most_common(top):
      launches = f"x{count[name] / steps:g}"
      result = (f"  -> {types[name][0][:80]}  [{types[name][1]}]" if name in types else "")
      lines.append(f"  {ps / steps / 1e9:8.3f} ms/step {ps / busy:6.1%} {launches:>7s}  "
                   f"{name[:100]}{result}")
    by_where = collections.Counter()
    for name, ps in total.items():
      if types.get(name, ("", ""))[1]:
        by_where[types[name][1]] += ps
    if by_where:
      named = sum(by_where.values())
      lines.append(f"  by where in the model ({named / steps / 1e9:.2f} ms/step of kernels the "
                   f"program names, from op_name metadata; layer numbers folded):")
      for place, ps in by_where.most_common(top):
        lines.append(f"  {ps / steps / 1e9:8.3f} ms/step {ps / busy:6.1%}  {place}")
  if not lines:
    lines.append("no device kernels in this trace (a CPU trace holds host threads only)")
  return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(prog="python -m prompt_jax.bench_profile", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("directory", help="the --profile=DIR of bench train_step")
  p.add_argument("--steps", type=int, default=2, help="steps in the trace (bench traces 2)")
  p.add_argument("--top", type=int, default=40, help="kernels to list per device")
  args = p.parse_args(argv)
  try:
    xplane_pb2 = _xplane_pb2()
    path = newest_trace(args.directory)
  except (ImportError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  space = xplane_pb2.XSpace()
  with open(path, "rb") as f:
    space.ParseFromString(f.read())
  hlo = os.path.join(args.directory, HLO_FILE)
  types = None
  if os.path.exists(hlo):
    with open(hlo) as f:
      types = instructions(f.read())
  print(f"trace: {path}{f' (instructions: {hlo})' if types else ''}")
  for line in summarise(space, args.steps, args.top, types):
    print(line)
  return 0


if __name__ == "__main__":
  sys.exit(main())
