#!/usr/bin/env bash
# `make test`: the whole suite as six pytest processes at once, one per group (gate, switches, watchdog, fleet,
# traffic, side: see tests/conftest.py), then the test that restarts the Docker engine and the switch's fuzzer, alone. Each group's output
# goes to its own log; at the end one line per group says how it went and how long it took, and every failing
# group's log follows it whole: the failures and pytest's summary of them. Exit status: the first failing group's.
# Extra arguments go to every run (e.g. -x, -k EXPR).
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=.venv/bin/pytest
logs=$(mktemp -d /tmp/lanectl-tests.XXXXXX)
groups=(gate switches watchdog fleet traffic side)
pids=()

run_group() {  # NAME MARKER-EXPRESSION ARGS...: run it, then leave "STATUS SECONDS" in NAME.rc
  local name=$1 marker=$2 started
  shift 2
  started=$(date +%s)
  "$pytest" -q -p no:cacheprovider --durations=5 -m "$marker" "$@" >"$logs/$name.log" 2>&1
  echo "$? $(( $(date +%s) - started ))" >"$logs/$name.rc"
}

# Bytecode is written and read: a machine that sets PYTHONDONTWRITEBYTECODE=1 (as these do) otherwise has every
# pytest process rewrite the asserts of every test module it collects (about 10 CPU-seconds each, seven processes)
# and every lanectl or stub process the tests start compile what it imports, anew. __pycache__ is ignored by git and
# left out of image builds. One collection first writes it, so that the groups starting at once find it written.
unset PYTHONDONTWRITEBYTECODE
"$pytest" -q -p no:cacheprovider --collect-only >/dev/null 2>&1
.venv/bin/python -m compileall -q lanectl images/stub-engine/stubengine >/dev/null

echo "== tests: ${groups[*]} at once, then solo (logs in $logs)"
for name in "${groups[@]}"; do
  run_group "$name" "$name" "$@" &
  pids+=($!)
done
# The runs and anything they started end with this script (^C, a CI timeout).
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
wait "${pids[@]}"
trap - EXIT
run_group solo solo "$@"

status=0
for name in "${groups[@]}" solo; do
  read -r code seconds <"$logs/$name.rc"
  summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error|deselected|skipped)|no tests ran" "$logs/$name.log" | tail -n 1)
  # 5: no tests collected (e.g. -k matched nothing in that group) is not a failure of the suite.
  if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then
    echo "FAIL  $name ($seconds s): $summary"
    [ "$status" -eq 0 ] && status=$code
  else
    echo "ok    $name ($seconds s): $summary"
  fi
done
for name in "${groups[@]}" solo; do
  read -r code _ <"$logs/$name.rc"
  if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then
    echo "== $name: its whole log"
    cat "$logs/$name.log"
  fi
done
exit "$status"
