from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lanectl.errors import BadInput
from lanectl.state.lanes import LaneState, LaneStateStore, StateFileCorrupt, WatchdogLease

REPO = Path(__file__).resolve().parent.parent
AT_NOON = datetime(2026, 11, 30, 12, 3, 11, 42_000, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> LaneStateStore:
    return LaneStateStore(tmp_path / "state" / "state.json", now=lambda: AT_NOON)


def test_a_missing_state_file_is_the_default_state(store: LaneStateStore):
    assert store.load() == LaneState()
    assert not store.path.exists()


def test_save_then_load_returns_the_state_stamped_with_the_save_time(store: LaneStateStore):
    state = LaneState(active="h2-REF", known_good=("h1-REF", "h2-REF"), watchdog_armed=False,
                      watchdog_lease=WatchdogLease(until="2026-11-30T13:00:00.000Z", reason="bench", by="op@box"))

    store.save(state)

    assert store.load() == LaneState(active="h2-REF", known_good=("h1-REF", "h2-REF"),
                                     watchdog_lease=state.watchdog_lease, updated="2026-11-30T12:03:11.042Z")
    assert json.loads(store.path.read_text())["version"] == 1
    assert store.path.stat().st_mode & 0o777 == 0o600
    assert store.path.parent.stat().st_mode & 0o777 == 0o700
    assert sorted(path.name for path in store.path.parent.iterdir()) == ["state.json"]


# state.json exactly as the lanectl before the pydantic model wrote it (dataclasses.asdict, indent 2).
WRITTEN_BEFORE = """{
  "version": 1,
  "active": "h2-REF",
  "known_good": [
    "h1-REF",
    "h2-REF"
  ],
  "watchdog_armed": false,
  "watchdog_lease": {
    "until": "2026-11-30T13:00:00.000Z",
    "reason": "bench",
    "by": "op@box"
  },
  "updated": "2026-11-30T12:03:11.042Z"
}
"""


def test_a_state_file_written_before_loads_and_is_written_back_byte_for_byte(store: LaneStateStore):
    store.path.parent.mkdir(mode=0o700)
    store.path.write_text(WRITTEN_BEFORE)

    state = store.load()
    store.save(state)

    assert state == LaneState(active="h2-REF", known_good=("h1-REF", "h2-REF"), updated="2026-11-30T12:03:11.042Z",
                              watchdog_lease=WatchdogLease(until="2026-11-30T13:00:00.000Z", reason="bench",
                                                           by="op@box"))
    assert store.path.read_text() == WRITTEN_BEFORE


def test_update_applies_a_transition_and_saves_it(store: LaneStateStore):
    store.save(LaneState(active="h1-REF", known_good=("h1-REF",)))

    saved = store.update(lambda state: state.with_active("h2-REF").with_known_good("h2-REF").armed())

    assert saved == LaneState(active="h2-REF", known_good=("h1-REF", "h2-REF"), watchdog_armed=True,
                              updated="2026-11-30T12:03:11.042Z")
    assert store.load() == saved


def test_an_unreadable_state_file_is_refused_and_left_byte_identical(store: LaneStateStore):
    store.path.parent.mkdir()
    broken = b'{"version": 1, "active": "h2-R'
    store.path.write_bytes(broken)

    with pytest.raises(StateFileCorrupt) as corrupt:
        store.load()

    path = store.path
    assert str(corrupt.value) == (
        f"{path} is not a readable lane state (not JSON: Unterminated string starting at: line 1 column 26 "
        f"(char 25)); the file was left untouched. Move it aside (mv {path} {path}.broken): `lanectl status` "
        f"then rebuilds what it can from the engine's container labels."
    )
    assert corrupt.value.exit_code == 2  # bad input: exit 2, with the file named
    assert store.path.read_bytes() == broken
    with pytest.raises(StateFileCorrupt):
        store.update(lambda state: state.with_active("h1-REF"))
    assert store.path.read_bytes() == broken


def test_a_state_file_from_a_newer_lanectl_is_refused_and_left_alone(store: LaneStateStore):
    store.path.parent.mkdir()
    newer = b'{"version": 2, "lanes": {}}\n'
    store.path.write_bytes(newer)

    with pytest.raises(StateFileCorrupt) as corrupt:
        store.load()

    path = store.path
    assert str(corrupt.value) == (
        f"{path} holds lane state version 2, written by a newer lanectl (this one reads version 1); the file "
        f"was left untouched. Use the newer lanectl, or move the file aside (mv {path} {path}.broken): "
        f"`lanectl status` then rebuilds what it can from the engine's container labels."
    )
    assert store.path.read_bytes() == newer


@pytest.mark.parametrize(("content", "detail"), [
    ("[]", "expected a JSON object, got list"),
    ('{"active": "h1-REF"}', "version must be 1, got None"),
    ('{"version": true}', "version must be 1, got True"),
    ('{"version": 1, "known_good": "h1-REF"}', "known_good: Input should be a valid array"),
    ('{"version": 1, "watchdog_armed": "yes"}', "watchdog_armed: Input should be a valid boolean"),
    ('{"version": 1, "active": 3}', "active: Input should be a valid string"),
    ('{"version": 1, "actve": "h1-REF"}', "actve: Extra inputs are not permitted"),
    ('{"version": 1, "watchdog_lease": {"until": "tomorrow", "reason": "", "by": ""}}',
     "watchdog_lease.until: Invalid isoformat string: 'tomorrow'"),
    ('{"version": 1, "watchdog_lease": {"until": "2026-11-30T13:00:00"}}',
     "watchdog_lease.until: a timestamp needs a timezone; watchdog_lease.reason: Field required; "
     "watchdog_lease.by: Field required"),
    ('{"version": 1, "watchdog_lease": {"until": "2026-11-30T13:00:00Z", "reason": "r", "by": "b", "x": 1}}',
     "watchdog_lease.x: Extra inputs are not permitted"),
])
def test_state_files_of_the_wrong_shape_are_refused(store: LaneStateStore, content: str, detail: str):
    store.path.parent.mkdir()
    store.path.write_text(content)

    with pytest.raises(StateFileCorrupt) as corrupt:
        store.load()

    assert corrupt.value.detail == detail
    assert store.path.read_text() == content


# Saves states as fast as it can; every state is self-consistent (all names carry the same number)
# and large, so a torn or half-written file would show.
WRITER_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from lanectl.state.lanes import LaneState, LaneStateStore
    store = LaneStateStore(Path(sys.argv[1]))
    start = int(sys.argv[2])
    print("writing", flush=True)
    for number in range(start, start + 1_000_000):
        store.save(LaneState(active=f"lane-{number}", known_good=tuple(f"lane-{number}-{k}" for k in range(2000))))
""")


def test_a_writer_killed_at_any_moment_leaves_a_loadable_whole_state(store: LaneStateStore):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    store.save(LaneState(active="lane-0", known_good=("lane-0-0",)))
    loads = 0
    for round_number in range(1, 6):
        writer = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(store.path), str(round_number * 10**6)],
                                  stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
            seen: set[str] = set()
            while len(seen) < 3 * round_number:  # kill at a different point in each round
                state = store.load()
                loads += 1
                assert state.active is not None
                number = state.active.removeprefix("lane-")
                assert all(lane.startswith(f"lane-{number}-") for lane in state.known_good)
                seen.add(number)
            writer.send_signal(signal.SIGKILL)
        finally:
            writer.kill()
            writer.wait()
            if writer.stdout is not None:
                writer.stdout.close()
        state = store.load()
        assert state.active is not None and len(state.known_good) in (1, 2000)
    assert loads >= 15


def test_known_good_keeps_the_most_recent_last_without_duplicates():
    state = LaneState().with_known_good("h1-REF").with_known_good("h2-REF").with_known_good("h1-REF")

    assert state.known_good == ("h2-REF", "h1-REF")
    assert LaneState().known_good == ()


def test_last_known_good_before_skips_the_current_lane():
    state = LaneState(known_good=("h0-REF", "h1-REF", "h2-REF"))

    assert state.last_known_good_before("h2-REF") == "h1-REF"
    assert state.last_known_good_before("h1-REF") == "h2-REF"
    assert state.last_known_good_before(None) == "h2-REF"
    assert LaneState(known_good=("h2-REF",)).last_known_good_before("h2-REF") is None
    assert LaneState().last_known_good_before(None) is None


def test_active_transitions_return_new_states():
    idle = LaneState()

    serving = idle.with_active("h2-REF")

    assert (idle.active, serving.active, serving.with_inactive().active) == (None, "h2-REF", None)


def test_a_disarm_lease_ends_at_its_time_and_arming_clears_it():
    armed = LaneState(active="h2-REF").armed()

    disarmed = armed.disarmed_for(600, "benchmark", "op@box", AT_NOON)

    assert disarmed.watchdog_armed is False
    assert disarmed.watchdog_lease == WatchdogLease(until="2026-11-30T12:13:11.042Z", reason="benchmark", by="op@box")
    assert not disarmed.lease_expired(AT_NOON)
    assert not disarmed.lease_expired(AT_NOON + timedelta(seconds=599.999))
    assert disarmed.lease_expired(AT_NOON + timedelta(seconds=600))
    assert disarmed.lease_expired(datetime(2026, 11, 30, 14, 0, tzinfo=UTC))
    assert (armed.watchdog_armed, armed.watchdog_lease) == (True, None)
    rearmed = disarmed.armed()
    assert (rearmed.watchdog_armed, rearmed.watchdog_lease) == (True, None)
    assert not rearmed.lease_expired(AT_NOON + timedelta(days=1))


def test_a_disarm_must_last_some_time():
    with pytest.raises(BadInput, match="positive number of seconds, got 0"):
        LaneState().disarmed_for(0, "benchmark", "op@box", AT_NOON)


def test_the_watchdog_is_armed_when_armed_or_when_its_lease_has_run_out():
    disarmed = LaneState().disarmed_for(600, "benchmark", "op@box", AT_NOON)

    assert not disarmed.watchdog_armed_at(AT_NOON + timedelta(seconds=599.999))
    assert disarmed.watchdog_armed_at(AT_NOON + timedelta(seconds=600))
    assert LaneState().armed().watchdog_armed_at(AT_NOON)
    assert not LaneState().watchdog_armed_at(AT_NOON)  # never armed, no lease: stays disarmed
