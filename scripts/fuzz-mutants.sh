#!/usr/bin/env bash
# Shows that the switch's fuzzer (tests/test_switch_fuzz.py) guards each runtime invariant of the executor: for
# each one, a copy of the tree with that check removed, the fuzzer's CI profile run on it, and whether it failed
# (it must). Each line says whether the machine found it in CI's profile, or only an example pinned beside it
# did (a sequence the machine found once); exit 1 if any survived. `make fuzz-mutants`.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-$root/.venv/bin/python}
survived=0

only=${1:-}  # a word of the mutants' names: only those run (e.g. `drain`), the baseline then not

mutant() {  # NAME FILE OLD NEW: the tree with OLD replaced by NEW in FILE
  local name=$1 file=$2 old=$3 new=$4 copy
  if [ -n "$only" ] && [[ "$name" != *"$only"* ]]; then return; fi
  copy=$(mktemp -d /tmp/lanectl-mutant.XXXXXX)
  tar -c --exclude=./.git --exclude=./.venv --exclude='./.contract-venv*' --exclude=./site --exclude=./.hypothesis --exclude=__pycache__ . \
    | tar -x -C "$copy"
  [ -z "$old" ] && old=$new  # the baseline: nothing removed
  OLD=$old NEW=$new "$python" - "$copy/$file" <<'PY' || { echo "mutant $name: the code to remove was not found"; exit 2; }
import os, sys
path = sys.argv[1]
text = open(path).read()
if os.environ["OLD"] not in text:
    sys.exit(1)
open(path, "w").write(text.replace(os.environ["OLD"], os.environ["NEW"], 1))
PY
  local begun=$SECONDS found
  if (cd "$copy" && PYTHONPATH=$copy "$python" -m pytest -q -x -p no:cacheprovider tests/test_switch_fuzz.py \
        -k interleavings >"$copy/fuzz.log" 2>&1); then
    if [ "$old" = "$new" ]; then
      echo "baseline  the machine passes on the tree as it is ($((SECONDS - begun)) s)"
    elif (cd "$copy" && PYTHONPATH=$copy "$python" -m pytest -q -p no:cacheprovider tests/test_switch_fuzz.py \
            -k "not interleavings" >"$copy/examples.log" 2>&1); then
      echo "SURVIVED  $name ($((SECONDS - begun)) s): neither the machine nor its pinned examples failed"
      survived=1
    else
      found=$(grep -m1 -E "^FAILED" "$copy/examples.log" | cut -c1-200)
      echo "killed    $name ($((SECONDS - begun)) s), by a pinned example only: $found"
    fi
  else
    # The first failed promise: pytest's "E" lines, or inside the exception group Hypothesis raises for several.
    found=$(grep -m1 -E "^(E|[ |]*) *[A-Za-z.]*Error: " "$copy/fuzz.log" | sed -E 's/^(E|[ |]*) *//' | cut -c1-200)
    if [ "$old" = "$new" ]; then
      echo "BASELINE FAILED ($((SECONDS - begun)) s): $found"
      survived=1
    else
      echo "killed    $name ($((SECONDS - begun)) s), by the machine: $found"
    fi
  fi
  rm -rf "$copy"
}

mutant "baseline" lanectl/lanes/execute.py "" "awake_beside"
mutant "one lane awake per GPU (no check before a start or a wake)" lanectl/lanes/execute.py \
  "        holding = awake_beside(self.catalog, lane, self.engine.list_containers(), self.calls.is_sleeping_in)" \
  "        holding: list[str] = []"
mutant "a stop gives the container its own drain (the plan's timeout instead)" lanectl/lanes/execute.py \
  "self.engine.stop(step.container, own_stop_timeout(state.stop_timeout, step.seconds))" \
  "self.engine.stop(step.container, int(step.seconds))"
mutant "a removal removes only what is stopped (no look before it)" lanectl/lanes/execute.py \
  "        if state.status in LIVE_STATES:" \
  "        if False:"
mutant "a lane is healthy only when every engine of it is awake (health alone)" lanectl/lanes/snapshot.py \
  "            active_healthy = health(lane) and not sleeping" \
  "            active_healthy = health(lane)"
mutant "a continuation first stops what is live on the target's GPUs (it replays the journal)" lanectl/lanes/plan.py \
  "    phases = (*_leave_for(inventory, target, asleep, waking)," \
  "    phases = ("
mutant "a restored container is gated where it publishes (the recipe's ports)" lanectl/lanes/execute.py \
  "            result = self.calls.gate(as_published(lane, self.engine.list_containers()), step.seconds," \
  "            result = self.calls.gate(lane, step.seconds,"
mutant "the way back wakes only what this run put to sleep" lanectl/lanes/execute.py \
  "            if self._never_slept(lane):" \
  "            if False:"
mutant "a dropped standby leaves nothing live (forgotten, left paused)" lanectl/lanes/plan.py \
  "    stops = stop_steps(inventory, lane, f\"its standby is lost: {reason}\") if lane is not None and stop else ()" \
  "    stops = ()"
mutant "a way back taken before any container changed changes none (the whole way back)" lanectl/lanes/execute.py \
  "                and self._bookkeeping_back(run):" \
  "                and False:"
mutant "a put-back removes only a stopped replacement (no look before it)" lanectl/lanes/execute.py \
  "        if replacement is not None and replacement.status in LIVE_STATES:" \
  "        if False:"
exit "$survived"
