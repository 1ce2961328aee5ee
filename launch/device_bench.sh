#!/usr/bin/env bash
# Issue 11's accelerator figures in one call of the device tool (one H100/H200, 15 device-minutes a
# session, at most 10 minutes a call): its image has jax, flax, optax, orbax, torch, transformers
# and peft, but no TensorFlow, seqio, clu or gin-config, so gin-config travels as a wheel.
#
#   here, once:   pip download --no-deps -d .whl gin-config && echo /.whl/ >> .git/info/exclude
#   device call:  carry [".whl"], timeout_s 600, command: OUT=$OUT bash launch/device_bench.sh
#   then:         copy $OUT/bench.md's blocks into docs/benchmarks.md
#
# Each bench has its own time limit, cut to what is left of BUDGET seconds (default 560, under the
# call's 10 minutes), so a slow one still leaves the others' figures in $OUT/bench.md; the most
# wanted run first. SMOKE=1: tiny shapes, to check the script on a CPU. PART=2 (the large and
# float32 rows) is a further call; PART=3 runs the XXL row alone. On an H100 (2026-11-26): the
# default part took 237 s (before the bias-form row was added), PART=2 about 200 s, and a start
# about 30 s of device time; on an H200 (2026-11-27) the default part took 252 s (before the
# XXL row and the profile were added: XXL alone took 42 s).
# The base step's profile comes back as $OUT/base_step.xplane.pb and its program as
# $OUT/step.hlo.txt: read them here with `python -m prompt_jax.bench_profile DIR` (DIR: the
# folder the tool copied them to; it needs TensorFlow).
set -uo pipefail
out=${OUT:-/tmp/device_bench}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# (`import gin` alone would find the repo's gin/ folder of configs as a namespace package.)
if ! python3 -c "import gin.config" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gin_site .whl/*.whl \
    || { echo "gin-config is missing: carry .whl (see the top of this script)"; exit 2; }
  export PYTHONPATH=/tmp/gin_site:$PYTHONPATH
fi
record=$out/bench.md
deadline=$((SECONDS + ${BUDGET:-560}))
bench() {  # bench SECONDS WHAT ARGS...: one bench, recorded; a failure or time-out is reported
  local limit=$1; shift
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 30 ]; then echo "== skipped (out of time): prompt-jax bench $*"; return; fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "== prompt-jax bench $* (limit ${limit} s)"
  timeout "$limit" python3 -m prompt_jax bench "$@" --record="$record" || echo "== exit $?"
}
python3 -c "import jax; print('devices:', jax.devices())"
if [ -n "${SMOKE:-}" ]; then
  tiny=(--num_layers=1 --batch=2 --inputs=16 --targets=4 --prompt_length=2 --steps=1)
  bench 300 attention "${tiny[@]}"
  bench 300 train_step "${tiny[@]}" --reference=none
  bench 300 train_step "${tiny[@]}" --reference=none --attention=xla --padding_as_lengths=false
  bench 300 startup "${tiny[@]}"
  echo "results: $record"
  exit 0
fi
if [ "${PART:-1}" = 3 ]; then
  # XXL's MFU (goal 50%), ours alone: PEFT's XXL side would not fit the call.
  bench 480 train_step --preset=t5_1_1_xxl --batch=8 --inputs=512 --targets=8 \
    --dtype=bfloat16 --reference=none --steps=5
  echo "results: $record"
  exit 0
fi
if [ "${PART:-1}" = 2 ]; then  # the other table rows, a second call
  bench 160 train_step --preset=t5_1_1_large --batch=32 --inputs=512 --targets=8 \
    --dtype=bfloat16 --reference=peft --steps=5
  # The float32 row: both sides' frozen weights and activations float32.
  bench 150 train_step --preset=t5_1_1_base --batch=32 --inputs=512 --targets=8 \
    --dtype=float32 --reference=peft --steps=5
  echo "results: $record"
  exit 0
fi
# The fused kernel against the einsum path at the base shape (acceptance 2, on a GPU).
bench 90 attention --preset=t5_1_1_base --batch=32 --inputs=512 --dtype=bfloat16
# The first table row: base, batch 32 x (512 + 100), 8 targets, bfloat16, vs PEFT.
bench 150 train_step --preset=t5_1_1_base --batch=32 --inputs=512 --targets=8 \
  --dtype=bfloat16 --reference=peft --steps=5 --profile=/tmp/base_step_trace
trace=$(find /tmp/base_step_trace -name '*.xplane.pb' 2>/dev/null | head -1)
[ -n "$trace" ] && cp "$trace" "$out/base_step.xplane.pb" \
  && cp /tmp/base_step_trace/step.hlo.txt "$out/step.hlo.txt"
# The same step with cuDNN given the [batch, heads, T, T] bias instead of the padding as lengths
# (the form before layers.PaddedBias; 0.043 s/step on the first H100 run).
bench 60 train_step --preset=t5_1_1_base --batch=32 --inputs=512 --targets=8 \
  --dtype=bfloat16 --reference=none --padding_as_lengths=false --steps=5
# Time to the first step from an XL checkpoint, cold and restarted (goals: 60 s and 15 s).
bench 280 startup --preset=t5_1_1_xl --batch=16 --inputs=512 --targets=8 --dtype=bfloat16
# The XL row's MFU (goal 50%), ours alone: PEFT's XL side would not fit the call.
bench 120 train_step --preset=t5_1_1_xl --batch=16 --inputs=512 --targets=8 \
  --dtype=bfloat16 --reference=none --steps=5
# XXL's MFU (goal 50%), ours alone (42 s on the H200, 65 GB of device memory).
bench 120 train_step --preset=t5_1_1_xxl --batch=8 --inputs=512 --targets=8 \
  --dtype=bfloat16 --reference=none --steps=5
echo "results: $record"
