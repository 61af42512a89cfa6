"""What `validate` accepts, every command renders; what would not render, `validate` refuses with file:line.

Each case here is one the property test (tests/test_recipe_properties.py) or the input pass of issue 52 found: it
passed `validate` and then crashed `render`, `lanes`, `status` or `up` with a traceback, or crashed validation
itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.test_cli import lanectl
from tests.test_recipe_validation import GOOD

TOO_LONG = "n" * 300


def refused(project: Path, *args: str) -> list[str]:
    """`lanectl ARGS`' lines on stderr, which must be a refusal (exit 2) with nothing on stdout."""
    result = lanectl(*args, cwd=project)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    return result.stderr.splitlines()


@pytest.mark.parametrize(("old", "new", "where"), [
    ("args: [/model,", 'args: ["/mo\\udc80del",', "recipes/r.yaml:10:12: defaults.engine.args[0]: holds \\udc80"),
    ('env: {X: "1"}', 'env: {X: "\\ud800"}', "recipes/r.yaml:20:16: lanes.b.engine.env.X: holds \\ud800"),
    ('env: {X: "1"}', 'env: {"\\udfff": "1"}', "recipes/r.yaml:20:13: lanes.b.engine.env: holds \\udfff"),
    ("engine:\n    args", 'engine:\n    entrypoint: ["/bin/s\\udc80"]\n    args',
     "recipes/r.yaml:10:18: defaults.engine.entrypoint[0]: holds \\udc80"),
], ids=["args", "env-value", "env-key", "entrypoint"])
def test_a_lone_surrogate_is_refused_where_it_is_written(project, write_recipe, old, new, where):
    write_recipe(GOOD.replace(old, new))
    lines = refused(project, "validate")
    assert lines[0].startswith(where), lines
    assert "half of a UTF-16 surrogate pair" in lines[0]
    assert refused(project, "render", "b")[0].startswith(where)


def broken_template(project: Path, text: str) -> None:
    folder = project / "images" / "broken"
    folder.mkdir()
    (folder / "Dockerfile.j2").write_text(text)


@pytest.mark.parametrize(("template", "line", "reason"), [
    ("FROM {{ base }}\n{% if %}\n", 2, "Expected an expression, got 'end of statement block'"),
    ("FROM {{ base }}\n\nRUN {{ nope }}\n", 3, "UndefinedError: 'nope' is undefined"),
    ('FROM {{ base }}\nRUN {{ 1 + "a" }}\n', 2, "TypeError: unsupported operand type(s) for +: 'int' and 'str'"),
    ('FROM {{ base }}\n{% include "nope.j2" %}\n', 2, "TemplateNotFound: nope.j2"),
], ids=["syntax", "undefined", "type", "missing-include"])
def test_a_template_that_does_not_render_is_refused_at_its_line(project, write_recipe, template, line, reason):
    broken_template(project, template)
    write_recipe(GOOD.replace("template: stub-engine", "template: broken"))
    assert refused(project, "validate") == [
        f"images/broken/Dockerfile.j2:{line}:1: the image template does not render: {reason} (lanes a, b); fix the "
        "template",
        "1 problem(s); nothing was built or started."]
    # A template changed after validation: the commands that render refuse it in one line, no traceback.
    assert refused(project, "render", "b") == [
        f"lanectl: images/broken/Dockerfile.j2:{line}: the image template does not render: {reason}; fix the "
        "template"]
    assert refused(project, "lanes")[0].startswith(f"lanectl: images/broken/Dockerfile.j2:{line}: ")


def test_a_template_linked_from_outside_its_folder_is_refused_by_every_command(project, write_recipe, tmp_path):
    outside = tmp_path / "elsewhere.j2"
    outside.write_text("FROM {{ base }}\n")
    (project / "images" / "broken").mkdir()
    (project / "images" / "broken" / "Dockerfile.j2").symlink_to(outside)
    write_recipe(GOOD.replace("template: stub-engine", "template: broken"))
    expected = ("recipes/r.yaml:5:15: defaults.image.template: images/broken/Dockerfile.j2 is a symbolic link out "
                "of its folder; copy the template into images/broken/")
    assert refused(project, "validate")[0] == expected
    assert refused(project, "render", "b")[0] == expected
    assert refused(project, "lanes")[0] == expected


PATCH = "\n    patches:\n      - {path: PATH, sha256: " + "0" * 64 + "}"


@pytest.mark.parametrize(("path", "why"), [(TOO_LONG + ".patch", " (File name too long)"),
                                           ("loop/x.patch", " (Too many levels of symbolic links)")],
                         ids=["name-too-long", "link-loop"])
def test_a_patch_path_the_os_refuses_is_a_located_problem(project, write_recipe, path, why):
    (project / "patches" / "loop").symlink_to(project / "patches" / "loop")
    write_recipe(GOOD.replace('env: {X: "1"}', 'env: {X: "1"}' + PATCH.replace("PATH", path)))
    lines = refused(project, "validate")
    assert lines[0].startswith("recipes/r.yaml:22:16: lanes.b.patches[0].path: ")
    assert lines[0].endswith(why + "; paths are relative to patches/") or "leads out of patches/" in lines[0]


@pytest.mark.parametrize("where", ["too-long", "loop"])
def test_a_recipes_folder_the_os_refuses_is_bad_input(project, where):
    os.symlink("loop", project / "loop")
    path = {"too-long": str(project / TOO_LONG), "loop": "loop"}[where]
    for args in (["--recipes", path, "validate"], ["validate", path]):
        lines = refused(project, *args)
        assert "Traceback" not in "\n".join(lines) and len(lines) <= 2, lines


@pytest.mark.parametrize("recipe_id", ["demo.", "demo-", "demo..x", "demo._x", "a" * 129])
def test_a_recipe_id_that_is_no_docker_repository_name_is_refused(project, write_recipe, recipe_id):
    """`id: 19g8m.` passed validate, and `lanectl lanes` then asked Docker about lanectl/19g8m.:a-…, which it
    refuses (invalid reference format) with an error lanectl did not expect."""
    write_recipe(GOOD.replace("id: t", f"id: {recipe_id}"))
    assert refused(project, "validate")[0].startswith("recipes/r.yaml:2:5: id: String should ")
