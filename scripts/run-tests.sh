#!/usr/bin/env bash
# `make test`: the whole suite in three pytest runs (the markers are set in tests/conftest.py):
#   main  everything that runs lanes on this engine or measures a rate or a timeout, in the foreground;
#   side  at the same time, in the background: what mostly waits (the two-node Swarm, registry pushes, the
#         installed wheel, cron) and the pure tests; its output follows the main run's;
#   solo  last and alone: the test that restarts the Docker engine every other test uses.
# On a 2-core CI machine this takes the suite from ~19 to ~13 minutes. Exit status: the first failing run's.
# Extra arguments go to all three runs (e.g. -x, -k EXPR).
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=.venv/bin/pytest
side_log=$(mktemp /tmp/lanectl-side-tests.XXXXXX.log)

"$pytest" -q -m "side" --durations=10 "$@" >"$side_log" 2>&1 &
side_pid=$!
# The side run's pytest and anything it started are stopped with this script (^C, a CI timeout).
trap 'kill "$side_pid" 2>/dev/null' EXIT

echo "== main run (the side run's output follows it; it is being written to $side_log)"
"$pytest" -q -m "not side and not solo" --durations=15 "$@"
main_status=$?

wait "$side_pid"
side_status=$?
trap - EXIT
echo "== side run (beside the main run)"
cat "$side_log"

echo "== solo run (restarts the Docker engine)"
"$pytest" -q -m "solo" "$@"
solo_status=$?

for status in $main_status $side_status $solo_status; do
  # 5: no tests collected (e.g. -k matched nothing in that run) is not a failure of the suite.
  if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
exit 0
