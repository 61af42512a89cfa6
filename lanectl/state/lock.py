"""One lock per Docker engine for every mutating command: an `flock` on a file named for the engine, in
`$LANECTL_LOCK_DIR` (default `/run/lock/lanectl`), and who holds it in a `.json` file beside it.

Per engine, not per state folder: two `lanectl up` run by root (state in /var/lib/lanectl) and by a user (state
in ~/.local/state/lanectl) drive the same containers, so they must exclude each other. The engine is named by
its address (the real path of its socket, or host:port), so /var/run/docker.sock and /run/docker.sock are one.
Everyone who may use the engine may take its lock: the folder and its files belong to the socket's group
(`docker`) with group write, and nobody else can write them.

The kernel drops an flock when the process holding it dies, however it dies (SIGKILL included), so a
lock is never left behind and nobody has to judge whether a holder is still alive. The details file
is what the operator waiting for the lock needs to see (`cat host.lock.json`: who, which command,
since when); it is written, atomically, only once the flock is held, and removed before it is let go.
A details file found by whoever takes the lock next was left by a holder that ended without releasing.

The lock file itself is never removed: a process waiting on a file that another one unlinks would
take a lock that nobody else can see.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from lanectl.errors import OperationFailed
from lanectl.records import frozen
from lanectl.state.atomic import write_atomically
from lanectl.state.file_model import Timestamp
from lanectl.state.journal import utc_now, utc_timestamp
from lanectl.state.paths import (
    NotAStateFile,
    StateDirUnsafe,
    check_state_file,
    create_state_dir,
    read_state_file,
    refuse_link,
)
from lanectl.state.strict import Bounds, read_record, record_data

POLL_SECONDS = 0.1
MAX_HOLDER_BYTES = 64 * 1024
LOCK_DIR = Path("/run/lock/lanectl")
DEFAULT_ENGINE = "unix:///var/run/docker.sock"


def engine_lock(command: str, environ: dict[str, str] | None = None) -> HostLock:
    """The lock of the Docker engine that `DOCKER_HOST` (or the default socket) names, for `command`."""
    env = dict(os.environ if environ is None else environ)
    host = env.get("DOCKER_HOST") or DEFAULT_ENGINE
    parts = urlsplit(host)
    socket_path = parts.path if parts.scheme in ("unix", "http+unix") else None
    name = os.path.realpath(socket_path) if socket_path else f"{parts.hostname}:{parts.port}"
    folder = Path(env.get("LANECTL_LOCK_DIR") or LOCK_DIR)
    group = _group_of(socket_path)
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return HostLock(folder / f"engine-{digest}.lock", command, group=group, engine=name)


def _group_of(socket_path: str | None) -> int | None:
    """The group that may use the engine (its socket's), which may then share its lock; None: only root and us."""
    if socket_path is None:
        return None
    try:
        return os.stat(socket_path).st_gid
    except OSError:
        return None


@frozen
class LockHolder:
    """host.lock.json: who holds the lock."""

    pid: Annotated[int, Bounds(gt=0)]
    command: str
    since: Timestamp
    host: str


class LockBusy(OperationFailed):
    """Another process holds the host lock; `holder` is what its details file says (pid None if unreadable)."""

    def __init__(self, holder: dict[str, Any], details: Path):
        self.holder = holder
        self.details = details
        if holder.get("pid") is None:
            message = f"locked by an unknown process ({details.name} missing or unreadable)"
        else:
            host = holder.get("host")
            elsewhere = f" on {host}" if host and host != socket.gethostname() else ""
            since = _local_clock_time(holder["since"])
            message = f"locked by pid {holder['pid']} ({holder.get('command')}){elsewhere} since {since}"
        super().__init__(message)


class HostLock:
    """The lock file `path` (normally `StateFiles(state_dir()).host_lock`), taken by `command` (shown to whoever
    waits). Its details file is `holder_path`, beside it."""

    def __init__(
        self,
        path: Path,
        command: str,
        *,
        group: int | None = None,
        engine: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], datetime] = utc_now,
    ):
        self.path = path
        self.holder_path = path.with_name(f"{path.name}.json")
        self.command = command
        # Shared with the engine's group (see the module docstring): the lock's folder and files are theirs too.
        self.group = group
        self.engine = engine
        self.clock = clock
        self.sleep = sleep
        self.now = now
        self.holder: dict[str, Any] | None = None  # ours, while we hold the lock
        # The details a holder that ended without releasing left behind, with a `reason`: for the caller to journal.
        self.took_over_from: dict[str, Any] | None = None
        self._fd: int | None = None

    def acquire(self, wait_seconds: float) -> None:
        """Take the lock, waiting up to `wait_seconds` for its holder to let go; raises LockBusy after that."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this HostLock")
        self.took_over_from = None
        fd = self._open()
        try:
            deadline = self.clock() + wait_seconds
            while not _try_flock(fd):
                remaining = deadline - self.clock()
                if remaining <= 0:
                    raise LockBusy(self._read_holder() or {"pid": None, "command": None, "since": None, "host": None},
                                   self.holder_path)
                self.sleep(min(POLL_SECONDS, remaining))
            left = self._read_holder()
            if left is not None:
                self.took_over_from = {**left, "reason": f"pid {left['pid']} ended without releasing the lock"}
            holder = record_data(LockHolder(pid=os.getpid(), command=self.command, since=utc_timestamp(self.now()),
                                            host=socket.gethostname()))
            write_atomically(self.holder_path, json.dumps(holder).encode(), mode=self._mode)
        except OSError as exc:
            os.close(fd)  # lets the flock go, if we had it
            raise OperationFailed(f"could not take the lock {self.path}: {exc.strerror or exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.holder = holder

    def holder_now(self) -> str | None:
        """Who holds the lock right now ("pid 4242 (lanectl up h2-REF)"), None when nobody does; takes nothing."""
        fd = self._open()
        try:
            if _try_flock(fd):
                fcntl.flock(fd, fcntl.LOCK_UN)
                return None
        finally:
            os.close(fd)
        holder = self._read_holder()
        return "an unknown process" if holder is None else f"pid {holder['pid']} ({holder['command']})"

    def release(self) -> None:
        """Let the lock go: the details file first, so nobody reads ours once the lock is someone else's."""
        fd, self._fd = self._fd, None
        ours, self.holder = self.holder, None
        if fd is None or ours is None:
            return
        # A forked child inherits this object and the open file, whose flock is its parent's: closing
        # the child's copy of the file leaves the parent's lock held.
        if ours["pid"] == os.getpid():
            self.holder_path.unlink(missing_ok=True)
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    @contextlib.contextmanager
    def held(self, wait_seconds: float) -> Iterator[HostLock]:
        """`with lock.held(30):` releases on any way out, Ctrl-C (KeyboardInterrupt) included."""
        self.acquire(wait_seconds)
        try:
            yield self
        finally:
            self.release()

    @property
    def _mode(self) -> int:
        return 0o600 if self.group is None else 0o660

    def _open(self) -> int:
        try:
            if self.group is None:
                create_state_dir(self.path.parent)
                check_state_file(self.path)
                check_state_file(self.holder_path)
            else:
                _shared_lock_dir(self.path.parent, self.group)
                refuse_link(self.path)
                refuse_link(self.holder_path)
            # O_NOFOLLOW: a link planted after the check above is refused (ELOOP) rather than locked through.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, self._mode)
        except OSError as exc:
            raise OperationFailed(f"could not open the lock {self.path}: {exc.strerror or exc}") from exc
        if self.group is not None:
            with contextlib.suppress(OSError):  # a file another member made is theirs to keep as it is
                os.fchmod(fd, self._mode)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise OperationFailed(f"the lock {self.path} is not a regular file ({stat.filemode(mode)}); move it aside")
        return fd

    def _read_holder(self) -> dict[str, Any] | None:
        """The details file, None when there is none or it is not one lanectl wrote."""
        try:
            raw = read_state_file(self.holder_path, MAX_HOLDER_BYTES, shared=self.group is not None)
            return None if raw is None else record_data(read_record(LockHolder, json.loads(raw)))
        except (OSError, NotAStateFile, ValueError, RecursionError):  # ValueError: not JSON, or not a holder
            return None


