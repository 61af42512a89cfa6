from __future__ import annotations

from pathlib import Path

from lanectl.errors import BadInput
from lanectl.output import Result, warning
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog, unrecognised_files


def validate_recipes(project: Project, paths: list[Path]) -> Result:
    """Raises `RecipeInvalid` with every problem; returns what was found when there is none.

    A .yaml under the folders that is neither a recipe nor a workload or probe is named (a warning), and
    when no recipe was found at all that is an error: "0 lanes" must not pass for a folder of recipes
    that were not recognised."""
    catalog = load_catalog(project, paths)
    unknown = [project.display(path) for path in unrecognised_files(project, paths)]
    why = ("no `schema: lanectl/v1` (a recipe), `lanectl-workload/v1` or `lanectl-probe/v1` key in the file; "
           "add the schema key, or move the file out of the recipes folder")
    if unknown and not catalog.lanes:
        raise BadInput(f"no lanectl recipe found; not recognised: {', '.join(unknown)}: {why}")
    return Result("validate", {
        "recipes": [project.display(r.file) for r in catalog.recipes],
        "lanes": sorted(catalog.lanes),
    }, tuple(warning(f"{name}: not a lanectl recipe, workload or probe, so not loaded: {why}") for name in unknown))


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "validate": {
        "example": """\
$ lanectl validate
ok: 2 lanes in 1 recipes (stub-a, stub-b)
$ lanectl validate recipes/starter.yaml    # one file; a folder checks every recipe under it
""",
        "exit": {
            0: "every recipe is valid",
            2: "one or more problems, each listed as `file:line:column: field: what to do`",
        },
    },
}
