"""The strict reader of state files (lanectl.state.strict): no coercion, no unknown keys, every error by path.

The stores' own tests (test_lane_state, test_standby_state, test_watchdog_hostile_state, test_journal) hold each
file to it through the real files; these hold the reader's rules one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

import pytest

from lanectl.state.strict import Bounds, Check, Invalid, Key, Matches, MaxLength, read_record, record_data


def _even(value: int) -> int:
    if value % 2:
        raise ValueError(f"{value} is odd")
    return value


@dataclass(frozen=True)
class Inner:
    name: Annotated[str, MaxLength(5)]
    count: Annotated[int, Bounds(ge=0, le=10)] = 0


@dataclass(frozen=True)
class Outer:
    version: Literal[1]
    inner: Inner
    flag: bool = False
    ratio: Annotated[float, Bounds(gt=0)] | None = None
    items: Annotated[tuple[Annotated[int, Check(_even)], ...], MaxLength(3)] = ()
    words: list[str] = field(default_factory=list)
    by_code: dict[Annotated[str, Matches(r"^\d+$")], Inner] = field(default_factory=dict)
    origin: Annotated[str | None, Key("from")] = None


@dataclass(frozen=True)
class Open:
    ALLOWS_EXTRA: ClassVar[bool] = True
    kind: str = ""


def errors(data: object, cls: type = Outer) -> list[str]:
    with pytest.raises(Invalid) as caught:
        read_record(cls, data)
    return [f"{'.'.join(map(str, loc))}: {message}" for loc, message in caught.value.errors]


def test_a_valid_record_reads_back_what_was_written() -> None:
    data = {"version": 1, "inner": {"name": "a", "count": 3}, "flag": True, "ratio": 2, "items": [2, 4],
            "words": ["x"], "by_code": {"43": {"name": "b"}}, "from": "h1-REF"}
    record = read_record(Outer, data)
    assert record == Outer(version=1, inner=Inner("a", 3), flag=True, ratio=2.0, items=(2, 4), words=["x"],
                           by_code={"43": Inner("b")}, origin="h1-REF")
    assert isinstance(record.ratio, float) and isinstance(record.items, tuple)
    assert record_data(record) == {**data, "ratio": 2.0, "by_code": {"43": {"name": "b", "count": 0}}}


@pytest.mark.parametrize(("data", "expected"), [
    ({"version": 1, "inner": {"name": 5}}, ["inner.name: Input should be a valid string"]),
    ({"version": 1, "inner": {"name": "a", "count": "1"}}, ["inner.count: Input should be a valid integer"]),
    ({"version": 1, "inner": {"name": "a", "count": True}}, ["inner.count: Input should be a valid integer"]),
    ({"version": 1, "inner": {"name": "a", "count": 1.0}}, ["inner.count: Input should be a valid integer"]),
    ({"version": 1, "inner": {"name": "a"}, "flag": 1}, ["flag: Input should be a valid boolean"]),
    ({"version": True, "inner": {"name": "a"}}, ["version: Input should be 1"]),
    ({"version": 1, "inner": {"name": "a"}, "ratio": float("nan")}, ["ratio: Input should be a finite number"]),
    ({"version": 1, "inner": {"name": "a"}, "ratio": float("inf")}, ["ratio: Input should be a finite number"]),
    ({"version": 1, "inner": {"name": "a"}, "ratio": 0}, ["ratio: Input should be greater than 0"]),
    ({"version": 1, "inner": {"name": "a", "count": 11}}, ["inner.count: Input should be less than or equal to 10"]),
    ({"version": 1, "inner": {"name": "abcdef"}}, ["inner.name: String should have at most 5 characters"]),
    ({"version": 1, "inner": {"name": "a"}, "items": [2, 4, 6, 8]},
     ["items: Tuple should have at most 3 items after validation, not 4"]),
    ({"version": 1, "inner": {"name": "a"}, "items": [2, 3]}, ["items.1: 3 is odd"]),
    ({"version": 1, "inner": {"name": "a"}, "items": "2"}, ["items: Input should be a valid array"]),
    ({"version": 1, "inner": {"name": "a"}, "words": "x"}, ["words: Input should be a valid list"]),
    ({"version": 1, "inner": {"name": "a"}, "by_code": {"x1": {"name": "b"}}},
     ["by_code.x1.[key]: String should match pattern '^\\d+$'"]),
    ({"version": 1, "inner": {"name": "a"}, "by_code": []}, ["by_code: Input should be a valid dictionary"]),
    ({"version": 1, "inner": []}, ["inner: Input should be an object"]),
    ({"inner": {"name": "a"}, "origin": "x"}, ["version: Field required", "origin: Extra inputs are not permitted"]),
    ({"version": 1, "inner": {"count": -1, "nme": "a"}},
     ["inner.name: Field required", "inner.count: Input should be greater than or equal to 0",
      "inner.nme: Extra inputs are not permitted"]),
])
def test_each_wrong_value_is_named_by_its_path_and_none_is_coerced(data: dict, expected: list[str]) -> None:
    assert errors(data) == expected


def test_a_record_that_allows_more_keys_keeps_checking_its_own() -> None:
    assert read_record(Open, {"kind": "step", "anything": [1]}) == Open("step")
    assert errors({"kind": 3, "anything": [1]}, Open) == ["kind: Input should be a valid string"]
