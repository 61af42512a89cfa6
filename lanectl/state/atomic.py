"""Replacing a file whole: a reader, or the next command after a crash, sees the old file or the new one.

The one way lanectl writes a file that something else may read at any moment: state files, the
watchdog's metrics and units, the host lock's holder, the upstream sdist cache. A temp file in the
same folder (a dot name with a .tmp suffix, which cron, systemd and node_exporter all skip) takes
the contents, is fsynced and renamed over the target, then the folder is fsynced so the rename
itself survives a power cut. The folder must exist.

A write killed between its temp file and the rename (kill -9, a power cut) leaves the temp file behind; the
next write of the same file removes such leftovers (`_remove_leftovers`).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

# A writer holds its temp file for the time of one write: milliseconds for a state file, while bytes keep arriving
# for a download. One untouched this long has no writer left.
LEFTOVER_AGE_SECONDS = 600


def fsync_directory(directory: Path) -> None:
    """Make a newly created or renamed entry survive a power cut, not only the file's contents."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path: Path, *, mode: int = 0o600) -> Iterator[BinaryIO]:
    """`with replacing(path) as handle:` write the new contents to `handle`; they become `path` when the
    block ends, and never if it raises (the temp file is removed, `path` is left as it was).

    For contents that arrive in pieces (a download); whole bytes go through `write_atomically`.
    """
    directory = path.parent
    _remove_leftovers(path)
    fd, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(fd, mode)  # mkstemp makes 0600 whatever the umask; the caller says who may read it
            yield handle
            handle.flush()
            os.fsync(fd)  # the contents must be on disk before the rename makes them the file
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    fsync_directory(directory)


def _remove_leftovers(path: Path) -> None:
    """Remove the temp files earlier writes of `path` left: exactly the names `replacing` makes (mkstemp's eight
    characters between them), regular files of this user's, untouched for LEFTOVER_AGE_SECONDS. Anything else in
    the folder, a link named like one included, is not ours to remove. Best effort: a write never fails for it."""
    made = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    try:
        names = [name for name in os.listdir(path.parent) if made.fullmatch(name)]
    except OSError:
        return
    for name in names:
        leftover = path.parent / name
        try:
            found = os.lstat(leftover)
            if (stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid()
                    and time.time() - found.st_mtime > LEFTOVER_AGE_SECONDS):
                leftover.unlink()
        except OSError:
            continue


def write_atomically(path: Path, content: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` whole with `content` (see the module docstring)."""
    with replacing(path, mode=mode) as handle:
        handle.write(content)
