from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lanectl.state.journal import Journal, utc_timestamp

REPO = Path(__file__).resolve().parent.parent
AT_NOON = datetime(2026, 11, 30, 12, 3, 11, 42_000, tzinfo=UTC)


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state" / "journal.jsonl", clock=lambda: AT_NOON)


def record_line(number: int) -> bytes:
    """A line as `append` writes it, for building big journals without 50k fsyncs."""
    record = {"ts": "2026-11-30T12:03:11.042Z", "who": "op@box", "pid": 4242, "kind": "probe", "n": number}
    return json.dumps(record, separators=(",", ":")).encode()


def test_append_writes_header_then_fields_and_read_returns_them(journal: Journal):
    first = journal.append("lock-taken", command="lanectl up h2-REF")
    second = journal.append("step", switch="ab12", step="stop-old", detail={"containers": ["a", "a-rtx"]})

    assert first == {
        "ts": "2026-11-30T12:03:11.042Z",
        "who": f"{pwd.getpwuid(os.geteuid()).pw_name}@{socket.gethostname()}",
        "pid": os.getpid(),
        "kind": "lock-taken",
        "command": "lanectl up h2-REF",
    }
    assert list(second)[:4] == ["ts", "who", "pid", "kind"]
    assert journal.read().records == [first, second]
    assert journal.read().problems == []
    raw = journal.path.read_bytes()
    assert raw.count(b"\n") == 2 and raw.endswith(b"\n")
    assert journal.path.stat().st_mode & 0o777 == 0o600
    assert journal.path.parent.stat().st_mode & 0o777 == 0o700


def test_append_is_one_write_of_the_whole_line_then_fsync(journal: Journal, monkeypatch: pytest.MonkeyPatch):
    calls: list[tuple[str, Any]] = []
    real_write, real_fsync = os.write, os.fsync

    def write(fd: int, data: bytes) -> int:
        calls.append(("write", bytes(data)))
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        calls.append(("fsync", fd))
        real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)
    journal.path.parent.mkdir()
    journal.path.write_bytes(record_line(1) + b"\n")  # an existing journal: no directory fsync expected

    record = journal.append("probe", n=2)

    line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
    assert [name for name, _ in calls] == ["write", "fsync"]
    assert calls[0][1] == line


def test_values_json_cannot_hold_are_refused_and_nothing_is_written(journal: Journal):
    with pytest.raises(TypeError, match="not JSON serializable"):
        journal.append("probe", when=datetime.now(UTC))
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        journal.append("probe", ratio=float("nan"))
    with pytest.raises(ValueError, match=r"\['pid'\] clash"):
        journal.append("probe", pid=1)
    assert not journal.path.exists()


def test_a_line_cut_by_a_killed_writer_is_reported_and_the_next_record_starts_on_its_own_line(journal: Journal):
    for number in range(3):
        journal.append("probe", n=number)
    cut = record_line(3)[:40]
    with journal.path.open("ab") as raw:
        raw.write(cut)

    contents = journal.read()
    assert [record["n"] for record in contents.records] == [0, 1, 2]
    assert contents.problems == ["journal.jsonl line 4: unreadable record (truncated or corrupt, 40 bytes); ignored"]

    journal.append("after-crash")
    journal.append("after-crash-2")

    contents = journal.read()
    assert [record["kind"] for record in contents.records] == ["probe"] * 3 + ["after-crash", "after-crash-2"]
    assert contents.problems == ["journal.jsonl line 4: unreadable record (truncated or corrupt, 40 bytes); ignored"]
    lines = journal.path.read_bytes().split(b"\n")
    assert lines[3] == cut
    assert json.loads(lines[4])["kind"] == "after-crash"
    assert b"\n\n" not in journal.path.read_bytes()


