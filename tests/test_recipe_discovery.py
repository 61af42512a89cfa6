"""Recipe discovery never skips a recipe without a word: a .yaml under recipes/ is a recipe (loaded, and
refused with its problems when it cannot be read), a workload or probe (left to the commands that use
them), or named as not recognised. Through the real CLI (`python -m lanectl validate`)."""

from __future__ import annotations

import textwrap

import pytest

from tests.test_cli import lanectl
from tests.test_recipe_validation import GOOD

RECIPE = textwrap.dedent(GOOD).lstrip("\n")
OK = "ok: 2 lanes in 1 recipes (a, b)\n"


@pytest.mark.parametrize("text", [
    "# " + "a long header comment line, " * 200 + "\n" + RECIPE,  # schema: past the first 4 KiB
    RECIPE.replace("schema: lanectl/v1", '"schema": "lanectl/v1"'),
    RECIPE.replace("schema: lanectl/v1", "'schema': 'lanectl/v1'"),
    RECIPE.replace("schema: lanectl/v1", "schema:    lanectl/v1   # the format"),
], ids=["after-4-KiB", "double-quoted-key", "single-quoted-key", "spaced-and-commented"])
def test_a_recipe_is_found_wherever_and_however_it_writes_its_schema(project, text):
    (project / "recipes" / "r.yaml").write_text(text)
    result = lanectl("validate", cwd=project)
    assert (result.returncode, result.stdout, result.stderr) == (0, OK, "")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_a_recipe_in_utf16_or_utf32_is_refused_not_skipped(project, encoding):
    (project / "recipes" / "r.yaml").write_bytes(RECIPE.encode(encoding))
    result = lanectl("validate", cwd=project)
    assert result.returncode == 2 and "0 lanes" not in result.stdout
    assert result.stderr.startswith("recipes/r.yaml:1:1: not UTF-8 text (UTF-16 or UTF-32, by its first bytes); "
                                    "save the file as UTF-8\n")


def test_a_yaml_file_of_no_known_kind_beside_a_recipe_is_named(project, write_recipe):
    write_recipe(GOOD)
    (project / "recipes" / "notes.yaml").write_text("notes: not a recipe\n")
    (project / "recipes" / "jm.yaml").write_text("schema: jm-recipe/v1\nid: x\n")
    (project / "recipes" / "workloads").mkdir()
    (project / "recipes" / "workloads" / "w.yaml").write_text("schema: lanectl-workload/v1\nname: w\n")
    result = lanectl("validate", cwd=project)
    assert (result.returncode, result.stdout) == (0, OK)
    assert result.stderr.splitlines() == [
        f"recipes/{name}: not a lanectl recipe, workload or probe, so not loaded: no `schema: lanectl/v1` (a "
        "recipe), `lanectl-workload/v1` or `lanectl-probe/v1` key in the file; add the schema key, or move the "
        "file out of the recipes folder" for name in ("jm.yaml", "notes.yaml")]


def test_a_folder_whose_yaml_is_all_unrecognised_is_an_error_not_0_lanes(project):
    (project / "recipes" / "r.yaml").write_text(RECIPE.replace("schema: lanectl/v1", "schema: lanectl-v1"))
    result = lanectl("validate", cwd=project)
    assert result.returncode == 2 and "0 lanes" not in result.stdout
    assert result.stderr.startswith("lanectl: no lanectl recipe found; not recognised: recipes/r.yaml: ")
