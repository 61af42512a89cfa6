"""Replacing a file whole: a reader, or the next command after a crash, sees the old file or the new one.

The one way lanectl writes a file that something else may read at any moment: state files, the
watchdog's metrics and units, the host lock's holder, the upstream sdist cache. A temp file in the
same folder (a dot name with a .tmp suffix, which cron, systemd and node_exporter all skip) takes
the contents, is fsynced and renamed over the target, then the folder is fsynced so the rename
itself survives a power cut. The folder must exist.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


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


def write_atomically(path: Path, content: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` whole with `content` (see the module docstring)."""
    with replacing(path, mode=mode) as handle:
        handle.write(content)
