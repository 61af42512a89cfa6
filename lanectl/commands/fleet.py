"""The --fleet verbs: one snapshot of the Swarm, the pure plan, and (unless --dry-run) that plan run under the lock
of the manager's engine and journaled in the fleet journal; `fleet status`.

A rollout and its --dry-run are one code path up to the plan, as on the box: the dry run prints the plan and
stops; the rollout takes the lock, plans again from a fresh snapshot (the Swarm may have changed meanwhile) and
runs exactly that plan."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from lanectl.errors import EXIT_FAILED, EXIT_OK
from lanectl.lanes.execute import Reporter
from lanectl.output import Result
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.lock import engine_lock
from lanectl.state.paths import StateFiles, create_state_dir, state_dir

if TYPE_CHECKING:
    from lanectl.fleet.plan import FleetSnapshot
    from lanectl.fleet.rollout import FleetOutcome, FleetRollout
    from lanectl.lanes.plan import Plan

Planner = Callable[["FleetSnapshot"], "Plan"]


def up(catalog: Catalog, target: Lane, *, nodes: Sequence[str], canary: str | None, no_gpu: bool, dry_run: bool,
       lock_wait: float, reporter: Reporter) -> Result:
    from lanectl.fleet.plan import plan_fleet_up

    def planner(snapshot: FleetSnapshot) -> Plan:
        return plan_fleet_up(catalog, snapshot, target, nodes=tuple(nodes), canary=canary, with_gpus=not no_gpu)

    command = f"lanectl up {target.name} --fleet"
    return _plan_or_run(catalog, planner, [target], command, dry_run=dry_run, lock_wait=lock_wait, reporter=reporter)


def rollback(catalog: Catalog, target: Lane | None, *, nodes: Sequence[str], canary: str | None, no_gpu: bool,
             dry_run: bool, lock_wait: float, reporter: Reporter) -> Result:
    from lanectl.fleet.plan import plan_fleet_rollback

    def planner(snapshot: FleetSnapshot) -> Plan:
        return plan_fleet_rollback(catalog, snapshot, target, nodes=tuple(nodes), canary=canary,
                                   with_gpus=not no_gpu)

    command = "lanectl rollback --fleet" + (f" --to {target.name}" if target else "")
    return _plan_or_run(catalog, planner, [target] if target else [], command, dry_run=dry_run,
                        lock_wait=lock_wait, reporter=reporter)


def _plan_or_run(catalog: Catalog, planner: Planner, lanes: list[Lane], command: str, *, dry_run: bool,
                 lock_wait: float, reporter: Reporter) -> Result:
    from lanectl.dockerapi.swarm import SwarmEngine
    from lanectl.fleet.plan import plan_data
    from lanectl.fleet.rollout import FleetRollout
    from lanectl.fleet.snapshot import take_fleet_snapshot

    files = StateFiles(state_dir())
    journal = Journal(files.fleet_journal)
    swarm = SwarmEngine()
    if dry_run:
        snapshot = take_fleet_snapshot(swarm, catalog, files, journal, lanes=lanes, environ=os.environ,
                                       create_secret_key=False)
        return Result("plan", plan_data(planner(snapshot)))
    create_state_dir(files.root)
    # The manager's engine's lock, as a box switch takes it: one mutation at a time there, whatever the state
    # folder; node leases keep two managers from changing one node at once.
    with engine_lock_held(command, lock_wait, reporter):
        outcome = plan_and_run(FleetRollout(catalog, swarm, journal, reporter=reporter), files, planner, lanes,
                               why=command.removeprefix("lanectl "))
    return Result("fleet-switch", outcome.as_dict(), exit_code=outcome.exit_code)


@contextmanager
def engine_lock_held(command: str, lock_wait: float, reporter: Reporter) -> Iterator[None]:
    """The manager's engine's lock, as a box switch takes it; a wait for it is said, not silent (up to a
    minute that reads as a hang)."""
    lock = engine_lock(command)
    busy = lock.holder_now()
    if busy is not None and lock_wait > 0:
        reporter.note(f"waiting up to {lock_wait:g} s for the lock of this Docker engine, held by {busy}")
    with lock.held(lock_wait):
        yield


def plan_and_run(rollout: FleetRollout, files: StateFiles, planner: Planner, lanes: list[Lane], *,
                 why: str) -> FleetOutcome:
    """A fresh snapshot, its plan, and that plan run; the caller holds the lock."""
    from lanectl.fleet.snapshot import take_fleet_snapshot

    snapshot = take_fleet_snapshot(rollout.swarm, rollout.catalog, files, rollout.journal, lanes=lanes,
                                   environ=os.environ, create_secret_key=True)
    return rollout.run(planner(snapshot), why=why, unfinished=snapshot.unfinished)


def status(recipes: Path | None) -> Result:
    """Exit 1 when the fleet is degraded. The fleet is what it is, whatever the local recipes say: without
    valid ones each lane is probed at /health and no drift is judged."""
    from lanectl.commands import catalog_if_valid
    from lanectl.dockerapi.swarm import SwarmEngine
    from lanectl.fleet.status import observe

    data = observe(SwarmEngine(), catalog_if_valid(recipes), StateFiles(state_dir()))
    return Result("fleet-status", data, exit_code=EXIT_OK if data["healthy"] else EXIT_FAILED)


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "fleet status": {
        "example": """\
$ lanectl fleet status
$ lanectl fleet status --json | jq '.data.healthy'
""",
        "exit": {
            0: "every node is ready and every lane placed on it answers",
            1: "degraded: a node is down or a lane does not answer",
            2: "an invalid recipe",
        },
    },
}
