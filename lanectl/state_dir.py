"""Where lanectl keeps the durable state of this host: the journal, the host lock and `state.json`.

`state_dir()` only names the folder; the stores create it when they first write, through
`create_state_dir`, so a read-only command (`lanectl status` on a fresh box) leaves no trace.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

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


def create_state_dir(path: Path) -> None:
    """Create the state folder (and its parents) if missing, readable by its owner only.

    The journal names who ran what on the box; nobody else needs to read it. An existing folder
    keeps the mode its owner gave it.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def fsync_directory(directory: Path) -> None:
    """Make a newly created or renamed entry survive a power cut, not only the file's contents."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, content: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` whole: a reader, or the next command after a crash, sees the old or the new file.

    Temp file in the same folder (a dot name with a .tmp suffix, which cron, systemd and
    node_exporter all skip), fsync, rename over, fsync the folder. The folder must exist.
    """
    directory = path.parent
    fd, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)  # the contents must be on disk before the rename makes them the file
        finally:
            os.close(fd)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    fsync_directory(directory)
