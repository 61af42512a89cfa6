"""Pydantic's validation errors as located problems: `file:line:column: field: message`, with what to do.

Recipes, kernels and workloads are all YAML read through `yaml_source`, so a validation error can name
the exact spot in the file; this is the one translation from pydantic's error list to those problems.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from lanectl.errors import Problem
from lanectl.recipe.model import is_record, record_fields
from lanectl.recipe.yaml_source import PathKey, YamlDocument

# pydantic names a key the model does not know `extra_forbidden`, and a key a dataclass record does not know
# `unexpected_keyword_argument`: both are an unknown key in the file.
UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")
# What pydantic names a value that is no integer, number or boolean, where the field takes one (they are strict).
SCALAR_KINDS = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean"}
# The words pydantic's lax mode read as a boolean: someone who wrote one of them in quotes meant that boolean.
BOOLEAN_WORDS = {**dict.fromkeys(("true", "yes", "on", "y", "t", "1"), "true"),
                 **dict.fromkeys(("false", "no", "off", "n", "f", "0"), "false")}
INTEGER_TEXT = r"[-+]?[0-9]{1,19}"  # a longer one is out of every range, and so named
NUMBER_TEXT = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<exponent>[eE][-+]?[0-9]+)?"


def problems_from_validation(exc: ValidationError, doc: YamlDocument, model: type[Any],
                             locate: Callable[[PathKey], PathKey] = lambda loc: loc) -> list[Problem]:
    """One `Problem` per place in `doc` that `exc` (from validating `model`) found wrong, at the line and
    column of the value (of the key, for an unknown or badly named key), with what to do about it.

    `locate` maps a location in the validated data to where it is written in the file, for data merged
    from several places (a lane's own keys over the recipe's defaults); several errors at one place
    (each member of a union failing) become one problem whose messages are joined by "or".
    """
    by_path: dict[tuple[PathKey, bool], list[str]] = {}
    plain: dict[tuple[PathKey, bool], str] = {}
    for error in exc.errors(include_url=False):
        data_loc = _data_path(doc, locate, tuple(error["loc"]), error["type"])
        # Errors about a mapping key itself (unknown key, bad variable name) point at the key.
        is_key = error["type"] in UNKNOWN_KEY or "[key]" in error["loc"]
        message = _message(error, model, data_loc)
        by_path.setdefault((data_loc, is_key), [])
        if message not in by_path[(data_loc, is_key)]:
            by_path[(data_loc, is_key)].append(message)
        if (written := _written_plain(error)) is not None:
            plain[(data_loc, is_key)] = written
    problems = []
    for (loc, is_key), messages in by_path.items():
        path = locate(loc)
        # `count: "1"` fails both the integer and the 'all' a union offers; what was meant is the integer.
        messages = [plain[(loc, is_key)]] if (loc, is_key) in plain else messages
        problems.append(doc.problem(path, " or ".join(messages) if len(messages) > 1 else messages[0], key=is_key))
    return problems


def _data_path(doc: YamlDocument, locate: Callable[[PathKey], PathKey], loc: PathKey,
               error_type: str) -> PathKey:
    """Drop the parts of a pydantic location that name union members rather than keys of the data."""
    kept: list[str | int] = []
    for i, part in enumerate(loc):
        candidate = (*kept, part)
        if doc.has(locate(candidate)) or (i == len(loc) - 1 and error_type == "missing"):
            kept.append(part)
        elif part == "schema_":
            kept.append("schema")
    return tuple(kept)


def _message(error: Any, model: type[Any], loc: PathKey) -> str:
    kind = error["type"]
    if kind in UNKNOWN_KEY:
        allowed = _allowed_keys(model, loc[:-1])
        expected = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return f"unknown key{expected}"
    if kind == "missing":
        return "required key is missing"
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix):]
    if "input" in error and not isinstance(error["input"], dict | list):
        message += f", got {_shown(error['input'])}"
    return message


def _written_plain(error: Any) -> str | None:
    """For text that reads as the integer, number or boolean its field takes ("30", "139.8", "no"), for 0 or 1 as a
    boolean and 2.0 as an integer: what it is and what to write instead. None for any other error."""
    kind = SCALAR_KINDS.get(error["type"])
    value = error.get("input")
    if kind is None:
        return None
    if error["type"] == "bool_type" and type(value) is int and value in (0, 1):
        return f"{value} is a number, not a boolean; write {'true' if value else 'false'}"
    if error["type"] == "int_type" and type(value) is float and value.is_integer():
        return f"{value!r} is a decimal number, not an integer; write {int(value)}"
    spelled = _spelled_plain(error["type"], value.strip()) if isinstance(value, str) else None
    if spelled is None:
        return None
    note = _exponent_note(value.strip(), spelled)
    return f"{_shown(value)} is text, not {kind}; write {spelled}, without quotes{note}"


def _spelled_plain(kind: str, text: str) -> str | None:
    """`text` as YAML writes the integer, number or boolean it reads as; None when it reads as none."""
    if kind == "bool_type":
        return BOOLEAN_WORDS.get(text.lower())
    if kind == "int_type":
        return str(int(text)) if re.fullmatch(INTEGER_TEXT, text) else None
    if not re.fullmatch(NUMBER_TEXT, text) or not math.isfinite(number := float(text)):
        return None
    if number.is_integer() and abs(number) < 1e16:
        return str(int(number))
    spelled = repr(number)
    # YAML 1.1 (PyYAML) reads an exponent as a number only after a dot: 1.0e+16, not 1e+16.
    return spelled.replace("e", ".0e") if "e" in spelled and "." not in spelled else spelled


def _exponent_note(text: str, spelled: str) -> str:
    """Why a plain `1e3` is text: YAML 1.1 reads an exponent only after a dot and with its sign."""
    match = re.fullmatch(NUMBER_TEXT, text)
    if match is None or not match["exponent"]:
        return ""
    mantissa, exponent = text[:match.start("exponent")], match["exponent"][1:]
    if "." in mantissa and exponent[0] in "+-":
        return ""
    mantissa += "" if "." in mantissa else ".0"
    exponent = exponent if exponent[0] in "+-" else f"+{exponent}"
    if f"{mantissa}e{exponent}" == spelled:
        return ""
    return f" (YAML reads an exponent as a number only after a dot and with its sign: {mantissa}e{exponent})"


def _shown(value: Any) -> str:
    """A rejected value, short: a 400-digit integer or a 1 MB string is named, not echoed."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {len(str(value)) if value.bit_length() < 14000 else 'thousands of'} digits"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "…"


def _allowed_keys(model: type[Any], loc: PathKey) -> list[str]:
    """The keys a mapping at `loc` accepts, for "unknown key" messages."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation, part)
        if annotation is None:
            return []
    fields = _fields(annotation)
    return [key for _, key, _ in fields] if fields is not None else []


def _fields(annotation: Any) -> list[tuple[str, str, Any]] | None:
    """A record's or a pydantic model's fields as (name, key, annotation); None for anything else."""
    if is_record(annotation):
        return record_fields(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(name, info.alias or name, info.annotation) for name, info in annotation.model_fields.items()]
    return None


def _unwrap(annotation: Any, part: str | int) -> Any:
    for candidate in _members(annotation):
        fields = _fields(candidate)
        if fields is not None and isinstance(part, str):
            for name, key, field_annotation in fields:
                if part in (name, key):
                    return field_annotation
        origin = typing.get_origin(candidate)
        args = typing.get_args(candidate)
        if origin is list and isinstance(part, int):
            return args[0]
        if origin is dict and isinstance(part, str) and len(args) == 2:
            return args[1]
    return None


def _members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _members(arg)]
    if typing.get_origin(annotation) is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    return [annotation]
