"""Which lanes wait asleep (vLLM sleep mode) on this host, and what each must generate when woken:
`state_dir/standby.json`.

Kept apart from `state.json` so that a standby never changes what the active lane is: a lost or unreadable
standby only makes the next rollback a cold start. A record is written *before* the lane is put to sleep,
so a run killed in between leaves a record for an awake lane (a wake of an awake vLLM is a no-op and the
wake check still holds it to its fingerprint), never a sleeping lane nobody knows of.

Callers hold the `HostLock` for load-change-save, as for `state.json`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import field, replace
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

from lanectl.errors import EXIT_BAD_INPUT, OperationFailed
from lanectl.records import frozen
from lanectl.state.atomic import write_atomically
from lanectl.state.file_model import Timestamp, load_state_file
from lanectl.state.journal import utc_now, utc_timestamp
from lanectl.state.paths import check_state_file, create_state_dir
from lanectl.state.strict import Bounds, record_data

MAX_STANDBY_BYTES = 1024 * 1024


@frozen
class Fingerprint:
    """Greedy output of the lane's wake-check prompt, recorded when it last passed its gate."""

    prompt: str
    max_tokens: Annotated[int, Bounds(ge=1)]
    text: str
    recorded: Timestamp


@frozen
class StandbyRecord:
    """A lane left asleep: since when, the output it must give again when woken, and what it holds."""

    lane: str
    since: Timestamp  # ISO UTC: when it was put to sleep
    fingerprint: Fingerprint
    # GPU memory it still holds asleep, as the engine logged it.
    resident_gib: Annotated[float, Bounds(ge=0)] | None = None


@frozen
class DroppedStandby:
    """Why a lane's standby was given up (it died asleep, a switch stopped it): the next rollback says so."""

    reason: str
    at: Timestamp


@frozen
class StandbyState:
    """The standby file: lanes asleep, their fingerprints, and standbys dropped with why."""

    version: Literal[1] = 1
    standbys: tuple[StandbyRecord, ...] = ()
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)
    dropped: dict[str, DroppedStandby] = field(default_factory=dict)

    def standby(self, lane: str) -> StandbyRecord | None:
        return next((record for record in self.standbys if record.lane == lane), None)

    def with_standby(self, record: StandbyRecord) -> StandbyState:
        others = tuple(r for r in self.standbys if r.lane != record.lane)
        dropped = {k: v for k, v in self.dropped.items() if k != record.lane}
        return replace(self, standbys=(*others, record), dropped=dropped)

    def without(self, lane: str, reason: str | None, now: datetime) -> StandbyState:
        """`lane` no longer waits asleep; a `reason` is kept for the next command that looks for it."""
        if self.standby(lane) is None:
            return self
        dropped = dict(self.dropped)
        if reason is not None:
            dropped[lane] = DroppedStandby(reason=reason, at=utc_timestamp(now))
        return replace(self, standbys=tuple(r for r in self.standbys if r.lane != lane), dropped=dropped)

    def serving(self, lane: str) -> StandbyState:
        """`lane` serves again: it is nobody's standby and nothing about its old one matters any more."""
        return replace(self, standbys=tuple(r for r in self.standbys if r.lane != lane),
                       dropped={k: v for k, v in self.dropped.items() if k != lane})

    def with_fingerprint(self, lane: str, fingerprint: Fingerprint) -> StandbyState:
        return replace(self, fingerprints={**self.fingerprints, lane: fingerprint})


class StandbyFileCorrupt(OperationFailed):
    exit_code = EXIT_BAD_INPUT

    def __init__(self, path: Path, detail: str):
        super().__init__(f"{path} is not a readable standby record ({detail}); the file was left untouched. Move it "
                         f"aside (mv {path} {path}.broken): lanectl then knows of no standby, the lanes left asleep "
                         "keep running, and their next rollback is a cold start")


class StandbyStore:
    def __init__(self, path: Path, *, now: Callable[[], datetime] = utc_now):
        self.path = path
        self.now = now

    def load(self) -> StandbyState:
        state = load_state_file(self.path, StandbyState, MAX_STANDBY_BYTES, "standby record", version=1,
                                refuse=lambda detail, newer: StandbyFileCorrupt(self.path, detail))
        return state or StandbyState()

    def update(self, change: Callable[[StandbyState], StandbyState]) -> StandbyState:
        return self.save(change(self.load()))

    def save(self, state: StandbyState) -> StandbyState:
        try:
            create_state_dir(self.path.parent)
            check_state_file(self.path)
            write_atomically(self.path, (json.dumps(record_data(state), indent=2) + "\n").encode())
        except OSError as exc:
            raise OperationFailed(f"could not write {self.path}: {exc.strerror or exc}") from exc
        return state

    def drop(self, lane: str, reason: str | None) -> StandbyState:
        return self.update(lambda s: s.without(lane, reason, self.now()))

    def timestamp(self) -> str:
        return utc_timestamp(self.now())
