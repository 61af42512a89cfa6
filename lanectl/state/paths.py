"""Where lanectl keeps the durable state of this host, and what each file there is called (`StateFiles`).

`state_dir()` only names the folder; the stores create it when they first write, through
`create_state_dir`, so a read-only command (`lanectl status` on a fresh box) leaves no trace.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from lanectl.errors import BadInput
from lanectl.records import frozen

SYSTEM_STATE_DIR = Path("/var/lib/lanectl")


def state_dir() -> Path:
    """`$LANECTL_STATE_DIR`; else `/var/lib/lanectl` for root; else the XDG state folder (`~/.local/state/lanectl`).

    Root gets a system path because the cron watchdog and an operator's `sudo lanectl up` must
    see the same lock and journal whatever their `$HOME` is.
    """
    explicit = os.environ.get("LANECTL_STATE_DIR")
    if explicit:
        return Path(explicit)
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "lanectl"


@frozen
class StateFiles:
    """The files in the state folder `root`, named by what they hold: the one place their names are spelled."""

    root: Path

    @property
    def lanes(self) -> Path:
        """Which lane is active, which are known good, the watchdog's arm state (`state.lanes`)."""
        return self.root / "state.json"

    @property
    def journal(self) -> Path:
        """This box's journal (`state.journal`)."""
        return self.root / "journal.jsonl"

    @property
    def fleet_journal(self) -> Path:
        """The journal of the fleet rollouts run from this box; the box's own lanes use `journal`."""
        return self.root / "fleet-journal.jsonl"

    @property
    def watchdog(self) -> Path:
        """The watchdog's memory between passes (`watchdog.state`)."""
        return self.root / "watchdog.json"

    @property
    def watchdog_pass_lock(self) -> Path:
        """Flocked by a watchdog pass so that two never overlap."""
        return self.root / "watchdog.pass.lock"

    @property
    def host_lock(self) -> Path:
        """The lock every mutating command holds (`state.lock`); who holds it is in `host.lock.json` beside it.

        Not `lock`: that is the folder the lanectl before flock used, which a killed holder may have left.
        """
        return self.root / "host.lock"

    @property
    def secret_key(self) -> Path:
        """The key of the digests of secret values that lanectl stamps on containers (never the values)."""
        return self.root / "secret-digest.key"

    @property
    def standby(self) -> Path:
        """The lanes waiting asleep (vLLM sleep mode) beside the active one, for a rollback that wakes them."""
        return self.root / "standby.json"

    @property
    def standby_checks(self) -> Path:
        """One folder per `lanectl standby check` run: its report (JSON, text) and the standby block it measured."""
        return self.root / "standby-checks"

    @property
    def calibration(self) -> Path:
        """The arm noise `gate --calibrate` measured here, per workload and cell, for later gates' intervals."""
        return self.root / "calibration.json"

    @property
    def pushes(self) -> Path:
        """One record per image pushed to a registry: the digest the registry returned (`state.pushes`)."""
        return self.root / "pushes"


class StateDirUnsafe(BadInput):
    """The state folder, a folder above it, or a state file could be changed by someone else."""


def create_state_dir(path: Path) -> None:
    """Create the state folder (and its parents) if missing, readable by its owner only, and refuse
    one that others could tamper with (`check_state_dir`).

    The journal names who ran what on the box; nobody else needs to read it. An existing folder
    keeps the mode its owner gave it.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_state_dir(path)


def check_state_dir(path: Path) -> None:
    """Refuse a state folder that is a link, sits below a link, or that another user could write.

    The watchdog runs as root from cron: a state file reached through a link, or a folder on the way
    that someone else can write (and so swap for a link), would let that someone make root write
    or read wherever they like. Links are refused outright (the fix is to name the real folder);
    folders must belong to root or to us and be writable by their owner only (sticky /tmp-style
    folders excepted, as for sshd's StrictModes).
    """
    absolute = Path(os.path.abspath(path))
    uid = os.geteuid()
    for component in (absolute, *absolute.parents):
        try:
            status = component.lstat()
        except (FileNotFoundError, NotADirectoryError):
            continue  # not created yet (or below a file, refused when the loop reaches it)
        if not stat.S_ISDIR(status.st_mode) and not stat.S_ISLNK(status.st_mode):
            raise StateDirUnsafe(
                f"state folder {absolute}: {component} is not a folder; set LANECTL_STATE_DIR to a "
                "folder (lanectl makes it when missing)")
        if stat.S_ISLNK(status.st_mode):
            raise StateDirUnsafe(
                f"state folder {absolute}: {component} is a symbolic link; lanectl does not keep state "
                f"through links. Set LANECTL_STATE_DIR={os.path.realpath(absolute)} (the real folder)")
        if status.st_uid not in (0, uid):
            raise StateDirUnsafe(
                f"state folder {absolute}: {component} belongs to {_user_name(status.st_uid)}, who could "
                f"replace what lanectl keeps there; fix: chown {_user_name(uid)} {component}")
        sticky = bool(status.st_mode & stat.S_ISVTX)
        if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky and component != absolute):
            raise StateDirUnsafe(
                f"state folder {absolute}: {component} can be written by other users "
                f"(mode {stat.S_IMODE(status.st_mode):04o}); fix: chmod go-w {component}")


def check_state_file(path: Path) -> None:
    """What every store calls before it reads or writes `path`: a safe folder, and no link."""
    if path.parent.exists():
        check_state_dir(path.parent)
    refuse_link(path)


class NotAStateFile(ValueError):
    """A state path holds something other than a regular file (a folder, a FIFO, a device)."""


def read_state_file(path: Path, limit: int, *, shared: bool = False) -> bytes | None:
    """The first `limit` + 1 bytes of a state file, None when there is none.

    Opened without following a link and without blocking, then checked to be a regular file:
    a FIFO named `state.json` would otherwise hang every command that reads the state. A `shared` file (the
    engine lock's, in a folder its group may write) is not held to the state folder's owner-only rule.
    """
    if shared:
        refuse_link(path)
    else:
        check_state_file(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise NotAStateFile("a folder, not a file") from None
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise NotAStateFile(f"not a regular file (mode {stat.filemode(kind)})")
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def refuse_link(path: Path) -> None:
    """Refuse to read or write a state file that is a symbolic link."""
    try:
        status = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(status.st_mode):
        raise StateDirUnsafe(
            f"{path} is a symbolic link (to {os.readlink(path)}); lanectl does not read or write state "
            f"through links. Remove the link (rm {path}) and run the command again")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
