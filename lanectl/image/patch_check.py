"""`lanectl patches check`: does each patch apply to the exact source its ``Base:`` names?

Checking never writes to the project: pinned upstream files are extracted into a temporary root.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from lanectl.image.in_image.patching import (
    Patch,
    PatchFormatError,
    PatchReport,
    check,
    parse_patch_file,
)
from lanectl.image.upstream import extract_files, fetch_sdist
from lanectl.project import leaves
from lanectl.records import frozen

ACCEPTED_BASE_FORMS = "'pypi:<project>==<version>' or 'path:<directory relative to the project root>'"
_PYPI_BASE = re.compile(r"^pypi:([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


@frozen
class PypiBase:
    """The sdist of one pinned release, e.g. ``pypi:vllm==0.31.0``."""

    project: str
    version: str


@frozen
class PathBase:
    """A directory of this project, e.g. ``path:images/stub-engine``."""

    directory: str


Base = PypiBase | PathBase


# A hunk header's line number: Python's int() refuses more than 4300 digits, and no source file has lines past 18.
_HUGE_NUMBER = re.compile(r"^@@ .*\d{19}", re.MULTILINE)


def read_patch_file(path: Path) -> Patch:
    """The patch in `path`, a file of patches/ that may be anything a checkout holds: a folder or a FIFO named
    `*.patch` is refused unopened (reading a FIFO waits for a writer forever), as is a hunk header whose numbers
    no source file reaches (`@@ -1,555…5 …`)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise PatchFormatError(str(path), None, f"cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
        raise PatchFormatError(str(path), None, f"is {kind}, not a patch; rename it or move it out of patches/")
    try:
        return parse_patch_file(path)
    except PatchFormatError:
        raise
    except (OSError, ValueError) as exc:
        text = path.read_bytes().decode("utf-8", errors="replace")
        if (huge := _HUGE_NUMBER.search(text)) is not None:
            line = text.count("\n", 0, huge.start()) + 1
            raise PatchFormatError(str(path), line, "a line number of this hunk header is far past any source "
                                                    "file's length; fix the header") from None
        raise PatchFormatError(str(path), None, f"cannot be read as a patch: {exc}") from None


def parse_base(patch: Patch) -> Base:
    line = patch.field_lines.get("Base")
    if match := _PYPI_BASE.match(patch.base):
        return PypiBase(project=match.group(1), version=match.group(2))
    if patch.base.startswith("path:"):
        directory = patch.base.removeprefix("path:").strip()
        parts = PurePosixPath(directory).parts
        if directory and not PurePosixPath(directory).is_absolute() and ".." not in parts:
            return PathBase(directory=directory)
        raise PatchFormatError(
            patch.source, line, f"Base {patch.base!r}: the directory must be relative and inside the project"
        )
    raise PatchFormatError(patch.source, line, f"Base {patch.base!r} is not understood; use {ACCEPTED_BASE_FORMS}")


def check_against_sdist(patches: list[Patch], sdist: Path) -> list[PatchReport]:
    """Each patch against the release in `sdist` (whatever its Base names), in the order given. A target the
    release lacks is reported by check() as a conflict, per patch."""
    targets = [target for patch in patches for target in patch.targets]
    with tempfile.TemporaryDirectory(prefix="lanectl-patch-check-") as pristine:
        extract_files(sdist, targets, Path(pristine), missing_ok=True)
        return [check(patch, Path(pristine)) for patch in patches]


def check_patch_files(
    patch_files: list[Path],
    project_root: Path,
    cache_dir: Path,
    progress: Callable[[int, int], None] | None = None,
) -> list[PatchReport]:
    """Check every patch against its Base; one report per patch, in the order given.

    Every patch file is parsed and its Base validated before anything is downloaded, and each
    pinned sdist is fetched (or taken from `cache_dir`) once however many patches name it.
    """
    patches = [read_patch_file(path) for path in patch_files]
    patches_by_base: dict[Base, list[int]] = {}
    for index, patch in enumerate(patches):
        patches_by_base.setdefault(parse_base(patch), []).append(index)

    reports: dict[int, PatchReport] = {}
    for base, indexes in patches_by_base.items():
        if isinstance(base, PypiBase):
            sdist = fetch_sdist(base.project, base.version, cache_dir, progress=progress)
            for index, report in zip(indexes, check_against_sdist([patches[i] for i in indexes], sdist), strict=True):
                reports[index] = report
        else:
            if leaves(project_root / base.directory, project_root):
                first = patches[indexes[0]]
                raise PatchFormatError(first.source, first.field_lines.get("Base"),
                                       f"Base {first.base!r} leads out of the project through a symlink")
            for index in indexes:
                reports[index] = check(patches[index], project_root / base.directory)
    return [reports[index] for index in range(len(patches))]
