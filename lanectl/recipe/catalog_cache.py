"""A validated catalog kept on disk, reused while none of the files it was validated from changed.

Parsing and validating the recipes is most of what a quick command such as `lanectl status`
does besides asking Docker; the recipes change rarely and the commands run often (the watchdog's
cron pass every minute). An entry holds the catalog and every file the validation read (recipes,
kernel files, templates, patches, kernel source folders, the project's folders), each with the
sha256 of its bytes (or its kind, for folders) and where its symlinks lead. It is used only when
all of them are as they were, the same recipe files are found, and the code that validated it
is the same: lanectl's version and the bytes of the recipe modules. Only catalogs without a
problem are stored, so every error is found and reported by a full validation.

Entries are pickles, in a `lanectl.project.CacheFolder`: read only when private to this user.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lanectl.project import CacheFolder

FORMAT = 2  # 2: the catalog holds dataclasses, not pydantic models
KEEP_ENTRIES = 32  # one per project folder; the least recently used beyond this are removed

Fingerprint = tuple[str, str, str]


def fingerprint(path: Path) -> Fingerprint:
    """What validation saw of `path`: where it leads, what it is, and for a regular file its bytes."""
    try:
        info = os.lstat(path)
    except OSError:
        return (str(path), "missing", "")
    kind = "link" if stat.S_ISLNK(info.st_mode) else "dir" if stat.S_ISDIR(info.st_mode) else (
        "file" if stat.S_ISREG(info.st_mode) else "other")
    digest = ""
    if os.path.isfile(path):  # a link to a file is read through, as the loader reads it
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            digest = "unreadable"
    elif kind == "link":
        kind += "-to-dir" if os.path.isdir(path) else "-dangling"
    return (os.path.realpath(path), kind, digest)


def fingerprints(paths: Iterable[Path]) -> tuple[tuple[str, Fingerprint], ...]:
    return tuple((str(path), fingerprint(path)) for path in sorted(set(paths)))


def code_stamp() -> str:
    """The code that validated an entry: a changed model or check makes every entry stale."""
    from importlib.util import find_spec

    from lanectl import __version__

    here = Path(__file__).parent
    code = [here / name for name in sorted(os.listdir(here)) if name.endswith(".py")]
    code += [here.parent / name for name in ("__init__.py", "project.py", "errors.py")]
    # pydantic's version file, read rather than imported: a command served from the cache never imports pydantic.
    pydantic = find_spec("pydantic")
    if pydantic is not None and pydantic.origin is not None:
        code.append(Path(pydantic.origin).with_name("version.py"))
    digest = hashlib.sha256(f"{FORMAT}\0{__version__}\0{sys.version}\0".encode())
    for path in code:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class CatalogCache:
    """One entry per recipes folder."""

    def __init__(self) -> None:
        self.entries = CacheFolder("catalogs", KEEP_ENTRIES)

    def key(self, recipes_dir: Path) -> str:
        return hashlib.sha256(str(recipes_dir).encode()).hexdigest()[:32] + ".pickle"

    def load(self, recipes_dir: Path, recipe_files: list[Path]) -> Any | None:
        """The stored catalog when everything it was validated from is unchanged; None otherwise."""
        raw = self.entries.read(self.key(recipes_dir))
        if raw is None:
            return None
        try:
            stored = pickle.loads(raw)
            if stored["stamp"] != code_stamp() or stored["recipe_files"] != [str(p) for p in recipe_files]:
                return None
            if fingerprints(Path(name) for name, _ in stored["inputs"]) != stored["inputs"]:
                return None
            return stored["catalog"]
        except Exception:  # a torn entry, or one of another lanectl: a miss
            return None

    def store(self, recipes_dir: Path, recipe_files: list[Path], inputs: Iterable[Path], catalog: Any) -> None:
        try:
            stored = {"stamp": code_stamp(), "recipe_files": [str(p) for p in recipe_files],
                      "inputs": fingerprints([*recipe_files, *inputs]), "catalog": catalog}
            content = pickle.dumps(stored, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # lanectl's sources unreadable (a zip), something unpicklable: no entry, no error
            return
        self.entries.write(self.key(recipes_dir), content)
