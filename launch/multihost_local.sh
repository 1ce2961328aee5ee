#!/usr/bin/env bash
# Runs `prompt-jax <command>` as N processes on this machine (fake CPU devices), as a smoke
# test of multi-host flags; each process gets DEVICES devices and a timeout.
#   launch/multihost_local.sh 2 2 train --gin_file=runs/embedded_default.gin --gin.MODEL_DIR="'/tmp/mh'"
set -euo pipefail
NPROC=${1:?number of processes}; DEVICES=${2:?devices per process}; shift 2
PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
TIMEOUT=${TIMEOUT:-600}
pids=()
for ((i = 0; i < NPROC; i++)); do
  XLA_FLAGS="--xla_force_host_platform_device_count=${DEVICES}" JAX_PLATFORMS=cpu \
    timeout "${TIMEOUT}" prompt-jax "$@" --coordinator_address="127.0.0.1:${PORT}" \
    --process_count="${NPROC}" --process_index="${i}" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "${pid}" || status=$?; done
exit "${status}"
