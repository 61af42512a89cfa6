"""Correctness probes, the pure part: every pass rule passes a good answer and fails each kind of bad
one; probe files and the workloads naming them are refused with file:line; the gate fails on a probe."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lanectl.bench.gate import LaneBench, judge
from lanectl.bench.loadgen import ArmResult, RequestResult, summarize
from lanectl.bench.probes import (
    CHARS_PER_TOKEN,
    GauntletItem,
    Needle,
    ProbeInvalid,
    answer_text,
    check_json,
    check_needle,
    check_sql,
    check_thinking,
    check_tool_call,
    check_yaml,
    haystack,
    load_probe,
    load_probes,
    max_model_len,
    needle_prompt,
    repetition_loop,
    requests_of,
    schema_errors,
)
from lanectl.bench.stats import ForcedPosition, TokenChoice, Verdict
from lanectl.bench.workload import WorkloadInvalid, load_workload

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "recipes" / "workloads"

THERMOSTAT = {"type": "object", "properties": {"room": {"type": "string", "minLength": 1},
                                               "target_c": {"type": "number", "minimum": 10, "maximum": 28}},
              "required": ["room", "target_c"], "additionalProperties": False}
TOOL_ITEM = GauntletItem.model_validate({
    "name": "thermostat", "prompt": "warmer", "expect": "tool_call", "tool_choice": "set_thermostat",
    "tools": [{"type": "function", "function": {"name": "set_thermostat", "parameters": THERMOSTAT}},
              {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]})
SQL_SCHEMA = ("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT);\n"
              "CREATE TABLE orders (user_id INTEGER, total REAL);")


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}]}


# -- the JSON Schema subset ----------------------------------------------------------------------------

def test_schema_errors_accept_a_valid_value_and_name_each_violation() -> None:
    schema = {"type": "object", "required": ["a", "tags"], "additionalProperties": False,
              "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 5},
                             "mode": {"enum": ["x", "y"]},
                             "tags": {"type": "array", "minItems": 1, "maxItems": 2,
                                      "items": {"type": "string", "minLength": 2, "maxLength": 3}}}}
    assert schema_errors({"a": 3, "mode": "x", "tags": ["ab"]}, schema) == []
    assert schema_errors({"a": 3.0, "tags": ["ab"]}, schema) == []  # 3.0 is an integer in JSON Schema
    assert schema_errors({"a": 0, "tags": ["ab"]}, schema) == ["$.a: 0 is below the minimum 1"]
    assert schema_errors({"a": 6, "tags": ["ab"]}, schema) == ["$.a: 6 is above the maximum 5"]
    assert schema_errors({"a": True, "tags": ["ab"]}, schema) == ["$.a: expected integer, got true"]
    assert schema_errors({"tags": ["ab"]}, schema) == ["$: missing required 'a'"]
    assert schema_errors({"a": 1, "tags": ["ab"], "b": 1}, schema) == ["$: unexpected property 'b'"]
    assert schema_errors({"a": 1, "mode": "z", "tags": ["ab"]}, schema) == ['$.mode: "z" is not one of ["x", "y"]']
    assert schema_errors({"a": 1, "tags": []}, schema) == ["$.tags: fewer than 1 items"]
    assert schema_errors({"a": 1, "tags": ["ab", "cd", "ef"]}, schema) == ["$.tags: more than 2 items"]
    assert schema_errors({"a": 1, "tags": ["a", "abcd"]}, schema) == [
        "$.tags[0]: shorter than 2 characters", "$.tags[1]: longer than 3 characters"]
    assert schema_errors([], schema) == ["$: expected object, got []"]
    assert schema_errors(None, {"type": ["string", "null"]}) == []


# -- gauntlet rules ------------------------------------------------------------------------------------

def test_a_schema_valid_call_of_the_forced_tool_passes() -> None:
    assert check_tool_call(call("set_thermostat", '{"room": "bedroom", "target_c": 21.5}'), TOOL_ITEM) is None


@pytest.mark.parametrize(("message", "why"), [
    ({"role": "assistant", "content": "Sure, 21 degrees.", "tool_calls": []}, "no tool call"),
    (call("unlock_door", "{}"), "not one of the offered tools"),
    (call("get_time", "{}"), "not the forced 'set_thermostat'"),
    (call("set_thermostat", '{"room": "bedroom", "target_c": 21.5'), "arguments are not JSON"),
    (call("set_thermostat", '["bedroom", 21.5]'), "not a JSON object"),
    (call("set_thermostat", '{"room": "bedroom", "target_c": 35}'), "$.target_c: 35 is above the maximum 28"),
    (call("set_thermostat", '{"room": "bedroom"}'), "missing required 'target_c'"),
])
def test_each_kind_of_bad_tool_call_fails(message: dict[str, Any], why: str) -> None:
    failure = check_tool_call(message, TOOL_ITEM)
    assert failure is not None and why in failure


def test_json_answers() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert check_json('{"n": 1}', schema) is None
    assert check_json('Here it is:\n```json\n{"n": 1}\n```\nDone.', schema) is None
    assert check_json('{"n": 1', None).startswith("not JSON")  # type: ignore[union-attr]
    assert check_json("[1, 2]", None) is None
    assert check_json('{"n": "one"}', schema) == 'JSON breaks the schema: $.n: expected integer, got "one"'


def test_yaml_answers_must_be_a_mapping_or_a_list() -> None:
    assert check_yaml("```yaml\njobs:\n  test:\n    runs-on: ubuntu-latest\n```", None) is None
    assert check_yaml("- a\n- b\n", None) is None
    assert "not a mapping or a list" in check_yaml("Sorry, I cannot write YAML.", None)  # type: ignore[operator]
    assert check_yaml("a: [1, 2\nb: 3", None).startswith("not YAML")  # type: ignore[union-attr]
    assert "breaks the schema" in check_yaml("a: 1", {"type": "object", "required": ["b"]})  # type: ignore[operator]


def test_sql_answers_compile_against_the_declared_tables() -> None:
    good = ("```sql\nSELECT u.email, COALESCE(SUM(o.total), 0) AS spend FROM users u "
            "LEFT JOIN orders o ON o.user_id = u.id GROUP BY u.email ORDER BY spend DESC;\n```")
    assert check_sql(good, SQL_SCHEMA) is None
    assert "no such column" in check_sql("SELECT name FROM users", SQL_SCHEMA)  # type: ignore[operator]
    assert "no such table" in check_sql("SELECT * FROM customers", SQL_SCHEMA)  # type: ignore[operator]
    assert "one statement" in check_sql("SELECT 1; DROP TABLE users", SQL_SCHEMA)  # type: ignore[operator]
    assert check_sql("```sql\n```", SQL_SCHEMA) == "no SQL in the reply"
    assert "does not compile" in check_sql("Use a LEFT JOIN.", SQL_SCHEMA)  # type: ignore[operator]


def test_the_answer_is_the_first_fenced_block_else_the_reply() -> None:
    assert answer_text("x\n```json\n{}\n```\n```\n[]\n```") == "{}"
    assert answer_text("  {}  ") == "{}"


# -- thinking, soak, needle ----------------------------------------------------------------------------

MARKERS = ("<think>", "</think>")


def test_thinking_passes_reasoning_apart_from_an_answer() -> None:
    assert check_thinking({"content": "25 minutes.", "reasoning": "17:10 - 14:35 ..."}, MARKERS) is None


@pytest.mark.parametrize(("message", "why"), [
    ({"content": "<think>17:10 - 14:35</think>2 h 35 min", "reasoning": None}, "leaked"),
    ({"content": "2 h 35 min</think>", "reasoning": "17:10 - 14:35"}, "leaked"),
    ({"content": "2 h 35 min", "reasoning": None}, "no reasoning returned apart"),
    ({"content": "2 h 35 min", "reasoning": "  "}, "no reasoning returned apart"),
    ({"content": "2 h 35 min", "reasoning_content": "old field"}, "only the old `reasoning_content` field"),
    ({"content": "", "reasoning": "17:10 - 14:35"}, "no answer after the reasoning"),
    ({"content": None, "reasoning": "17:10 - 14:35"}, "no answer after the reasoning"),
])
def test_each_kind_of_bad_thinking_reply_fails(message: dict[str, Any], why: str) -> None:
    failure = check_thinking(message, MARKERS)
    assert failure is not None and why in failure


def test_repetition_loop_rule() -> None:
    prose = " ".join(f"word{i}" for i in range(500))
    assert repetition_loop(prose, 8, 3, 400) is None
    looped = prose + " " + " ".join(["a b c d e f"] * 20)
    failure = repetition_loop(looped, 8, 3, 400)
    assert failure is not None and failure.startswith("loop: ") and "in the last 400 words (at most 3)" in failure
    # Exactly max_repeats occurrences pass; one more fails.
    three = prose + " " + " ".join(["a b c d e f g h"] * 3)
    assert repetition_loop(three, 8, 3, 400) is None
    assert repetition_loop(three + " a b c d e f g h", 8, 3, 400) is not None
    # Only the window counts: a loop that ended long before the last `window` words is not judged.
    assert repetition_loop(looped + " " + prose, 8, 3, 400) is None
    assert repetition_loop("short", 8, 3, 400) is None


def needle(**changes: Any) -> Needle:
    fields = {"schema": "lanectl-probe/v1", "name": "n", "kind": "needle", "max_tokens": 16,
              "haystack_tokens": 2000, "depth": 0.25, "needle": "The vault code is 7349-KESTREL.",
              "question": "What is the vault code?", "answer": "7349-KESTREL"}
    return Needle.model_validate({**fields, **changes})


def test_haystack_has_the_configured_length_and_the_needle_at_its_depth() -> None:
    for depth in (0.0, 0.25, 0.5, 1.0):
        probe = needle(depth=depth)
        text = haystack(probe)
        assert len(text) == probe.haystack_tokens * CHARS_PER_TOKEN
        assert text.count(probe.needle) == 1
        where = text.index(probe.needle) / len(text)
        assert abs(where - depth) < 0.05, (depth, where)
    assert needle_prompt(needle()).endswith("\n\nWhat is the vault code?")


def test_needle_answer_rule() -> None:
    assert check_needle("The code is 7349-kestrel.", "7349-KESTREL") is None
    assert check_needle("The text does not say.", "7349-KESTREL") is not None
    assert check_needle("", "7349-KESTREL") is not None


def test_requests_ask_for_what_each_rule_checks() -> None:
    gauntlet = load_probe(WORKLOADS / "probes" / "gauntlet.yaml").probe
    bodies = {item: body for item, body, _ in requests_of(gauntlet)}
    assert bodies["thermostat"]["tool_choice"] == {"type": "function", "function": {"name": "set_thermostat"}}
    assert bodies["calendar"]["tool_choice"] == "required"
    assert bodies["csv-to-json"]["response_format"]["type"] == "json_schema"
    assert "CREATE TABLE users" in bodies["spend-sql"]["messages"][0]["content"]
    thinking = load_probe(WORKLOADS / "probes" / "thinking.yaml").probe
    assert all(body["chat_template_kwargs"] == {"thinking": True} for _, body, _ in requests_of(thinking))


# -- files and bad input -------------------------------------------------------------------------------

def test_shipped_probes_and_the_workloads_naming_them_load() -> None:
    kinds = {path.stem: load_probe(path).probe for path in sorted((WORKLOADS / "probes").glob("*.yaml"))}
    assert {name: p.kind for name, p in kinds.items()} == {
        "gauntlet": "gauntlet", "needle-4k": "needle", "needle-900k": "needle", "soak": "soak",
        "soak-demo": "soak", "thinking": "thinking"}
    assert len(kinds["gauntlet"].items) == 12 and len(kinds["thinking"].prompts) == 16  # type: ignore[union-attr]
    assert len(kinds["soak"].prompts) == 4  # type: ignore[union-attr]
    assert load_workload(WORKLOADS / "coding.yaml").probes == ["gauntlet", "thinking", "soak", "needle-900k"]
    assert load_workload(WORKLOADS / "demo.yaml").probes == ["gauntlet", "thinking", "soak-demo", "needle-4k"]
    # The production needle fits the production lanes' --max-model-len 1048576.
    assert load_probes(WORKLOADS / "coding.yaml", ["needle-900k"], [("h2-REF", 1048576)])


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def refused(path: Path) -> list[str]:
    with pytest.raises(ProbeInvalid) as info:
        load_probe(path, shown=path.name)
    return [str(p) for p in info.value.problems]


NEEDLE = """
    schema: lanectl-probe/v1
    name: n
    kind: needle
    max_tokens: 16
    haystack_tokens: {tokens}
    depth: {depth}
    needle: "The vault code is 7349-KESTREL."
    question: "What is the vault code?"
    answer: "{answer}"
