"""`lanectl import jm PATH`: a J-M-Recipes recipe folder (recipe.yaml + launch command) as a lanectl recipe."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml

from lanectl.errors import BadInput, OperationFailed, Problem, RecipeInvalid
from lanectl.output import Result
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from lanectl.recipe.jm_import import JM_SCHEMA, JmImport, import_jm, launch_file_name
from lanectl.recipe.yaml_source import (
    PathKey,
    YamlSyntaxError,
    format_path,
    load_yaml,
    read_text_file,
    read_yaml_file,
)
from lanectl.records import frozen


@frozen
class ImportedRecipe:
    text: str  # the lanectl/v1 recipe, ending with what was not mapped, as comments
    unmapped: list[str]  # one located line per jm field left out


def import_jm_recipe(path: Path, *, lane: str = "main") -> ImportedRecipe:
    """`path` is the recipe's folder or its recipe.yaml; the launch command is read from beside it."""
    recipe_file = path / "recipe.yaml" if path.is_dir() else path
    if recipe_file.is_symlink():
        # Read through, a link to another file (the shadow file) would have its lines quoted in the errors.
        raise BadInput(f"{recipe_file} is a symbolic link; give the J-M recipe's own file (copy it into the folder)")
    if not recipe_file.is_file():
        raise BadInput(f"{recipe_file}: no such file (expected a J-M recipe folder or its recipe.yaml)")
    try:
        doc = read_yaml_file(recipe_file, str(recipe_file))
    except YamlSyntaxError as exc:
        raise RecipeInvalid([exc.problem]) from None
    launch_file = recipe_file.parent / launch_file_name(doc)
    line, column = doc.position(("launch", "command_file"))
    if not launch_file.is_file():
        raise RecipeInvalid([Problem(str(recipe_file), line, column, "launch.command_file",
                                     f"{launch_file}: no such file; the launch command is read from it")])
    if not launch_file.resolve().is_relative_to(recipe_file.parent.resolve()):
        # A link out of the folder: the same escape as an absolute path, one step removed.
        raise RecipeInvalid([Problem(str(recipe_file), line, column, "launch.command_file",
                                     f"{launch_file} is a link out of the recipe's folder; copy the launch "
                                     f"command next to recipe.yaml")])
    try:
        launch_text = read_text_file(launch_file, str(launch_file))
    except YamlSyntaxError as exc:
        raise RecipeInvalid([exc.problem]) from None
    result = import_jm(doc, launch_text, str(launch_file), lane=lane)
    unmapped = [str(problem) for problem in result.unmapped]
    header = [f"# Imported by `lanectl import jm` from {_comment(str(recipe_file))} ({JM_SCHEMA}) and "
              f"{_comment(launch_file.name)}.",
              "# Check it with `lanectl validate`; add companions, kernels, patches and the watchdog by hand."]
    # Listed after the recipe: recipe discovery looks for `schema: lanectl/…` near the top of a file.
    footer = []
    if unmapped:
        footer.append("# Not mapped (no lanectl field holds them; kept here so nothing is dropped silently):")
        footer += [f"#   {_comment(line)}" for line in unmapped]
    body = yaml.safe_dump(result.recipe, sort_keys=False, width=200, allow_unicode=True)
    text = "\n".join([*header, body.rstrip("\n"), *footer]) + "\n"
    refused = validation_problems(text, result, str(recipe_file))
    if refused:
        raise RecipeInvalid(refused)
    return ImportedRecipe(text=text, unmapped=unmapped)


