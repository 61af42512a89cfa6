from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lanectl.state.lock import HostLock, LockBusy
from lanectl.state.paths import StateDirUnsafe, StateFiles

REPO = Path(__file__).resolve().parent.parent

# Takes the lock as argv[2] at 12:03:11 UTC (after "ready" and waiting for the file argv[3], if given),
# says "held" (or "busy"), releases on the first line of stdin, says "released", lives on until stdin closes.
HOLDER_SCRIPT = textwrap.dedent("""
    import sys
    from datetime import UTC, datetime
    from pathlib import Path
    from lanectl.state.lock import HostLock, LockBusy
    from lanectl.state.paths import StateFiles
    lock = HostLock(StateFiles(Path(sys.argv[1])).host_lock, sys.argv[2],
                    now=lambda: datetime(2026, 11, 30, 12, 3, 11, tzinfo=UTC))
    go = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    if go is not None:
        print("ready", flush=True)
        while not go.exists():
            pass
    try:
        lock.acquire(0)
    except LockBusy:
        print("busy", flush=True)
        sys.exit(0)
    print("held", flush=True)
    sys.stdin.readline()
    lock.release()
    print("released", flush=True)
    sys.stdin.readline()
""")


class LockHolder:
    """A separate process holding (or trying to take) the host lock."""

    def __init__(self, directory: Path, command: str = "lanectl up h2-REF", go: Path | None = None):
        arguments = [sys.executable, "-c", HOLDER_SCRIPT, str(directory), command] + ([str(go)] if go else [])
        self.process = subprocess.Popen(arguments, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONPATH": str(REPO)})
        self.pid = self.process.pid

    def said(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def release(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("release\n")
        self.process.stdin.flush()
        assert self.said() == "released"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def holders() -> Iterator[list[LockHolder]]:
    started: list[LockHolder] = []
    yield started
    for holder in started:
        holder.stop()


@pytest.fixture
def timezone_two_hours_east() -> Iterator[None]:
    """LockBusy shows the holder's `since` in local time; a POSIX TZ string needs no tzdata."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "XYZ-2"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def holding(directory: Path, holders: list[LockHolder], command: str = "lanectl up h2-REF") -> LockHolder:
    holder = LockHolder(directory, command)
    holders.append(holder)
    assert holder.said() == "held"
    return holder


def lock_at(directory: Path, command: str = "lanectl rollback", **options: object) -> HostLock:
    return HostLock(StateFiles(directory).host_lock, command, **options)  # type: ignore[arg-type]


def details(directory: Path) -> Path:
    return lock_at(directory).holder_path


def holder_file(directory: Path) -> dict:
    return json.loads(details(directory).read_text())


def test_the_holder_details_are_written_beside_the_lock_once_it_is_held(tmp_path: Path):
    lock = lock_at(tmp_path, "lanectl up h2-REF", now=lambda: datetime(2026, 11, 30, 12, 3, 11, tzinfo=UTC))

    with lock.held(0):
        assert holder_file(tmp_path) == {"pid": os.getpid(), "command": "lanectl up h2-REF",
                                         "since": "2026-11-30T12:03:11.000Z", "host": socket.gethostname()}
        assert details(tmp_path).stat().st_mode & 0o777 == 0o600
        assert sorted(p.name for p in tmp_path.iterdir()) == ["host.lock", "host.lock.json"]

    assert sorted(p.name for p in tmp_path.iterdir()) == ["host.lock"]  # the lock file stays; see lock.py


def test_second_contender_polls_until_the_wait_ends_then_names_the_holder(
    tmp_path: Path, holders: list[LockHolder], timezone_two_hours_east: None
):
    holder = holding(tmp_path, holders)
    elapsed = 0.0
    naps: list[float] = []

    def nap(seconds: float) -> None:
        nonlocal elapsed
        naps.append(seconds)
        elapsed += seconds

    lock = lock_at(tmp_path, clock=lambda: elapsed, sleep=nap)
    with pytest.raises(LockBusy) as busy:
        lock.acquire(2.0)

    assert str(busy.value) == f"locked by pid {holder.pid} (lanectl up h2-REF) since 14:03:11"
    assert busy.value.exit_code == 1
    assert busy.value.holder["pid"] == holder.pid
    assert busy.value.holder["command"] == "lanectl up h2-REF"
    assert sum(naps) == pytest.approx(2.0)
    assert len(naps) >= 20 and max(naps) <= 0.1
    assert holder_file(tmp_path)["pid"] == holder.pid
    assert lock.holder is None and lock.took_over_from is None


def test_contender_gets_the_lock_when_the_holder_releases_within_the_wait(
    tmp_path: Path, holders: list[LockHolder]
):
    holder = holding(tmp_path, holders)
    naps: list[float] = []

    def nap(seconds: float) -> None:
        if not naps:
            holder.release()
        naps.append(seconds)
        time.sleep(seconds)

    lock = lock_at(tmp_path, sleep=nap)
    lock.acquire(30)

    assert len(naps) == 1
    assert holder_file(tmp_path)["pid"] == os.getpid()
    assert holder_file(tmp_path)["command"] == "lanectl rollback"
    assert lock.took_over_from is None  # released properly: nothing left behind
    lock.release()
    assert not details(tmp_path).exists()


def test_a_holder_killed_with_sigkill_leaves_a_lock_the_next_process_takes_at_once(
    tmp_path: Path, holders: list[LockHolder]
):
    killed = holding(tmp_path, holders)
    killed.process.send_signal(signal.SIGKILL)
    killed.process.wait(timeout=10)

    # The next process, with no wait at all: the kernel let the killed holder's flock go.
    taker = holding(tmp_path, holders, command="lanectl rollback")

    assert holder_file(tmp_path)["pid"] == taker.pid
    assert holder_file(tmp_path)["command"] == "lanectl rollback"


def test_whoever_takes_a_lock_a_killed_holder_left_learns_whose_it_was(tmp_path: Path, holders: list[LockHolder]):
    killed = holding(tmp_path, holders)
    killed.process.send_signal(signal.SIGKILL)  # not reaped yet: a zombie holds no file, and no flock

    lock = lock_at(tmp_path)
    deadline = time.monotonic() + 10
    while True:  # the kernel closes a killed process's files as it exits, not at once
        try:
            lock.acquire(0)
            break
        except LockBusy:
            assert time.monotonic() < deadline, "the killed holder's lock was never let go"
            time.sleep(0.01)

    assert lock.took_over_from == {"pid": killed.pid, "command": "lanectl up h2-REF",
                                   "since": "2026-11-30T12:03:11.000Z", "host": socket.gethostname(),
                                   "reason": f"pid {killed.pid} ended without releasing the lock"}
    assert holder_file(tmp_path)["pid"] == os.getpid()
    lock.release()


def hold_by_hand(directory: Path, holder: dict | None) -> int:
    """Hold the lock through a file descriptor of our own, with `holder` as its details (none if None)."""
    fd = os.open(StateFiles(directory).host_lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if holder is not None:
        details(directory).write_text(json.dumps(holder))
    return fd


def test_a_holder_on_another_host_is_named_with_its_host(tmp_path: Path, timezone_two_hours_east: None):
    fd = hold_by_hand(tmp_path, {"pid": 4242, "command": "lanectl up h1-REF", "since": "2026-11-30T12:03:11.000Z",
                                 "host": "other-box"})
    try:
        with pytest.raises(LockBusy) as busy:
            lock_at(tmp_path, "lanectl up h2-REF").acquire(0)
    finally:
        os.close(fd)

    assert str(busy.value) == "locked by pid 4242 (lanectl up h1-REF) on other-box since 14:03:11"


@pytest.mark.parametrize("written", [None, '{"pid": 0, "command": "x", "since": "now", "host": "h"}', "{"])
def test_a_lock_whose_details_are_missing_or_unreadable_is_still_busy(tmp_path: Path, written: str | None):
    fd = hold_by_hand(tmp_path, None)
    if written is not None:
        details(tmp_path).write_text(written)
    try:
        with pytest.raises(LockBusy) as busy:
            lock_at(tmp_path).acquire(0)
    finally:
        os.close(fd)

    assert str(busy.value) == "locked by an unknown process (host.lock.json missing or unreadable)"
    assert busy.value.holder["pid"] is None


def test_only_one_of_many_contenders_takes_the_lock(tmp_path: Path, holders: list[LockHolder]):
    go = tmp_path / "go"
    contenders = [LockHolder(tmp_path, f"lanectl up contender-{number}", go=go) for number in range(6)]
    holders.extend(contenders)
    assert [contender.said() for contender in contenders] == ["ready"] * 6
    go.touch()

    answers = {contender.pid: contender.said() for contender in contenders}

    assert sorted(answers.values()) == ["busy"] * 5 + ["held"]
    assert answers[holder_file(tmp_path)["pid"]] == "held"


def test_a_forked_child_does_not_release_its_parents_lock(tmp_path: Path, holders: list[LockHolder]):
    lock = lock_at(tmp_path, "lanectl up h2-REF")
    lock.acquire(0)

    child = os.fork()
    if child == 0:
        lock.release()
        os._exit(0)
    os.waitpid(child, 0)

    other = LockHolder(tmp_path, "lanectl rollback")
    holders.append(other)
    assert other.said() == "busy"
    assert holder_file(tmp_path)["pid"] == os.getpid()
    lock.release()
    assert not details(tmp_path).exists()


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, RuntimeError])
def test_the_lock_is_released_however_the_block_ends(tmp_path: Path, interruption: type[BaseException]):
    lock = lock_at(tmp_path, "lanectl up h2-REF")

    with pytest.raises(interruption):
        with lock.held(0):
            assert holder_file(tmp_path)["pid"] == os.getpid()
            raise interruption()

    assert not details(tmp_path).exists()
    with lock_at(tmp_path, "lanectl rollback").held(0):
        assert holder_file(tmp_path)["command"] == "lanectl rollback"


@pytest.mark.parametrize("name", ["host.lock", "host.lock.json"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path, name: str):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    (state / name).symlink_to(target)

    with pytest.raises(StateDirUnsafe, match=f"{state / name} is a symbolic link"):
        lock_at(state).acquire(0)

    assert target.read_text() == "precious\n"