"""


def test_a_needle_longer_than_its_haystack_a_depth_outside_0_1_and_an_unfindable_answer(tmp_path: Path) -> None:
    assert refused(write(tmp_path, "a.yaml", NEEDLE.format(tokens=8, depth=0.5, answer="7349-KESTREL"))) == [
        "a.yaml:7:9: needle: the needle (8 tokens at 4 characters a token) is not shorter than the haystack "
        "(8 tokens)"]
    assert refused(write(tmp_path, "b.yaml", NEEDLE.format(tokens=100, depth=1.5, answer="7349-KESTREL"))) == [
        "b.yaml:6:8: depth: Input should be less than or equal to 1, got 1.5"]
    assert refused(write(tmp_path, "c.yaml", NEEDLE.format(tokens=100, depth=-0.1, answer="7349-KESTREL"))) == [
        "c.yaml:6:8: depth: Input should be greater than or equal to 0, got -0.1"]
    assert refused(write(tmp_path, "d.yaml", NEEDLE.format(tokens=100, depth=0.5, answer="1234"))) == [
        "d.yaml:9:9: answer: the answer is not in the needle, so no reply could pass"]


def test_unknown_keys_kinds_and_empty_lists_are_refused_with_their_line(tmp_path: Path) -> None:
    assert refused(write(tmp_path, "a.yaml", """
        schema: lanectl-probe/v1
        name: s
        kind: soak
        max_tokens: 16
        ngram: 8
        max_repeat: 3
        window: 100
        prompts: []
    """)) == ["a.yaml:1:1: max_repeats: required key is missing",
              "a.yaml:6:1: max_repeat: unknown key; expected one of: schema, name, description, max_tokens, "
              "timeout_seconds, kind, prompts, ngram, max_repeats, window",
              "a.yaml:8:10: prompts: List should have at least 1 item after validation, not 0"]
    assert refused(write(tmp_path, "b.yaml", """
        schema: lanectl-probe/v1
        name: s
        kind: sprint
    """)) == ["b.yaml:3:7: kind: kind must be one of: gauntlet, thinking, soak, needle"]
    assert refused(write(tmp_path, "c.yaml", """
        schema: lanectl-probe/v1
        name: s
        kind: soak
        max_tokens: 16
        ngram: 8
        max_repeats: 3
        window: 4
        prompts: [go]
    """)) == ["c.yaml:7:9: window: the window (4 words) is shorter than one n-gram (8)"]


def test_gauntlet_items_are_checked_for_meaning(tmp_path: Path) -> None:
    problems = refused(write(tmp_path, "g.yaml", """
        schema: lanectl-probe/v1
        name: g
        kind: gauntlet
        max_tokens: 64
        items:
          - name: t
            prompt: call it
            expect: tool_call
            tool_choice: missing_tool
            tools:
              - type: function
                function:
                  name: f
                  parameters: {type: object, properties: {x: {type: string, pattern: "^a"}}}
          - name: q
            prompt: query it
            expect: sql
            sql_schema: "CREATE TABLE (oops"
          - name: j
            prompt: json it
            expect: json
            sql_schema: "CREATE TABLE t (a)"
          - name: j
            prompt: again
            expect: yaml
    """))
    assert problems == [
        "g.yaml:9:18: items[0].tool_choice: tool_choice is `required` or one of the tools: f",
        "g.yaml:14:78: items[0].tools[0].function.parameters.properties.x.pattern: schema keyword 'pattern' is "
        "not checked by the probes; use only: additionalProperties, enum, items, maxItems, maxLength, maximum, "
        "minItems, minLength, minimum, properties, required, type",
        'g.yaml:18:17: items[1].sql_schema: SQLite refuses the schema: near "(": syntax error',
        "g.yaml:22:17: items[2].sql_schema: sql_schema is for expect: sql, not json",
        "g.yaml:23:11: items[3].name: item name 'j' is used twice",
    ]


def test_a_haystack_beyond_a_lanes_max_model_len_is_refused_at_its_line(tmp_path: Path) -> None:
    workload = write(tmp_path, "w.yaml", "")
    write(tmp_path, "probes/n.yaml", NEEDLE.format(tokens=4000, depth=0.5, answer="7349-KESTREL"))
    with pytest.raises(ProbeInvalid) as info:
        load_probes(workload, ["n"], [("demo-h1", None), ("small", 4000), ("big", 32768)])
    [problem] = [str(p) for p in info.value.problems]
    assert problem.endswith("probes/n.yaml:5:18: haystack_tokens: the needle prompt (4007 tokens at 4 characters "
                            "a token) plus 16 output tokens exceeds lane small's --max-model-len 4000"), problem
    assert load_probes(workload, ["n"], [("big", 32768)])[0].name == "n"


def test_max_model_len_is_read_from_the_serve_flags() -> None:
    assert max_model_len(["/model", "--max-model-len", "1048576"]) == 1048576
    assert max_model_len(["--max-model-len=32768"]) == 32768
    assert max_model_len(["--max-model-len", "64k"]) == 64000
    assert max_model_len(["--max-model-len", "1M"]) == 1048576
    assert max_model_len(["--max-num-seqs", "16"]) is None
    assert max_model_len(["--max-model-len", "auto"]) is None


def test_a_workload_with_an_empty_or_unknown_probe_list_is_refused(tmp_path: Path) -> None:
    head = "schema: lanectl-workload/v1\nname: w\nmax_tokens: 8\nclasses: {a: [hi]}\n"
    write(tmp_path, "probes/real.yaml", NEEDLE.format(tokens=100, depth=0.5, answer="7349-KESTREL"))
    for text, expected in [
        (head + "probes: []\n", "w.yaml:5:9: probes: List should have at least 1 item after validation, not 0"),
        (head + "probes: [real, fake]\n", f"w.yaml:5:16: probes[1]: no probe 'fake' ({tmp_path}/probes/fake.yaml "
                                          "does not exist); known: real"),
        (head + "probes: [real, real]\n", "w.yaml:5:16: probes[1]: probe 'real' is named twice"),
    ]:
        path = write(tmp_path, "w.yaml", text)
        with pytest.raises(WorkloadInvalid) as info:
            load_workload(path, shown="w.yaml")
        assert [str(p) for p in info.value.problems] == [expected]


# -- the gate ------------------------------------------------------------------------------------------

def arm(name: str, probes: dict[str, dict[str, Any]]) -> LaneBench:
    return LaneBench(lane="demo-h2" if name == "candidate" else "demo-h1", arm=name, image="i", started="t",
                     probes=probes)


def summary(passed: int, total: int, failures: list[str] = []) -> dict[str, Any]:  # noqa: B006
    return {"kind": "thinking", "passed": passed, "total": total, "ok": passed == total, "failures": failures,
            "seconds": {}}


def test_a_probe_failed_in_any_arm_fails_the_gate_naming_the_probe_and_the_arm() -> None:
    good = {"thinking": summary(16, 16)}
    bad = {"thinking": summary(15, 16, ["prompt-3: reasoning leaked into the answer (<think> in content)"])}
    report = judge([arm("control-1", good), arm("candidate", bad), arm("control-2", good)], 1.025)
    assert report.verdict == Verdict.FAIL
    assert report.reasons == ["candidate (demo-h2) failed probe thinking: 15/16 passed; prompt-3: reasoning "
                              "leaked into the answer (<think> in content)"]
    assert report.probes["thinking"]["candidate"]["passed"] == 15
    assert json.loads(json.dumps(report.as_dict()))["probes"]["thinking"]["control-1"]["ok"] is True
    control_fails = judge([arm("control-1", good), arm("candidate", good), arm("control-2", bad)], 1.025)
    assert control_fails.verdict == Verdict.FAIL and control_fails.reasons[0].startswith("control-2 (demo-h1)")
    clean = judge([arm("control-1", good), arm("candidate", good), arm("control-2", good)], 1.025)
    assert clean.verdict == Verdict.INCONCLUSIVE  # no cells measured here: nothing beat the bar


def timed_cell(tok_per_s: float) -> ArmResult:
    """One cell of ten 100-token requests at exactly `tok_per_s` each."""
    seconds = 100 / tok_per_s
    results = [RequestResult(prompt_class="prose", prompt_index=0, ok=True, error=None, started_s=i * seconds,
                             finished_s=(i + 1) * seconds, chunk_times_s=(i * seconds + 0.01, (i + 1) * seconds),
                             output_tokens=100, texts=("x",)) for i in range(10)]
    return summarize(results, wall_time_s=10 * seconds, concurrency=1)


def test_a_candidate_its_scoring_failed_on_is_not_promoted_however_fast() -> None:
    """Teacher forcing that could not score a prompt says nothing about it: the gate reruns rather than passes."""
    reference = (TokenChoice(" the", math.log(0.95), {" the": math.log(0.95)}, token_id=0),)
    agreed = (ForcedPosition(" the", math.log(0.95), " the", math.log(0.95), token_id=0, top_token_id=0),)

    def bracket_arm(name: str, rate: float, forced: bool) -> LaneBench:
        made = arm(name, {"thinking": summary(16, 16)})
        made.cells["prose@1"] = timed_cell(rate)
        made.greedy["prose#0"] = reference
        if forced:
            made.forced["prose#0"] = agreed
        else:
            made.notes.append("prose#0: scoring request: HTTP 400: prompt_logprobs is not supported")
        return made

    scored = judge([bracket_arm("control-1", 100, True), bracket_arm("candidate", 120, True),
                    bracket_arm("control-2", 100, True)], 1.025)
    assert scored.verdict == Verdict.PASS and scored.fidelity["unscored"] == 0
    unscored = judge([bracket_arm("control-1", 100, True), bracket_arm("candidate", 120, False),
                      bracket_arm("control-2", 100, True)], 1.025)
    assert unscored.verdict == Verdict.INCONCLUSIVE
    assert (unscored.fidelity["verdict"], unscored.fidelity["unscored"]) == ("inconclusive", 1)
    fidelity, *rest = unscored.reasons
    assert fidelity == ("fidelity: 1 prompt(s) could not be scored in a candidate arm, so teacher forcing cannot "
                        "vouch for them (prose#0: scoring request: HTTP 400: prompt_logprobs is not supported)")
    # The bracket ran without a calibration of this host: the verdict says so, and says nothing else.
    assert [reason.split(":")[0] for reason in rest] == ["prior missing"]
