from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lanectl.errors import LanectlError
from lanectl.output import Result
from lanectl.recipe.catalog import Catalog
from lanectl.state.lanes import LaneStateStore
from lanectl.state.paths import StateFiles, create_state_dir, state_dir
from lanectl.watchdog.runner import PassResult, Watchdog
from lanectl.watchdog.state import WatchdogStateStore

if TYPE_CHECKING:
    from lanectl.lanes.switcher import Reporter


def check(catalog: Catalog, kernel_log: str | None, *, reporter: Reporter) -> Result:
    """One pass, for cron: exit 0 healthy, 1 acted or unhealthy, 2 misconfigured."""
    result = _watchdog(catalog, kernel_log, reporter=reporter).check()
    return Result("watchdog.check", result.as_dict(), exit_code=result.exit_code)


def run(catalog: Catalog, kernel_log: str | None, *, reporter: Reporter, stop: threading.Event,
        on_pass: Callable[[PassResult, str], None]) -> Result:
    """Passes on Docker events, kernel-log lines and the probe interval until `stop` is set; each pass and
    what woke it go to `on_pass`."""
    _watchdog(catalog, kernel_log, reporter=reporter).run(stop, on_pass=on_pass)
    return Result("watchdog.run", {})


def arm(catalog: Catalog, *, reporter: Reporter) -> Result:
    state = _watchdog(catalog, None, reporter=reporter, need_engine=False).arm()
    return Result("watchdog.arm", {"armed": state.watchdog_armed})


def rearm(catalog: Catalog, *, reporter: Reporter) -> Result:
    """For cron: re-arm only when the maintenance lease has expired; idempotent."""
    state, message = _watchdog(catalog, None, reporter=reporter, need_engine=False).rearm()
    return Result("watchdog.rearm", {"armed": state.watchdog_armed, "message": message})


def disarm(catalog: Catalog, seconds: float, reason: str, *, reporter: Reporter) -> Result:
    """Observe and record only, until the lease ends (or `watchdog arm`)."""
    from lanectl.state.journal import current_user_at_host

    state = _watchdog(catalog, None, reporter=reporter, need_engine=False).disarm(seconds, reason,
                                                                                 current_user_at_host())
    lease = state.watchdog_lease
    return Result("watchdog.disarm", {"until": lease.until if lease else None, "reason": reason})


def _watchdog(catalog: Catalog, kernel_log: str | None, *, reporter: Reporter, need_engine: bool = True) -> Watchdog:
    """The kernel log named on the command line, else $LANECTL_KERNEL_LOG, else /dev/kmsg (not required)."""
    import os

    spec = kernel_log or os.environ.get("LANECTL_KERNEL_LOG")
    return open_watchdog(catalog, spec, explicit=spec is not None, reporter=reporter, need_engine=need_engine)


def open_watchdog(catalog: Catalog, kernel_log_spec: str | None, *, explicit: bool, reporter: Reporter,
                  need_engine: bool = True) -> Watchdog:
    """The default kernel log (/dev/kmsg) needs root: without it the watchdog still watches the
    lane and says that Xid lines are not read; a source the user named must work (exit 2 if not)."""
    from lanectl.host.kernel_log import open_kernel_log

    directory = state_dir()
    create_state_dir(directory)
    kernel_log, problem = None, None
    try:
        kernel_log = open_kernel_log(kernel_log_spec or "kmsg")
        kernel_log.read_new(None)  # fails now, not in the middle of a pass, when it cannot be read
    except LanectlError as exc:
        if explicit:
            raise
        kernel_log, problem = None, f"Xid lines are not read: {exc}"
    engine: Any = None
    if need_engine:
        from lanectl.dockerapi.containers import ContainerEngine

        engine = ContainerEngine()
    watchdog = Watchdog(catalog, directory, engine=engine, reporter=reporter, kernel_log=kernel_log,
                        kernel_log_problem=problem)
    if problem:
        reporter.note(problem)
    return watchdog


