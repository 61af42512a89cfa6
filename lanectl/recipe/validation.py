"""Pydantic's validation errors as located problems: `file:line:column: field: message`, with what to do.

Recipes, kernels and workloads are all YAML read through `yaml_source`, so a validation error can name
the exact spot in the file; this is the one translation from pydantic's error list to those problems.
"""

from __future__ import annotations

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


def problems_from_validation(exc: ValidationError, doc: YamlDocument, model: type[Any],
                             locate: Callable[[PathKey], PathKey] = lambda loc: loc) -> list[Problem]:
    """One `Problem` per place in `doc` that `exc` (from validating `model`) found wrong, at the line and
    column of the value (of the key, for an unknown or badly named key), with what to do about it.

    `locate` maps a location in the validated data to where it is written in the file, for data merged
    from several places (a lane's own keys over the recipe's defaults); several errors at one place
    (each member of a union failing) become one problem whose messages are joined by "or".
    """
    by_path: dict[tuple[PathKey, bool], list[str]] = {}
    for error in exc.errors(include_url=False):
        data_loc = _data_path(doc, locate, tuple(error["loc"]), error["type"])
        # Errors about a mapping key itself (unknown key, bad variable name) point at the key.
        is_key = error["type"] in UNKNOWN_KEY or "[key]" in error["loc"]
        message = _message(error, model, data_loc)
        by_path.setdefault((data_loc, is_key), [])
        if message not in by_path[(data_loc, is_key)]:
            by_path[(data_loc, is_key)].append(message)
    problems = []
    for (loc, is_key), messages in by_path.items():
        path = locate(loc)
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
