"""Correctness probes: what a candidate must still get right, whatever its speed.

Each probe is a `lanectl-probe/v1` YAML file under `recipes/workloads/probes/`, named by a workload's
`probes:` list; `gate` runs every named probe in every arm and any failure fails the gate. Four kinds,
each with its pass rule (the file states the rule's parameters; the rules are the functions below):

- `gauntlet`: tool-call and structured-output prompts. `tool_call`: the reply holds a tool call of the
  offered (or the forced) tool whose arguments are JSON valid against the tool's `parameters` schema;
  `json`: the answer parses as JSON (and matches `schema` if given; sent as `response_format`);
  `yaml`: the answer parses as a YAML mapping or list (and matches `schema` if given);
  `sql`: the answer is one statement that SQLite compiles (`EXPLAIN`) against the file's `sql_schema`.
  The answer is the first fenced code block of the reply if it has one, else the whole reply.
- `thinking`: the reply carries reasoning apart (vLLM's `reasoning` field, called `reasoning_content`
  before vllm#27752), a non-empty answer, and no `leak_markers` (`<think>`, `</think>`) in the answer.
- `soak`: long generations; none may loop: in the last `window` words no `ngram`-word sequence may occur
  more than `max_repeats` times.
- `needle`: a haystack of `haystack_tokens` tokens (at CHARS_PER_TOKEN characters a token) with the needle
  sentence at `depth` (0 = start, 1 = end), then the question; the answer must contain `answer`. Its time
  is recorded.

Schemas are a subset of JSON Schema, checked by `schema_errors`; a keyword outside it is refused when the
file is read, so no rule silently ignores part of a schema.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from lanectl.bench.sql_check import SqlRefused, check_schema, compile_query
from lanectl.errors import BadInput, Problem
from lanectl.recipe.model import flag_value
from lanectl.recipe.validation import problems_from_validation
from lanectl.recipe.yaml_source import PathKey, YamlDocument, YamlSyntaxError, read_yaml_file
from lanectl.records import frozen

PROBE_SCHEMA = "lanectl-probe/v1"
PROBES_DIR = "probes"
# The haystack's length rule: English prose runs about four characters a token with a BPE tokenizer.
CHARS_PER_TOKEN = 4
# Requests of one probe in flight at once: enough to keep a batching engine busy, few enough that a
# soak's long generations do not queue behind one another on a small lane.
PROBE_STREAMS = 4
CHAT_PATH = "/v1/chat/completions"
# What an answer may be to be parsed as JSON or YAML: far beyond any probe's expected answer, far below
# what makes the parsers recurse past Python's limit or the schema check run for minutes.
MAX_ANSWER_CHARS = 1_000_000
MAX_ANSWER_DEPTH = 64

Text = Annotated[str, StringConstraints(min_length=1)]
ItemName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]

# The JSON Schema keywords `schema_errors` enforces, and those it may ignore because they constrain nothing.
SCHEMA_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "enum", "minimum",
                             "maximum", "minLength", "maxLength", "items", "minItems", "maxItems"})
SCHEMA_NOTES = frozenset({"description", "title", "default", "$schema", "examples"})
JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


# -- the JSON Schema subset ----------------------------------------------------------------------------

def schema_problems(schema: Any, path: PathKey) -> list[tuple[PathKey, str]]:
    """Where `schema` uses something `schema_errors` does not check: (path in the file, message)."""
    if not isinstance(schema, dict):
        return [(path, "a schema is a mapping")]
    found: list[tuple[PathKey, str]] = []
    for key, value in schema.items():
        if key not in SCHEMA_KEYWORDS | SCHEMA_NOTES:
            found.append(((*path, key), f"schema keyword {key!r} is not checked by the probes; use only: "
                                        f"{', '.join(sorted(SCHEMA_KEYWORDS))}"))
        elif key == "type":
            kinds = value if isinstance(value, list) else [value]
            if not kinds or any(k not in JSON_TYPES for k in kinds):
                found.append(((*path, key), f"type must be one of {', '.join(JSON_TYPES)} (or a list of them)"))
        elif key == "properties":
            if not isinstance(value, dict):
                found.append(((*path, key), "properties is a mapping of name -> schema"))
            else:
                for name, sub in value.items():
                    found += schema_problems(sub, (*path, key, name))
        elif key == "items":
            found += schema_problems(value, (*path, key))
        elif key == "required" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            found.append(((*path, key), "required is a list of property names"))
        elif key == "additionalProperties" and not isinstance(value, bool):
            found.append(((*path, key), "additionalProperties must be true or false here"))
        elif key == "enum" and not (isinstance(value, list) and value):
            found.append(((*path, key), "enum is a non-empty list"))
        elif key in ("minimum", "maximum") and (isinstance(value, bool) or not isinstance(value, int | float)):
            found.append(((*path, key), f"{key} is a number"))
        elif key in ("minLength", "maxLength", "minItems", "maxItems") and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0):
            found.append(((*path, key), f"{key} is a non-negative integer"))
    return found


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}[kind] is type(value)


def schema_errors(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """What in `value` breaks `schema` (the subset in SCHEMA_KEYWORDS), one message each; [] when valid."""
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is_type(value, k) for k in kinds):
            return [f"{where}: expected {' or '.join(kinds)}, got {json.dumps(value)[:60]}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {json.dumps(value)[:60]} is not one of {json.dumps(schema['enum'])[:80]}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{where}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{where}: longer than {schema['maxLength']} characters")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{where}: more than {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                errors += schema_errors(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [f"{where}: missing required {name!r}" for name in schema.get("required", []) if name not in value]
        for name, item in value.items():
            if name in properties:
                errors += schema_errors(item, properties[name], f"{where}.{name}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: unexpected property {name!r}")
    return errors


# -- probe files ---------------------------------------------------------------------------------------

class _ProbeFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["lanectl-probe/v1"] = Field(alias="schema", description="Always lanectl-probe/v1.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="What a workload's `probes:` calls it.")
    description: str = ""
    max_tokens: int = Field(ge=1, le=1_000_000, description="Output tokens per request.")
    timeout_seconds: float = Field(120, gt=0, le=3600, description="Per request.")


class GauntletItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: ItemName
    prompt: Text
    expect: Literal["tool_call", "json", "yaml", "sql"]
    tools: list[dict[str, Any]] | None = Field(None, description="tool_call: OpenAI `tools`.")
    tool_choice: str | None = Field(None, description="tool_call: `required`, or the name of the tool to force.")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="json/yaml: the answer's schema.")
    sql_schema: str | None = Field(None, description="sql: CREATE TABLE statements the query must compile against.")


class Gauntlet(_ProbeFile):
    kind: Literal["gauntlet"]
    items: list[GauntletItem] = Field(min_length=1)


class Thinking(_ProbeFile):
    kind: Literal["thinking"]
    prompts: list[Text] = Field(min_length=1)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="How the model is asked to think.")
    leak_markers: list[Text] = Field(default_factory=lambda: ["<think>", "</think>"])


class Soak(_ProbeFile):
    kind: Literal["soak"]
    prompts: list[Text] = Field(min_length=1)
    ngram: int = Field(ge=1, le=1000, description="Words in the sequence checked for repeats.")
    max_repeats: int = Field(ge=1, description="Most times one n-gram may occur in the window.")
    window: int = Field(ge=1, description="The last this many words of each generation are checked.")


class Needle(_ProbeFile):
    kind: Literal["needle"]
    haystack_tokens: int = Field(ge=1, le=100_000_000)
    depth: float = Field(ge=0, le=1, description="Where the needle sits: 0 the start, 1 the end.")
    needle: Text
    question: Text
    answer: Text


Probe = Gauntlet | Thinking | Soak | Needle
KINDS: dict[str, type[Gauntlet] | type[Thinking] | type[Soak] | type[Needle]] = {
    "gauntlet": Gauntlet, "thinking": Thinking, "soak": Soak, "needle": Needle}


@frozen
class ProbeFile:
    """A probe as read, with its document, so later checks (the lanes' context length) can name the line."""

    probe: Probe
    doc: YamlDocument


class ProbeInvalid(BadInput):
    def __init__(self, problems: list[Problem]):
        self.problems = sorted(set(problems))
        super().__init__("\n".join(str(p) for p in self.problems))


def probe_file(workload_path: Path, name: str) -> Path:
    return workload_path.parent / PROBES_DIR / f"{name}.yaml"


def known_probes(workload_path: Path) -> list[str]:
    folder = workload_path.parent / PROBES_DIR
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def load_probe(path: Path, shown: str | None = None) -> ProbeFile:
    """Read and validate one probe file; raise `ProbeInvalid` naming file, line and field of each problem."""
    shown = shown or str(path)
    try:
        doc = read_yaml_file(path, shown)
    except YamlSyntaxError as exc:
        raise ProbeInvalid([exc.problem]) from None
    if not isinstance(doc.data, dict):
        raise ProbeInvalid([Problem(shown, 1, 1, "", "a probe is a YAML mapping with schema, name, kind, ...")])
    model = KINDS.get(doc.data.get("kind"))  # type: ignore[arg-type]
    if model is None:
        where = ("kind",) if "kind" in doc.data else ()
        raise ProbeInvalid([doc.problem(where, f"kind must be one of: {', '.join(KINDS)}")])
    try:
        probe = model.model_validate(doc.data)
    except ValidationError as exc:
        raise ProbeInvalid(problems_from_validation(exc, doc, model)) from None
    problems = [doc.problem(where, message) for where, message in _meaning_problems(probe)]
    if problems:
        raise ProbeInvalid(problems)
    return ProbeFile(probe, doc)


def _meaning_problems(probe: Probe) -> list[tuple[PathKey, str]]:
    found: list[tuple[PathKey, str]] = []
    if isinstance(probe, Gauntlet):
        for i, item in enumerate(probe.items):
            found += _item_problems(item, ("items", i))
        names = [item.name for item in probe.items]
        found += [(("items", i, "name"), f"item name {n!r} is used twice") for i, n in enumerate(names)
                  if n in names[:i]]
    elif isinstance(probe, Soak) and probe.window < probe.ngram:
        found.append((("window",), f"the window ({probe.window} words) is shorter than one n-gram ({probe.ngram})"))
    elif isinstance(probe, Needle):
        needle_tokens = -(-len(probe.needle) // CHARS_PER_TOKEN)
        if needle_tokens >= probe.haystack_tokens:
            found.append((("needle",), f"the needle ({needle_tokens} tokens at {CHARS_PER_TOKEN} characters a "
                                       f"token) is not shorter than the haystack ({probe.haystack_tokens} tokens)"))
        if probe.answer.lower() not in probe.needle.lower():
            found.append((("answer",), "the answer is not in the needle, so no reply could pass"))
    return found


def _item_problems(item: GauntletItem, at: PathKey) -> list[tuple[PathKey, str]]:
    found: list[tuple[PathKey, str]] = []
    only = {"tools": "tool_call", "tool_choice": "tool_call", "schema": "json or yaml", "sql_schema": "sql"}
    given = {"tools": item.tools, "tool_choice": item.tool_choice, "schema": item.schema_,
             "sql_schema": item.sql_schema}
    for key, value in given.items():
        if value is not None and item.expect not in only[key].split(" or "):
            found.append(((*at, key), f"{key} is for expect: {only[key]}, not {item.expect}"))
    if item.expect == "tool_call":
        if not item.tools:
            return [*found, ((*at, "expect"), "expect: tool_call needs tools")]
        names = []
        for i, tool in enumerate(item.tools):
            function = tool.get("function")
            if tool.get("type") != "function" or not isinstance(function, dict) or not function.get("name"):
                found.append(((*at, "tools", i), "a tool is {type: function, function: {name, parameters}}"))
                continue
            names.append(function["name"])
            found += schema_problems(function.get("parameters", {}), (*at, "tools", i, "function", "parameters"))
        if item.tool_choice not in (None, "required", *names):
            found.append(((*at, "tool_choice"), f"tool_choice is `required` or one of the tools: {', '.join(names)}"))
    elif item.schema_ is not None:
        found += schema_problems(item.schema_, (*at, "schema"))
    if item.expect == "sql":
        if not item.sql_schema:
            found.append(((*at, "expect"), "expect: sql needs sql_schema (CREATE TABLE statements)"))
        else:
            try:
                check_schema(item.sql_schema)
            except SqlRefused as exc:
                found.append(((*at, "sql_schema"), f"SQLite refuses the schema: {exc}"))
    return found


def load_probes(workload_path: Path, names: Sequence[str], lanes: Sequence[tuple[str, int | None]]) -> list[Probe]:
    """The probes a workload names, each valid and fitting every lane (name, --max-model-len); raise
    `ProbeInvalid` with every problem of every file."""
    loaded, problems = [], []
    for name in names:
        try:
            loaded.append(load_probe(probe_file(workload_path, name)))
        except ProbeInvalid as exc:
            problems += exc.problems
    problems += context_problems(loaded, lanes)
    if problems:
        raise ProbeInvalid(problems)
    return [each.probe for each in loaded]


def context_problems(probes: Sequence[ProbeFile], lanes: Sequence[tuple[str, int | None]]) -> list[Problem]:
    """A needle whose prompt and answer would not fit a lane's --max-model-len; lanes without the flag are
    not checked (the engine then takes the model's own length, which lanectl cannot know)."""
    found = []
    for loaded in probes:
        probe = loaded.probe
        if not isinstance(probe, Needle):
            continue
        needed = prompt_tokens(needle_prompt(probe)) + probe.max_tokens
        for lane, limit in lanes:
            if limit is not None and needed > limit:
                found.append(loaded.doc.problem(
                    ("haystack_tokens",), f"the needle prompt ({needed - probe.max_tokens} tokens at "
                    f"{CHARS_PER_TOKEN} characters a token) plus {probe.max_tokens} output tokens exceeds lane "
                    f"{lane}'s --max-model-len {limit}"))
    return found


def max_model_len(args: list[str]) -> int | None:
    """The serve flags' `--max-model-len`: an integer, or vLLM's 64k / 1M forms (lower case x1000, upper
    case x1024); None when absent or in a form not read here (the check is then left to the engine)."""
    value = flag_value(args, "--max-model-len")
    match = re.fullmatch(r"(\d+)([kKmMgG]?)", (value or "").strip())
    if not match:
        return None
    scale = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}
    return int(match[1]) * scale[match[2]]


# -- pass rules (pure) ---------------------------------------------------------------------------------

def answer_text(content: str) -> str:
    """The first fenced code block's body when the reply has one (models wrap JSON, YAML and SQL in
    ```fences```), else the whole reply; stripped."""
    fenced = re.search(r"```[^\n`]*\n(.*?)```", content, re.DOTALL)
    return (fenced[1] if fenced else content).strip()


def check_tool_call(message: dict[str, Any], item: GauntletItem) -> str | None:
    """None when the reply holds a call of an offered tool (the forced one if `tool_choice` names one) whose
    arguments are a JSON object valid against that tool's parameters; else why not."""
    tools = {t["function"]["name"]: t["function"].get("parameters", {}) for t in item.tools or []}
    calls = message.get("tool_calls") or []
    if not calls:
        return f"no tool call (content: {_short(message.get('content'))})"
    function = (calls[0] or {}).get("function") or {}
    name = function.get("name")
    if name not in tools:
        return f"called {name!r}, not one of the offered tools ({', '.join(tools)})"
    if item.tool_choice not in (None, "required") and name != item.tool_choice:
        return f"called {name!r}, not the forced {item.tool_choice!r}"
    try:
        arguments = _json_value(str(function.get("arguments") or ""))
    except ValueError as exc:
        return f"{name} arguments are not JSON ({exc}): {_short(function.get('arguments'))}"
    if not isinstance(arguments, dict):
        return f"{name} arguments are not a JSON object: {_short(function.get('arguments'))}"
    errors = schema_errors(arguments, tools[name])
    return f"{name} arguments break its schema: {'; '.join(errors[:3])}" if errors else None


def bounded_answer(text: str) -> str | None:
    """Why an answer is too big or too deep to parse, or None. A model's answer is anyone's text:
    `json` and PyYAML recurse per bracket (RecursionError), and the schema check walks what they built."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"the answer is {len(text)} characters, more than {MAX_ANSWER_CHARS} to parse"
    depth = deepest = 0
    for char in text:  # brackets inside strings count too: an over-estimate only refuses sooner
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    if deepest > MAX_ANSWER_DEPTH:
        return f"the answer nests deeper than {MAX_ANSWER_DEPTH} levels"
    return None


def _json_value(text: str) -> Any:
    """json.loads within the answer bounds; ValueError with why not."""
    refused = bounded_answer(text)
    if refused is not None:
        raise ValueError(refused)
    return json.loads(text)


def check_json(content: str, schema: dict[str, Any] | None) -> str | None:
    try:
        value = _json_value(answer_text(content))
    except ValueError as exc:
        return f"not JSON ({exc}): {_short(content)}"
    errors = schema_errors(value, schema) if schema is not None else []
    return f"JSON breaks the schema: {'; '.join(errors[:3])}" if errors else None


def check_yaml(content: str, schema: dict[str, Any] | None) -> str | None:
    # Any text parses as a YAML scalar, so only a mapping or a list counts as a YAML answer.
    text = answer_text(content)
    refused = bounded_answer(text) or _yaml_shape(text)
    if refused is not None:
        return f"not YAML a probe parses ({refused}): {_short(content)}"
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return f"not YAML ({str(exc).splitlines()[0]}): {_short(content)}"
    if not isinstance(value, dict | list):
        return f"YAML is not a mapping or a list: {_short(content)}"
    errors = schema_errors(value, schema) if schema is not None else []
    return f"YAML breaks the schema: {'; '.join(errors[:3])}" if errors else None


def _yaml_shape(text: str) -> str | None:
    """Why PyYAML should not build `text`, from its event stream (which it reads without recursing):
    block nesting deeper than the brackets show, or an alias: one line of `&a [*a, *a]` per level doubles
    what the schema check walks (a billion laughs in a few hundred bytes)."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                return "it uses YAML aliases (*name), which an answer has no need of"
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_ANSWER_DEPTH:
                    return f"it nests deeper than {MAX_ANSWER_DEPTH} levels"
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return None  # safe_load reports it, with its position
    return None


def check_sql(content: str, sql_schema: str) -> str | None:
    """SQLite compiles the answer (EXPLAIN: planned, never run) against the declared tables; one statement."""
    query = answer_text(content).rstrip().rstrip(";")
    if not query:
        return "no SQL in the reply"
    try:
        compile_query(sql_schema, query)
    except SqlRefused as exc:
        return f"SQLite does not compile it ({exc}): {_short(query)}"
    return None


def check_thinking(message: dict[str, Any], leak_markers: Sequence[str]) -> str | None:
    reasoning = message.get("reasoning")
    content = message.get("content") or ""
    leaked = [marker for marker in leak_markers if marker in content]
    if leaked:
        return f"reasoning leaked into the answer ({', '.join(leaked)} in content)"
    if not isinstance(reasoning, str) or not reasoning.strip():
        hint = " (only the old `reasoning_content` field)" if message.get("reasoning_content") else ""
        return f"no reasoning returned apart from the answer{hint}"
    if not content.strip():
        return "no answer after the reasoning"
    return None


def repetition_loop(text: str, ngram: int, max_repeats: int, window: int) -> str | None:
    """None unless some `ngram`-word sequence occurs more than `max_repeats` times in the last `window` words."""
    words = text.split()[-window:]
    counts = Counter(tuple(words[i:i + ngram]) for i in range(len(words) - ngram + 1))
    if not counts:
        return None
    gram, seen = counts.most_common(1)[0]
    if seen > max_repeats:
        return f"loop: {' '.join(gram)!r} occurs {seen} times in the last {len(words)} words (at most {max_repeats})"
    return None


def check_needle(content: str, answer: str) -> str | None:
    if answer.lower() in content.lower():
        return None
    return f"the answer does not contain {answer!r}: {_short(content)}"


def prompt_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


# Filler for the haystack: plain sentences that mention nothing a needle might ask about.
FILLER = (
    "The river bends twice before it reaches the town, and the old mill stands where the second bend slows "
    "the water. Farmers bring grain there in autumn, and the miller keeps a ledger of every sack. "
    "In winter the road over the hill is closed, so the carts go the long way round through the valley. "
    "The school at the crossroads has one room, a stove, and a shelf of books the teacher replaces each "
    "spring. Market day is Thursday; the square fills with stalls of apples, cheese, wool and tools. "
)


def haystack(probe: Needle) -> str:
    """`haystack_tokens` tokens of filler (CHARS_PER_TOKEN characters each) with the needle sentence at
    `depth`, placed at the nearest sentence boundary so it reads as part of the text."""
    size = probe.haystack_tokens * CHARS_PER_TOKEN - len(probe.needle) - 1
    filler = (FILLER * (size // len(FILLER) + 1))[:size]
    at = int(len(filler) * probe.depth)
    boundary = filler.rfind(". ", 0, at)
    at = 0 if at == 0 or boundary < 0 else boundary + 2
    return filler[:at] + probe.needle + " " + filler[at:]


def needle_prompt(probe: Needle) -> str:
    return f"{haystack(probe)}\n\n{probe.question}"


def _short(text: Any, limit: int = 80) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit - 1] + "…"


# -- running a probe against a lane --------------------------------------------------------------------

@frozen
class Check:
    item: str
    failure: str | None  # None: passed
    seconds: float


@dataclass
class ProbeReport:
    name: str
    kind: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.failure is None for check in self.checks)

    def summary(self) -> dict[str, Any]:
        return {"kind": self.kind, "passed": sum(c.failure is None for c in self.checks), "total": len(self.checks),
                "ok": self.passed, "failures": [f"{c.item}: {c.failure}" for c in self.checks if c.failure],
                "seconds": {c.item: round(c.seconds, 3) for c in self.checks}}


Request = tuple[str, dict[str, Any], Callable[[dict[str, Any]], str | None]]  # item, body, rule on the message


def requests_of(probe: Probe) -> list[Request]:
    """Each request a probe sends (chat completions, temperature 0) and the rule its reply must pass."""
    base: dict[str, Any] = {"max_tokens": probe.max_tokens, "temperature": 0}

    def user(text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": text}]

    if isinstance(probe, Gauntlet):
        return [_gauntlet_request(item, base) for item in probe.items]
    if isinstance(probe, Thinking):
        extra = {"chat_template_kwargs": probe.chat_template_kwargs} if probe.chat_template_kwargs else {}
        markers = probe.leak_markers
        return [(f"prompt-{i + 1}", {**base, **extra, "messages": user(text)},
                 lambda m: check_thinking(m, markers)) for i, text in enumerate(probe.prompts)]
    if isinstance(probe, Soak):
        soak = probe
        return [(f"prompt-{i + 1}", {**base, "messages": user(text)},
                 lambda m: repetition_loop(m.get("content") or "", soak.ngram, soak.max_repeats, soak.window))
                for i, text in enumerate(probe.prompts)]
    needle = probe
    return [("needle", {**base, "messages": user(needle_prompt(needle))},
             lambda m: check_needle(m.get("content") or "", needle.answer))]


def _gauntlet_request(item: GauntletItem, base: dict[str, Any]) -> Request:
    prompt = item.prompt
    body: dict[str, Any] = dict(base)
    rule: Callable[[dict[str, Any]], str | None]
    if item.expect == "tool_call":
        body["tools"] = item.tools
        body["tool_choice"] = ("required" if item.tool_choice in (None, "required")
                               else {"type": "function", "function": {"name": item.tool_choice}})
        rule = lambda m: check_tool_call(m, item)  # noqa: E731
    elif item.expect == "json":
        body["response_format"] = ({"type": "json_schema", "json_schema": {"name": item.name, "schema": item.schema_}}
                                   if item.schema_ is not None else {"type": "json_object"})
        rule = lambda m: check_json(m.get("content") or "", item.schema_)  # noqa: E731
    elif item.expect == "yaml":
        rule = lambda m: check_yaml(m.get("content") or "", item.schema_)  # noqa: E731
    else:
        sql_schema = item.sql_schema or ""
        # The model must see the tables it is to query; the same text the check compiles against.
        prompt = f"{prompt}\n\nThe database (SQLite):\n{sql_schema.strip()}"
        rule = lambda m: check_sql(m.get("content") or "", sql_schema)  # noqa: E731
    body["messages"] = [{"role": "user", "content": prompt}]
    return item.name, body, rule


def run_probe(base_url: str, model: str, probe: Probe, client: httpx.Client | None = None) -> ProbeReport:
    """Send every request of `probe` to the lane (PROBE_STREAMS at a time) and judge each reply by its rule."""
    report = ProbeReport(probe.name, probe.kind)
    own = client is None
    http = client or httpx.Client(timeout=probe.timeout_seconds,
                                  limits=httpx.Limits(max_connections=PROBE_STREAMS))

    def one(request: Request) -> Check:
        item, body, rule = request
        started = time.monotonic()
        try:
            reply = http.post(base_url + CHAT_PATH, json={**body, "model": model}, timeout=probe.timeout_seconds)
        except httpx.HTTPError as exc:
            return Check(item, f"request failed: {type(exc).__name__}: {exc}", time.monotonic() - started)
        seconds = time.monotonic() - started
        try:
            data = reply.json()
        except (ValueError, RecursionError):  # json recurses per bracket: a hostile body ends the recursion
            data = None
        if reply.status_code != 200 or not isinstance(data, dict):
            message = (data or {}).get("error", {}).get("message") if isinstance(data, dict) else None
            return Check(item, f"HTTP {reply.status_code}: {_short(message or reply.text, 160)}", seconds)
        try:
            message = data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            return Check(item, f"no choices[0].message in the reply: {_short(data)}", seconds)
        try:
            return Check(item, rule(message if isinstance(message, dict) else {}), seconds)
        except Exception as exc:  # noqa: BLE001 - an answer no check foresaw fails its item, never the gate
            return Check(item, f"the answer could not be checked: {type(exc).__name__}: {_short(str(exc))}", seconds)

    try:
        with ThreadPoolExecutor(PROBE_STREAMS) as pool:
            report.checks = list(pool.map(one, requests_of(probe)))
    finally:
        if own:
            http.close()
    return report
