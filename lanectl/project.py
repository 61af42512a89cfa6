"""Where a lanectl project keeps its parts, and where lanectl keeps its cache.

A project is a folder holding `recipes/`, `images/`, `kernels/` and `patches/`; recipes refer
to the other three by paths relative to it. Image templates a project does not have come from the
ones lanectl ships (`vllm`, `stub-engine`, the shared `_lane/` blocks).

The cache holds downloads (upstream sources) and results that are slow to work out and cheap to
check again, kept from one command to the next (the validated catalog, rendered Dockerfiles). Each
of those is a convenience: one that is missing, torn or cannot be written costs only speed, never an
error. It is read only when it and its folder belong to this user and nobody else may write them:
a catalog entry is a pickle, and a planted one would run its author's code.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from lanectl.records import frozen

# Package data (lanectl/image/templates/) beside this module, the same in a checkout, an editable install and a
# wheel (lanectl is never run from a zip). Its stub-engine is a link to the demo project's images/stub-engine,
# which a wheel carries as files. Found from __file__: importlib.resources would import zipfile and tempfile at
# every start.
BUILTIN_IMAGES_DIR = Path(__file__).parent / "image" / "templates"


@frozen
class Project:
    """A recipes project: its root folder (templates, patches, kernels) and its recipes folder."""

    root: Path
    recipes_dir: Path

    @classmethod
    def locate(cls, recipes_dir: Path | None = None) -> Project:
        """`--recipes DIR`, else `LANECTL_RECIPES`, else `./recipes`; the project root is its parent."""
        if recipes_dir is None:
            from_env = os.environ.get("LANECTL_RECIPES")
            recipes_dir = Path(from_env) if from_env else Path("recipes")
        try:
            resolved = recipes_dir.resolve()
        except (OSError, RuntimeError) as exc:  # a loop of links is a RuntimeError before Python 3.13
            from lanectl.errors import BadInput

            raise BadInput(f"recipes folder {recipes_dir}: {getattr(exc, 'strerror', None) or exc}; give a "
                           "usable path (--recipes or LANECTL_RECIPES)") from None
        return cls(root=resolved.parent, recipes_dir=resolved)

    @property
    def images_dir(self) -> Path:
        return self.root / "images"

    @property
    def kernels_dir(self) -> Path:
        return self.root / "kernels"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    def display(self, path: Path) -> str:
        """A path as the user should read it in messages: relative to the current folder when inside it."""
        try:
            absolute = path.resolve()
            return absolute.relative_to(Path.cwd()).as_posix()
        except (OSError, RuntimeError):  # a name too long, a loop of links: shown as given
            return str(path)
        except ValueError:
            return str(absolute)


def leaves(path: Path, folder: Path, *, resolved_folder: Path | None = None) -> bool:
    """Whether `path`, with `..` and every symlink on the way followed, ends up outside `folder`.

    Recipes and patches come from checkouts: a `../` or a symlink must not pull a file from
    elsewhere on the host into an image or a report. `resolved_folder`: `folder.resolve()`, for a caller
    that checks every file of one folder.
    """
    try:
        return not path.resolve().is_relative_to(resolved_folder or folder.resolve())
    except (ValueError, OSError, RuntimeError):  # a NUL byte, a name too long, a link loop (RuntimeError before
        return True                              # Python 3.13): no such place inside the folder


def cache_dir() -> Path:
    """`LANECTL_CACHE_DIR`, else the XDG cache folder: downloaded upstream sources live here."""
    explicit = os.environ.get("LANECTL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lanectl"


def template_dir(images_dir: Path, name: str) -> Path | None:
    """`<images_dir>/<name>/` when the project has a Dockerfile.j2 there (it overrides lanectl's own template of
    that name), else lanectl's own, else None."""
    for images in (images_dir, BUILTIN_IMAGES_DIR):
        if (images / name / "Dockerfile.j2").is_file():
            return images / name
    return None


def known_templates(images_dir: Path) -> list[str]:
    return sorted({template.parent.name for images in (images_dir, BUILTIN_IMAGES_DIR)
                   for template in images.glob("*/Dockerfile.j2")})


class CacheFolder:
    """One kind of entry, in its own folder, at most `keep` of them (the least recently used go)."""

    def __init__(self, name: str, keep: int):
        self.folder = cache_dir() / name
        self.keep = keep

    def path(self, key: str) -> Path:
        return self.folder / key

    def read(self, key: str) -> bytes | None:
        path = self.path(key)
        try:
            if not (_private(self.folder) and _private(path)):
                return None
            content = path.read_bytes()
            os.utime(path)  # recently used: kept when the folder is pruned
            return content
        except OSError:
            return None

    def write(self, key: str, content: bytes) -> None:
        """Atomically (a reader sees the old entry or the new one); best effort."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not _private(self.folder):
                return
            import tempfile  # a cache entry is written rarely, and read at every start

            fd, temp = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(content)
                os.replace(temp, self.path(key))
            except BaseException:
                Path(temp).unlink(missing_ok=True)
                raise
            self._prune()
        except OSError:
            return

    def _prune(self) -> None:
        entries = []
        for path in self.folder.iterdir():
            if not path.name.startswith("."):
                try:
                    entries.append((path.stat().st_mtime, path))
                except OSError:  # removed by another lanectl meanwhile
                    continue
        for _, stale in sorted(entries, reverse=True)[self.keep:]:
            stale.unlink(missing_ok=True)


def _private(path: Path) -> bool:
    info = os.lstat(path)
    return (info.st_uid == os.geteuid() and not stat.S_ISLNK(info.st_mode)
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
