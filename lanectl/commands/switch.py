from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from lanectl.dockerapi.containers import ContainerEngine
from lanectl.lanes.plan import plan_switch
from lanectl.lanes.switcher import LaneSwitcher, Reporter, SwitchOutcome, built_tag, rollback_target, standby_facts
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneStateStore
from lanectl.state.lock import HostLock
from lanectl.state.paths import create_state_dir, state_dir
from lanectl.state.standby import STANDBY_FILE, StandbyStore


@contextmanager
def switcher(catalog: Catalog, command: str, *, lock_wait: float, reporter: Reporter,
             no_gpu: bool = False) -> Iterator[LaneSwitcher]:
    """One mutation at a time per host: the lock is held for the whole command and released on any exit."""
    directory = state_dir()
    create_state_dir(directory)
    engine = ContainerEngine()
    journal = Journal(directory / "journal.jsonl")
    lock = HostLock(directory / "lock", command)
    with lock.held(lock_wait):
        if lock.took_over_from:
            holder = lock.took_over_from
            journal.append("note", message=f"took over the lock of pid {holder.get('pid')} "
                                           f"({holder.get('command')}) since {holder.get('since')}: "
                                           f"{holder.get('reason')}")
        yield LaneSwitcher(catalog, engine, journal, LaneStateStore(directory / "state.json"), reporter=reporter,
                           no_gpu=no_gpu)


def dry_run_up(catalog: Catalog, lane: Lane, *, rollback: bool = False) -> list[str]:
    """What `up` would do, from what the engine shows now; changes nothing and takes no lock."""
    directory = state_dir()
    engine = ContainerEngine()
    lines = []
    unfinished = Journal(directory / "journal.jsonl").unfinished_intent()
    if unfinished:
        lines.append(f"would first reconcile the unfinished {unfinished['action']} "
                     f"({unfinished.get('from') or '-'} -> {unfinished.get('to') or '-'})")
    observed = engine.lane_containers()
    facts = standby_facts(catalog, StandbyStore(directory / STANDBY_FILE), observed, rollback=rollback)
    active = LaneStateStore(directory / "state.json").load().active
    steps = plan_switch(lane, built_tag(engine, lane), catalog, observed, active=active, standby=facts)
    lines.append(f"would disarm the watchdog for {lane.name}'s startup budget")
    lines += [f"would {step.describe()}" for step in steps]
    lines.append(f"would re-arm the watchdog; on a failed gate, stop {lane.name} and bring the previous lane back")
    return lines


def dry_run_rollback(catalog: Catalog, to: Lane | None) -> list[str]:
    state = LaneStateStore(state_dir() / "state.json").load()
    return dry_run_up(catalog, to or rollback_target(catalog, state), rollback=True)


def run(action: Callable[[LaneSwitcher], SwitchOutcome], catalog: Catalog, command: str, *, lock_wait: float,
        reporter: Reporter, no_gpu: bool = False) -> SwitchOutcome:
    with switcher(catalog, command, lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu) as lanes:
        return action(lanes)