def validation_problems(text: str, imported: JmImport, recipe_file: str) -> list[Problem]:
    """What `lanectl validate` would refuse in the imported recipe `text`, each problem at the jm field or launch
    command line its value came from. The recipe is validated by lanectl's own loader, in a scratch project."""
    with tempfile.TemporaryDirectory(prefix="lanectl-import-jm-") as scratch:
        recipes = Path(scratch) / "recipes"
        recipes.mkdir()
        (recipes / "imported.yaml").write_text(text, encoding="utf-8")
        try:
            load_catalog(Project.locate(recipes), [recipes / "imported.yaml"])
        except RecipeInvalid as exc:
            found = exc.problems
        else:
            return []
    paths = _paths_by_position(text)
    args = imported.recipe["defaults"]["engine"]["args"]
    located: dict[tuple[str, int, int, str], Problem] = {}
    for problem in found:
        path = _path_of(problem, paths)
        if path == ("defaults", "engine", "args"):
            # A problem with the whole list names the argument it is about first (`--api-key would bake ...`).
            word = problem.message.split(" ", 1)[0]
            path = (*path, args.index(word)) if word in args else path
        origin = imported.origin_of(path) if path is not None else None
        message = f"{problem.message} (the imported recipe's {problem.path or 'file'})"
        if origin is None:
            origin = Problem(recipe_file, 0, 0, "", "")
        # One jm value may become several of the recipe's (a port is both container and host port): once.
        key = (origin.file, origin.line, origin.column, problem.message)
        located.setdefault(key, Problem(_shown(origin.file, recipe_file), origin.line, origin.column, origin.path,
                                        message))
    return list(located.values())


def _paths_by_position(text: str) -> dict[tuple[int, int], list[PathKey]]:
    doc = load_yaml(text, "imported.yaml")
    positions: dict[tuple[int, int], list[PathKey]] = {}
    for table in (doc.value_at, doc.key_at):
        for path, position in table.items():
            positions.setdefault(position, []).append(path)
    return positions


def _path_of(problem: Problem, positions: dict[tuple[int, int], list[PathKey]]) -> PathKey | None:
    """The recipe path a validation problem is about: of the paths at its position, the one it names (a mapping and
    its first key share a position), else the most specific."""
    candidates = positions.get((problem.line, problem.column), [])
    named = [path for path in candidates if format_path(path) == problem.path]
    if named:
        return named[0]
    return max(candidates, key=len) if candidates else None


def _shown(origin_file: str, recipe_file: str) -> str:
    """The jm files as the user named the recipe: `recipe.yaml` and the launch file beside it."""
    if origin_file == "--lane":
        return origin_file
    folder = Path(recipe_file).parent
    return str(folder / origin_file) if not Path(origin_file).is_absolute() and origin_file != recipe_file \
        else origin_file


def _comment(text: str) -> str:
    """`text` for a YAML comment: a file name may hold a newline, which would end the comment and start
    keys of the recipe; escaped as in a double-quoted YAML (JSON) string, without the quotes."""
    return json.dumps(text)[1:-1]  # ASCII: YAML also breaks lines at NEL, U+2028, U+2029


def _check_new_file(out_file: Path) -> None:
    """`--out` names a new file, in a folder that exists or can be made (lanectl.state.out_paths)."""
    from lanectl.state.out_paths import check_output_file, check_output_folder

    check_output_folder(out_file.parent, "--out")
    if out_file.parent.is_dir():
        check_output_file(out_file, "--out")
    if out_file.is_symlink() or out_file.exists():
        raise BadInput(f"{out_file} already exists; choose a new file")


def import_jm_command(path: Path, *, lane: str = "main", out_file: Path | None = None) -> Result:
    """`lanectl import jm`: the recipe (written to `out_file`, a new file, when given) and what was not mapped."""
    if out_file is not None:
        _check_new_file(out_file)
    imported = import_jm_recipe(path, lane=lane)
    if out_file is not None:
        _check_new_file(out_file)
        try:
            out_file.parent.mkdir(parents=True, exist_ok=True)
            with out_file.open("x", encoding="utf-8") as handle:  # "x": never overwrites a file made meanwhile
                handle.write(imported.text)
        except OSError as exc:
            raise OperationFailed(f"--out {out_file}: could not write it ({exc.strerror or exc})") from None
    return Result("import.jm", {"recipe": imported.text, "out": None if out_file is None else str(out_file),
                                "unmapped": imported.unmapped})


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "import jm": {
        "example": """\
$ lanectl import jm ../J-M-Recipes/recipes/deepseek-v4-flash --lane h2-REF \
    --out recipes/deepseek.yaml
$ lanectl validate recipes/deepseek.yaml
""",
        "exit": {
            0: "converted; each field it could not map is listed with its location",
            2: "not a jm-recipe/v1 recipe, or an unknown lane",
        },
    },
}
