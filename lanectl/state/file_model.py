"""What every state file's model shares: strict pydantic, timestamps, and how a file that fails reads.

State files are written by lanectl and read back by later commands and by the cron watchdog, so a
value of the wrong type must be refused where it is read, not surface later as a crash. Strict: no
coercion (`"1"` is not a number, `1` is not true), no unknown keys.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

# How many of a file's errors a report names; the rest are counted.
SHOWN_ERRORS = 5


class StateFileModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def _timestamp(text: str) -> str:
    moment = datetime.fromisoformat(text)  # ValueError -> a validation error naming the field
    if moment.tzinfo is None:
        raise ValueError("a timestamp needs a timezone")
    return text


# ISO 8601 with a timezone, kept as written (`utc_timestamp` writes them).
Timestamp = Annotated[str, Field(max_length=64), AfterValidator(_timestamp)]


def describe_invalid(error: ValidationError) -> str:
    """`field.path: what is wrong` for each error, `; `-joined: the detail a refused state file is reported with."""
    problems = []
    for item in error.errors(include_url=False, include_input=False)[:SHOWN_ERRORS]:
        where = ".".join(str(part) for part in item["loc"]) or "(the whole file)"
        problems.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
    more = error.error_count() - len(problems)
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")
