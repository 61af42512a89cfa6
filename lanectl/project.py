"""Where a lanectl project keeps its parts, and where lanectl keeps its cache.

A project is a folder holding `recipes/`, `images/`, `kernels/` and `patches/`; recipes refer
to the other three by paths relative to it. Image templates a project does not have come from the
ones lanectl ships (`vllm`, `stub-engine`, the shared `_lane/` blocks).
"""

from __future__ import annotations

import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path

# Package data (lanectl/image/templates/), found the same way in a checkout, an editable install and a
# wheel. Its stub-engine is a link to the demo project's images/stub-engine, which a wheel carries as files.
BUILTIN_IMAGES_DIR = Path(str(importlib.resources.files("lanectl") / "image" / "templates"))


@dataclass(frozen=True)
class Project:
    root: Path
    recipes_dir: Path

    @classmethod
    def locate(cls, recipes_dir: Path | None = None) -> Project:
        """`--recipes DIR`, else `LANECTL_RECIPES`, else `./recipes`; the project root is its parent."""
        if recipes_dir is None:
            from_env = os.environ.get("LANECTL_RECIPES")
            recipes_dir = Path(from_env) if from_env else Path("recipes")
        recipes_dir = recipes_dir.resolve()
        return cls(root=recipes_dir.parent, recipes_dir=recipes_dir)

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
        absolute = path.resolve()
        try:
            return absolute.relative_to(Path.cwd()).as_posix()
        except ValueError:
            return str(absolute)


def leaves(path: Path, folder: Path) -> bool:
    """Whether `path`, with `..` and every symlink on the way followed, ends up outside `folder`.

    Recipes and patches come from checkouts: a `../` or a symlink must not pull a file from
    elsewhere on the host into an image or a report.
    """
    try:
        return not path.resolve().is_relative_to(folder.resolve())
    except (ValueError, OSError):  # a NUL byte or a link loop: no such place inside the folder
        return True


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
