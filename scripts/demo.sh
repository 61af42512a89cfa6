#!/usr/bin/env bash
# The demo: the job lanectl does, on the embedded CPU stub-engine lanes (recipes/demo/stub.yaml).
# Run through `make demo`, which has already done the host set-up. The demo keeps its own state
# in .demo-state/ so it never touches a real lanectl state dir on this host.
set -euo pipefail
cd "$(dirname "$0")/.."
export LANECTL_STATE_DIR="$PWD/.demo-state"
lanectl=.venv/bin/lanectl
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { say "lanectl $*"; $lanectl "$@"; }

run validate
run patches check
run build demo-h1 demo-h2 demo-h2-8 demo-broken
run up demo-h1 --no-gpu
say "lanectl up demo-h2 --no-gpu   # demo-h1 is not stopped: it waits asleep (vLLM sleep mode) as a standby"
$lanectl up demo-h2 --no-gpu
run status
say "curl -m 3 http://127.0.0.1:18000/v1/completions ...   # demo-h1 sleeps: vLLM queues the request, nothing answers it"
curl -sS -m 3 http://127.0.0.1:18000/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt": "Are you there?", "max_tokens": 4}' \
  || echo "(no answer in 3 s: a sleeping lane queues requests until a wake; /health answers $(curl -s -o /dev/null \
-w '%{http_code}' http://127.0.0.1:18000/health) all the while, so only GET /is_sleeping tells: \
$(curl -s http://127.0.0.1:18000/is_sleeping))"
say "lanectl rollback --no-gpu   # wakes demo-h1 in seconds instead of loading it again"
$lanectl rollback --no-gpu
run up demo-h2 --no-gpu
say "lanectl up demo-broken --no-gpu   # never becomes healthy: lanectl wakes demo-h2, which it left asleep"
$lanectl up demo-broken --no-gpu || echo "(exit code $?: the switch failed, and the way back worked)"
run status
say "docker kill lanectl-demo-demo-h2   # the active lane's engine crashes"
docker kill lanectl-demo-demo-h2 >/dev/null
say "lanectl watchdog check --kernel-log file:/dev/null   # one cron pass: it restarts the lane"
$lanectl watchdog check --kernel-log file:/dev/null || echo "(exit code $?: the watchdog acted)"
run watchdog status
run history -n 12
run diff demo-h1 demo-h2
# The bracket takes 2-3 minutes more than the rest of the demo together, so the demo names it instead of running it.
say "next: lanectl gate demo-h2 demo-h2-8 --control demo-h1 --workload demo --no-gpu --out results/   # a bracket of two candidates, then: lanectl report results/<run> --release-note"
say "lanectl down   # the demo is over: the active lane and any standby stop; containers are kept for the next run"
$lanectl down
