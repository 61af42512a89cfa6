"""One lock per host for every mutating command: an atomic `mkdir state_dir/lock` plus `lock/holder.json`.

A directory rather than a bare `flock`, as kamal does: it says who holds it, for what and since when
(`cat lock/holder.json`), which is what the operator waiting for it needs to see. The price is that a
holder killed by SIGKILL leaves it behind, so a holder that is gone (its pid no longer runs, or the host
restarted since) is detected and its lock taken over, and the taker records whose it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lanectl.errors import OperationFailed
from lanectl.state.journal import utc_now, utc_timestamp
from lanectl.state.paths import create_state_dir

HOLDER_NAME = "holder.json"
POLL_SECONDS = 0.1
# A lock without a readable holder.json is normally a holder between its mkdir and its write,
# a few milliseconds; only after this long do we believe it was killed there.
HOLDERLESS_GRACE_SECONDS = 10.0
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


class LockBusy(OperationFailed):
    """Another live process holds the host lock; `holder` is its holder.json (pid None if unreadable)."""

    def __init__(self, holder: dict[str, Any]):
        self.holder = holder
        since = _local_clock_time(holder.get("since"))
        if holder.get("pid") is None:
            message = f"locked by an unknown process (holder.json missing or unreadable) since {since}"
        else:
            host = holder.get("host")
            elsewhere = f" on {host}" if host and host != socket.gethostname() else ""
            message = f"locked by pid {holder['pid']} ({holder.get('command')}){elsewhere} since {since}"
        super().__init__(message)


class HostLock:
    """The lock `directory` (normally `state_dir() / "lock"`), taken by `command` (shown to whoever waits)."""

    def __init__(
        self,
        directory: Path,
        command: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], datetime] = utc_now,
    ):
        self.path = directory
        self.command = command
        self.clock = clock
        self.sleep = sleep
        self.now = now
        self.holder: dict[str, Any] | None = None  # ours, while we hold the lock
        # The dead holder whose lock this process removed, with a `reason`: for the caller to journal.
        self.took_over_from: dict[str, Any] | None = None

    def acquire(self, wait_seconds: float) -> None:
        """Take the lock, waiting up to `wait_seconds` for a live holder; raises LockBusy after that."""
        if self.holder is not None:
            raise RuntimeError(f"{self.path} is already held by this HostLock")
        self.took_over_from = None
        create_state_dir(self.path.parent)
        deadline = self.clock() + wait_seconds
        while True:
            try:
                os.mkdir(self.path, 0o700)
            except FileExistsError:
                pass
            else:
                if self._claim():
                    return
                continue
            holder, gone_because = self._inspect()
            if holder is None:
                continue  # released between our mkdir and our look: try again at once
            if gone_because is not None and self._take_over():
                continue
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise LockBusy(holder)
            self.sleep(min(POLL_SECONDS, remaining))

    def release(self) -> None:
        """Remove the lock if it is still ours (same pid, same `since`); never anyone else's."""
        ours, self.holder = self.holder, None
        # A forked child inherits this object, not the lock.
        if ours is None or ours["pid"] != os.getpid():
            return
        current = self._read_holder()
        if current is None or current["pid"] != ours["pid"] or current["since"] != ours["since"]:
            return
        # holder.json first: a release killed half-way leaves a holder-less lock, taken over after the grace.
        (self.path / HOLDER_NAME).unlink(missing_ok=True)
        shutil.rmtree(self.path, ignore_errors=True)

    @contextlib.contextmanager
    def held(self, wait_seconds: float) -> Iterator[HostLock]:
        """`with lock.held(30):` releases on any way out, Ctrl-C (KeyboardInterrupt) included."""
        self.acquire(wait_seconds)
        try:
            yield self
        finally:
            self.release()

    def _claim(self) -> bool:
        """Write our holder.json into the lock dir we just made; False if the dir was taken from us meanwhile."""
        pid = os.getpid()
        holder = {
            "pid": pid,
            "command": self.command,
            "since": utc_timestamp(self.now()),
            "host": socket.gethostname(),
            "boot_id": _boot_id(),
            "pid_start": _process_start(pid),
        }
        made = os.stat(self.path)
        try:
            fd, temp_name = tempfile.mkstemp(dir=self.path, prefix=f".{HOLDER_NAME}.", suffix=".tmp")
            try:
                os.write(fd, json.dumps(holder).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp_name, self.path / HOLDER_NAME)
        except FileNotFoundError:
            return False  # our dir was taken over as holder-less before we could write into it
        except BaseException:
            # Interrupted half-way: a lock left holder-less would block everyone for the grace period.
            if _same_directory(self.path, made):
                shutil.rmtree(self.path, ignore_errors=True)
            raise
        # A writer stalled past the grace period may have had its dir taken over (its holder.json
        # then landed in the removed copy): only a read-back says the lock is really ours.
        if self._read_holder() != holder:
            return False
        self.holder = holder
        return True

    def _inspect(self) -> tuple[dict[str, Any] | None, str | None]:
        """The current holder (None if there is no lock), and why it is gone (None if it may be alive)."""
        try:
            made = os.stat(self.path).st_mtime
        except FileNotFoundError:
            return None, None
        holder = self._read_holder()
        if holder is None:
            unknown = {"pid": None, "command": None, "since": utc_timestamp(datetime.fromtimestamp(made, UTC)),
                       "host": None}
            age = time.time() - made  # against the kernel's clock, which stamped the mtime; not `now`
            if age > HOLDERLESS_GRACE_SECONDS:
                return unknown, f"{HOLDER_NAME} missing or unreadable and the lock is {age:.0f} s old"
            return unknown, None
        return holder, _why_holder_is_gone(holder)

    def _take_over(self) -> bool:
        """Remove the lock if, looked at again under a guard, its holder is still gone; True if it is gone now.

        Renaming alone does not make the takeover safe: a second contender that judged the same dead
        holder could rename the *fresh* lock the first one just made. So the look and the rename happen
        under a `flock` of the folder holding the lock, which the kernel releases if we die.
        """
        guard = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            holder, gone_because = self._inspect()
            if holder is None:
                return True
            if gone_because is None:
                return False
            # The rename makes the lock vanish at once; deleting its contents can then take its time.
            removed = self.path.with_name(f"{self.path.name}.stale-{holder['pid'] or 'unknown'}-{secrets.token_hex(4)}")
            try:
                os.rename(self.path, removed)
            except FileNotFoundError:
                return True
            self.took_over_from = {**holder, "reason": gone_because}
            for leftover in self.path.parent.glob(f"{self.path.name}.stale-*"):  # ours, and any a killed taker left
                shutil.rmtree(leftover, ignore_errors=True)
            return True
        except OSError as exc:
            raise OperationFailed(f"could not take over the stale lock {self.path}: {exc.strerror or exc}") from exc
        finally:
            os.close(guard)

    def _read_holder(self) -> dict[str, Any] | None:
        try:
            holder = json.loads((self.path / HOLDER_NAME).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(holder, dict):
            return None
        pid = holder.get("pid")
        # pid 0 or negative would make os.kill signal a whole process group.
        if type(pid) is not int or pid <= 0:
            return None
        if not all(isinstance(holder.get(key), str) for key in ("command", "since", "host")):
            return None
        return holder


def _why_holder_is_gone(holder: dict[str, Any]) -> str | None:
    if holder["host"] != socket.gethostname():
        return None  # another host's processes cannot be checked from here
    pid = holder["pid"]
    boot_id = _boot_id()
    if holder.get("boot_id") and boot_id and holder["boot_id"] != boot_id:
        # After a reboot the pid may well belong to some unrelated process by now.
        return f"the host restarted since pid {pid} took the lock"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"pid {pid} is no longer running"
    except PermissionError:
        pass  # alive, and someone else's
    state, start = _process_state(pid)
    if state == "Z":
        return f"pid {pid} has exited (its parent has not reaped it yet)"
    if holder.get("pid_start") is not None and start is not None and start != holder["pid_start"]:
        return f"pid {pid} is now a different process"
    return None


def _same_directory(path: Path, made: os.stat_result) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino)


def _boot_id() -> str | None:
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    return _process_state(pid)[1]


def _process_state(pid: int) -> tuple[str | None, int | None]:
    """State letter and start time (clock ticks since boot) from /proc/<pid>/stat; None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None, None
    # The command name (field 2) may hold spaces and parentheses: count fields after the last ")".
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None, None


def _local_clock_time(since: Any) -> str:
    try:
        return datetime.fromisoformat(str(since)).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return str(since)