def _shared_lock_dir(folder: Path, group: int) -> None:
    """The engine lock's folder: made if missing, belonging to the engine's group with group write (setgid, so
    its files are the group's too); refused when it is a link or others (outside the group) can write it."""
    if not folder.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a user outside the group keeps the folder to themselves
            os.chown(folder, -1, group)
            os.chmod(folder, 0o2770)
    status = folder.lstat()
    if stat.S_ISLNK(status.st_mode):
        raise StateDirUnsafe(f"the engine lock folder {folder} is a symbolic link; set LANECTL_LOCK_DIR to a real "
                             "folder")
    if status.st_mode & stat.S_IWOTH and not status.st_mode & stat.S_ISVTX:
        raise StateDirUnsafe(f"the engine lock folder {folder} can be written by anyone (mode "
                             f"{stat.S_IMODE(status.st_mode):04o}); fix: chmod o-w {folder}")
    if status.st_uid not in (0, os.geteuid()) and status.st_gid != group:
        raise StateDirUnsafe(f"the engine lock folder {folder} belongs to another user and not to the engine's "
                             f"group; fix: chgrp {group} {folder} && chmod 2770 {folder}")


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _local_clock_time(since: str) -> str:
    return datetime.fromisoformat(since).astimezone().strftime("%H:%M:%S")
