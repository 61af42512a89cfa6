"""What the shell completes: lane names from the recipes' catalog, and recipe files."""

from __future__ import annotations

from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog, recipe_files


def lane_names(project: Project, incomplete: str = "") -> list[str]:
    """The catalog's lane names starting with `incomplete`; none when the recipes do not load.

    Completion runs on every Tab press: a broken or half-written recipe must leave the prompt as it was,
    never print a problem or a traceback into the user's command line.
    """
    try:
        names = list(load_catalog(project, []).lanes)
    except Exception:  # noqa: BLE001 - see above: completion fails silently, whatever went wrong
        return []
    return [name for name in names if name.startswith(incomplete)]



def recipe_paths(project: Project, incomplete: str = "") -> list[str]:
    """The recipe files `validate` would read, as the user would type them (relative to the current folder)."""
    try:
        shown = [project.display(path) for path in recipe_files(project)]
    except Exception:  # noqa: BLE001 - completion fails silently, as in lane_names
        return []
    return [path for path in shown if path.startswith(incomplete)]
