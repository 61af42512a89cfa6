"""records that echo a request: every vLLM 0.31.0 logger call that formats something a request sent (its id, which a
client picks with X-Request-Id, its model name, its prompt, its parameters), found in vLLM's installed code.

Each begins with vLLM's own words, never with the echoed text: so a rule anchored at the message's start (`^`, which
the recipe model requires of `forbid` and `fatal_log_lines`) cannot be set off through one, and lanectl's built-in
fatal lines, anchored too, are never matched by one, whatever a client puts in it.
"""

from __future__ import annotations

import ast
import re
from functools import cache

import pytest
import vllm_oracle as oracle
from lanes import lanes

from lanectl.health.engine_log import fatal_engine_line, fatal_engine_lines, record_message, startup_match

# Names that hold what a request sent, in vLLM's serving and engine code.
REQUEST_NAMES = {"request", "raw_request", "request_id", "req_id", "error_check_ret", "prompt", "prompt_text",
                 "params", "sampling_params", "lora_request", "outputs", "messages", "engine_request_ids",
                 "ft_request", "child_request"}
WHERE = ("vllm/entrypoints/", "vllm/v1/engine/")
FORGED = "EngineCore encountered a fatal error."


@cache
def echo_calls() -> list[oracle.LogCall]:
    by_place = {(c.file, c.line): c for c in oracle.log_calls("vllm") if c.file.startswith(WHERE)}
    found = []
    for file in sorted({f for f, _ in by_place}):
        tree = ast.parse((oracle.SITE / file).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            call = by_place.get((file, getattr(node, "lineno", -1)))
            if call is None or not isinstance(node, ast.Call):
                continue
            named = {n.id for a in node.args[1:] for n in ast.walk(a) if isinstance(n, ast.Name)}
            named |= {n.attr for a in node.args[1:] for n in ast.walk(a) if isinstance(n, ast.Attribute)}
            if named & REQUEST_NAMES:
                found.append(call)
    return found


def _filled(call: oracle.LogCall, text: str) -> str:
    """The call's message with every hole holding `text` (a number where only a number fits)."""
    hole = r"%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.\d+)?"
    numeric = re.sub(hole + "[diouxXeEfFgG]", "1", call.template.replace("%%", "%"))
    return re.sub(hole + r"[srac]|\{…\}", lambda _: text, numeric)


def _line(call: oracle.LogCall, message: str) -> str:
    return f"(APIServer pid=1) {call.level} 12-01 08:31:00 [{call.file.rsplit('/', 1)[-1]}:{call.line}] {message}"


def test_the_records_that_echo_a_request_are_found() -> None:
    templates = {c.template for c in echo_calls()}
    # The two the issue names, found by the scan rather than listed: the model name, and a request's own id.
    assert "Error with model %s" in templates and "Request %s aborted." in templates, sorted(templates)


@pytest.mark.parametrize("call", echo_calls(), ids=lambda c: c.where)
def test_an_echoing_record_begins_with_vllms_words_and_no_fatal_rule_believes_it(call: oracle.LogCall) -> None:
    assert not re.match(r"%|\{…\}", call.template), (
        f"{call.where} {call.template!r} begins with a request's text: a rule anchored with ^ could match it")
    line = _line(call, _filled(call, FORGED))
    assert not fatal_engine_line(line), f"lanectl's built-in fatal lines believe {line!r}"


def _rules() -> list[tuple[str, str]]:
    out = []
    for lane in lanes():
        out += [(f"{lane.name} startup_log.forbid", r) for r in lane.spec.health.startup_log.forbid]
        out += [(f"{lane.name} watchdog.fatal_log_lines", r) for r in lane.spec.watchdog.fatal_log_lines]
    return out


def test_no_shipped_fail_rule_is_set_off_by_an_echoing_record() -> None:
    """Each rule is anchored (the recipe model refuses it otherwise); an echoing record whose holes hold the rule's
    own text does not meet it."""
    for name, rule in _rules():
        pattern = re.compile(rule)
        bait = re.sub(r"\\(.)", r"\1", rule.lstrip("^"))
        for call in echo_calls():
            line = _line(call, _filled(call, bait))
            assert not startup_match(pattern, line) and not fatal_engine_lines([line], [rule]), (name, rule, line)


def test_the_echoes_lanectl_names_are_never_believed() -> None:
    for call in echo_calls():
        if call.template.startswith(("Error with model ", "Request ", "Received request ", "Added request ")):
            assert record_message(_line(call, _filled(call, FORGED))) is None, call.where
