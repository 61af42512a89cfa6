"""The standby record (`standby.json`), host memory from /proc/meminfo, and the engine's resident-memory line."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lanectl.host.gpu_memory import parse_memory
from lanectl.host.host_memory import available_gib
from lanectl.lanes.standby import resident_gib
from lanectl.state.standby import Fingerprint, StandbyFileCorrupt, StandbyRecord, StandbyState, StandbyStore

NOW = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
PRINT = Fingerprint(prompt="p", max_tokens=8, text=" a b", recorded="2026-12-01T02:00:00.000Z")


def store(tmp_path: Path) -> StandbyStore:
    return StandbyStore(tmp_path / "state" / "standby.json", now=lambda: NOW)


def test_no_file_is_no_standby_and_reading_creates_nothing(tmp_path):
    assert store(tmp_path).load() == StandbyState()
    assert not (tmp_path / "state").exists()


def test_a_standby_round_trips_and_a_drop_keeps_its_reason(tmp_path):
    standbys = store(tmp_path)
    standbys.update(lambda s: s.with_fingerprint("a", PRINT))
    standbys.update(lambda s: s.with_standby(StandbyRecord(lane="a", since=standbys.timestamp(), fingerprint=PRINT,
                                                           resident_gib=1.5)))
    loaded = standbys.load()
    assert loaded.standby("a") == StandbyRecord(lane="a", since="2026-12-01T03:00:00.000Z", fingerprint=PRINT,
                                                resident_gib=1.5)
    assert loaded.fingerprints == {"a": PRINT}
    standbys.drop("a", "its primary container exited while asleep (exit code 1)")
    loaded = standbys.load()
    assert loaded.standby("a") is None
    assert loaded.dropped["a"].reason == "its primary container exited while asleep (exit code 1)"
    assert loaded.dropped["a"].at == "2026-12-01T03:00:00.000Z"
    assert loaded.fingerprints == {"a": PRINT}, "the fingerprint outlives the standby: the lane may sleep again"
    standbys.update(lambda s: s.serving("a"))
    assert standbys.load().dropped == {}
    assert (tmp_path / "state" / "standby.json").stat().st_mode & 0o777 == 0o600


def test_dropping_a_lane_that_is_no_standby_changes_nothing(tmp_path):
    standbys = store(tmp_path)
    standbys.drop("a", "why")
    assert standbys.load() == StandbyState()


@pytest.mark.parametrize(("content", "detail"), [
    (b"{", "not JSON: Expecting property name"),
    (b"[]", "expected a JSON object, got list"),
    (json.dumps({"version": "1"}).encode(), "version must be 1, got '1'"),
    (json.dumps({"version": 2}).encode(), "version 2, written by a newer lanectl"),
    (json.dumps({"version": 1, "standbys": [{"lane": "a"}]}).encode(), "standbys.0.since: Field required"),
    (json.dumps({"version": 1, "extra": 1}).encode(), "extra: Extra inputs are not permitted"),
])
def test_an_unreadable_record_exits_2_naming_the_file_and_the_fix(tmp_path, content, detail):
    standbys = store(tmp_path)
    standbys.path.parent.mkdir(mode=0o700)
    standbys.path.write_bytes(content)
    with pytest.raises(StandbyFileCorrupt) as caught:
        standbys.load()
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert message.startswith(f"{standbys.path} is not a readable standby record (") and detail in message
    assert f"mv {standbys.path} {standbys.path}.broken" in message and "cold start" in message


def _record_with(**change) -> bytes:
    record = {"lane": "h1-REF", "since": "2026-12-01T02:00:00.000Z", "resident_gib": 1.5,
              "fingerprint": {"prompt": "p", "max_tokens": 8, "text": "t", "recorded": "2026-12-01T02:00:00.000Z"}}
    record.update(change)
    return json.dumps({"version": 1, "standbys": [record]}).encode()


BAD_STANDBY_FIGURES = {
    "since-not-iso": (_record_with(since="yesterday"), "standbys.0.since: Invalid isoformat string"),
    "since-without-timezone": (_record_with(since="2026-12-01T02:00:00"), "a timestamp needs a timezone"),
    "resident-nan": (_record_with(resident_gib=float("nan")), "standbys.0.resident_gib: Input should be a finite"),
    "resident-inf": (_record_with(resident_gib=float("inf")), "standbys.0.resident_gib: Input should be a finite"),
    "resident-negative": (_record_with(resident_gib=-3.0), "standbys.0.resident_gib: Input should be greater than"),
    "fingerprint-recorded-not-iso": (
        _record_with(fingerprint={"prompt": "p", "max_tokens": 8, "text": "t", "recorded": "noon"}),
        "standbys.0.fingerprint.recorded: Invalid isoformat string"),
    "max-tokens-zero": (_record_with(fingerprint={"prompt": "p", "max_tokens": 0, "text": "t",
                                                  "recorded": "2026-12-01T02:00:00.000Z"}),
                        "standbys.0.fingerprint.max_tokens: Input should be greater than or equal to 1"),
    "dropped-at-not-iso": (json.dumps({"version": 1, "dropped": {"a": {"reason": "r", "at": "later"}}}).encode(),
                           "dropped.a.at: Invalid isoformat string"),
}


@pytest.mark.parametrize(("content", "detail"), BAD_STANDBY_FIGURES.values(), ids=BAD_STANDBY_FIGURES.keys())
def test_a_record_with_a_bad_time_or_figure_is_refused_where_it_is_read(tmp_path, content, detail):
    standbys = store(tmp_path)
    standbys.path.parent.mkdir(mode=0o700)
    standbys.path.write_bytes(content)
    with pytest.raises(StandbyFileCorrupt) as caught:
        standbys.load()
    assert detail in str(caught.value)


@pytest.mark.docker
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_status_refuses_a_bad_standby_json_clearly_and_leaves_it(tmp_path, as_json):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    content = _record_with(since="yesterday", resident_gib=float("nan"))
    (state / "standby.json").write_bytes(content)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(state), "LANECTL_RECIPES": str(REPO / "recipes")})

    result = subprocess.run([sys.executable, "-m", "lanectl", "status", *(["--json"] if as_json else [])],
                            capture_output=True, text=True, env=env, timeout=120)

    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"lanectl: {state / 'standby.json'} is not a readable standby record (")
    assert "since: Invalid isoformat string" in result.stderr and "resident_gib" in result.stderr
    assert (state / "standby.json").read_bytes() == content and result.stdout == ""


def test_host_memory_is_memavailable(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24731708 kB\nMemFree:         1000000 kB\nMemAvailable:   23898472 kB\n")
    assert available_gib(meminfo) == pytest.approx(23898472 / 2**20)
    meminfo.write_text("MemTotal:       24731708 kB\n")
    assert available_gib(meminfo) is None
    assert available_gib(tmp_path / "missing") is None
    assert available_gib() is not None, "this Linux host has /proc/meminfo"


def test_resident_memory_is_the_engines_last_report():
    log = ("INFO 12-01 03:55:28 [gpu_worker.py:104] Sleep mode freed 71.25 GiB memory, 1.38 GiB memory is still in "
           "use.\nINFO ...\nINFO 12-01 04:00:00 [gpu_worker.py:104] Sleep mode freed 70.00 GiB memory, 2.50 GiB "
           "memory is still in use.\n")
    assert resident_gib(log) == 2.5
    assert resident_gib("INFO nothing about sleep\n") is None


def test_gpu_memory_is_read_as_nvidia_smi_answers_it():
    # Recorded from `nvidia-smi --query-gpu=index,uuid,memory.total,memory.free --format=csv,noheader,nounits`
    # on an NVIDIA H200 (driver 580), the line as it came.
    h200 = "0, GPU-3a527203-54df-61c1-0387-ab370efdd1bd, 143771, 143156\n"
    assert parse_memory(h200) == {"0": (143771, 143156), "GPU-3a527203-54df-61c1-0387-ab370efdd1bd": (143771, 143156)}
    assert parse_memory(h200 + "1, GPU-x, [N/A], 3\n") is None
    assert parse_memory("") is None


def test_a_temp_file_a_killed_write_left_is_removed_by_the_next_write_and_nothing_else_is(tmp_path):
    """A write killed between its temp file and the rename (kill -9, a power cut) left `.standby.json.*.tmp` in
    the state folder for ever. The next write of standby.json removes such leftovers of its own: old enough that
    no writer can still be at work on them, regular files, the exact name the atomic write makes."""
    import os
    import time

    standbys = store(tmp_path)
    standbys.update(lambda s: s.with_fingerprint("a", PRINT))
    folder = standbys.path.parent
    hour_ago = time.time() - 3600
    left = folder / ".standby.json.k3x_9qzt.tmp"
    left.write_text("{")
    os.utime(left, (hour_ago, hour_ago))
    kept = {
        folder / ".standby.json.ab12cd34.tmp": "in progress",  # a writer may be at work on it: just made
        folder / ".state.json.ab12cd34.tmp": "another file's",
        folder / ".standby.json.tmp": "not the name a write makes",
        folder / "standby.json.ab12cd34.tmp": "not the name a write makes",
    }
    for path, text in kept.items():
        path.write_text(text)
        if "in progress" not in text:
            os.utime(path, (hour_ago, hour_ago))
    linked = folder / ".standby.json.zz99zz99.tmp"
    linked.symlink_to(tmp_path / "elsewhere")
    os.utime(linked, (hour_ago, hour_ago), follow_symlinks=False)

    standbys.update(lambda s: s.with_fingerprint("b", PRINT))
    assert not left.exists(), "the leftover is gone"
    assert all(path.read_text() == text for path, text in kept.items())
    assert linked.is_symlink(), "a link is not a leftover of a write"
    assert set(standbys.load().fingerprints) == {"a", "b"}
