"""A released source distribution as pin check reads it: its package's Python files, in memory, once.

The sdist comes from the package index through lanectl.image.upstream (fetched once, verified, cached), the same
source `lanectl patches check` holds patches to.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

from lanectl.image.upstream import Progress, UpstreamError, fetch_sdist
from lanectl.records import frozen


@frozen
class ReleaseSource:
    """One release of one project: `files` maps a path under the sdist's top folder (`vllm/envs.py`, `PKG-INFO`) to
    its text, for the project's package and its metadata."""

    project: str
    version: str
    sdist: Path
    files: dict[str, str]

    def text(self, relpath: str) -> str | None:
        return self.files.get(relpath)

    def python_files(self, under: str = "") -> Iterator[tuple[str, str]]:
        for relpath, text in self.files.items():
            if relpath.endswith(".py") and relpath.startswith(under):
                yield relpath, text

    def pinned(self, requirement: str) -> str | None:
        """The version this release pins `requirement` to (`Requires-Dist: name==X` in its PKG-INFO)."""
        for line in (self.text("PKG-INFO") or "").splitlines():
            found = re.match(rf"Requires-Dist:\s*{re.escape(requirement)}==([^;\s]+)\s*(;.*)?$", line, re.IGNORECASE)
            if found and "extra ==" not in (found[2] or ""):
                return found[1]
        return None


def read_release(project: str, version: str, package: str, cache_dir: Path,
                 progress: Progress | None = None) -> ReleaseSource:
    """`project`==`version` from the index (cached under `cache_dir`): every file of `package` and the PKG-INFO."""
    sdist = fetch_sdist(project, version, cache_dir, progress=progress)
    files: dict[str, str] = {}
    try:
        with tarfile.open(sdist, "r:gz") as archive:
            for member in archive:
                _top, _, relpath = member.name.partition("/")
                if not member.isfile() or not (relpath == "PKG-INFO" or relpath.startswith(f"{package}/")):
                    continue
                handle = archive.extractfile(member)
                if handle is not None:
                    files[relpath] = handle.read().decode("utf-8", "replace")
    except (tarfile.TarError, OSError) as error:
        raise UpstreamError(f"cannot read {sdist}: {error}") from error
    if not any(path.startswith(f"{package}/") for path in files):
        raise UpstreamError(f"{sdist} holds no {package}/ package")
    return ReleaseSource(project, version, sdist, files)
