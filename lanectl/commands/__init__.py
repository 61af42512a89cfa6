"""One module per verb: each takes explicit arguments and returns a `lanectl.output.Result`; none prints.

Long work reports progress through the reporter the caller passes in (the CLI's draws it with rich).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lanectl.recipe.catalog import Catalog


def catalog_if_valid(recipes: Path | None) -> Catalog | None:
    """For the verbs that describe the host or the fleet as they are: broken or missing recipes leave the
    lanes unknown, they do not stop the report."""
    from lanectl.errors import LanectlError
    from lanectl.project import Project
    from lanectl.recipe.catalog import load_catalog

    try:
        return load_catalog(Project.locate(recipes), [])
    except LanectlError:
        return None
