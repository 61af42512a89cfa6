"""Hostile YAML and files through the real entry points (`python -m lanectl …` in a subprocess):
each gives exit 2 with the file (and line) named, never a traceback and never a hang."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lanectl.recipe import yaml_source
from lanectl.recipe.yaml_source import MAX_NODES, YamlSyntaxError, load_yaml
from tests.test_cli import lanectl
from tests.test_recipe_validation import GOOD


def billion_laughs(levels: int = 9) -> str:
    lines = ['x0: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"x{i}: &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]")
    return "\n".join(lines) + "\n"


HOSTILE_YAML = {
    "billion-laughs": (
        "schema: lanectl/v1\n" + billion_laughs(),
        f"recipes/r.yaml:7:5: this value expands to more than {MAX_NODES} YAML nodes through aliases "
        "(a 'billion laughs'?); write it out or use fewer aliases",
    ),
    "recursive-alias": (
        "schema: lanectl/v1\nid: z\nlanes: &l {a: *l}\n",
        "recipes/r.yaml:3:15: this alias refers to a value that contains it (a recursive alias); "
        "aliases may only repeat a finished value",
    ),
    "deep-nesting": (
        "schema: lanectl/v1\nid: d\nlanes: " + "[" * 500 + "]" * 500 + "\n",
        "recipes/r.yaml:3:71: nested more than 64 levels deep; flatten this value",
    ),
    "5000-digit-int": (
        "schema: lanectl/v1\nid: y\nkeep_stopped_lanes: 1" + "0" * 5000 + "\nlanes: {a: {}}\n",
        "recipes/r.yaml:3:21: keep_stopped_lanes: cannot read this value: an integer this long is not a number "
        "lanectl accepts; quote it to make it a string",
    ),
    "10**400": (
        "schema: lanectl/v1\nid: y\nkeep_stopped_lanes: 1" + "0" * 400 + "\nlanes: {a: {}}\n",
        "recipes/r.yaml:3:21: keep_stopped_lanes: Input should be less than or equal to 20, got an integer of "
        "401 digits\n"
        # A top-level problem hides none of the lanes' own.
        "recipes/r.yaml:4:12: lanes.a.engine: required key is missing\n"
        "recipes/r.yaml:4:12: lanes.a.health: required key is missing\n"
        "recipes/r.yaml:4:12: lanes.a.image: required key is missing",
    ),
    "bad-date": (
        "schema: lanectl/v1\nid: q\ndescription: 2026-13-45\nlanes: {a: {}}\n",
        "recipes/r.yaml:3:14: description: cannot read this value: month must be in 1..12; "
        "quote it to make it a string",
    ),
    "control-character": (
        "schema: lanectl/v1\nid: q\ndescription: a\x07b\n",
        "recipes/r.yaml:3:15: malformed YAML: the control character #x0007 is not allowed; remove it",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_YAML))
def test_hostile_recipe_yaml_is_a_located_error(project: Path, case: str) -> None:
    text, expected = HOSTILE_YAML[case]
    (project / "recipes" / "r.yaml").write_text(text)

    # "Never a hang": lanectl() gives the process 60 s and fails the test past it. How little work the
    # alias bound lets a small file cost is counted, not timed, in test_alias_bound_stops_work_and_memory.
    result = lanectl("validate", cwd=project)

    count = len(expected.splitlines())
    assert (result.returncode, result.stderr) == (2, f"{expected}\n{count} problem(s); nothing was built or started.\n")
    assert "Traceback" not in result.stdout + result.stderr


def test_non_utf8_recipe_names_line_and_column(project: Path) -> None:
    (project / "recipes" / "r.yaml").write_bytes(b"schema: lanectl/v1\nid: x\ndescription: caf\xe9\n")

    result = lanectl("validate", cwd=project)

    assert (result.returncode, result.stderr) == (
        2,
        "recipes/r.yaml:3:17: not UTF-8 text (byte 0xe9); save the file as UTF-8\n"
        "1 problem(s); nothing was built or started.\n",
    )


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_directory_named_yaml_among_recipes_does_not_hang(project: Path, write_recipe, kind: str) -> None:
    write_recipe(GOOD)
    odd = project / "recipes" / "odd.yaml"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.mkdir()
    expected = {
        "fifo": "recipes/odd.yaml: is not a regular file (a FIFO, socket or device); give a YAML file",
        "directory": "recipes/odd.yaml: is a directory, not a YAML file; rename it or move it away",
    }[kind]

    result = lanectl("validate", cwd=project)

    count = len(expected.splitlines())
    assert (result.returncode, result.stderr) == (2, f"{expected}\n{count} problem(s); nothing was built or started.\n")


def test_an_explicit_fifo_recipe_path_does_not_hang(project: Path) -> None:
    os.mkfifo(project / "fifo.yaml")

    result = lanectl("validate", "fifo.yaml", cwd=project)

    assert (result.returncode, result.stderr) == (
        2,
        "fifo.yaml: is not a regular file (a FIFO, socket or device); give a YAML file\n"
        "1 problem(s); nothing was built or started.\n",
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("fifo", "kernels/evil.yaml: is not a regular file (a FIFO, socket or device); give a YAML file"),
        (b"name: evil\n# \xff\n", "kernels/evil.yaml:2:3: not UTF-8 text (byte 0xff); save the file as UTF-8"),
        (
            "name: evil\n" + billion_laughs(),
            f"kernels/evil.yaml:7:5: this value expands to more than {MAX_NODES} YAML nodes through aliases "
            "(a 'billion laughs'?); write it out or use fewer aliases",
        ),
    ],
    ids=["fifo", "non-utf8", "billion-laughs"],
)
def test_hostile_kernel_files(project: Path, write_recipe, content: str | bytes, expected: str) -> None:
    write_recipe(GOOD.replace("  b:\n    engine:\n      env: {X: \"1\"}\n", "  b:\n    kernels: [evil]\n"))
    path = project / "kernels" / "evil.yaml"
    if content == "fifo":
        os.mkfifo(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)

    result = lanectl("validate", cwd=project)

    assert result.returncode == 2
    assert expected in result.stderr.splitlines(), result.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("fifo", "workloads/evil.yaml: is not a regular file (a FIFO, socket or device); give a YAML file"),
        ("dir", "workloads/evil.yaml: is a directory, not a YAML file; rename it or move it away"),
        (b"schema: x\n\xc3(\n", "workloads/evil.yaml:2:1: not UTF-8 text (byte 0xc3); save the file as UTF-8"),
        (
            billion_laughs(),
            f"workloads/evil.yaml:6:5: this value expands to more than {MAX_NODES} YAML nodes through aliases "
            "(a 'billion laughs'?); write it out or use fewer aliases",
        ),
    ],
    ids=["fifo", "directory", "non-utf8", "billion-laughs"],
)
def test_hostile_workload_files(tmp_path: Path, content: str | bytes, expected: str) -> None:
    from lanectl.bench.workload import WorkloadInvalid, load_workload, workload_file

    folder = tmp_path / "recipes" / "workloads"
    folder.mkdir(parents=True)
    path = folder / "evil.yaml"
    if content == "fifo":
        os.mkfifo(path)
    elif content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)

    with pytest.raises(WorkloadInvalid) as raised:
        load_workload(workload_file(tmp_path / "recipes", "evil"), shown="workloads/evil.yaml")

    assert str(raised.value) == expected


def test_alias_bound_stops_work_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small file cannot cost seconds or gigabytes: the work is counted in nodes composed and walked
    (the same on a quiet or a loaded machine), not timed. An unbounded expansion walks 387 million
    nodes; the counter stops it at a thousand, so a broken bound fails here rather than hanging."""
    import tracemalloc

    text = billion_laughs(9)  # 9**9 = 387 million values if expanded
    assert len(text) < 1000
    counts = {"composed": 0, "walked": 0}
    limit = 1_000  # the file holds fewer than 100 nodes; anything proportional to the expansion is far above

    def counting(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            if counts[name] > limit:
                raise AssertionError(f"more than {limit} nodes {name}: the alias expansion is not bounded")
            return inner(*args, **kwargs)

        return counted

    compose = yaml_source._BoundedLoader.compose_node
    monkeypatch.setattr(yaml_source._BoundedLoader, "compose_node", counting("composed", compose))
    monkeypatch.setattr(yaml_source, "_walk", counting("walked", yaml_source._walk))
    tracemalloc.start()
    try:
        with pytest.raises(YamlSyntaxError, match="expands to more than"):
            load_yaml(text, "laughs.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert counts["composed"] < 100  # stopped while composing, at the value that blows up
    assert counts["walked"] == 0  # before a single node was walked
    assert peak < 5_000_000


def test_aliases_within_the_bound_still_work() -> None:
    doc = load_yaml("base: &b {a: 1, b: [1, 2]}\ncopy: *b\nmerged: {<<: *b, c: 3}\n", "ok.yaml")

    assert doc.data == {"base": {"a": 1, "b": [1, 2]}, "copy": {"a": 1, "b": [1, 2]},
                        "merged": {"a": 1, "b": [1, 2], "c": 3}}
