"""`@frozen`: lanectl's frozen dataclasses, with the methods every one of them shares written once.

A frozen dataclass gets six methods of its own (`__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__`,
`__delattr__`), each generated as source text and compiled when the class is created. Python 3.11 does that
for every class at import, ~0.5 ms a class here, and a quick command (`status`, the watchdog's cron pass)
creates about seventy. Comparing, hashing and printing need no code of their own per class: `@frozen` gives
each class the shared functions below, which read the class's fields, and leaves `dataclass` to generate only
what must know them (`__init__`, and the frozen `__setattr__`/`__delattr__`). They behave as dataclass's own:
equal when of the same class with equal compared fields, hashed over the same fields, shown as
`Name(field=value, ...)`.

Use it as `@frozen` or `@frozen(kw_only=True)` (the name attrs gives the same idea); fields are
`dataclasses.field(...)` as usual.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T", bound=type)


@overload
def frozen(cls: T, /) -> T: ...


@overload
def frozen(*, kw_only: bool = False) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: Any = None, /, *, kw_only: bool = False) -> Any:
    def make(cls: Any) -> Any:
        cls = dataclasses.dataclass(frozen=True, kw_only=kw_only, repr=False, eq=False)(cls)
        fields = dataclasses.fields(cls)
        cls._record_shown = tuple(f.name for f in fields if f.repr)
        cls._record_compared = tuple(f.name for f in fields if f.compare)
        cls._record_hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        cls.__repr__ = _repr
        cls.__eq__ = _eq
        cls.__hash__ = _hash
        return cls

    return make if cls is None else make(cls)


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._record_shown)
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self._record_compared
    return tuple(getattr(self, name) for name in names) == tuple(getattr(other, name) for name in names)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, name) for name in self._record_hashed))
