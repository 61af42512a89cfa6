"""What every state file shares: strict records (`lanectl.state.strict`), timestamps, and how a file that
fails reads.

State files are written by lanectl and read back by later commands and by the cron watchdog, so a
value of the wrong type must be refused where it is read, not surface later as a crash. Strict: no
coercion (`"1"` is not a number, `1` is not true), no unknown keys.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, TypeVar

from lanectl.errors import OperationFailed
from lanectl.state.atomic import write_atomically
from lanectl.state.paths import NotAStateFile, check_state_file, create_state_dir, read_state_file
from lanectl.state.strict import Check, Invalid, MaxLength, error_lines, read_record

# How many of a file's errors a report names; the rest are counted.
SHOWN_ERRORS = 5


def _timestamp(text: str) -> str:
    moment = datetime.fromisoformat(text)  # ValueError -> a validation error naming the field
    if moment.tzinfo is None:
        raise ValueError("a timestamp needs a timezone")
    return text


# ISO 8601 with a timezone, kept as written (`utc_timestamp` writes them).
Timestamp = Annotated[str, MaxLength(64), Check(_timestamp)]


def describe_invalid(error: Invalid) -> str:
    """`field.path: what is wrong` for each error, `; `-joined: the detail a refused state file is reported with."""
    problems = error_lines(error.errors[:SHOWN_ERRORS])
    more = len(error.errors) - len(problems)
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")


Model = TypeVar("Model")


class NewerVersion(ValueError):
    """The file names a version above the one this lanectl reads: written by a newer lanectl."""

    def __init__(self, version: int):
        super().__init__(f"version {version}, written by a newer lanectl")
        self.version = version


def parse_state_file(raw: bytes, model: type[Model], limit: int, what: str, *, version: int | None = None) -> Model:
    """`raw` (a state file's bytes, as `read_state_file` returns them) as a `model`; ValueError saying what is
    wrong when it is not one: its size, encoding, JSON, shape, `version` (when given; NewerVersion when above
    it, so a newer lanectl's file is refused as such, not as wrong-shaped), then each invalid field.
    `what` names the kind of file in the size error."""
    if len(raw) > limit:
        raise ValueError(f"more than the {limit} bytes a {what} can hold")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: [[[[…]]]] nested past Python's limit
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    if version is not None:
        found = data.get("version")
        if type(found) is int and found > version:
            raise NewerVersion(found)
        if type(found) is not int or found != version:
            raise ValueError(f"version must be {version}, got {found!r}")
    if hasattr(model, "model_validate_json"):  # a pydantic model: the bench's calibration file
        from pydantic import ValidationError

        try:
            # From the text, not `data`: strict JSON-mode validation takes a list for a tuple field.
            validate = typing.cast(typing.Any, model).model_validate_json
            return typing.cast(Model, validate(text))
        except ValidationError as exc:
            errors = [(tuple(e["loc"]), e["msg"].removeprefix("Value error, "))
                      for e in exc.errors(include_url=False, include_input=False)]
            raise ValueError(describe_invalid(Invalid(errors))) from None
    try:
        return read_record(model, data)
    except Invalid as exc:
        raise ValueError(describe_invalid(exc)) from None


def load_state_file(path: Path, model: type[Model], limit: int, what: str, *, version: int,
                    refuse: Callable[[str, NewerVersion | None], Exception]) -> Model | None:
    """The state file at `path` as a `model`, None when there is none yet. One that is not a regular file or
    not a valid `model` raises `refuse(detail, newer)`, the store's own error (it says how to move the file
    aside); one that cannot be read raises OperationFailed with the system's reason."""
    try:
        raw = read_state_file(path, limit)
    except NotAStateFile as exc:
        raise refuse(str(exc), None) from exc
    except OSError as exc:
        raise OperationFailed(f"could not read {path}: {exc.strerror or exc}") from exc
    if raw is None:
        return None
    try:
        return parse_state_file(raw, model, limit, what, version=version)
    except NewerVersion as exc:
        raise refuse(str(exc), exc) from exc
    except ValueError as exc:
        raise refuse(str(exc), None) from exc


def write_state_file(path: Path, data: bytes) -> None:
    """Replace the state file at `path` whole (`write_atomically`), creating a safe state folder first and never
    writing through a link; OperationFailed with the system's reason when it cannot be written."""
    try:
        create_state_dir(path.parent)
        check_state_file(path)
        write_atomically(path, data)
    except OSError as exc:
        raise OperationFailed(f"could not write {path}: {exc.strerror or exc}") from exc
