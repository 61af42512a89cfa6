#!/usr/bin/env bash
# CI on a busy machine (issue 23): a fresh clone's .ci/run with a busy loop (`yes > /dev/null`) on every core
# beside it, as other work on a shared CI machine would be. Prints the commit, the load before and after, and
# the run's exit status and seconds; exits with .ci/run's status.
#   bash scripts/ci-under-load.sh [CLONE_DIR]     (default /tmp/lanectl-ci-under-load; removed first)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
clone=${1:-/tmp/lanectl-ci-under-load}
rm -rf "$clone" && git clone -q "$repo" "$clone" && cd "$clone" || exit 9
echo "commit $(git rev-parse --short HEAD); cores $(nproc); start $(date -u +%FT%TZ)"
hogs=()
for _ in $(seq "$(nproc)"); do yes > /dev/null & hogs+=($!); done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
uptime
started=$(date +%s)
bash .ci/run
status=$?
uptime
echo "ci rc=$status in $(( $(date +%s) - started )) s with $(nproc) busy loops beside it; end $(date -u +%FT%TZ)"
exit "$status"
