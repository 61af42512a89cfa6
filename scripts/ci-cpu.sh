#!/usr/bin/env bash
# Where a fresh clone's .ci/run spends the machine's CPU (docs/development.md): the whole
# machine and the Docker containers from the cgroup v1 cpuacct counters, read before and after; .ci/run's own
# process tree and, within it, the contract suite from /usr/bin/time. The rest is dockerd, containerd, the shims
# and the kernel. Needs cgroup v1 with Docker's cgroupfs driver (/sys/fs/cgroup/cpuacct/docker), as here.
#   bash scripts/ci-cpu.sh [CLONE_DIR]     (default /tmp/lanectl-ci-cpu; removed first)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
clone=${1:-/tmp/lanectl-ci-cpu}
counters=/sys/fs/cgroup/cpuacct
[ -r "$counters/cpuacct.usage" ] && [ -r "$counters/docker/cpuacct.usage" ] ||
  { echo "ci-cpu: no cgroup v1 cpuacct counters for the machine and for Docker here" >&2; exit 2; }
rm -rf "$clone" && git clone -q "$repo" "$clone" && cd "$clone" || exit 9
# Only in this scratch clone: the contract part, which runs in the background, under its own timer.
sed -i 's|^make contract >"\$contract_log" 2>&1 &|/usr/bin/time -f "contract cpu: user %U s, sys %S s" make contract >"$contract_log" 2>\&1 \&|' .ci/run
grep -q "contract cpu" .ci/run || { echo "ci-cpu: .ci/run no longer starts make contract as this script expects" >&2; exit 9; }
log=$(mktemp /tmp/lanectl-ci-cpu.XXXXXX.log)
machine0=$(cat $counters/cpuacct.usage) docker0=$(cat $counters/docker/cpuacct.usage)
/usr/bin/time -f ".ci/run cpu: user %U s, sys %S s, wall %e s" bash .ci/run >"$log" 2>&1
status=$?
machine1=$(cat $counters/cpuacct.usage) docker1=$(cat $counters/docker/cpuacct.usage)
echo "commit $(git rev-parse --short HEAD); .ci/run exit $status (its log: $log)"
grep -E "^(ok|FAIL) " "$log" | tail -4
grep -hE "^(contract cpu|\.ci/run cpu):" "$log"
echo "machine $(( (machine1 - machine0) / 1000000000 )) CPU-s on $(nproc) cores; Docker containers" \
     "$(( (docker1 - docker0) / 1000000000 )) CPU-s"
exit "$status"
