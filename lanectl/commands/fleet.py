"""The --fleet verbs: the manager's engine, the host lock and the fleet journal; `fleet status`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lanectl.errors import EXIT_FAILED, EXIT_OK
from lanectl.fleet.rollout import FleetOutcome, FleetRollout
from lanectl.lanes.switcher import Reporter
from lanectl.output import Result
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.lock import HostLock
from lanectl.state.paths import StateFiles, create_state_dir, state_dir
from lanectl.state.pushes import PushStore


@contextmanager
def fleet_rollout(catalog: Catalog, command: str, *, lock_wait: float, reporter: Reporter,
                  no_gpu: bool) -> Iterator[FleetRollout]:
    """The host lock keeps this box's own switches and fleet rollouts from interleaving; node leases keep
    two managers from changing one node at once."""
    from lanectl.dockerapi.swarm import SwarmEngine

    files = StateFiles(state_dir())
    create_state_dir(files.root)
    swarm = SwarmEngine()
    with HostLock(files.host_lock, command).held(lock_wait):
        yield FleetRollout(catalog, swarm, Journal(files.fleet_journal), reporter=reporter,
                           pushes=PushStore(files.root), no_gpu=no_gpu)


def run(action: Callable[[FleetRollout], FleetOutcome], catalog: Catalog, command: str, *, lock_wait: float,
        reporter: Reporter, no_gpu: bool) -> Result:
    with fleet_rollout(catalog, command, lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu) as rollout:
        outcome = action(rollout)
    return Result("fleet-switch", outcome.as_dict(), exit_code=outcome.exit_code)


def dry_run_up(catalog: Catalog, lane: Lane, nodes: list[str], canary: str | None) -> list[str]:
    """What `up --fleet` would do; changes nothing and takes no lock."""
    from lanectl.dockerapi.swarm import SwarmEngine
    from lanectl.fleet.plan import choose_nodes, service_name
    from lanectl.fleet.rollout import pushed_image
    from lanectl.image.containers import plan_containers
    from lanectl.image.render import plan_image

    order = choose_nodes(lane, SwarmEngine().nodes(), nodes, canary)
    image = pushed_image(PushStore(state_dir()), lane)
    roles = [c.role for c in plan_containers(lane, plan_image(lane))]
    lines = [f"each node pulls {image}"]
    for index, node in enumerate(order):
        label = "canary" if index == 0 else "then"
        services = ", ".join(service_name(lane, role, node.hostname) for role in roles)
        lines.append(f"would update {label} {node.hostname}: {services} (stop-first, Swarm rolls back a failed "
                     f"health check), then hold {lane.name} to its gate")
    lines.append("on a failure: stop the rollout and roll back every node changed so far")
    return lines


def status(recipes: Path | None) -> Result:
    """Exit 1 when the fleet is degraded. The fleet is what it is, whatever the local recipes say: without
    valid ones each lane is probed at /health."""
    from lanectl.commands import catalog_if_valid
    from lanectl.dockerapi.swarm import SwarmEngine
    from lanectl.fleet.status import observe

    data = observe(SwarmEngine(), catalog_if_valid(recipes))
    return Result("fleet-status", data, exit_code=EXIT_OK if data["healthy"] else EXIT_FAILED)
