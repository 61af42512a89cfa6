"""The watchdog's memory between passes: `state_dir/watchdog.json`, replaced whole on every pass.

Arm state and lease live in `state.json` with the lanes (a switch disarms the watchdog under the
host lock); this file holds what only the watchdog needs: failure counts, its restarts in the
window, the log and kernel-log cursors, counters for metrics, the last pass and action.

The file is checked against a strict model (`WatchdogFile`) before any of it is used: a value of the
wrong type, out of range or not finite would otherwise surface passes later as a crash (a restart
time that is not a timestamp, a log cursor in the year 10^300). A file that fails is moved aside,
never deleted, and the watchdog's memory starts afresh: counters are worth less than a watchdog
that keeps watching.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from lanectl.records import frozen
from lanectl.state.atomic import write_atomically
from lanectl.state.file_model import Timestamp, parse_state_file
from lanectl.state.paths import NotAStateFile, check_state_file, create_state_dir, read_state_file
from lanectl.state.strict import Bounds, Matches, MaxLength, record_data
from lanectl.watchdog.policy import WatchdogMemory

WATCHDOG_STATE_VERSION = 1
# Anything bigger is not a file this lanectl wrote: 1 MiB holds years of counters.
MAX_STATE_BYTES = 1024 * 1024
# Counters and times are bounded so that nothing read back can overflow a later sum, a datetime or
# the Docker API's `since` (UNIX seconds up to the year 5138; counts up to 2^53, exact as JSON numbers).
MAX_COUNT = 2**53
MAX_UNIX_SECONDS = 1e11


Count = Annotated[int, Bounds(ge=0, le=MAX_COUNT)]
UnixSeconds = Annotated[float, Bounds(ge=0, le=MAX_UNIX_SECONDS)]
Text = Annotated[str, MaxLength(4096)]
LongText = Annotated[str, MaxLength(65536)]


@frozen
class MemoryFile:
    """The watchdog's memory as the state file holds it."""

    lane: Text | None = None
    consecutive_failures: Count = 0
    restarts: Annotated[tuple[Timestamp, ...], MaxLength(10_000)] = ()
    ready_since_start: bool = False


@frozen
class LastActionFile:
    """The watchdog's last action as the state file holds it."""

    ts: Timestamp
    action: Text
    reason: LongText
    outcome: LongText


@frozen
class WatchdogFile:
    """watchdog.json as written by `WatchdogStateStore.save`: what its reading checks."""

    version: Annotated[int, Bounds(ge=WATCHDOG_STATE_VERSION, le=WATCHDOG_STATE_VERSION)] = WATCHDOG_STATE_VERSION
    memory: MemoryFile = MemoryFile()
    log_since: UnixSeconds | None = None
    kernel_cursor: Text | None = None
    last_generation_probe: UnixSeconds | None = None
    last_pass: Timestamp | None = None
    last_pass_result: LongText | None = None
    last_pass_seconds: UnixSeconds = 0.0
    last_action: LastActionFile | None = None
    heartbeat: Timestamp | None = None
    restarts_total: dict[Text, Count] = field(default_factory=dict)
    rollbacks_total: Count = 0
    xid_total: dict[Annotated[str, Matches(r"^\d{1,6}$")], Count] = field(default_factory=dict)
    xid_hardware_total: Count = 0


@frozen
class WatchdogRecord:
    """The watchdog's state file: its memory, its log cursors and its last action."""

    version: int = WATCHDOG_STATE_VERSION
    memory: WatchdogMemory = field(default_factory=WatchdogMemory)
    log_since: float | None = None  # engine log cursor: UNIX time of the last pass that read it
    kernel_cursor: str | None = None
    last_generation_probe: float | None = None
    last_pass: str | None = None
    last_pass_result: str | None = None
    last_pass_seconds: float = 0.0
    last_action: dict[str, Any] | None = None
    heartbeat: str | None = None
    restarts_total: dict[str, int] = field(default_factory=dict)
    rollbacks_total: int = 0
    xid_total: dict[str, int] = field(default_factory=dict)
    xid_hardware_total: int = 0


def parse_watchdog_file(raw: bytes) -> WatchdogRecord:
    """The record in `raw`; ValueError saying where and what when it is not a valid watchdog.json."""
    parsed = parse_state_file(raw, WatchdogFile, MAX_STATE_BYTES, "watchdog.json")
    data = record_data(parsed)
    remembered = data.pop("memory")
    memory = WatchdogMemory(**{**remembered, "restarts": tuple(remembered["restarts"])})
    return replace(WatchdogRecord(**data), memory=memory)


class WatchdogStateStore:
    def __init__(self, path: Path, *, quarantine: bool = True):
        """`quarantine`: move an invalid file aside (the watchdog); False for readers such as `watchdog status`."""
        self.path = path
        self.quarantine = quarantine
        self.problem: str | None = None

    def load(self) -> WatchdogRecord:
        """A missing file starts the watchdog's memory afresh; so does an invalid one, moved aside to
        `watchdog.json.corrupt-<UTC time>` and described in `problem` for the caller to report."""
        self.problem = None
        try:
            raw = read_state_file(self.path, MAX_STATE_BYTES)
        except NotAStateFile as exc:
            return self._invalid(str(exc))
        except OSError as exc:
            return self._invalid(exc.strerror or str(exc))
        if raw is None:
            return WatchdogRecord()
        try:
            return parse_watchdog_file(raw)
        except ValueError as exc:
            return self._invalid(str(exc))

    def _invalid(self, detail: str) -> WatchdogRecord:
        if not self.quarantine:
            self.problem = f"{self.path} is not a valid watchdog state ({detail}); the next pass moves it aside"
            return WatchdogRecord()
        aside = self.path.with_name(f"{self.path.name}.corrupt-{datetime.now(UTC):%Y%m%dT%H%M%S.%fZ}")
        try:
            os.rename(self.path, aside)
            moved = f"moved aside to {aside}"
        except OSError as exc:
            moved = f"could not be moved aside ({exc.strerror or exc})"
        self.problem = (f"{self.path} was not a valid watchdog state ({detail}); {moved}; "
                        f"the watchdog's memory starts afresh")
        return WatchdogRecord()

    def save(self, record: WatchdogRecord) -> None:
        create_state_dir(self.path.parent)
        check_state_file(self.path)
        write_atomically(self.path, (json.dumps(asdict(record), indent=2, sort_keys=True) + "\n").encode())
