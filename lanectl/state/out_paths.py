"""Files and folders lanectl writes because the user named them (`--out`, `--html`): one rule for all of them.

lanectl replaces a file whole by renaming a temp file over the name (lanectl.state.atomic), so whatever the name
was is gone: `/dev/null` would become a regular file on a root cron box that only checks that a note renders, a
FIFO would stop being one, and a note written over the run's results.json would destroy the evidence it came
from. So a name the user gives is checked before any work starts (a gate's run is not started towards a path it
cannot write), and again just before the write:

- a file target may be missing, a regular file or a symbolic link (the link is replaced, never written through);
  a device, a FIFO, a socket or a folder is refused;
- a folder target may be missing (it is made), or a folder; anything else is refused;
- the folder that will hold it must exist as a folder (or be creatable, for a folder target) and be writable;
- nothing is written inside the run folder a note is made from: its files are the evidence.

Every refusal is one line, exit 2 (BadInput), with nothing changed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from lanectl.errors import BadInput, OperationFailed

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"),
          (stat.S_ISREG, "a file"))


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _status(path: Path, option: str, *, follow: bool) -> os.stat_result | None:
    """`path`'s stat, None when nothing is there; a path the OS refuses (too long, a loop of links) is bad input."""
    try:
        return path.stat() if follow else path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadInput(f"{option} {path}: {exc.strerror or exc}; give a usable path") from None


def check_output_file(path: Path, option: str, *, run_dir: Path | None = None) -> None:
    """Refuse `path` as the file `option` writes unless it is missing, a regular file or a symbolic link, in an
    existing writable folder, and (with `run_dir`) outside the run folder whose evidence it is written from."""
    found = _status(path, option, follow=False)
    if found is not None and not (stat.S_ISREG(found.st_mode) or stat.S_ISLNK(found.st_mode)):
        raise BadInput(f"{option} {path} is {kind_of(found.st_mode)}, which lanectl never replaces; give a "
                       "file name")
    folder = path.parent
    _check_writable_folder(folder, option, path)
    if run_dir is not None and _inside(folder, run_dir, option):
        raise BadInput(f"{option} {path} is inside the run folder {run_dir}, whose files are the run's evidence; "
                       "write it elsewhere")


def check_output_folder(path: Path, option: str, *, empty: bool = False) -> None:
    """Refuse `path` as the folder `option` writes into unless it is a folder (an `empty` one when asked) or
    missing with a writable folder to make it in."""
    found = _status(path, option, follow=True)
    if found is not None:
        if not stat.S_ISDIR(found.st_mode):
            raise BadInput(f"{option} {path} is {kind_of(found.st_mode)}; give a folder")
        if empty and any(path.iterdir()):
            raise BadInput(f"{option} {path} is not empty; give a new or empty folder")
        _check_writable_folder(path, option, path)
        return
    nearest = path.parent
    while _status(nearest, option, follow=True) is None and nearest != nearest.parent:
        nearest = nearest.parent
    _check_writable_folder(nearest, option, path)


def _check_writable_folder(folder: Path, option: str, path: Path) -> None:
    found = _status(folder, option, follow=True)
    if found is None:
        raise BadInput(f"{option} {path}: the folder {folder} does not exist")
    if not stat.S_ISDIR(found.st_mode):
        raise BadInput(f"{option} {path}: {folder} is {kind_of(found.st_mode)}, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BadInput(f"{option} {path}: the folder {folder} is not writable")


def _inside(folder: Path, run_dir: Path, option: str) -> bool:
    try:
        return folder.resolve().is_relative_to(run_dir.resolve())
    except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of links, on Pythons before 3.13
        raise BadInput(f"{option} {folder}: {exc}; give a usable path") from None


def write_output_file(path: Path, content: bytes, option: str, *, run_dir: Path | None = None) -> None:
    """Check `path` again (something may have been made there while the work ran) and replace it whole."""
    from lanectl.state.atomic import write_atomically

    check_output_file(path, option, run_dir=run_dir)
    try:
        write_atomically(path, content, mode=0o644)
    except OSError as exc:
        raise OperationFailed(f"{option} {path}: could not write it ({exc.strerror or exc}); nothing was "
                              "written") from None
