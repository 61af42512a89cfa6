"""Strict reading of lanectl's own state files into frozen dataclasses.

State files are written by lanectl and read back by every later command, the cron watchdog's pass among them, so
a value of the wrong type must be refused where it is read, not surface later as a crash. What the files hold is
small and fixed: strings, integers, finite numbers, booleans, `None`, literals, lists, string-keyed mappings and
nested records, some with bounds or a check of their own. This module reads exactly that, without pydantic,
whose import and model classes were about a third of a quick command's start-up (`make bench ONLY=cli_startup`);
the recipes, validated once and cached, keep pydantic.

A record is a frozen dataclass; its fields' annotations say what each accepts, with these markers inside
`Annotated[...]`: `Bounds`, `MaxLength`, `Matches`, `Check` and `Key` (the JSON key when it is not the field's
name). Reading is strict, as pydantic's strict mode is: no coercion (`"1"` is not a number, `1` is not true), no
unknown keys unless the record allows them (`ALLOWS_EXTRA`), no NaN or infinity. Errors name the field's path and
say what is wrong in pydantic's words, all of them at once.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any, Literal, TypeVar

from lanectl.records import frozen

Record = TypeVar("Record")
Loc = tuple[str | int, ...]


@frozen
class Bounds:
    """Numeric limits on a field, in pydantic's meaning of ge, gt and le."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None


@frozen
class MaxLength:
    """At most this many characters (a string) or items (a tuple)."""

    limit: int


@frozen
class Matches:
    """A regular expression a string field must match (searched, as pydantic's pattern is)."""

    pattern: str


@frozen
class Check:
    """`check(value)` after the type's own checks: a ValueError is the field's error, in its words."""

    check: Callable[[Any], Any]


@frozen
class Key:
    """The field's key in the file, where it differs from the field's name (`from`, a Python keyword)."""

    name: str


class Invalid(ValueError):
    """The data is not a valid record: `errors` lists `(location, message)`, in the order found."""

    def __init__(self, errors: list[tuple[Loc, str]]):
        super().__init__("; ".join(error_lines(errors)))
        self.errors = errors


def error_lines(errors: list[tuple[Loc, str]]) -> list[str]:
    """`field.path: what is wrong`, one per error."""
    return [f"{'.'.join(map(str, loc)) or '(the whole file)'}: {message}" for loc, message in errors]


def read_record(cls: type[Record], data: Any) -> Record:
    """`data` (parsed JSON) as a `cls`; Invalid naming every field that is wrong."""
    errors: list[tuple[Loc, str]] = []
    value = _read(cls, data, (), errors)
    if errors:
        raise Invalid(errors)
    return typing.cast(Record, value)


def record_data(record: Any) -> dict[str, Any]:
    """The record as JSON data, under each field's key: what `read_record` reads back."""
    return {key: _data(getattr(record, name)) for name, key, _ in _fields(record.__class__)}


