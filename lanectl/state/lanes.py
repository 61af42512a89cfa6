"""What this host is serving, as lanectl last left it: `state_dir/state.json`.

`LaneState` is the file's strict model, and its transitions are pure; `LaneStateStore` reads and
writes the file, always whole: a new version goes to a temp file that replaces the old one, so a
reader (or the next command after a crash) sees either the previous state or the new one, never a
mix. A file that is not a valid state is refused and left untouched (exit 2), never guessed at.

Load, change and save (`update`) is not atomic between processes: callers hold the `HostLock`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from lanectl.errors import EXIT_BAD_INPUT, BadInput, OperationFailed
from lanectl.records import frozen
from lanectl.state.atomic import write_atomically
from lanectl.state.file_model import NewerVersion, Timestamp, load_state_file
from lanectl.state.journal import utc_now, utc_timestamp
from lanectl.state.paths import check_state_file, create_state_dir
from lanectl.state.strict import record_data

STATE_VERSION: Literal[1] = 1
MAX_STATE_BYTES = 1024 * 1024  # a few lane names and a lease; anything bigger was not written by lanectl
# A lease past a year is a typo (or an overflow waiting to happen), not maintenance.
MAX_DISARM_SECONDS = 366 * 86400
# The reason of a switch's own lease starts with this: the watchdog tells it from an operator's by it.
SWITCH_LEASE_PREFIX = "switch to "


@frozen
class WatchdogLease:
    """The watchdog is disarmed until `until` (ISO UTC), because `reason`, as asked by `by`."""

    until: Timestamp
    reason: str
    by: str


@frozen
class LaneState:
    """state.json, as `LaneStateStore` writes it and checks it on reading; its transitions return new states."""

    version: Literal[1] = STATE_VERSION
    active: str | None = None
    known_good: tuple[str, ...] = ()  # lanes that passed their health gate here, most recent last
    watchdog_armed: bool = False
    watchdog_lease: WatchdogLease | None = None
    updated: str | None = None

    def with_active(self, lane: str) -> LaneState:
        return replace(self, active=lane)

    def with_inactive(self) -> LaneState:
        return replace(self, active=None)

    def with_known_good(self, lane: str) -> LaneState:
        return replace(self, known_good=(*(known for known in self.known_good if known != lane), lane))

    def armed(self) -> LaneState:
        return replace(self, watchdog_armed=True, watchdog_lease=None)

    def disarmed_for(self, seconds: float, reason: str, by: str, now: datetime) -> LaneState:
        # A disarm always ends: a forgotten one would leave the box unguarded until someone notices.
        if not seconds > 0:
            raise BadInput(f"the watchdog can be disarmed only for a positive number of seconds, got {seconds}")
        if seconds > MAX_DISARM_SECONDS:
            raise BadInput(f"the watchdog can be disarmed for at most {MAX_DISARM_SECONDS // 86400} days, "
                           f"got {seconds:g} s")
        try:
            reason.encode()
        except UnicodeEncodeError:
            # Bytes that were not UTF-8 in the argument: JSON would keep them as lone surrogates, which no
            # reader of state.json accepts, so every later command would fail on the file.
            raise BadInput("the disarm reason is not UTF-8 text; give it as UTF-8") from None
        lease = WatchdogLease(until=utc_timestamp(now + timedelta(seconds=seconds)), reason=reason, by=by)
        return replace(self, watchdog_armed=False, watchdog_lease=lease)

    def lease_expired(self, now: datetime) -> bool:
        """True when there is a lease and `now` has reached its end; False with no lease at all."""
        if self.watchdog_lease is None:
            return False
        return now >= datetime.fromisoformat(self.watchdog_lease.until)

    def watchdog_armed_at(self, now: datetime) -> bool:
        """Whether the watchdog acts at `now`: armed, or disarmed by a lease that has run out.

        An expired lease arms the watchdog at once, whether or not a pass has re-armed it in the file
        yet: the watchdog's passes act on this, and every command that shows the arm state says this.
        """
        return self.watchdog_armed or self.lease_expired(now)

    def last_known_good_before(self, current: str | None) -> str | None:
        """The most recent known-good lane other than `current`: where a rollback goes."""
        for lane in reversed(self.known_good):
            if lane != current:
                return lane
        return None


class StateFileCorrupt(OperationFailed):
    # Exit 2: the input (the file) is bad; running the command again cannot help until it is moved.
    exit_code = EXIT_BAD_INPUT

    def __init__(self, path: Path, detail: str, *, newer_version: int | None = None):
        self.path = path
        self.detail = detail
        aside = f"mv {path} {path}.broken"
        if newer_version is not None:
            message = (f"{path} holds lane state version {newer_version}, written by a newer lanectl "
                       f"(this one reads version {STATE_VERSION}); the file was left untouched. "
                       f"Use the newer lanectl, or move the file aside ({aside}): `lanectl status` then "
                       f"rebuilds what it can from the engine's container labels.")
        else:
            message = (f"{path} is not a readable lane state ({detail}); the file was left untouched. "
                       f"Move it aside ({aside}): `lanectl status` then rebuilds what it can from the "
                       f"engine's container labels.")
        super().__init__(message)


class LaneStateStore:
    def __init__(self, path: Path, *, now: Callable[[], datetime] = utc_now):
        self.path = path
        self.now = now

    def load(self) -> LaneState:
        """The saved state; the default state if there is no file yet."""
        def refuse(detail: str, newer: NewerVersion | None) -> StateFileCorrupt:
            return StateFileCorrupt(self.path, detail, newer_version=newer.version if newer else None)

        state = load_state_file(self.path, LaneState, MAX_STATE_BYTES, "lane state", version=STATE_VERSION,
                                refuse=refuse)
        return state or LaneState()

    def save(self, state: LaneState) -> LaneState:
        """Write `state` whole; returns it as saved (with `updated` stamped)."""
        return self._write(state)

    def update(self, change: Callable[[LaneState], LaneState]) -> LaneState:
        """Load, apply `change`, save; returns the state as saved (with `updated` stamped)."""
        return self._write(change(self.load()))

    def _write(self, state: LaneState) -> LaneState:
        stamped = replace(state, updated=utc_timestamp(self.now()))
        text = json.dumps(record_data(stamped), indent=2) + "\n"
        try:
            create_state_dir(self.path.parent)
            check_state_file(self.path)
            write_atomically(self.path, text.encode())
        except OSError as exc:
            raise OperationFailed(f"could not write {self.path}: {exc.strerror or exc}") from exc
        return stamped