def test_corrupt_middle_lines_are_skipped_and_named_blank_lines_are_not(journal: Journal):
    journal.path.parent.mkdir()
    journal.path.write_bytes(b"\n".join([record_line(0), b"{\"kind\": \"probe\", \"n\"", b"", b"[1, 2]",
                                         b"\xff\xfe", record_line(1)]) + b"\n")

    contents = journal.read()

    assert [record["n"] for record in contents.records] == [0, 1]
    assert contents.problems == [
        "journal.jsonl line 2: unreadable record (truncated or corrupt, 21 bytes); ignored",
        "journal.jsonl line 4: unreadable record (truncated or corrupt, 6 bytes); ignored",
        "journal.jsonl line 5: unreadable record (truncated or corrupt, 2 bytes); ignored",
    ]


def test_a_missing_journal_has_no_records(journal: Journal):
    assert journal.read().records == [] and journal.read().problems == []
    assert journal.tail(10).records == [] and journal.tail(10).problems == []
    assert journal.unfinished_intent() is None
    assert not journal.path.exists()


def test_tail_of_a_big_journal_reads_only_its_end(journal: Journal, monkeypatch: pytest.MonkeyPatch):
    journal.path.parent.mkdir()
    journal.path.write_bytes(b"\n".join(record_line(number) for number in range(50_000)) + b"\n")
    size = journal.path.stat().st_size
    bytes_read = 0
    real_pread = os.pread

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        nonlocal bytes_read
        data = real_pread(fd, length, offset)
        bytes_read += len(data)
        return data

    monkeypatch.setattr(os, "pread", counting_pread)
    last = journal.tail(50)
    monkeypatch.undo()

    assert last.records == journal.read().records[-50:]
    assert last.problems == []
    assert 0 < bytes_read <= journal.tail_block_bytes < size / 40


def test_tail_reports_unreadable_lines_within_its_window_only(journal: Journal):
    lines = [record_line(0), record_line(1), b"garbage-before-the-window", record_line(2), record_line(3),
             b"{\"cut", record_line(4), record_line(5)]
    journal.path.parent.mkdir()
    journal.path.write_bytes(b"\n".join(lines) + b"\n" + record_line(6)[:30])

    last = journal.tail(3)

    assert [record["n"] for record in last.records] == [3, 4, 5]
    assert last.problems == [
        "journal.jsonl line 4 from the end: unreadable record (truncated or corrupt, 5 bytes); ignored",
        "journal.jsonl line 1 from the end: unreadable record (truncated or corrupt, 30 bytes); ignored",
    ]
    assert journal.tail(100).records == journal.read().records
    assert journal.tail(0).records == []


@pytest.mark.parametrize("block_bytes", [1, 2, 7, 61, 4096])
@pytest.mark.parametrize("trailing_newline", [True, False])
def test_tail_agrees_with_read_whatever_the_block_size(journal: Journal, block_bytes: int, trailing_newline: bool):
    long_record = json.dumps({"kind": "long", "blob": "x" * 300}).encode()
    lines = [record_line(0), b"", record_line(1), b"not json", long_record, b"", b"", record_line(2),
             b"[]", record_line(3), long_record, record_line(4)]
    journal.path.parent.mkdir()
    journal.path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline else b""))
    journal.tail_block_bytes = block_bytes
    everything = journal.read().records

    readable = [index for index, line in enumerate(lines) if line.startswith(b"{")]
    unreadable = [index for index, line in enumerate(lines) if line and not line.startswith(b"{")]
    for count in range(1, len(everything) + 2):
        last = journal.tail(count)
        assert last.records == everything[-count:]
        window_start = readable[-count] if count <= len(readable) else 0
        assert last.problems == [
            f"journal.jsonl line {len(lines) - index} from the end: unreadable record "
            f"(truncated or corrupt, {len(lines[index])} bytes); ignored"
            for index in unreadable if index > window_start
        ]