def _data(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record_data(value)
    if isinstance(value, tuple | list):
        return [_data(item) for item in value]
    if isinstance(value, dict):
        return {key: _data(item) for key, item in value.items()}
    return value


_MISSING = object()


@cache
def _fields(cls: Any) -> tuple[tuple[str, str, Any], ...]:
    """Each field's name, key and annotation (with its markers)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = []
    for field in dataclasses.fields(cls):
        annotation = hints[field.name]
        key = next((m.name for m in _markers(annotation) if isinstance(m, Key)), field.name)
        fields.append((field.name, key, annotation))
    return tuple(fields)


def _markers(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation)[1:] if typing.get_origin(annotation) is typing.Annotated else ()


def _read_record(cls: type, data: Any, loc: Loc, errors: list[tuple[Loc, str]]) -> Any:
    if not isinstance(data, dict):
        errors.append((loc, "Input should be an object"))
        return None
    values: dict[str, Any] = {}
    known = set()
    found = len(errors)
    for field, (name, key, annotation) in zip(dataclasses.fields(cls), _fields(cls), strict=True):
        known.add(key)
        if key in data:
            values[name] = _read(annotation, data[key], (*loc, key), errors)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            errors.append(((*loc, key), "Field required"))
    if not getattr(cls, "ALLOWS_EXTRA", False):
        errors.extend(((*loc, key), "Extra inputs are not permitted") for key in data if key not in known)
    if len(errors) > found:
        return None
    try:
        return cls(**values)
    except ValueError as exc:  # a check of the whole record (its __post_init__)
        errors.append((loc, str(exc)))
        return None


def _read(annotation: Any, data: Any, loc: Loc, errors: list[tuple[Loc, str]]) -> Any:
    markers = _markers(annotation)
    if markers:
        annotation = typing.get_args(annotation)[0]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    found = len(errors)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if data is None and len(members) < len(args):
            return None
        if len(members) != 1:  # state files hold `X | None` only
            raise TypeError(f"unsupported union {annotation!r}")
        value = _read(members[0], data, loc, errors)
    elif origin is Literal:
        if not any(type(data) is type(choice) and data == choice for choice in args):
            errors.append((loc, "Input should be " + _choices(args)))
        value = data
    elif origin in (tuple, list):  # tuple[X, ...] or list[X]
        if not isinstance(data, list):
            # pydantic's words, kept so that a report reads as it always did: an array for a tuple, a list for a list
            errors.append((loc, "Input should be a valid " + ("array" if origin is tuple else "list")))
            return None
        value = origin(_read(args[0], item, (*loc, i), errors) for i, item in enumerate(data))
    elif origin is dict:
        if not isinstance(data, dict):
            errors.append((loc, "Input should be a valid dictionary"))
            return None
        value = {_read(args[0], key, (*loc, key, "[key]"), errors): _read(args[1], item, (*loc, key), errors)
                 for key, item in data.items()}
    elif dataclasses.is_dataclass(annotation):
        value = _read_record(typing.cast(type, annotation), data, loc, errors)
    else:
        value = _scalar(annotation, data, loc, errors)
    if len(errors) > found:
        return None
    for marker in markers:
        problem = _constraint(marker, value)
        if problem is not None:
            errors.append((loc, problem))
            return None
        if isinstance(marker, Check):
            try:
                value = marker.check(value)
            except ValueError as exc:
                errors.append((loc, str(exc)))
                return None
    return value


def _scalar(annotation: Any, data: Any, loc: Loc, errors: list[tuple[Loc, str]]) -> Any:
    if annotation is str:
        ok = type(data) is str
    elif annotation is bool:
        ok = type(data) is bool
    elif annotation is int:
        ok = type(data) is int
    elif annotation is float:
        ok = type(data) in (int, float)
        if ok and not math.isfinite(data):
            errors.append((loc, "Input should be a finite number"))
            return None
        data = float(data) if ok else data
    elif annotation is Any:
        return data
    else:
        raise TypeError(f"unsupported annotation {annotation!r}")
    if not ok:
        what = {str: "a valid string", bool: "a valid boolean", int: "a valid integer", float: "a valid number"}
        errors.append((loc, f"Input should be {what[annotation]}"))
    return data


def _constraint(marker: Any, value: Any) -> str | None:
    if isinstance(marker, Bounds):
        if marker.ge is not None and not value >= marker.ge:
            return f"Input should be greater than or equal to {marker.ge}"
        if marker.gt is not None and not value > marker.gt:
            return f"Input should be greater than {marker.gt}"
        if marker.le is not None and not value <= marker.le:
            return f"Input should be less than or equal to {marker.le}"
    elif isinstance(marker, MaxLength) and len(value) > marker.limit:
        if isinstance(value, str):
            return f"String should have at most {marker.limit} characters"
        return f"Tuple should have at most {marker.limit} items after validation, not {len(value)}"
    elif isinstance(marker, Matches) and re.search(marker.pattern, value) is None:
        return f"String should match pattern '{marker.pattern}'"
    return None


def _choices(choices: tuple[Any, ...]) -> str:
    shown = [repr(choice) for choice in choices]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
