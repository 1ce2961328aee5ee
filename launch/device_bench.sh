#!/usr/bin/env bash
# Issue 11's accelerator figures in one call of the device tool (one H100/H200, 15 device-minutes a
# session, at most 10 minutes a call): its image has jax, flax, optax, orbax, torch, transformers
# and peft, but no TensorFlow, seqio, clu or gin-config, so gin-config travels as a wheel.
#
#   here, once:   pip download --no-deps -d .whl gin-config && echo /.whl/ >> .git/info/exclude
#   device call:  carry [".whl"], timeout_s 600, command: OUT=$OUT bash launch/device_bench.sh
#   then:         copy $OUT/bench.md's blocks into docs/benchmarks.md
#
# Each bench has its own time limit (together under 9 minutes) so a slow one still leaves the
# others' figures in $OUT/bench.md. SMOKE=1: tiny shapes, to check the script on a CPU.
set -uo pipefail
out=${OUT:-/tmp/device_bench}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import gin" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gin_site .whl/*.whl \
    || { echo "gin-config is missing: carry .whl (see the top of this script)"; exit 2; }
  export PYTHONPATH=/tmp/gin_site:$PYTHONPATH
fi
record=$out/bench.md
bench() {  # bench SECONDS WHAT ARGS...: one bench, recorded; a failure or time-out is reported
  local limit=$1; shift
  echo "== prompt-jax bench $* (limit ${limit} s)"
  timeout "$limit" python3 -m prompt_jax bench "$@" --record="$record" || echo "== exit $?"
}
python3 -c "import jax; print('devices:', jax.devices())"
if [ -n "${SMOKE:-}" ]; then
  tiny=(--num_layers=1 --batch=2 --inputs=16 --targets=4 --prompt_length=2 --steps=1)
  bench 300 attention "${tiny[@]}"
  bench 300 train_step "${tiny[@]}" --reference=none
  bench 300 startup "${tiny[@]}"
  echo "results: $record"
  exit 0
fi
# The fused kernel against the einsum path at the base shape (acceptance 2, on a GPU).
bench 60 attention --preset=t5_1_1_base --batch=32 --inputs=512 --dtype=bfloat16
# The first table row: base, batch 32 x (512 + 100), 8 targets, bfloat16, vs PEFT.
bench 150 train_step --preset=t5_1_1_base --batch=32 --inputs=512 --targets=8 \
  --dtype=bfloat16 --reference=peft --steps=5
# Time to the first step from an XL checkpoint, cold and restarted (goals: 60 s and 15 s).
bench 300 startup --preset=t5_1_1_xl --batch=16 --inputs=512 --targets=8 --dtype=bfloat16
echo "results: $record"
