"""`lanectl import jm PATH`: a J-M-Recipes recipe folder (recipe.yaml + launch command) as a lanectl recipe."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from lanectl.errors import BadInput, Problem, RecipeInvalid
from lanectl.output import Result
from lanectl.recipe.jm_import import JM_SCHEMA, import_jm, launch_file_name
from lanectl.recipe.yaml_source import YamlSyntaxError, read_text_file, read_yaml_file


@dataclass(frozen=True)
class ImportedRecipe:
    text: str  # the lanectl/v1 recipe, ending with what was not mapped, as comments
    unmapped: list[str]  # one located line per jm field left out


def import_jm_recipe(path: Path, *, lane: str = "main") -> ImportedRecipe:
    """`path` is the recipe's folder or its recipe.yaml; the launch command is read from beside it."""
    recipe_file = path / "recipe.yaml" if path.is_dir() else path
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
    return ImportedRecipe(text="\n".join([*header, body.rstrip("\n"), *footer]) + "\n", unmapped=unmapped)


def _comment(text: str) -> str:
    """`text` for a YAML comment: a file name may hold a newline, which would end the comment and start
    keys of the recipe; escaped as in a double-quoted YAML (JSON) string, without the quotes."""
    return json.dumps(text)[1:-1]  # ASCII: YAML also breaks lines at NEL, U+2028, U+2029


def import_jm_command(path: Path, *, lane: str = "main", out_file: Path | None = None) -> Result:
    """`lanectl import jm`: the recipe (written to `out_file`, a new file, when given) and what was not mapped."""
    if out_file is not None and (out_file.exists() or out_file.is_symlink()):
        raise BadInput(f"{out_file} already exists; choose a new file")
    imported = import_jm_recipe(path, lane=lane)
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        with out_file.open("x", encoding="utf-8") as handle:  # "x": never overwrites a file made meanwhile
            handle.write(imported.text)
    return Result("import.jm", {"recipe": imported.text, "out": None if out_file is None else str(out_file),
                                "unmapped": imported.unmapped})
