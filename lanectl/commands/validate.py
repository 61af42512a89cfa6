from __future__ import annotations

from pathlib import Path

from lanectl.errors import BadInput, Problem, RecipeInvalid
from lanectl.output import Result, warning
from lanectl.project import Project
from lanectl.recipe.catalog import Catalog, load_catalog, unrecognised_files


def validate_recipes(project: Project, paths: list[Path]) -> Result:
    """Raises `RecipeInvalid` with every problem; returns what was found when there is none.

    A .yaml under the folders that is neither a recipe nor a workload or probe is named (a warning), and
    when no recipe was found at all that is an error: "0 lanes" must not pass for a folder of recipes
    that were not recognised."""
    catalog = load_catalog(project, paths)
    unrendered = render_problems(catalog)
    if unrendered:
        raise RecipeInvalid(unrendered)
    unknown = [project.display(path) for path in unrecognised_files(project, paths)]
    why = ("no `schema: lanectl/v1` (a recipe), `lanectl-workload/v1` or `lanectl-probe/v1` key in the file; "
           "add the schema key, or move the file out of the recipes folder")
    if unknown and not catalog.lanes:
        raise BadInput(f"no lanectl recipe found; not recognised: {', '.join(unknown)}: {why}")
    if not catalog.lanes:
        # `--recipes /etc` said "ok: 0 lanes": a folder without a recipe validates nothing.
        where = ", ".join(str(path) for path in paths) or project.display(project.recipes_dir)
        raise BadInput(f"no lanectl recipe found in {where}: a recipe is a .yaml with `schema: lanectl/v1`; "
                       "`lanectl init` starts one")
    return Result("validate", {
        "recipes": [project.display(r.file) for r in catalog.recipes],
        "lanes": sorted(catalog.lanes),
    }, tuple(warning(f"{name}: not a lanectl recipe, workload or probe, so not loaded: {why}") for name in unknown))


def render_problems(catalog: Catalog) -> list[Problem]:
    """Each lane rendered as `render`, `build` and `up` render it: what validate accepts, every command renders. A
    template that does not render is located at its own file and line (once, naming the lanes that use it);
    anything else at the lane."""
    from lanectl.image.render import TemplateFailed, plan_image

    problems = []
    failed: dict[tuple[str, int, str], list[str]] = {}
    for name, lane in sorted(catalog.lanes.items()):
        try:
            plan_image(lane)
        except TemplateFailed as exc:
            failed.setdefault((exc.file, exc.line, exc.reason), []).append(name)
        except BadInput as exc:
            problems.append(Problem(catalog.project.display(lane.recipe.file), *lane.declared_at, f"lanes.{name}",
                                    f"does not render: {exc}"))
    for (file, line, reason), lanes in failed.items():
        # Jinja names the line, not the column: column 1 is the line's start.
        problems.append(Problem(file, line, 1 if line else 0, "", f"the image template does not render: {reason} "
                                                                  f"(lanes {', '.join(lanes)}); fix the template"))
    return problems


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
