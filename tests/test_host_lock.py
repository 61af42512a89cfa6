from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lanectl.state.lock import HOLDERLESS_GRACE_SECONDS, HostLock, LockBusy

REPO = Path(__file__).resolve().parent.parent

# Takes the lock as argv[2] at 12:03:11 UTC (after "ready" and waiting for the file argv[3], if given),
# says "held" (or "busy"), releases on the first line of stdin, says "released", lives on until stdin closes.
HOLDER_SCRIPT = textwrap.dedent("""
    import sys
    from datetime import UTC, datetime
    from pathlib import Path
    from lanectl.state.lock import HostLock, LockBusy
    lock = HostLock(Path(sys.argv[1]) / "lock", sys.argv[2], now=lambda: datetime(2026, 11, 30, 12, 3, 11, tzinfo=UTC))
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


def holder_file(directory: Path) -> dict:
    return json.loads((directory / "lock" / "holder.json").read_text())


def write_holder(directory: Path, **fields: object) -> None:
    (directory / "lock").mkdir(parents=True)
    holder = {"pid": os.getpid(), "command": "lanectl up h1-REF", "since": "2026-11-30T12:03:11.000Z",
              "host": socket.gethostname(), **fields}
    (directory / "lock" / "holder.json").write_text(json.dumps(holder))


def dead_pid() -> int:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    return finished.pid


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

    lock = HostLock(tmp_path / "lock", "lanectl rollback", clock=lambda: elapsed, sleep=nap)
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

    lock = HostLock(tmp_path / "lock", "lanectl rollback", sleep=nap)
    lock.acquire(30)

    assert len(naps) == 1
    assert holder_file(tmp_path)["pid"] == os.getpid()
    assert holder_file(tmp_path)["command"] == "lanectl rollback"
    assert lock.took_over_from is None
    lock.release()
    assert not (tmp_path / "lock").exists()


def test_the_lock_of_a_killed_holder_is_taken_over(tmp_path: Path, holders: list[LockHolder]):
    holder = holding(tmp_path, holders)
    holder.stop()

    lock = HostLock(tmp_path / "lock", "lanectl rollback")
    lock.acquire(0)

    assert lock.took_over_from is not None
    assert lock.took_over_from["pid"] == holder.pid
    assert lock.took_over_from["command"] == "lanectl up h2-REF"
    assert lock.took_over_from["reason"] == f"pid {holder.pid} is no longer running"
    assert holder_file(tmp_path)["pid"] == os.getpid()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lock"]


def test_the_lock_of_a_killed_but_unreaped_holder_is_taken_over(tmp_path: Path, holders: list[LockHolder]):
    holder = holding(tmp_path, holders)
    holder.process.kill()
    stat = Path(f"/proc/{holder.pid}/stat")
    for _ in range(1000):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.005)

    lock = HostLock(tmp_path / "lock", "lanectl rollback")
    lock.acquire(0)

    assert lock.took_over_from is not None
    assert lock.took_over_from["reason"] == f"pid {holder.pid} has exited (its parent has not reaped it yet)"


@pytest.mark.skipif(not Path("/proc/sys/kernel/random/boot_id").exists(), reason="needs Linux's boot_id")
def test_a_lock_taken_before_the_last_boot_is_stale_even_if_its_pid_is_alive_now(tmp_path: Path):
    write_holder(tmp_path, pid=os.getpid(), boot_id="a-previous-boot")

    lock = HostLock(tmp_path / "lock", "lanectl up h1-REF")
    lock.acquire(0)

    assert lock.took_over_from is not None
    assert lock.took_over_from["reason"] == f"the host restarted since pid {os.getpid()} took the lock"


def test_a_reused_pid_does_not_keep_a_dead_holders_lock(tmp_path: Path):
    start = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
    write_holder(tmp_path, pid=os.getppid(), pid_start=start + 1)

    lock = HostLock(tmp_path / "lock", "lanectl up h1-REF")
    lock.acquire(0)

    assert lock.took_over_from is not None
    assert lock.took_over_from["reason"] == f"pid {os.getppid()} is now a different process"


def test_a_live_holder_is_never_taken_over(tmp_path: Path):
    start = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
    write_holder(tmp_path, pid=os.getppid(), pid_start=start)

    with pytest.raises(LockBusy):
        HostLock(tmp_path / "lock", "lanectl up h1-REF").acquire(0)
    assert holder_file(tmp_path)["pid"] == os.getppid()


def test_a_holder_on_another_host_is_not_judged_from_here(tmp_path: Path, timezone_two_hours_east: None):
    pid = dead_pid()
    write_holder(tmp_path, pid=pid, host="other-box")

    with pytest.raises(LockBusy) as busy:
        HostLock(tmp_path / "lock", "lanectl up h2-REF").acquire(0)

    assert str(busy.value) == f"locked by pid {pid} (lanectl up h1-REF) on other-box since 14:03:11"


def test_a_lock_without_holder_file_is_waited_for_while_young_and_taken_over_when_old(tmp_path: Path):
    (tmp_path / "lock").mkdir()

    with pytest.raises(LockBusy) as busy:
        HostLock(tmp_path / "lock", "lanectl up h2-REF").acquire(0)
    assert str(busy.value).startswith("locked by an unknown process (holder.json missing or unreadable) since ")
    assert busy.value.holder["pid"] is None

    made = time.time() - HOLDERLESS_GRACE_SECONDS - 5
    os.utime(tmp_path / "lock", (made, made))
    lock = HostLock(tmp_path / "lock", "lanectl up h2-REF")
    lock.acquire(0)
    assert lock.took_over_from is not None
    assert lock.took_over_from["pid"] is None
    assert lock.took_over_from["reason"].startswith("holder.json missing or unreadable and the lock is 1")


def test_only_one_of_many_contenders_takes_over_a_stale_lock(tmp_path: Path, holders: list[LockHolder]):
    write_holder(tmp_path, pid=dead_pid())
    go = tmp_path / "go"
    contenders = [LockHolder(tmp_path, f"lanectl up contender-{number}", go=go) for number in range(6)]
    holders.extend(contenders)
    assert [contender.said() for contender in contenders] == ["ready"] * 6
    go.touch()

    answers = {contender.pid: contender.said() for contender in contenders}

    assert sorted(answers.values()) == ["busy"] * 5 + ["held"]
    assert answers[holder_file(tmp_path)["pid"]] == "held"


def test_a_contender_looks_again_under_the_takeover_guard_before_removing_a_lock(
    tmp_path: Path, holders: list[LockHolder]
):
    """The race the guard exists for: judged stale, then replaced by a live holder before the rename."""
    write_holder(tmp_path, pid=dead_pid())
    guard = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(guard, fcntl.LOCK_EX)
    try:
        contender = LockHolder(tmp_path, "lanectl up h2-REF")
        holders.append(contender)
        deadline = time.monotonic() + 10
        while not any(line.split()[1] == "->" and line.split()[5] == str(contender.pid)
                      for line in Path("/proc/locks").read_text().splitlines()):
            assert time.monotonic() < deadline, "the contender never waited for the takeover guard"
            time.sleep(0.005)  # until it waits for the guard, having judged the lock stale
        shutil.rmtree(tmp_path / "lock")
        write_holder(tmp_path, pid=os.getpid())
    finally:
        os.close(guard)

    assert contender.said() == "busy"
    assert holder_file(tmp_path)["pid"] == os.getpid()


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path: Path):
    lock = HostLock(tmp_path / "lock", "lanectl up h2-REF")
    lock.acquire(0)
    someone_else = {**holder_file(tmp_path), "since": "2026-11-30T12:09:00.000Z"}
    (tmp_path / "lock" / "holder.json").write_text(json.dumps(someone_else))

    lock.release()

    assert holder_file(tmp_path) == someone_else


def test_a_forked_child_does_not_release_its_parents_lock(tmp_path: Path):
    lock = HostLock(tmp_path / "lock", "lanectl up h2-REF")
    lock.acquire(0)

    child = os.fork()
    if child == 0:
        lock.release()
        os._exit(0)
    os.waitpid(child, 0)

    assert holder_file(tmp_path)["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "lock").exists()


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, RuntimeError])
def test_the_lock_is_released_however_the_block_ends(tmp_path: Path, interruption: type[BaseException]):
    lock = HostLock(tmp_path / "lock", "lanectl up h2-REF")

    with pytest.raises(interruption):
        with lock.held(0):
            assert holder_file(tmp_path)["pid"] == os.getpid()
            raise interruption()

    assert not (tmp_path / "lock").exists()
    with HostLock(tmp_path / "lock", "lanectl rollback").held(0):
        assert holder_file(tmp_path)["command"] == "lanectl rollback"
