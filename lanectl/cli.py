"""The `lanectl` command line: parse, call one domain function, render its result.

Exit codes everywhere: 0 success, 1 the operation failed, 2 bad input or usage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from lanectl import __version__
from lanectl.errors import EXIT_FAILED, LanectlError, RecipeInvalid
from lanectl.project import Project
from lanectl.recipe.catalog import Catalog, load_catalog

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Run GPU LLM serving lanes safely: recipes to images, switches, rollback, watchdog.")
patches_app = typer.Typer(no_args_is_help=True, help="Backported patches and the upstream source they target.")
app.add_typer(patches_app, name="patches")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

RecipesOption = Annotated[
    Path | None,
    typer.Option("--recipes", help="Recipes folder (default: $LANECTL_RECIPES, else ./recipes).",
                 show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output (a versioned envelope).")]


class _State:
    recipes: Path | None = None


state = _State()


@app.callback()
def _root(recipes: RecipesOption = None,
          version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False) -> None:
    if version:
        out.print(f"lanectl {__version__}")
        raise typer.Exit(0)
    state.recipes = recipes


def emit_json(command: str, data: Any) -> None:
    """The stable envelope scripts parse: bump `lanectl` only on an incompatible change."""
    sys.stdout.write(json.dumps({"lanectl": 1, "command": command, "data": data}, indent=2, sort_keys=True) + "\n")


def catalog(paths: list[Path] | None = None) -> Catalog:
    return load_catalog(Project.locate(state.recipes), paths or [])


@app.command()
def validate(paths: Annotated[list[Path] | None, typer.Argument(help="Recipe files or folders.")] = None,
             as_json: JsonOption = False) -> None:
    """Check every recipe (or those given); exit 2 with every problem listed."""
    from lanectl.commands.validate import validate_recipes

    result = validate_recipes(Project.locate(state.recipes), paths or [])
    if as_json:
        emit_json("validate", result)
    else:
        out.print(f"ok: {len(result['lanes'])} lanes in {len(result['recipes'])} recipes "
                  f"({', '.join(result['lanes'])})")


@app.command()
def lanes(as_json: JsonOption = False) -> None:
    """The lanes of all recipes: name, recipe, image tag, and whether the image is built."""
    from lanectl.commands.lanes import list_lanes

    rows, note = list_lanes(catalog())
    if as_json:
        emit_json("lanes", {"lanes": rows, "note": note})
        return
    header = ("LANE", "RECIPE", "IMAGE", "BUILT", "COMPANIONS")
    table = [header] + [
        (row["lane"], row["recipe"], row["image"], {True: "yes", False: "no", None: "?"}[row["built"]],
         ",".join(row["companions"]) or "-")
        for row in rows
    ]
    # Plain aligned columns: never truncated, whatever the terminal width (tags are long).
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        out.print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip(),
                  markup=False)
    if note:
        err.print(note)


@app.command()
def render(lane: Annotated[str, typer.Argument(help="Lane name, e.g. h2-REF.")],
           out_dir: Annotated[Path | None, typer.Option("--out", help="Write the build context here.")] = None,
           as_json: JsonOption = False) -> None:
    """The Dockerfile, build context and container specs of a lane; nothing is built."""
    from lanectl.commands.render import render_lane

    result = render_lane(catalog().lane(lane), out_dir)
    if as_json:
        emit_json("render", result)
        return
    out.print(f"# lane {result['lane']}  image {result['image']}  inputs {result['input_hash']}")
    out.print("# ---- Dockerfile ----")
    out.print(result["dockerfile"], markup=False, end="")
    out.print("# ---- build context ----")
    for item in result["context"]:
        out.print(f"{item['size']:>9}  {item['sha256'][:12]}  {item['path']}", markup=False)
    out.print("# ---- containers (start order) ----")
    out.print(json.dumps(result["containers"], indent=2), markup=False)
    if out_dir is not None:
        err.print(f"wrote the build context and containers.json to {out_dir}")


@app.command()
def schema() -> None:
    """The JSON Schema of the recipe format, for editors (yaml-language-server)."""
    from lanectl.schema import recipe_json_schema

    sys.stdout.write(json.dumps(recipe_json_schema(), indent=2) + "\n")


@patches_app.command("check")
def patches_check(as_json: JsonOption = False) -> None:
    """Each patch against the real pinned upstream source: applies | already-upstream | conflicts."""
    from lanectl.commands.patches import check_project_patches

    reports = check_project_patches(Project.locate(state.recipes), progress=err)
    if as_json:
        emit_json("patches.check", {"patches": reports})
    else:
        colours = {"applies": "green", "already-upstream": "yellow", "conflicts": "red"}
        for report in reports:
            first, *rest = report["lines"]
            status, _, remainder = first.partition("  ")
            out.print(f"[{colours[status]}]{status:<17}[/]", end="")
            out.print(f"{remainder}  {report['subject']}", markup=False)
            for line in rest:
                out.print(line, markup=False)
    if any(r["status"] == "conflicts" for r in reports):
        raise typer.Exit(EXIT_FAILED)


@app.command()
def build(lanes_: Annotated[list[str] | None, typer.Argument(metavar="LANE...", help="Lanes to build.")] = None,
          all_lanes: Annotated[bool, typer.Option("--all", help="Build every lane.")] = False,
          push: Annotated[bool, typer.Option("--push", help="Push both tags after building.")] = False,
          no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every step.")] = False,
          as_json: JsonOption = False) -> None:
    """Build lane images (content-addressed tags); unchanged inputs build nothing."""
    from lanectl.commands.build import build_lanes

    if bool(lanes_) == all_lanes:
        raise typer.BadParameter("name lanes to build, or --all (not both)")
    loaded = catalog()
    chosen = list(loaded.lanes.values()) if all_lanes else [loaded.lane(name) for name in lanes_ or []]
    outcomes = build_lanes(chosen, no_cache=no_cache, push=push, console=err, live=not as_json)
    if as_json:
        emit_json("build", {"builds": [o.__dict__ | {"log_tail": list(o.log_tail)} for o in outcomes]})
    else:
        for outcome in outcomes:
            colour = {"built": "green", "unchanged": "cyan", "failed": "red"}[outcome.status]
            out.print(f"[{colour}]{outcome.status:<9}[/] {outcome.lane}: {outcome.message}"
                      + (" (pushed)" if outcome.pushed else ""))
            if outcome.status == "failed":
                err.print("[bold]last lines of the failing step:[/]")
                for line in outcome.log_tail:
                    err.print(f"  {line}", markup=False)
    if any(o.status == "failed" for o in outcomes):
        raise typer.Exit(EXIT_FAILED)


def main() -> None:
    # Click handles usage errors (exit 2) and typer.Exit itself; domain errors arrive here.
    try:
        app()
    except RecipeInvalid as exc:
        for problem in exc.problems:
            err.print(str(problem), markup=False)
        err.print(f"{len(exc.problems)} problem(s); nothing was built or started.")
        sys.exit(exc.exit_code)
    except LanectlError as exc:
        err.print(f"lanectl: {exc}", markup=False)
        sys.exit(exc.exit_code)