def watchdog_status() -> Result:
    """Armed?, lease, last pass, last action, heartbeat age, counters; what could not be read."""
    files = StateFiles(state_dir())
    state = LaneStateStore(files.lanes).load()
    memory_store = WatchdogStateStore(files.watchdog, quarantine=False)
    record = memory_store.load()
    now = datetime.now(UTC)
    heartbeat_age = None
    if record.heartbeat:
        heartbeat_age = round(now.timestamp() - datetime.fromisoformat(record.heartbeat).timestamp(), 1)
    lease = state.watchdog_lease
    return Result("watchdog.status", {
        "armed": state.watchdog_armed_at(now),
        "lease": None if lease is None else {"until": lease.until, "reason": lease.reason, "by": lease.by,
                                             "expired": state.lease_expired(now)},
        "active": state.active,
        "last_pass": record.last_pass,
        "last_pass_result": record.last_pass_result,
        "last_pass_seconds": record.last_pass_seconds,
        "last_action": record.last_action,
        "heartbeat": record.heartbeat,
        "heartbeat_age_seconds": heartbeat_age,
        "consecutive_failures": record.memory.consecutive_failures,
        "restarts_in_window": list(record.memory.restarts),
        "restarts_total": record.restarts_total,
        "rollbacks_total": record.rollbacks_total,
        "xid_total": record.xid_total,
        "xid_hardware_total": record.xid_hardware_total,
        "problems": [p for p in (memory_store.problem,) if p],
    })


def install_units(*, cron: bool, dry_run: bool, recipes_dir: Path, root: Path = Path("/")) -> Result:
    """The units carry where the state and the recipes are, so cron's bare environment finds them."""
    import os

    from lanectl.watchdog.install import install, render_cron, render_systemd, running_lanectl_command

    environ = {**os.environ, "LANECTL_STATE_DIR": str(state_dir()), "LANECTL_RECIPES": str(recipes_dir)}
    command = running_lanectl_command()
    unit = render_cron(command, environ) if cron else render_systemd(command, environ)
    messages = install([unit], dry_run=dry_run, root=root)
    if dry_run:
        # One message per line: a message is one line on the terminal (a line break in it is shown escaped).
        messages += [f"--- {unit.path} ---", *unit.content.rstrip("\n").splitlines()]
    elif not cron:
        messages.append("now: systemctl daemon-reload && systemctl enable --now lanectl-watchdog")
    return Result("watchdog.install", {"lines": messages})


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "watchdog check": {
        "example": """\
# what cron runs every minute (see `watchdog install`)
$ lanectl watchdog check --kernel-log file:/var/log/kern.log
""",
        "exit": {
            0: "healthy, or nothing to watch",
            1: "the watchdog acted (a restart, a rollback) or the lane is unhealthy",
            2: "misconfigured: no readable state, an active lane missing from the recipes",
        },
    },
    "watchdog run": {
        "example": """\
# what the systemd unit runs (see `watchdog install --systemd`)
$ lanectl watchdog run
""",
        "exit": {
            0: "stopped by SIGTERM or Ctrl-C",
            2: "misconfigured at start",
        },
    },
    "watchdog arm": {
        "example": """\
$ lanectl watchdog arm     # after maintenance, before the lease runs out
""",
        "exit": {
            0: "armed",
        },
    },
    "watchdog rearm": {
        "example": """\
$ lanectl watchdog rearm   # cron runs it before each check: it re-arms only an expired lease
""",
        "exit": {
            0: "armed again, or nothing to do",
        },
    },
    "watchdog disarm": {
        "example": """\
$ lanectl watchdog disarm --for 2h --reason "swapping the NIC"
""",
        "exit": {
            0: "disarmed until the lease ends",
            2: "a bad --for",
        },
    },
    "watchdog status": {
        "example": """\
$ lanectl watchdog status
watchdog: disarmed
active lane: -
last pass: never (-); heartbeat never
restarts: 0; rollbacks: 0; Xid: 0 (hardware 0)
""",
        "exit": {
            0: "the state was read",
            1: "the watchdog's state file is damaged (it is named)",
        },
    },
    "watchdog install": {
        "example": """\
$ sudo lanectl watchdog install --cron --dry-run    # print /etc/cron.d/lanectl; write nothing
$ sudo lanectl watchdog install --cron
$ sudo lanectl watchdog install --systemd
$ sudo systemctl daemon-reload && sudo systemctl enable --now lanectl-watchdog
""",
        "exit": {
            0: "written (or already up to date)",
            1: "a file could not be written (installing needs root)",
            2: "neither or both of --cron and --systemd, or a setting that cron or systemd cannot carry",
        },
    },
}
