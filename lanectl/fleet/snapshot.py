"""One look at the Swarm for a fleet plan: nodes, lanectl's services and their tasks, every service's name, the
pushed digests of the lanes concerned, the keyed digests of their secrets and the fleet journal's unfinished
switch. Read once per command and passed down, as the box's `lanes/snapshot.py` does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lanectl.dockerapi.swarm import SwarmEngine
from lanectl.fleet.plan import FleetSnapshot
from lanectl.image.render import plan_image
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.paths import StateFiles
from lanectl.state.pushes import PushStore
from lanectl.state.secret_digests import secret_digests


def take_fleet_snapshot(swarm: SwarmEngine, catalog: Catalog, files: StateFiles, journal: Journal, *,
                        lanes: Iterable[Lane], environ: Mapping[str, str], create_secret_key: bool) -> FleetSnapshot:
    services = tuple(swarm.lane_services())
    pushes = PushStore(files.root)
    pushed = {}
    concerned = {lane.name: lane for lane in lanes}
    concerned.update((s.lane, catalog.lanes[s.lane]) for s in services if s.lane in catalog.lanes)
    for lane in concerned.values():
        record = pushes.find(plan_image(lane).tag, lane.spec.image.registry)
        if record is not None:
            pushed[lane.name] = record.reference
    secrets = {name for lane in catalog.lanes.values() if lane.spec.placement.backend == "swarm"
               for _, role in lane.spec.engines() for name in role.secret_env}
    return FleetSnapshot(
        nodes=tuple(swarm.nodes()), services=services, tasks={s.id: tuple(swarm.tasks(s.id)) for s in services},
        service_names=tuple(swarm.service_names()), pushed=pushed,
        secret_digests=secret_digests(files.secret_key, secrets, environ, create=create_secret_key),
        unfinished=journal.unfinished_intent(),
    )
