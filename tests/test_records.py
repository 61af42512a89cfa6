"""`@frozen` records behave as `@dataclass(frozen=True)` ones: the shared methods are held to dataclass's own."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from lanectl.records import frozen


@frozen
class Point:
    """A record."""

    x: int
    y: float = 0.0
    note: str = dataclasses.field(default="", compare=False)
    blob: bytes = dataclasses.field(default=b"", repr=False)


@dataclasses.dataclass(frozen=True)
class PointByDataclass:
    """The same record, as dataclass writes it."""

    x: int
    y: float = 0.0
    note: str = dataclasses.field(default="", compare=False)
    blob: bytes = dataclasses.field(default=b"", repr=False)


@frozen(kw_only=True)
class Named(Point):
    """A subclass, keyword-only."""

    name: str


CASES = [(1, 2.0, "a", b"z"), (1, 2.0, "b", b"z"), (1, 3.0, "a", b"z"), (1, float("nan"), "a", b"")]


def test_equality_hash_and_repr_are_dataclass_s_own():
    for a in CASES:
        for b in CASES:
            ours, theirs = (Point(*a), Point(*b)), (PointByDataclass(*a), PointByDataclass(*b))
            assert (ours[0] == ours[1]) == (theirs[0] == theirs[1]), (a, b)
        assert hash(Point(*a)) == hash(PointByDataclass(*a))
        assert repr(Point(*a)) == repr(PointByDataclass(*a)).replace("PointByDataclass", "Point")
    assert Point(1) != PointByDataclass(1) and Point(1) != (1, 0.0)


def test_a_record_is_frozen_and_replace_pickle_and_fields_work():
    point = Point(1, 2.0, "n")
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    assert dataclasses.replace(point, x=5) == Point(5, 2.0)
    assert pickle.loads(pickle.dumps(point)) == point
    assert [f.name for f in dataclasses.fields(Named)] == ["x", "y", "note", "blob", "name"]
    named = Named(x=1, name="n")
    assert named == Named(x=1, name="n") != Named(x=1, name="m")
    assert repr(named) == "Named(x=1, y=0.0, note='', name='n')"
    with pytest.raises(TypeError):
        Named(1, 0.0, "", b"", "n")  # type: ignore[misc]  # name is keyword-only
