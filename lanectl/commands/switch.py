"""`up`, `rollback` and `down`: on this box's engine, or with --fleet on the Swarm nodes; --dry-run plans only.

A local switch and its --dry-run are one code path up to the plan: the same snapshot, the same planner. The dry
run prints the plan and stops; the switch takes the engine lock, plans again from a fresh snapshot (the engine
may have changed meanwhile) and runs exactly that plan.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from lanectl.dockerapi.containers import ContainerEngine
from lanectl.errors import BadInput
from lanectl.lanes.execute import Reporter, SwitchOutcome
from lanectl.lanes.interrupt import Interrupt
from lanectl.lanes.inventory import labelled_lanes
from lanectl.lanes.plan import Plan, plan_down, plan_reconcile, plan_rollback, plan_up
from lanectl.lanes.snapshot import Snapshot
from lanectl.lanes.switcher import LaneSwitcher
from lanectl.output import Result, warning
from lanectl.recipe.catalog import Catalog, Lane, unread_summary
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneStateStore
from lanectl.state.lock import engine_lock
from lanectl.state.paths import StateFiles, create_state_dir, state_dir
from lanectl.state.standby import StandbyStore


def up(catalog: Catalog, lane: str, *, reporter: Reporter, lock_wait: float, dry_run: bool = False,
       no_rollback: bool = False, no_gpu: bool = False, fleet: bool = False, nodes: Sequence[str] = (),
       canary: str | None = None, interrupt: Interrupt | None = None) -> Result:
    """Switch this box (or with `fleet`, the Swarm nodes) to `lane`, health-gated, or go back. `interrupt`: the
    command's own, when it holds signals to its end (`Interrupt.held`)."""
    target = catalog.lane(lane)
    _require_fleet_for_nodes(nodes, canary, fleet)
    _require_placement(target, fleet)
    if fleet:
        from lanectl.commands import fleet as fleet_commands

        if no_rollback:
            raise BadInput("--no-rollback is for local lanes; on Swarm a failed update is always rolled back")
        return fleet_commands.up(catalog, target, nodes=nodes, canary=canary, no_gpu=no_gpu, dry_run=dry_run,
                                 lock_wait=lock_wait, reporter=reporter)
    if dry_run:
        return dry_run_plan(catalog, lambda snapshot: plan_up(
            catalog, snapshot, target, rollback_on_failure=not no_rollback, with_gpus=not no_gpu), target.name,
            reporter=reporter, no_gpu=no_gpu)
    return run(lambda lanes: lanes.up(target, rollback_on_failure=not no_rollback), catalog, f"lanectl up {lane}",
               lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu, interrupt=interrupt)


def rollback(catalog: Catalog, to: str | None, *, reporter: Reporter, lock_wait: float, dry_run: bool = False,
             no_gpu: bool = False, fleet: bool = False, nodes: Sequence[str] = (),
             canary: str | None = None, interrupt: Interrupt | None = None) -> Result:
    """Back to `to`, or the last known-good lane, through the same gated path as `up` (--fleet: Swarm's)."""
    target = catalog.lane(to) if to else None
    _require_fleet_for_nodes(nodes, canary, fleet)
    if fleet:
        from lanectl.commands import fleet as fleet_commands

        if target is not None:
            _require_placement(target, fleet=True)
        return fleet_commands.rollback(catalog, target, nodes=nodes, canary=canary, no_gpu=no_gpu, dry_run=dry_run,
                                       lock_wait=lock_wait, reporter=reporter)
    if dry_run:
        return dry_run_plan(catalog, lambda snapshot: plan_rollback(catalog, snapshot, target, with_gpus=not no_gpu),
                            *([target.name] if target else []), reporter=reporter, no_gpu=no_gpu)
    return run(lambda lanes: lanes.rollback(target), catalog, "lanectl rollback" + (f" --to {to}" if to else ""),
               lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu, interrupt=interrupt)


