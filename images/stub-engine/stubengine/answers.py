"""Chat replies that are not free text: what lanectl's correctness probes ask a lane for.

A real model answers these from what it understood; the stub answers them by rule, deterministically
(every value is derived from a BLAKE2 hash of the prompt), well enough to pass each probe:

- `tools` (with `tool_choice` "required", "auto" or a named function): one call of the named tool, else
  of the first, with arguments built from the tool's JSON Schema (every property, each value within its
  type, enum, bounds and lengths); finish_reason "tool_calls".
- `response_format` json_schema: a JSON value built the same way from the schema; json_object: an object.
- `chat_template_kwargs` with `thinking` or `enable_thinking` true: reasoning in `reasoning` (vLLM's
  field since vllm#27752), the answer in `content`.
- a last user message asking for "only the YAML" / "only the SQL": a fenced YAML mapping, or a fenced
  `SELECT` of the first column of the first table a `CREATE TABLE` in the prompt declares.
- a last line "What is X?" whose prompt holds a sentence "X is VALUE.": VALUE (the needle in a haystack).

Anything else is None: the reply is the usual stream of vocabulary tokens. The output faults of
faults.py bend these replies (broken_tool_json, leak_reasoning, miss_needle).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from . import decoding

THINKING_KEYS = ("thinking", "enable_thinking")
REASONING_TOKENS = 24
ANSWER_TOKENS = 12
ONLY_FORMAT = re.compile(r"\bonly (?:the |a |one )?(yaml|sql)\b", re.IGNORECASE)
CREATE_TABLE = re.compile(r"CREATE TABLE\s+(\w+)\s*\(\s*(\w+)", re.IGNORECASE)
QUESTION = re.compile(r"^what is (.+?)\?", re.IGNORECASE)


@dataclass
class Answer:
    content: str | None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"

    def text_length(self) -> int:
        calls = sum(len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in self.tool_calls)
        return len(self.content or "") + len(self.reasoning or "") + calls

    def tokens(self) -> int:
        """Decode steps the reply takes: about four characters a token, as decoding.prompt_tokens counts."""
        return max(1, math.ceil(self.text_length() / 4))

    def truncated(self, max_tokens: int) -> Answer:
        """The reply cut at `max_tokens` tokens, as an engine stops mid-output: finish_reason "length"."""
        if self.tokens() <= max_tokens:
            return self
        keep = max_tokens * 4
        calls = [{**c, "function": {**c["function"], "arguments": c["function"]["arguments"][:keep]}}
                 for c in self.tool_calls]
        reasoning = self.reasoning[:keep] if self.reasoning is not None else None
        content = self.content[: max(0, keep - len(reasoning or ""))] if self.content is not None else None
        return Answer(content, reasoning, calls, "length")


class _Values:
    """Deterministic choices, each from the hash of the prompt and where in the reply it is made."""

    def __init__(self, prompt: str) -> None:
        self._key = hashlib.blake2b(prompt.encode(), digest_size=16, person=b"stubanswer").digest()

    def number(self, where: str) -> int:
        return int.from_bytes(hashlib.blake2b(where.encode(), digest_size=8, key=self._key).digest(), "little")

    def words(self, where: str, count: int) -> str:
        return " ".join(decoding.VOCAB[self.number(f"{where}#{i}") % decoding.V] for i in range(count))

    def value(self, schema: Any, where: str = "$") -> Any:
        if not isinstance(schema, dict):
            return self.words(where, 2)
        if schema.get("enum"):
            options = schema["enum"]
            return options[self.number(where) % len(options)]
        kind = schema.get("type", "object" if "properties" in schema else "string")
        kind = kind[0] if isinstance(kind, list) and kind else kind
        if kind == "object":
            return {name: self.value(sub, f"{where}.{name}") for name, sub in (schema.get("properties") or {}).items()}
        if kind == "array":
            count = max(1, schema.get("minItems", 1))
            count = min(count, schema.get("maxItems", count))
            return [self.value(schema.get("items"), f"{where}[{i}]") for i in range(count)]
        if kind in ("integer", "number"):
            lo = schema.get("minimum", 0)
            hi = schema.get("maximum", lo + 100)
            if kind == "integer":
                lo, hi = math.ceil(lo), math.floor(hi)
                return lo + self.number(where) % (hi - lo + 1) if hi >= lo else lo
            return round(lo + (self.number(where) % 101) / 100 * (hi - lo), 2)
        if kind == "boolean":
            return self.number(where) % 2 == 0
        if kind == "null":
            return None
        text = self.words(where, 2)
        while len(text) < schema.get("minLength", 0):
            text += " " + self.words(f"{where}+{len(text)}", 1)
        return text[: schema["maxLength"]] if "maxLength" in schema else text


def _last_user(messages: Any) -> str:
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role", "user") == "user":
            content = message.get("content") or ""
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content)
    return ""


def _tool_call(body: dict[str, Any], values: _Values, fault: str | None) -> Answer | None:
    tools = [t.get("function") for t in body.get("tools") or [] if isinstance(t, dict)]
    tools = [t for t in tools if isinstance(t, dict) and t.get("name")]
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    function = tools[0]
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name")
        function = next((t for t in tools if t["name"] == named), function)
    arguments = json.dumps(values.value(function.get("parameters") or {"type": "object"}))
    if fault == "broken_tool_json":
        arguments = arguments[:-1]
    call = {"id": f"chatcmpl-tool-{values.number('id') % 16**16:016x}", "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}
    return Answer(None, tool_calls=[call], finish_reason="tool_calls")


def answer(body: dict[str, Any], prompt: str, tokens: decoding.TokenStream, fault: str | None) -> Answer | None:
    """The reply to a chat request that asks for more than free text (see the module docstring), or None."""
    values = _Values(prompt)
    called = _tool_call(body, values, fault)
    if called is not None:
        return called
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") in ("json_schema", "json_object"):
        schema = (response_format.get("json_schema") or {}).get("schema") or {"type": "object",
                                                                              "properties": {"answer": {}}}
        return Answer(json.dumps(values.value(schema)))
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and any(kwargs.get(key) is True for key in THINKING_KEYS):
        text = [decoding.token_text(tokens.token(i)) for i in range(REASONING_TOKENS + ANSWER_TOKENS)]
        reasoning, content = "".join(text[:REASONING_TOKENS]).strip(), "".join(text[REASONING_TOKENS:]).strip()
        if fault == "leak_reasoning":
            return Answer(f"<think>{reasoning}</think>\n\n{content}")
        return Answer(content, reasoning)
    last = _last_user(body.get("messages"))
    asked = ONLY_FORMAT.search(last)
    if asked and asked[1].lower() == "yaml":
        mapping = {"name": values.words("name", 1), "steps": [values.words(f"step{i}", 3) for i in range(3)]}
        lines = [f"name: {mapping['name']}", "steps:", *(f"  - {step}" for step in mapping["steps"])]
        return Answer("```yaml\n" + "\n".join(lines) + "\n```")
    table = CREATE_TABLE.search(prompt)
    if asked and table:
        return Answer(f"```sql\nSELECT {table[2]} FROM {table[1]};\n```")
    question = QUESTION.match(last.strip().splitlines()[-1] if last.strip() else "")
    if question:
        found = re.search(re.escape(question[1]) + r" is (.+?)\.(?:\s|$)", prompt, re.IGNORECASE)
        if found:
            if fault == "miss_needle":
                return Answer("The text does not say.")
            return Answer(found[1])
    return None
