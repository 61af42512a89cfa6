#!/usr/bin/env bash
# The whole GPU-side proof for issue 10, as the device command runs it:
#   bash gpu/run-on-h200.sh [check_combine.py args, e.g. --module PATH]
# Logs go to $OUT (the device tool's return folder) when set.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGDIR=${OUT:-$(mktemp -d /tmp/gpu-proof.XXXXXX)}
mkdir -p "$LOGDIR"
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -2
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$LOGDIR/env.log"

echo "######## (a) split-KV combine vs pure-torch reference"
python3 gpu/check_combine.py "$@" 2>&1 | tee "$LOGDIR/combine.log"
rc_combine=${PIPESTATUS[0]}

echo "######## (b) side-build mechanism"
SIDEBUILD_LOGDIR="$LOGDIR" bash gpu/side_build/run.sh 2>&1 | tee "$LOGDIR/side_build.log"
rc_side=${PIPESTATUS[0]}

echo "######## combine rc=$rc_combine side_build rc=$rc_side  (logs: $LOGDIR)"
[ "$rc_combine" -eq 0 ] && [ "$rc_side" -eq 0 ]
