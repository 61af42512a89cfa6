from __future__ import annotations

from pathlib import Path

from lanectl.output import Result
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog


def validate_recipes(project: Project, paths: list[Path]) -> Result:
    """Raises `RecipeInvalid` with every problem; returns what was found when there is none."""
    catalog = load_catalog(project, paths)
    return Result("validate", {
        "recipes": [project.display(r.file) for r in catalog.recipes],
        "lanes": sorted(catalog.lanes),
    })