def down(catalog: Catalog, lane: str | None, *, reporter: Reporter, lock_wait: float, dry_run: bool = False,
         recipe_problems: Sequence[str] = (), interrupt: Interrupt | None = None) -> Result:
    """Stop `lane`, or the active one and every lane waiting asleep as a standby (companions first); their
    containers are kept for a later start. `catalog` holds the lanes of the recipes that load (`recipe_problems`
    say why the others do not): a lane none of them has is stopped and removed as its containers' labels name
    it."""
    files = StateFiles(state_dir())
    name = lane or LaneStateStore(files.lanes).load().active
    if dry_run:
        result = dry_run_plan(catalog, lambda snapshot: plan_down(catalog, snapshot, name, with_standbys=lane is None),
                              *([name] if name else []), reporter=reporter, no_gpu=False)
    else:
        if lane is not None:
            _require_known(catalog, lane, files)
        result = run(lambda lanes: lanes.down(name, with_standbys=lane is None), catalog,
                     f"lanectl down {lane or name or '(standbys)'}", lock_wait=lock_wait, reporter=reporter,
                     interrupt=interrupt)
    if not recipe_problems:
        return result
    return replace(result, messages=(*result.messages, warning(unread_summary(recipe_problems))))


def _require_known(catalog: Catalog, name: str, files: StateFiles) -> None:
    """A name that neither the recipes that load, the engine's labels nor the state files know is refused before
    the lock is taken or an unfinished switch finished (exit 2), with the lane names it may have meant."""
    if name in catalog.lanes:
        return
    if name == LaneStateStore(files.lanes).load().active or StandbyStore(files.standby).load().standby(name):
        return
    if name not in labelled_lanes(catalog, ContainerEngine().list_containers(), os.path.realpath(files.root)):
        catalog.lane(name)


def _require_fleet_for_nodes(nodes: Sequence[str], canary: str | None, fleet: bool) -> None:
    if (nodes or canary) and not fleet:
        raise BadInput("--nodes and --canary choose Swarm nodes; add --fleet")


def dry_run_plan(catalog: Catalog, planner: Callable[[Snapshot], Plan], *lanes: str, reporter: Reporter,
                 no_gpu: bool) -> Result:
    """What the command would do, from what the engine shows now: the plan it would run, as it would run it.
    Changes nothing and takes no lock."""
    switcher = _switcher(catalog, reporter=reporter, no_gpu=no_gpu)
    snapshot = switcher.snapshot(*lanes, create_secret_key=False)
    data: dict[str, object] = {"reconcile": None}  # every key of the envelope there always, null when it has nothing
    lines: list[str] = []
    unfinished = plan_reconcile(catalog, snapshot, with_gpus=not no_gpu)
    if unfinished is not None:
        intent = snapshot.unfinished or {}
        lines.append(f"would first finish or undo the unfinished {intent.get('action')} "
                     f"({intent.get('from') or '-'} -> {intent.get('to') or '-'}):")
        lines += [f"  {line}" for line in unfinished.lines()]
        lines.append("then, planned from what the engine shows now (the plan is made again after it):")
        data["reconcile"] = unfinished.as_dict()
    plan = planner(snapshot)
    data.update(plan.as_dict())
    data["steps"] = [*lines, *plan.lines()]
    return Result("plan", data)


def _switcher(catalog: Catalog, *, reporter: Reporter, no_gpu: bool,
              interrupt: Interrupt | None = None) -> LaneSwitcher:
    files = StateFiles(state_dir())
    return LaneSwitcher(catalog, ContainerEngine(), Journal(files.journal), LaneStateStore(files.lanes),
                        reporter=reporter, no_gpu=no_gpu, interrupt=interrupt)