def test_intent_steps_and_outcome_round_trip(journal: Journal):
    intent = journal.record_intent(action="up", from_lane="h1-REF", to_lane="h2-REF", why="operator",
                                   steps=["stop-old", "start-new", "health-gate"])
    journal.record_step(intent["switch"], "stop-old", "stopped dsv41-vllm-1017-h1-REF")
    journal.record_step(intent["switch"], "start-new")

    unfinished = journal.unfinished_intent()

    assert unfinished is not None
    assert len(intent["switch"]) == 32 and int(intent["switch"], 16) >= 0
    assert unfinished == {**intent, "done_steps": ["stop-old", "start-new"]}
    assert (unfinished["from"], unfinished["to"], unfinished["steps"]) == (
        "h1-REF", "h2-REF", ["stop-old", "start-new", "health-gate"])

    journal.record_outcome(intent["switch"], "ok", "h2-REF healthy")
    assert journal.unfinished_intent() is None


def test_unfinished_intent_is_the_last_intent_no_outcome_closes_with_only_its_own_steps(journal: Journal):
    crashed = journal.record_intent(action="up", from_lane="h1-REF", to_lane="h2-REF", why="", steps=["a", "b"])
    journal.record_step(crashed["switch"], "a")
    journal.append("watchdog", event="observation", lane="h2-REF")  # records of no switch between them
    with journal.path.open("ab") as raw:
        raw.write(b"{\"kind\": \"step\", \"swi")  # a writer killed mid-line must not hide the intent

    unfinished = journal.unfinished_intent()
    assert unfinished is not None
    assert unfinished["switch"] == crashed["switch"]
    assert unfinished["done_steps"] == ["a"]

    # A switch that followed it planned over it from what the engine showed: it is never continued.
    finished = journal.record_intent(action="rollback", from_lane="h2-REF", to_lane="h1-REF", why="", steps=["a"])
    journal.record_step(finished["switch"], "a")
    journal.record_outcome(finished["switch"], "finished")
    assert journal.unfinished_intent() is None

    latest = journal.record_intent(action="up", from_lane="h1-REF", to_lane="h2-REF", why="retry", steps=["a"])
    journal.record_step(crashed["switch"], "b")
    unfinished = journal.unfinished_intent()
    assert unfinished is not None
    assert (unfinished["switch"], unfinished["done_steps"]) == (latest["switch"], [])


def test_appends_from_several_processes_all_land_whole(journal: Journal):
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from lanectl.state.journal import Journal
        journal = Journal(Path(sys.argv[1]))
        for number in range(40):
            journal.append("probe", writer=sys.argv[2], n=number, padding="x" * 2000)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", script, str(journal.path), str(writer)], env=env)
               for writer in range(4)]
    assert [writer.wait(timeout=30) for writer in writers] == [0] * 4

    contents = journal.read()
    assert contents.problems == []
    for writer in map(str, range(4)):
        assert [record["n"] for record in contents.records if record["writer"] == writer] == list(range(40))


def test_timestamps_are_utc_with_milliseconds():
    assert utc_timestamp(datetime(2026, 11, 30, 13, 3, 11, 999_999, tzinfo=UTC)) == "2026-11-30T13:03:11.999Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        utc_timestamp(datetime(2026, 11, 30))


def test_last_switch_open_reads_back_to_the_last_switch_record_only(journal: Journal) -> None:
    assert journal.last_switch_open() is False  # no journal yet
    journal.append("intent", switch="s1", action="up", why="up a", steps=["start a"], **{"from": None, "to": "a"})
    assert journal.last_switch_open() is True
    journal.append("step", switch="s1", step="start a")
    journal.append("watchdog", event="pass", lane="a")  # records of no switch do not count
    assert journal.last_switch_open() is True, "killed past its last step: its steps but no outcome"
    journal.append("outcome", switch="s1", result="ok")
    journal.append("watchdog", event="pass", lane="a")
    assert journal.last_switch_open() is False
    with journal.path.open("ab") as out:
        out.write(b'{"kind": "intent", "switch": \n')  # a torn line is skipped, not taken for a switch
    assert journal.last_switch_open() is False
