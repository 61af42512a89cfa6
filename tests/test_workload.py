"""Workload files: the shipped ones are valid, mistakes are named by file, line and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from lanectl.bench.workload import WorkloadInvalid, load_workload, prefixed, workload_file
from lanectl.errors import BadInput
from lanectl.project import Project
from lanectl.recipe.catalog import recipe_files

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "recipes" / "workloads"


def write(tmp_path: Path, text: str, name: str = "w.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(WorkloadInvalid) as info:
        load_workload(path, shown=path.name)
    return [str(p) for p in info.value.problems]


def test_shipped_coding_workload_is_valid() -> None:
    w = load_workload(WORKLOADS / "coding.yaml")
    assert w.name == "coding"
    assert w.temperature == 0
    assert sorted(w.classes) == ["code", "prose", "shell", "structured", "tool_json"]
    for name in w.classes:
        prompts = w.prompts(name)
        assert len(prompts) >= 5
        assert len(set(prompts)) == len(prompts)


def test_shipped_2k_workload_has_long_prompts() -> None:
    w = load_workload(WORKLOADS / "coding-2k.yaml")
    prompts = w.prompts("coding_2k")
    assert len(prompts) == 4
    # ~2K tokens at ~4 bytes per token (the stub counts exactly so).
    assert all(7000 <= len(p.encode()) <= 9000 for p in prompts), [len(p.encode()) for p in prompts]


def test_shipped_workloads_stay_small_and_are_not_recipes() -> None:
    files = sorted(WORKLOADS.glob("*.yaml"))
    assert sum(f.stat().st_size for f in files) < 60_000
    assert recipe_files(Project(root=REPO, recipes_dir=REPO / "recipes"), [WORKLOADS]) == []


def test_loads_a_minimal_workload(tmp_path: Path) -> None:
    path = write(tmp_path, """
        schema: lanectl-workload/v1
        name: tiny
        max_tokens: 8
        classes:
          prose: ["hello"]
        """)
    w = load_workload(path)
    assert (w.name, w.max_tokens, w.temperature, w.description) == ("tiny", 8, 0.0, "")
    assert w.prompts("prose") == ["hello"]


def test_unknown_class_names_the_known_ones(tmp_path: Path) -> None:
    w = load_workload(WORKLOADS / "coding.yaml")
    with pytest.raises(BadInput, match="workload coding has no class 'poetry'; it has: prose, structured, code, shell"):
        w.prompts("poetry")


def test_errors_name_file_line_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, """
        schema: lanectl-workload/v1
        name: bad
        max_tokens: 0
        temprature: 0
        classes:
          prose: []
          code: ["ok", ""]
        """)
    assert problems(path) == [
        "w.yaml:3:13: max_tokens: Input should be greater than or equal to 1, got 0",
        "w.yaml:4:1: temprature: unknown key; expected one of: schema, name, description, max_tokens, "
        "temperature, classes, probes, agent_classes, context_lengths, calibration_max_age_days",
        "w.yaml:6:10: classes.prose: List should have at least 1 item after validation, not 0",
        "w.yaml:7:16: classes.code[1]: String should have at least 1 character, got ''",
    ]


def test_a_recipe_schema_is_not_a_workload(tmp_path: Path) -> None:
    path = write(tmp_path, """
        schema: lanectl/v1
        name: x
        max_tokens: 8
        classes: {prose: [a]}
        """)
    assert problems(path) == ["w.yaml:1:9: schema: Input should be 'lanectl-workload/v1', got 'lanectl/v1'"]


def test_missing_keys_and_bad_class_names(tmp_path: Path) -> None:
    path = write(tmp_path, """
        schema: lanectl-workload/v1
        name: x
        classes:
          Bad Name: [a]
        """)
    got = problems(path)
    assert got[0] == "w.yaml:1:1: max_tokens: required key is missing"
    assert got[1].startswith("w.yaml:4:3: classes.Bad Name: String should match pattern")


def test_malformed_yaml_and_non_mapping(tmp_path: Path) -> None:
    assert problems(write(tmp_path, "schema: [\n")) == [
        "w.yaml:2:1: malformed YAML: expected the node content, but found '<stream end>'; fix the syntax at this spot"
    ]
    assert problems(write(tmp_path, "- a\n- b\n")) == [
        "w.yaml:1:1: a workload is a YAML mapping with schema, name, max_tokens and classes"
    ]


def test_unreadable_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"missing.yaml: cannot be read: No such file or directory"):
        load_workload(tmp_path / "missing.yaml")


def test_workload_file_resolves_names_and_paths(tmp_path: Path) -> None:
    recipes = REPO / "recipes"
    assert workload_file(recipes, "coding") == WORKLOADS / "coding.yaml"
    assert workload_file(recipes, str(WORKLOADS / "coding-2k.yaml")) == WORKLOADS / "coding-2k.yaml"
    with pytest.raises(BadInput, match="no workload 'codin'; known workloads: coding, coding-2k"):
        workload_file(recipes, "codin")
    with pytest.raises(BadInput, match="no workloads in"):
        workload_file(tmp_path, "coding")


def test_prefixes_differ_per_arm_and_keep_the_prompt() -> None:
    prompt = "Write a haiku about caches."
    arms = [prefixed(prompt, arm) for arm in ("1718000000-A1", "1718000000-B", "1718000000-A2")]
    assert len(set(arms)) == 3
    assert arms[0] == "[run 1718000000-A1] Write a haiku about caches."
    assert all(a.endswith(prompt) for a in arms)
    # The prefix sits at the very start, so it falls in the first KV block (16 tokens) of every prompt.
    assert all(len(a.encode()) - len(prompt.encode()) < 16 * 4 for a in arms)


@pytest.mark.parametrize("bad", ["", "a]b", "a\nb"])
def test_prefix_refuses_ids_that_would_blur_it(bad: str) -> None:
    with pytest.raises(ValueError, match="arm id"):
        prefixed("x", bad)


def test_agent_classes_and_context_lengths_are_checked_at_their_lines(tmp_path: Path) -> None:
    path = write(tmp_path, """
        schema: lanectl-workload/v1
        name: agents
        max_tokens: 32
        classes:
          prose: ["hello"]
          tool_json: ["call a tool"]
        agent_classes: [tool_json, tools]
        context_lengths: [0, 1024, 1024]
        """)
    assert problems(path) == [
        "w.yaml:7:28: agent_classes[1]: 'tools' is not a class of this workload; it has: prose, tool_json",
        "w.yaml:8:28: context_lengths[2]: 1024 is listed twice",
    ]


def test_a_context_beyond_the_lanes_max_model_len_is_refused_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, """
        schema: lanectl-workload/v1
        name: long
        max_tokens: 32
        classes:
          prose: ["hello"]
        context_lengths:
          - 0
          - 4064
          - 65536
        """)
    w = load_workload(path, max_model_len=65568)  # 65536 + 32 fits exactly
    assert w.context_lengths == [0, 4064, 65536] and load_workload(path).context_lengths == w.context_lengths
    with pytest.raises(WorkloadInvalid) as info:
        load_workload(path, shown="w.yaml", max_model_len=4095, lane="demo-h1")
    assert [str(p) for p in info.value.problems] == [
        "w.yaml:8:5: context_lengths[1]: 4064 tokens + max_tokens 32 exceed demo-h1's --max-model-len 4095",
        "w.yaml:9:5: context_lengths[2]: 65536 tokens + max_tokens 32 exceed demo-h1's --max-model-len 4095",
    ]


def test_padding_reaches_the_context_length_and_keeps_the_question_last() -> None:
    from lanectl.bench.workload import padded

    question = "What is a write-ahead log for?"
    assert padded(question, 0) == question
    assert padded(question, 2) == question  # already longer than 2 tokens
    long = padded(question, 1000)
    assert len(long.encode()) == 4000 and long.endswith(question)
