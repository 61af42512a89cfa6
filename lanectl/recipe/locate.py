"""Where in its recipe file a lane's value is written: the lane's own key, else the recipe's default it inherits."""

from __future__ import annotations

from pathlib import Path

from lanectl.recipe.catalog import Lane
from lanectl.recipe.yaml_source import PathKey, read_yaml_file


def lane_field_location(lane: Lane, path: PathKey, shown: str | None = None) -> str:
    """`recipes/…yaml:LINE` of the value at `path` (as in the lane's spec: `("engine", "env")`), by the rule the
    recipe loader locates its problems by. `shown` is how the file is named (default: its path as the catalog has
    it)."""
    doc = read_yaml_file(lane.recipe.file, shown or str(lane.recipe.file))
    own = ("lanes", lane.name, *path)
    located = own if doc.has(own) or not doc.has(("defaults", *path)) else ("defaults", *path)
    line, _ = doc.position(located)
    return f"{doc.file}:{line}"


def shown_path(file: Path, project_root: Path) -> str:
    """A recipe file as messages name it: relative to the project root when inside it."""
    try:
        return file.resolve().relative_to(project_root.resolve()).as_posix()
    except ValueError:
        return str(file)