@contextmanager
def switcher(catalog: Catalog, command: str, *, lock_wait: float, reporter: Reporter,
             no_gpu: bool = False, interrupt: Interrupt | None = None) -> Iterator[LaneSwitcher]:
    """One mutation at a time per Docker engine: its lock is held for the whole command and released on any
    exit."""
    directory = state_dir()
    create_state_dir(directory)
    lanes = _switcher(catalog, reporter=reporter, no_gpu=no_gpu, interrupt=interrupt)
    lock = engine_lock(command)
    with lock.held(lock_wait):
        if lock.took_over_from:
            holder = lock.took_over_from
            lanes.journal.append("note", message=f"took over the lock of pid {holder.get('pid')} "
                                                 f"({holder.get('command')}) since {holder.get('since')}: "
                                                 f"{holder.get('reason')}")
        yield lanes


def run(action: Callable[[LaneSwitcher], SwitchOutcome], catalog: Catalog, command: str, *, lock_wait: float,
        reporter: Reporter, no_gpu: bool = False, interrupt: Interrupt | None = None) -> Result:
    with switcher(catalog, command, lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu,
                  interrupt=interrupt) as lanes:
        outcome = action(lanes)
    message = outcome.message
    late = lanes.interrupt.pending()
    if late and outcome.signum is None:
        # It came past the last step a way back could undo (bookkeeping after the gate, or after the switch
        # ended): the switch finished, and the signal is said, not silently dropped.
        message += f" ({late} came when nothing was left to undo: the switch finished)"
    return Result("switch", {"result": outcome.result, "message": message, "lane": outcome.lane,
                             "steps": list(outcome.steps), "diagnostics": outcome.diagnostics},
                  exit_code=outcome.exit_code)


def _require_placement(lane: Lane, fleet: bool) -> None:
    """A lane runs where its recipe places it; the flag must agree, so nothing lands on the wrong engine."""
    on_swarm = lane.spec.placement.backend == "swarm"
    if on_swarm and not fleet:
        raise BadInput(f"lane {lane.name} is placed on Swarm (placement.backend: swarm); run "
                       f"`lanectl up {lane.name} --fleet`")
    if fleet and not on_swarm:
        raise BadInput(f"lane {lane.name} runs on the local engine (no `placement: {{backend: swarm}}` in its "
                       f"recipe); run `lanectl up {lane.name}` without --fleet")


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "up": {
        "example": """\
$ lanectl up h2-REF --dry-run     # the planned steps; nothing changes
$ lanectl up h2-REF
ok: h2-REF is serving …
$ lanectl up demo-h1 --no-gpu     # the demo and tests: the recipe's GPU requests are left out
""",
        "exit": {
            0: "the lane serves (or already did)",
            1: ("the switch failed: the lane did not pass its health gate (the previous lane was brought back unless "
                "--no-rollback), or the host lock stayed busy past --lock-wait"),
            2: "an unknown lane, a bad option value or an invalid recipe; nothing was changed",
            130: "interrupted by Ctrl-C: the output says which lane serves, if any; the next up or rollback ends it",
            143: "ended by SIGTERM, as for 130",
        },
    },
    "rollback": {
        "example": """\
$ lanectl rollback               # to the last known-good lane
$ lanectl rollback --to h1-REF   # to a lane of your choice, through the same health gate
""",
        "exit": {
            0: "the lane went back to serving",
            1: "the way back failed its health gate, or no known-good lane is left",
            2: "an unknown lane or an invalid recipe; nothing was changed",
            130: "interrupted by Ctrl-C: the output says which lane serves, if any; the next up or rollback ends it",
            143: "ended by SIGTERM, as for 130",
        },
    },
    "down": {
        "example": """\
$ lanectl down            # the active lane and every standby; the containers are kept
$ lanectl down demo-h2    # one lane
$ lanectl down old-lane   # a lane no recipe that loads has: stopped and removed as its containers' labels name it
""",
        "exit": {
            0: "stopped (or already stopped)",
            1: "a container could not be stopped, or the host lock stayed busy",
            2: ("a lane that neither the recipes that load, the engine's labels nor the state files know, or the "
                "containers of another state folder; nothing was changed"),
        },
    },
}
