#!/usr/bin/env bash
# `lanectl standby check`'s protocol against a real vLLM 0.26.0 on the GPU machine (issue 55), in two device calls
# (the machine keeps /tmp for 30 s after a call; one call carries at most 64 MiB, so the payload travels in two
# 41 MiB parts, beside a copy of this branch's lanectl and gpu/vllm_serve in $SRC):
#   call 1: bash $SRC/gpu/vllm_serve/standby-on-device.sh part1   carry $P/part-aa and $SRC: stash it, make the models
#   call 2: bash $SRC/gpu/vllm_serve/standby-on-device.sh run     carry $P/part-ab and $SRC: unpack, then the check
#           with UVA offload (V1 runner) and two starts beside it, then the control without offload
# Build the parts here with payload.sh, then `cat part-* | split -b 41M`. What it printed lands in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
P=${P:-.gpu-payload}
OUT=${OUT:-$(mktemp -d /tmp/standby-check.XXXXXX)}
stash=/tmp/lanectl-payload
started=$(date +%s)
# A call brings back at most 8 files: each run's folder travels as one archive.
pack() {
  for run in uva control; do
    [ -d "$OUT/$run" ] && tar -C "$OUT" -czf "$OUT/$run.tgz" "$run" && rm -rf "${OUT:?}/$run"
  done
  ls -l "$OUT"
}
step=${1:-}
shift || true  # the rest are standby_check.py's arguments
case "$step" in
  part1)
    mkdir -p "$stash" && cp "$P"/part-aa "$stash"/ && ls -l "$stash"
    {
      date -u +%Y-%m-%dT%H:%M:%SZ
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)'
      free -g | head -2
    } 2>&1 | tee "$OUT/env.log"
    [ -d /tmp/models/llama-1b-random ] || python3 "$here/make_models.py" /tmp/models 2>&1 | tail -5 | tee "$OUT/make_models.log"
    du -sh /tmp/models/*
    ;;
  run)
    if [ ! -d /tmp/site/vllm ]; then
      [ -f "$stash/part-aa" ] || { echo "part-aa is gone: the machine went cold; run part1 again" >&2; exit 3; }
      cp "$P"/part-ab "$stash"/ || exit 3
      mkdir -p /tmp/site && cat "$stash"/part-* | xz -d | tar -x -C /tmp/site || exit 3
    fi
    echo "unpacked after $(( $(date +%s) - started )) s"
    export PYTHONPATH=/tmp/site
    python3 -c 'import vllm; print("vllm", vllm.__version__)' 2>&1 | tail -1 | tee -a "$OUT/env.log"
    # The checked lane: UVA offload of 1 GiB of MLP weights on the V1 runner (the V2 runner never creates the
    # offloader in 0.26.0), 12 cycles with 8 streams in flight; then, asleep, an engine beside it at 0.92 (vLLM's
    # default, expected to fit) and at 0.99 (expected to find too little free memory).
    offload=(--env VLLM_USE_V2_MODEL_RUNNER=0 --vllm-arg=--offload-backend --vllm-arg=uva --vllm-arg=--cpu-offload-gb
             --vllm-arg=1 --vllm-arg=--cpu-offload-params --vllm-arg=gate_up_proj --vllm-arg=down_proj)
    python3 "$here/standby_check.py" --model /tmp/models/llama-1b-random --out "$OUT/uva" "${offload[@]}" \
      --cycles "${CYCLES:-12}" --beside "${BESIDE:-0.92,0.99}" "$@" 2>&1 | tee "$OUT/uva.log" | grep -v "INFO:  "
    # The control: the same engine and runner without offload, the same cycles, no start beside.
    if [ $(( $(date +%s) - started )) -lt "${CONTROL_BEFORE_S:-400}" ]; then
      python3 "$here/standby_check.py" --model /tmp/models/llama-1b-random --out "$OUT/control" \
        --env VLLM_USE_V2_MODEL_RUNNER=0 --cycles "${CYCLES:-12}" "$@" 2>&1 | tee "$OUT/control.log" | grep -v "INFO:  "
    else
      echo "control not run: $(( $(date +%s) - started )) s gone; run the control step next"
    fi
    pack
    ;;
  control)
    export PYTHONPATH=/tmp/site
    [ -d /tmp/site/vllm ] || { echo "the payload is gone: the machine went cold" >&2; exit 3; }
    python3 "$here/standby_check.py" --model /tmp/models/llama-1b-random --out "$OUT/control" \
      --env VLLM_USE_V2_MODEL_RUNNER=0 --cycles "${CYCLES:-12}" "$@" 2>&1 | tee "$OUT/control.log" | grep -v "INFO:  "
    pack
    ;;
  *) echo "usage: $0 part1|run|control [standby_check.py args]" >&2; exit 2 ;;
esac
