"""The watchdog's memory between passes: `state_dir/watchdog.json`, replaced whole on every pass.

Arm state and lease live in `state.json` with the lanes (a switch disarms the watchdog under the
host lock); this file holds what only the watchdog needs: failure counts, its restarts in the
window, the log and kernel-log cursors, counters for metrics, the last pass and action.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from lanectl.state_dir import create_state_dir, write_atomically
from lanectl.watchdog_policy import WatchdogMemory

WATCHDOG_STATE_VERSION = 1


@dataclass(frozen=True)
class WatchdogRecord:
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


class WatchdogStateStore:
    def __init__(self, path: Path):
        self.path = path
        self.problem: str | None = None

    def load(self) -> WatchdogRecord:
        """A missing or unreadable file starts the watchdog's memory afresh (and says so): counters
        are worth less than a watchdog that keeps watching."""
        try:
            data = json.loads(self.path.read_text())
            remembered = data.pop("memory", {})
            memory = WatchdogMemory(**{**remembered, "restarts": tuple(remembered.get("restarts", ()))})
            return replace(WatchdogRecord(**data), memory=memory)
        except FileNotFoundError:
            return WatchdogRecord()
        except (ValueError, TypeError, KeyError) as exc:
            self.problem = f"{self.path} was unreadable ({exc}); the watchdog's memory starts afresh"
            return WatchdogRecord()

    def save(self, record: WatchdogRecord) -> None:
        create_state_dir(self.path.parent)
        write_atomically(self.path, (json.dumps(asdict(record), indent=2, sort_keys=True) + "\n").encode())
