"""`up`, `rollback` and `down`: on this box's engine, or with --fleet on the Swarm nodes; --dry-run plans only."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from lanectl.dockerapi.containers import ContainerEngine
from lanectl.errors import BadInput
from lanectl.lanes.plan import plan_switch
from lanectl.lanes.switcher import LaneSwitcher, Reporter, SwitchOutcome, built_tag, rollback_target, standby_facts
from lanectl.output import Result
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneStateStore
from lanectl.state.lock import HostLock
from lanectl.state.paths import StateFiles, create_state_dir, state_dir
from lanectl.state.standby import StandbyStore


def up(catalog: Catalog, lane: str, *, reporter: Reporter, lock_wait: float, dry_run: bool = False,
       no_rollback: bool = False, no_gpu: bool = False, fleet: bool = False, nodes: Sequence[str] = (),
       canary: str | None = None) -> Result:
    """Switch this box (or with `fleet`, the Swarm nodes) to `lane`, health-gated, or go back."""
    from lanectl.fleet.rollout import require_placement

    target = catalog.lane(lane)
    _require_fleet_for_nodes(nodes, canary, fleet)
    require_placement(target, fleet)
    if fleet:
        from lanectl.commands import fleet as fleet_commands

        if no_rollback:
            raise BadInput("--no-rollback is for local lanes; on Swarm a failed update is always rolled back")
        if dry_run:
            return _plan(target, fleet_commands.dry_run_up(catalog, target, list(nodes), canary))
        return fleet_commands.run(lambda rollout: rollout.up(target, nodes=nodes, canary=canary), catalog,
                                  f"lanectl up {lane} --fleet", lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu)
    if dry_run:
        return _plan(target, dry_run_up(catalog, target))
    return run(lambda lanes: lanes.up(target, rollback_on_failure=not no_rollback), catalog, f"lanectl up {lane}",
               lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu)


def rollback(catalog: Catalog, to: str | None, *, reporter: Reporter, lock_wait: float, dry_run: bool = False,
             no_gpu: bool = False, fleet: bool = False, nodes: Sequence[str] = (),
             canary: str | None = None) -> Result:
    """Back to `to`, or the last known-good lane, through the same gated path as `up` (--fleet: Swarm's)."""
    target = catalog.lane(to) if to else None
    _require_fleet_for_nodes(nodes, canary, fleet)
    if fleet:
        from lanectl.commands import fleet as fleet_commands
        from lanectl.fleet.rollout import require_placement

        if target is not None:
            require_placement(target, fleet=True)
        if dry_run:
            raise BadInput("--dry-run is not offered for rollback --fleet; `lanectl fleet status` shows each "
                           "node's previous lane")
        return fleet_commands.run(lambda rollout: rollout.rollback(target, nodes=nodes, canary=canary), catalog,
                                  "lanectl rollback --fleet", lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu)
    if dry_run:
        planned = target or rollback_target(catalog, LaneStateStore(StateFiles(state_dir()).lanes).load())
        return _plan(planned, dry_run_up(catalog, planned, rollback=True))
    return run(lambda lanes: lanes.rollback(target), catalog, "lanectl rollback" + (f" --to {to}" if to else ""),
               lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu)


def down(catalog: Catalog, lane: str | None, *, reporter: Reporter, lock_wait: float) -> Result:
    """Stop `lane`, or the active one and every lane waiting asleep as a standby (companions first); their
    containers are kept for a later start."""
    files = StateFiles(state_dir())
    name = lane or LaneStateStore(files.lanes).load().active
    if name is None and not StandbyStore(files.standby).load().standbys:
        raise BadInput("no active lane; name the lane to stop")
    target = catalog.lane(name) if name else None
    return run(lambda lanes: lanes.down(target, with_standbys=lane is None), catalog,
               f"lanectl down {lane or name or '(standbys)'}", lock_wait=lock_wait, reporter=reporter)


def _require_fleet_for_nodes(nodes: Sequence[str], canary: str | None, fleet: bool) -> None:
    if (nodes or canary) and not fleet:
        raise BadInput("--nodes and --canary choose Swarm nodes; add --fleet")


def _plan(lane: Lane, steps: list[str]) -> Result:
    return Result("plan", {"lane": lane.name, "steps": steps})


@contextmanager
def switcher(catalog: Catalog, command: str, *, lock_wait: float, reporter: Reporter,
             no_gpu: bool = False) -> Iterator[LaneSwitcher]:
    """One mutation at a time per host: the lock is held for the whole command and released on any exit."""
    directory = state_dir()
    create_state_dir(directory)
    engine = ContainerEngine()
    files = StateFiles(directory)
    journal = Journal(files.journal)
    lock = HostLock(files.host_lock, command)
    with lock.held(lock_wait):
        if lock.took_over_from:
            holder = lock.took_over_from
            journal.append("note", message=f"took over the lock of pid {holder.get('pid')} "
                                           f"({holder.get('command')}) since {holder.get('since')}: "
                                           f"{holder.get('reason')}")
        yield LaneSwitcher(catalog, engine, journal, LaneStateStore(files.lanes), reporter=reporter,
                           no_gpu=no_gpu)


def dry_run_up(catalog: Catalog, lane: Lane, *, rollback: bool = False) -> list[str]:
    """What `up` would do, from what the engine shows now; changes nothing and takes no lock."""
    files = StateFiles(state_dir())
    engine = ContainerEngine()
    lines = []
    unfinished = Journal(files.journal).unfinished_intent()
    if unfinished:
        lines.append(f"would first reconcile the unfinished {unfinished['action']} "
                     f"({unfinished.get('from') or '-'} -> {unfinished.get('to') or '-'})")
    observed = engine.lane_containers()
    facts = standby_facts(catalog, StandbyStore(files.standby), observed, rollback=rollback)
    active = LaneStateStore(files.lanes).load().active
    steps = plan_switch(lane, built_tag(engine, lane), catalog, observed, active=active, standby=facts)
    lines.append(f"would disarm the watchdog for {lane.name}'s startup budget")
    lines += [f"would {step.describe()}" for step in steps]
    lines.append(f"would re-arm the watchdog; on a failed gate, stop {lane.name} and bring the previous lane back")
    return lines


def run(action: Callable[[LaneSwitcher], SwitchOutcome], catalog: Catalog, command: str, *, lock_wait: float,
        reporter: Reporter, no_gpu: bool = False) -> Result:
    with switcher(catalog, command, lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu) as lanes:
        outcome = action(lanes)
    return Result("switch", {"result": outcome.result, "message": outcome.message, "lane": outcome.lane,
                             "steps": list(outcome.steps), "diagnostics": outcome.diagnostics},
                  exit_code=outcome.exit_code)
