"""Hostile state through the real CLI: corrupt or wrong-shaped watchdog.json, state.json and journal
records, links and folders others can write. Every case runs `python -m lanectl` as a user would and
checks the exit code, what is said, and what is left on disk; none may show a traceback or hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_in_process import run_cli
from tests.conftest import REPO

TIMEOUT = 60  # a hang is a failure, not a wait


def lanectl(*args: str, state: Path, kernel_log: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(state), "LANECTL_RECIPES": str(REPO / "recipes"), "COLUMNS": "200"})
    if kernel_log is not None:
        env["LANECTL_KERNEL_LOG"] = f"file:{kernel_log}"
    result = run_cli(*args, cwd=REPO, env=env, timeout=TIMEOUT)
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture
def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    return directory


@pytest.fixture
def kernel_log(tmp_path: Path) -> Path:
    log = tmp_path / "kern.log"
    log.write_text("")
    return log


def journal_records(state: Path) -> list[dict]:
    path = state / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- watchdog.json: moved aside, reported, the watchdog starts afresh ---------------------------------

BAD_WATCHDOG_FILES = {
    "not-json": b'{"memory": ',
    "empty": b"",
    "non-utf8": b'\xff\xfe{"version": 1}',
    "a-list": b"[]",
    "wrong-type-counter": b'{"rollbacks_total": "many"}',
    "bool-as-count": b'{"rollbacks_total": true}',
    "wrong-type-restarts": b'{"memory": {"restarts": "yesterday"}}',
    "restart-not-a-timestamp": b'{"memory": {"restarts": ["yesterday"]}}',
    "heartbeat-without-timezone": b'{"heartbeat": "2026-11-30T12:00:00"}',
    "huge-integer": b'{"rollbacks_total": 1' + b"0" * 5000 + b"}",
    "integer-past-2-53": b'{"xid_hardware_total": 18014398509481984}',
    "negative-count": b'{"memory": {"consecutive_failures": -1}}',
    "infinite-float": b'{"last_pass_seconds": 1e999}',
    "nan": b'{"log_since": NaN}',
    "log-cursor-in-year-10-300": b'{"log_since": 1e300}',
    "unknown-key": b'{"surprise": 1}',
    "newer-version": b'{"version": 2}',
    "cursor-not-text": b'{"kernel_cursor": 42}',
    "xid-code-not-a-number": b'{"xid_total": {"thirty-one": 1}}',
    "last-action-wrong-shape": b'{"last_action": {"ts": 1}}',
    "nested-past-the-recursion-limit": b"[" * 100_000,
    "two-mebibytes": b" " * (2 * 1024 * 1024) + b"{}",
}


@pytest.mark.parametrize("content", BAD_WATCHDOG_FILES.values(), ids=BAD_WATCHDOG_FILES.keys())
def test_a_bad_watchdog_json_is_moved_aside_reported_and_the_pass_runs(state: Path, kernel_log: Path,
                                                                         content: bytes):
    (state / "watchdog.json").write_bytes(content)

    result = lanectl("watchdog", "check", state=state, kernel_log=kernel_log)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "-: none: no active lane: nothing to watch\n"
    assert f"{state / 'watchdog.json'} was not a valid watchdog state (" in result.stderr
    aside = list(state.glob("watchdog.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content, "moved aside, never changed"
    assert f"moved aside to {aside[0]}" in result.stderr
    assert [r["event"] for r in journal_records(state)] == ["state-moved-aside"]
    fresh = json.loads((state / "watchdog.json").read_text())
    assert fresh["last_pass_result"] == "none: no active lane: nothing to watch"


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_watchdog_json_that_is_not_a_file_is_moved_aside(state: Path, kernel_log: Path, kind: str):
    path = state / "watchdog.json"
    path.mkdir() if kind == "directory" else os.mkfifo(path)

    result = lanectl("watchdog", "check", state=state, kernel_log=kernel_log)

    assert result.returncode == 0, result.stderr
    assert "was not a valid watchdog state (" in result.stderr and "moved aside to" in result.stderr
    assert json.loads(path.read_text())["last_pass"]


def test_watchdog_status_reports_a_bad_file_and_leaves_it_for_the_watchdog(state: Path):
    (state / "watchdog.json").write_bytes(b'{"rollbacks_total": "many"}')

    result = lanectl("watchdog", "status", state=state)

    assert result.returncode == 0
    assert (f"{state / 'watchdog.json'} is not a valid watchdog state (rollbacks_total: Input should be a valid "
            f"integer); the next pass moves it aside") in result.stderr
    assert (state / "watchdog.json").read_bytes() == b'{"rollbacks_total": "many"}'


# --- state.json: exit 2 with the file named, left untouched -------------------------------------------

BAD_STATE_FILES = {
    "not-json": (b'{"version": 1, "active": "demo', "not JSON"),
    "non-utf8": (b'{"version": 1, "active": "\xff"}', "not UTF-8 text (byte 26)"),
    "a-list": (b"[]", "expected a JSON object, got list"),
    "active-not-text": (b'{"version": 1, "active": 5}', "active: Input should be a valid string"),
    "known-good-not-a-list": (b'{"version": 1, "known_good": "demo-h1"}', "known_good: Input should be a valid array"),
    "armed-not-bool": (b'{"version": 1, "watchdog_armed": "yes"}', "watchdog_armed: Input should be a valid boolean"),
    "lease-wrong-shape": (b'{"version": 1, "watchdog_lease": {"until": 1}}',
                          "watchdog_lease.until: Input should be a valid string; "
                          "watchdog_lease.reason: Field required"),
    "lease-until-not-a-time": (b'{"version": 1, "watchdog_lease": {"until": "soon", "reason": "r", "by": "b"}}',
                               "watchdog_lease.until: Invalid isoformat string: 'soon'"),
    "version-infinite": (b'{"version": 1e999}', "version must be 1, got inf"),
    "version-huge": (b'{"version": 1' + b"0" * 5000 + b"}", "not JSON"),
    "version-true": (b'{"version": true}', "version must be 1, got True"),
    "nested-past-the-recursion-limit": (b"[" * 100_000, "not JSON"),
    "two-mebibytes": (b" " * (2 * 1024 * 1024) + b"{}", "more than the 1048576 bytes"),
}


@pytest.mark.parametrize(("content", "detail"), BAD_STATE_FILES.values(), ids=BAD_STATE_FILES.keys())
@pytest.mark.parametrize("command", [("watchdog", "check"), ("watchdog", "status"), ("watchdog", "arm")])
def test_a_bad_state_json_exits_2_naming_the_file(state: Path, kernel_log: Path, content: bytes, detail: str,
                                                 command: tuple[str, ...]):
    (state / "state.json").write_bytes(content)

    result = lanectl(*command, state=state, kernel_log=kernel_log)

    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f"{state / 'state.json'} is not a readable lane state (" in result.stdout + result.stderr
    assert detail in result.stdout + result.stderr
    assert (state / "state.json").read_bytes() == content


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_state_json_that_is_not_a_file_exits_2_without_hanging(state: Path, kernel_log: Path, kind: str):
    path = state / "state.json"
    path.mkdir() if kind == "directory" else os.mkfifo(path)

    result = lanectl("watchdog", "check", state=state, kernel_log=kernel_log)

    assert result.returncode == 2
    assert f"{path} is not a readable lane state (" in result.stdout


def test_watchdog_run_journals_a_failed_pass_and_runs_the_next(state: Path, kernel_log: Path):
    (state / "state.json").write_bytes(b'{"version": 1, "active": 5}')
    env = {key: value for key, value in os.environ.items() if not key.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(state), "LANECTL_RECIPES": str(REPO / "recipes")})
    run = subprocess.Popen([sys.executable, "-m", "lanectl", "watchdog", "run", "--kernel-log", f"file:{kernel_log}"],
                           env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(r.get("event") == "pass-failed"
                                                      for r in journal_records(state)):
            time.sleep(0.2)
        (state / "state.json").write_text('{"version": 1}')  # the operator fixes it; no restart needed
        while time.monotonic() < deadline and not (state / "watchdog.json").exists():
            time.sleep(0.2)
        assert run.poll() is None, "the watchdog kept running"
    finally:
        run.terminate()
        _, stderr = run.communicate(timeout=30)
    failed = [r for r in journal_records(state) if r.get("event") == "pass-failed"]
    assert failed and "active: Input should be a valid string" in failed[0]["message"]
    assert "[start] -: none: pass failed: " in stderr
    assert json.loads((state / "watchdog.json").read_text())["last_pass_result"] == (
        "none: no active lane: nothing to watch")
    assert "Traceback" not in stderr


# --- journal records: skipped with their line number, never a traceback -------------------------------

GOOD = {"ts": "2026-11-30T12:00:00.000Z", "who": "root@box", "pid": 1, "kind": "note", "message": "fine"}
BAD_JOURNAL_LINES = {
    "truncated": (b'{"ts": "2026-11-30T12:0', "truncated or corrupt"),
    "non-utf8": (b'{"ts": "\xff", "kind": "note"}', "truncated or corrupt"),
    "a-list": (b"[1, 2]", "truncated or corrupt"),
    "who-an-object": (b'{"who": {"a": 1}, "kind": "note"}', "who: Input should be a valid string"),
    "kind-a-number": (b'{"kind": 5}', "kind: Input should be a valid string"),
    "kind-a-list": (b'{"kind": [5]}', "kind: Input should be a valid string"),
    "pid-text": (b'{"pid": "1", "kind": "note"}', "pid: Input should be a valid integer"),
    "pid-huge": (b'{"pid": 1e999, "kind": "note"}', "pid: Input should be a valid integer"),
    "pid-true": (b'{"pid": true, "kind": "note"}', "pid: Input should be a valid integer"),
    "intent-steps-text": (b'{"kind": "intent", "switch": "s", "action": "up", "from": null, "to": "x", '
                          b'"why": "w", "steps": "all"}', "steps: Input should be a valid list"),
    "intent-without-to": (b'{"kind": "intent", "switch": "s", "action": "up", "from": null, "why": "w", '
                          b'"steps": []}', "to: Field required"),
    "outcome-switch-number": (b'{"kind": "outcome", "switch": 7, "result": "ok"}',
                              "switch: Input should be a valid string"),
    "nested-past-the-recursion-limit": (b"[" * 100_000, "truncated or corrupt"),
    "integer-of-5000-digits": (b'{"pid": 1' + b"0" * 5000 + b"}", "truncated or corrupt"),
    "two-mebibyte-line": (b'{"kind": "note", "message": "' + b"x" * (2 * 1024 * 1024) + b'"}',
                          "longer than 1048576 bytes"),
}


@pytest.mark.parametrize(("line", "why"), BAD_JOURNAL_LINES.values(), ids=BAD_JOURNAL_LINES.keys())
def test_history_skips_a_bad_record_naming_its_line(state: Path, line: bytes, why: str):
    good = json.dumps(GOOD).encode()
    (state / "journal.jsonl").write_bytes(b"\n".join([good, line, good]) + b"\n")

    result = lanectl("history", state=state)
    as_json = lanectl("history", "--json", state=state)

    assert result.returncode == 0 and as_json.returncode == 0
    assert result.stdout.count("fine") == 2
    assert f"journal: journal.jsonl line 2 from the end: unreadable record ({why}, {len(line)} bytes); ignored" \
        in result.stderr
    data = json.loads(as_json.stdout)["data"]
    assert len(data["records"]) == 2 and len(data["problems"]) == 1


def test_a_bad_intent_does_not_reach_a_switch_or_status(state: Path, kernel_log: Path):
    bad_intent = {**GOOD, "kind": "intent", "switch": "s1", "action": "up", "from": None, "to": "demo-h1",
                  "why": "w", "steps": "stop-old"}
    (state / "journal.jsonl").write_text(json.dumps(bad_intent) + "\n")

    result = lanectl("status", "--json", state=state)

    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["data"]
    assert data["unfinished_switch"] is None
    assert data["journal_problems"] == [
        "journal.jsonl line 1 from the end: unreadable record (steps: Input should be a valid list, "
        f"{len(json.dumps(bad_intent))} bytes); ignored"]


# --- links and folders others can write: refused with the fix, exit 2 ---------------------------------


@pytest.mark.parametrize("name", ["state.json", "watchdog.json", "watchdog.pass.lock"])
def test_a_state_file_that_is_a_link_is_refused_and_its_target_untouched(state: Path, kernel_log: Path,
                                                                         tmp_path: Path, name: str):
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    (state / name).symlink_to(target)

    result = lanectl("watchdog", "check", state=state, kernel_log=kernel_log)

    assert result.returncode == 2, (result.stdout, result.stderr)
    assert (f"{state / name} is a symbolic link (to {target}); lanectl does not read or write state through "
            f"links. Remove the link (rm {state / name})") in result.stdout + result.stderr
    assert target.read_text() == "precious\n"


def test_a_journal_link_is_refused_by_history_and_by_a_writing_command(state: Path, tmp_path: Path):
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    (state / "journal.jsonl").symlink_to(target)

    for command in (("history",), ("watchdog", "disarm", "--for", "1h", "--reason", "bench")):
        result = lanectl(*command, state=state)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert f"{state / 'journal.jsonl'} is a symbolic link" in result.stderr
    assert target.read_text() == "precious\n"


@pytest.mark.parametrize("where", ["the folder", "a folder above it"])
def test_a_state_folder_reached_through_a_link_is_refused(tmp_path: Path, kernel_log: Path, where: str):
    real = tmp_path / "real" / "state"
    real.mkdir(parents=True, mode=0o700)
    if where == "the folder":
        link = tmp_path / "state-link"
        link.symlink_to(real)
        state, named = link, link
    else:
        link = tmp_path / "parent-link"
        link.symlink_to(real.parent)
        state, named = link / "state", link

    result = lanectl("watchdog", "check", state=state, kernel_log=kernel_log)

    assert result.returncode == 2
    assert (f"lanectl: state folder {state}: {named} is a symbolic link; lanectl does not keep state through "
            f"links. Set LANECTL_STATE_DIR={real} (the real folder)") in result.stderr
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_state_folder_others_can_write_is_refused_with_the_chmod(state: Path, kernel_log: Path, mode: int):
    state.chmod(mode)

    result = lanectl("watchdog", "check", state=state, kernel_log=kernel_log)

    assert result.returncode == 2
    assert (f"lanectl: state folder {state}: {state} can be written by other users (mode {mode:04o}); "
            f"fix: chmod go-w {state}") in result.stderr
    assert list(state.iterdir()) == []


def test_a_folder_above_that_others_can_write_is_refused(tmp_path: Path, kernel_log: Path):
    above = tmp_path / "shared"
    above.mkdir()
    above.chmod(0o777)  # no sticky bit: anyone may rename the state folder away and put a link there
    state = above / "state"

    result = lanectl("watchdog", "check", state=state, kernel_log=kernel_log)

    assert result.returncode == 2
    assert f"{above} can be written by other users (mode 0777); fix: chmod go-w {above}" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_state_folder_owned_by_another_user_is_refused_with_the_chown(state: Path, kernel_log: Path):
    os.chown(state, 65534, 65534)

    result = lanectl("watchdog", "check", state=state, kernel_log=kernel_log)

    assert result.returncode == 2
    assert f"lanectl: state folder {state}: {state} belongs to " in result.stderr
    assert f"fix: chown root {state}" in result.stderr


@pytest.mark.parametrize("duration", ["999999999999h", "9000h"])
def test_a_disarm_longer_than_a_year_exits_2(state: Path, duration: str):
    result = lanectl("watchdog", "disarm", "--for", duration, "--reason", "x", state=state)

    assert result.returncode == 2
    assert "the watchdog can be disarmed for at most 366 days" in result.stderr
    assert not (state / "state.json").exists()


@pytest.mark.parametrize("journal", ["a-folder", "a-link"])
def test_a_disarm_that_cannot_be_journaled_leaves_the_watchdog_as_it_was(state: Path, tmp_path: Path, journal: str):
    assert lanectl("watchdog", "arm", state=state).returncode == 0
    before = (state / "state.json").read_bytes()
    (state / "journal.jsonl").unlink(missing_ok=True)
    if journal == "a-folder":
        (state / "journal.jsonl").mkdir()
    else:
        (tmp_path / "elsewhere.jsonl").write_text("")
        (state / "journal.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")

    result = lanectl("watchdog", "disarm", "--for", "1h", "--reason", "maintenance", state=state)
    status = lanectl("watchdog", "status", "--json", state=state)

    assert result.returncode == 2 and "journal" in result.stderr and "run the command again" in result.stderr
    assert json.loads(status.stdout)["data"]["armed"] is True  # neither disarmed nor journaled
    assert json.loads((state / "state.json").read_bytes())["watchdog_lease"] is None
    assert json.loads(before)["watchdog_armed"] is True


def test_a_disarm_on_a_fresh_box_that_cannot_be_journaled_writes_no_state(state: Path):
    (state / "journal.jsonl").mkdir()

    result = lanectl("watchdog", "disarm", "--for", "1h", "--reason", "maintenance", state=state)

    assert result.returncode == 2 and "is a folder, not a file; move it aside" in result.stderr
    assert not (state / "state.json").exists()


def test_a_disarm_reason_that_is_not_utf8_is_refused_and_state_stays_readable(state: Path):
    result = lanectl("watchdog", "disarm", "--for", "1h", "--reason", os.fsdecode(b"bad \xff byte"), state=state)

    assert result.returncode == 2
    assert "the disarm reason is not UTF-8 text" in result.stderr
    assert not (state / "state.json").exists()
    assert lanectl("watchdog", "status", state=state).returncode == 0
