"""Who is changing a node: the node label (`io.lanectl.lease`) a fleet run holds while it changes the node, and
when another run may take it over. Pure; the judgement's facts (the clock, this host, whether a pid lives, which
switches the journal closed) are passed in.

A run killed with SIGKILL never gives its lease back. Waiting out the lease's whole term would block every
other run for as long as the startup budget allows (hours on a real model), so a lease is left behind, and
taken over, as soon as any of these shows that its run is over: its term has passed, its process on this host
is gone, or the journal has closed its switch (the next run closes a killed run's switch when it continues it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lanectl.records import frozen

# The term of a lease written before leases said their own (an hour: longer than any such run's phase).
LEGACY_LEASE_SECONDS = 3600
LEASE_PATTERN = re.compile(r"^(?P<holder>\S+?)(?: pid (?P<pid>\d+))?(?: switch (?P<switch>[0-9a-f]+))?"
                           r" @(?P<since>\d+(?:\.\d+)?)(?: \+(?P<seconds>\d+))?$")


@frozen
class NodeLease:
    holder: str  # user@host
    pid: int | None
    switch: str | None
    since: float | None  # UNIX time it was taken
    seconds: float | None  # how long the run that took it could last

    @property
    def host(self) -> str:
        return self.holder.rpartition("@")[2]

    def label(self) -> str:
        return f"{self.holder} pid {self.pid} switch {self.switch} @{self.since:.0f} +{self.seconds:.0f}"

    def who(self) -> str:
        return f"{self.holder} pid {self.pid}" if self.pid is not None else self.holder


def read_lease(value: str) -> NodeLease:
    """A lease label as written by any lanectl: older ones have no switch nor term; an unreadable one no time."""
    match = LEASE_PATTERN.match(value.strip())
    if match is None:
        return NodeLease(value.strip() or "?", None, None, None, None)
    pid, seconds = match["pid"], match["seconds"]
    return NodeLease(match["holder"], int(pid) if pid else None, match["switch"], float(match["since"]),
                     float(seconds) if seconds else None)


def why_left_behind(lease: NodeLease, *, now: float, host: str, pid_alive: Callable[[int], bool],
                    switch_closed: Callable[[str], bool], term_seconds: float) -> str | None:
    """Why `lease` no longer stands for a run changing the node (so it may be taken over), or None while its
    run may still be going. `term_seconds` stands in for a lease that does not say how long its run could last."""
    if lease.since is None:
        return "it does not say when it was taken"
    term = lease.seconds if lease.seconds is not None else term_seconds
    if now - lease.since >= term:
        return f"it was taken {now - lease.since:.0f} s ago, longer than its run could last ({term:.0f} s)"
    if lease.pid is not None and lease.host == host and not pid_alive(lease.pid):
        return f"its process (pid {lease.pid} on {host}) is gone"
    if lease.switch is not None and switch_closed(lease.switch):
        return f"its run (switch {lease.switch}) has ended"
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this host. This process never holds a lease it is asking about: a lease
    with its own pid was left by an earlier run in it (or a pid reused since), so it counts as gone."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def closed_switches(records: Iterable[Mapping[str, Any]]) -> set[str]:
    """The switches a journal's records give an outcome for: a lease that names one outlived its run."""
    return {str(r["switch"]) for r in records if r.get("kind") == "outcome" and "switch" in r}
