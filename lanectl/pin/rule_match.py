"""Can a logger call print a message that a startup-log rule matches? Decided from the call's format string.

A rule (a regex searched in an engine record's message) and a format string (literal text with holes) are both read
as patterns of literal characters and wildcards, and the question is whether one message fits both: the classic
intersection of two wildcard patterns, decided over positions. What a hole stands for is a value: numbers, names,
paths, sizes, without white space; the words of a message come from its literal text. Two more rules keep a call that
is nothing but holes (`logger.info("%s", text)`) from matching everything: at least one of the rule's literal
characters must come from the call's literal text, and when the rule names a word of four letters or more, one such
word must be in that text. Every regex construct other than literal characters, anchors, groups and alternatives is
taken as "anything", so the answer may say "can" where the engine cannot, never "cannot" where it can.
"""

from __future__ import annotations

import re
import re._parser as sre_parse  # type: ignore[import-not-found]  # the standard library's own regex parser
from collections.abc import Sequence
from functools import cache

from lanectl.pin.log_calls import LogCall

# A wildcard: any string. Pattern items are characters (str) or one of these.
ANY = "\0any"
VALUE = "\0value"  # a hole's value: any non-empty string without white space
WORD = re.compile(r"[A-Za-z]{4,}")
MAX_ALTERNATIVES = 64


@cache
def _rule_patterns(regex: str) -> tuple[tuple[str, ...], ...]:
    """The rule as wildcard patterns, one per alternative, each with ANY at an end it does not anchor."""
    flags = re.compile(regex).flags
    parsed = sre_parse.parse(regex, flags)
    alternatives = _sequence(list(parsed))
    out = []
    for items in alternatives[:MAX_ALTERNATIVES]:
        start = bool(items) and items[0] == "^"
        end = bool(items) and items[-1] == "$"
        core = [item for item in items if item not in ("^", "$")]
        if flags & re.IGNORECASE:
            core = [item.lower() if len(item) == 1 else item for item in core]
        out.append(tuple(([] if start else [ANY]) + core + ([] if end else [ANY])))
    return tuple(out)


def _sequence(nodes: list) -> list[list[str]]:
    """Alternatives of a parsed sequence, each a list of characters, wildcards and the anchors "^" / "$"."""
    alternatives: list[list[str]] = [[]]
    for index, (op, value) in enumerate(nodes):
        name = str(op)
        if name == "LITERAL":
            parts = [[chr(value)]]
        elif name == "AT":
            anchor = str(value)
            if anchor in ("AT_BEGINNING", "AT_BEGINNING_STRING") and index == 0:
                parts = [["^"]]
            elif anchor in ("AT_END", "AT_END_STRING") and index == len(nodes) - 1:
                parts = [["$"]]
            else:
                parts = [[]]
        elif name == "SUBPATTERN":
            parts = _sequence(list(value[-1]))
        elif name == "BRANCH":
            parts = [alt for branch in value[1] for alt in _sequence(list(branch))]
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _high, item = value
            parts = [alt + [ANY] for alt in _sequence(list(item))] if low >= 1 else [[ANY]]
        else:
            parts = [[ANY]]
        alternatives = [head + part for head in alternatives for part in parts][:MAX_ALTERNATIVES]
    return alternatives


@cache
def _call_pattern(call: LogCall) -> tuple[str, ...]:
    items: list[str] = []
    for part in call.parts():
        items.extend([VALUE] if part is None else list(part))
    return tuple(items)


def _intersects(message: Sequence[str], rule: Sequence[str]) -> bool:
    """Whether one string fits both patterns with at least one rule character matched by a literal message
    character. `message` holds characters and VALUE; `rule` characters and ANY."""
    start = (0, 0, False)
    seen = {start}
    stack = [start]
    while stack:
        i, j, anchored = stack.pop()
        if i == len(message) and j == len(rule) and anchored:
            return True
        steps = []
        m = message[i] if i < len(message) else None
        r = rule[j] if j < len(rule) else None
        if r == ANY:
            steps.append((i, j + 1, anchored))  # ANY matches nothing more
            if m is not None:
                steps.append((i + 1, j, anchored))  # ANY takes the message's next item (a character or a value)
        if m == VALUE:
            if r is not None and r != ANY and not r.isspace():
                steps.append((i, j + 1, anchored))  # the value takes the rule's next character...
                steps.append((i + 1, j + 1, anchored))  # ...and may end with it
        elif m is not None and r is not None and r != ANY and m == r:
            steps.append((i + 1, j + 1, True))
        for step in steps:
            if step not in seen:
                seen.add(step)
                stack.append(step)
    return False


@cache
def _literal_text(call: LogCall) -> str:
    return "".join(part for part in call.parts() if part)


@cache
def _words(regex: str) -> tuple[str, ...]:
    return tuple(WORD.findall(re.sub(r"\\.", " ", regex)))


@cache  # every lane on one release asks it of the same calls and mostly the same rules
def can_print(regex: str, call: LogCall) -> bool:
    """Whether some message of `call` (its holes filled with values) contains a match of the rule `regex`."""
    words = _words(regex)
    literal = _literal_text(call)
    if words and not any(word in literal for word in words):
        return False
    message = _call_pattern(call)
    return any(_intersects(message, rule) for rule in _rule_patterns(regex))


def printing_calls(regex: str, calls: Sequence[LogCall]) -> list[LogCall]:
    """The calls that can print a message the rule matches."""
    return [call for call in calls if can_print(regex, call)]
