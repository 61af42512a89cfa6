"""`lanectl fleet status`: every node, its GPUs and labels, which lane runs there, and whether it answers.

`summarize` is pure (nodes, services, tasks and probe results in; rows and problems out); `observe`
gathers those from the manager and probes each node's published port itself, because a task Swarm
calls running may still not answer (a hung engine, a firewall between the boxes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from lanectl.dockerapi.labels import GATED_LABEL_PREFIX, LEASE_LABEL, SPEC_FIELDS_LABEL
from lanectl.dockerapi.swarm import NodeInfo, ServiceState, SwarmEngine, TaskInfo
from lanectl.fleet.node_lease import LEGACY_LEASE_SECONDS, closed_switches, pid_alive, read_lease, why_left_behind
from lanectl.fleet.plan import fleet_containers
from lanectl.fleet.services import current_task, service_drift, service_fields, task_problem, ungated_services
from lanectl.image.render import plan_image
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.records import frozen
from lanectl.state.paths import StateFiles
from lanectl.state.pushes import PushStore
from lanectl.state.secret_digests import secret_digests

PROBE_TIMEOUT_SECONDS = 2.0


@frozen
class Probe:
    ok: bool
    detail: str


def summarize(nodes: Sequence[NodeInfo], services: Sequence[ServiceState],
              tasks: Mapping[str, Sequence[TaskInfo]], probes: Mapping[str, Probe],
              drift: Mapping[str, list[str]] | None = None,
              leases_left: Mapping[str, str] | None = None,
              left_over: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The fleet as one document; `healthy` is false when any node is down, any lane role is not serving or
    changed since its node's last gate, or a run that is over left its lease. `drift`: service ID -> how it
    differs from its lane's recipe now, field by field (a switch would update it). `leases_left`: hostname ->
    why its lease's run is over. `left_over`: service ID -> the lane whose switch removes it (its role is not
    in the lane its node's primary runs)."""
    problems: list[str] = []
    rows = []
    known = {n.hostname for n in nodes}
    for node in sorted(nodes, key=lambda n: n.hostname):
        lanes = []
        placed = [s for s in services if s.node == node.hostname]
        ungated = set(ungated_services(node, placed))
        for service in sorted(placed, key=lambda s: (s.recipe, s.role)):
            service_tasks = tasks.get(service.id, [])
            task = current_task(service_tasks)
            problem = task_problem(service_tasks)
            probe = probes.get(service.id)
            serving = problem is None and task is not None and task.state == "running" and (
                probe is None or probe.ok)
            entry = {
                "recipe": service.recipe, "lane": service.lane, "role": service.role, "service": service.name,
                "task": task.state if task else "none", "problem": problem,
                # Swarm's restarts are the watchdog signal on a fleet: failed tasks in its (short) history.
                "failed_tasks": sum(1 for t in service_tasks if t.state in ("failed", "rejected")),
                "update": service.update_state, "update_message": service.update_message or None,
                "previous_lane": service.previous_lane,
                "health": None if probe is None else ("ok" if probe.ok else probe.detail),
                "serving": serving,
                "gated": service.name not in ungated,
                "drift": list((drift or {}).get(service.id, [])),
            }
            lanes.append(entry)
            entry["left_over"] = (left_over or {}).get(service.id)
            if entry["left_over"] is not None:
                lane_now = entry["left_over"]
                problems.append(f"{node.hostname}: {service.name} ({service.role} of {service.lane}) is left over: "
                                f"{lane_now} has no {service.role}; `lanectl up {lane_now} --fleet` removes it")
            if node.state != "ready":
                continue
            if not serving:
                why = problem or (probe.detail if probe and not probe.ok else f"task {entry['task']}")
                problems.append(f"{node.hostname}: {service.lane} {service.role} is not serving ({why})")
            elif service.name in ungated:
                # A task that answers /health may still generate nothing: only the node's gate says it serves.
                problems.append(f"{node.hostname}: {service.lane} {service.role} changed since the node last passed "
                                f"its gate ({service.name}); `lanectl up {service.lane} --fleet` gates it")
        if node.state != "ready":
            unreachable = ", ".join(sorted({str(e["lane"]) for e in lanes}))
            problems.append(f"{node.hostname}: node is {node.state}" + (
                f"; its lanes ({unreachable}) cannot be reached" if lanes else ""))
        labels = {k: v for k, v in node.labels.items() if k != LEASE_LABEL and not k.startswith(GATED_LABEL_PREFIX)}
        left = (leases_left or {}).get(node.hostname)
        if left is not None:
            problems.append(f"{node.hostname}: the lease of {read_lease(node.labels[LEASE_LABEL]).who()} is left "
                            f"behind ({left}); the next `up --fleet` or `rollback --fleet` takes it over")
        rows.append({
            "hostname": node.hostname, "state": node.state, "availability": node.availability, "role": node.role,
            "addr": node.addr, "engine": node.engine_version, "gpus": node.gpus, "labels": labels,
            "lease": node.labels.get(LEASE_LABEL), "lease_left_behind": left, "lanes": lanes,
        })
    for service in services:
        if service.node not in known:
            problems.append(f"{service.name}: placed on {service.node}, which is not in the Swarm")
    return {"healthy": not problems, "problems": problems, "nodes": rows}


def service_drift_now(service: ServiceState, lane: Lane, pushed: str | None,
                      secret_digests: Mapping[str, str]) -> list[str]:
    """How `service` differs from its lane's recipe as `up --fleet` would run it now; GPUs judged as the service
    was created (with or without, --no-gpu), which its recorded fields say."""
    if pushed is None:
        return [f"{lane.name}'s current build has not been pushed; `lanectl build {lane.name} --push` first"]
    recorded = service.labels.get(SPEC_FIELDS_LABEL)
    with_gpus = recorded is None or json.loads(recorded).get("gpus") is not None
    for container in fleet_containers(lane, pushed, with_gpus=with_gpus):
        if container.role == service.role:
            return service_drift(service.labels, lane, service_fields(container, secret_digests))
    return [f"its role {service.role} is no longer in {lane.name}'s recipe"]


def observe(swarm: SwarmEngine, catalog: Catalog | None, files: StateFiles | None = None) -> dict[str, Any]:
    nodes = swarm.nodes()
    services = swarm.lane_services()
    tasks = {s.id: swarm.tasks(s.id) for s in services}
    by_host = {n.hostname: n for n in nodes}
    probes: dict[str, Probe] = {}
    for service in services:
        node = by_host.get(service.node)
        task = current_task(tasks[service.id])
        if service.role != ROLE_PRIMARY or node is None or node.state != "ready" or task is None \
                or task.state != "running":
            continue
        probes[service.id] = _probe(node, service, catalog)
    return summarize(nodes, services, tasks, probes, _drift(services, catalog, files), _leases_left(nodes, files),
                     left_over_services(services, catalog))


def left_over_services(services: Sequence[ServiceState], catalog: Catalog | None) -> dict[str, str]:
    """service ID -> the lane of its node's primary, for each service of a role that lane does not have."""
    if catalog is None:
        return {}
    primaries = {(s.recipe, s.node): catalog.lanes.get(s.lane) for s in services if s.role == ROLE_PRIMARY}
    left = {}
    for service in services:
        lane = primaries.get((service.recipe, service.node))
        if lane is not None and service.role not in lane.roles:
            left[service.id] = lane.name
    return left


def _leases_left(nodes: Sequence[NodeInfo], files: StateFiles | None) -> dict[str, str]:
    """hostname -> why its lease's run is over, for each node whose lease is left behind."""
    from lanectl.state.journal import Journal, current_user_at_host

    held = {n.hostname: read_lease(n.labels[LEASE_LABEL]) for n in nodes if n.labels.get(LEASE_LABEL)}
    if not held:
        return {}
    closed = closed_switches(Journal(files.fleet_journal).read().records) if files is not None else set()
    host = current_user_at_host().rpartition("@")[2]
    verdicts = {name: why_left_behind(lease, now=time.time(), host=host, pid_alive=pid_alive,
                                      switch_closed=closed.__contains__, term_seconds=LEGACY_LEASE_SECONDS)
                for name, lease in held.items()}
    return {name: why for name, why in verdicts.items() if why is not None}


def _drift(services: Sequence[ServiceState], catalog: Catalog | None,
           files: StateFiles | None) -> dict[str, list[str]]:
    if catalog is None or files is None:
        return {}
    pushes = PushStore(files.root)
    lanes = {s.lane: catalog.lanes[s.lane] for s in services if s.lane in catalog.lanes}
    secrets = {name for lane in lanes.values() for _, role in lane.spec.engines() for name in role.secret_env}
    digests = secret_digests(files.secret_key, secrets, os.environ, create=False)
    drift = {}
    for service in services:
        lane = lanes.get(service.lane)
        if lane is None:
            continue
        record = pushes.find(plan_image(lane).tag, lane.spec.image.registry)
        drift[service.id] = service_drift_now(service, lane, record.reference if record else None, digests)
    return drift


def _probe(node: NodeInfo, service: ServiceState, catalog: Catalog | None) -> Probe:
    import httpx

    ports = (service.spec.get("EndpointSpec") or {}).get("Ports") or []
    if not ports:
        return Probe(False, "publishes no port")
    lane = catalog.lanes.get(service.lane) if catalog else None
    path = lane.spec.health.health_path if lane else "/health"
    url = f"http://{node.addr}:{ports[0]['PublishedPort']}{path}"
    try:
        response = httpx.get(url, timeout=PROBE_TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        return Probe(False, f"{url}: {type(exc).__name__}")
    return Probe(response.status_code == 200, f"{url}: HTTP {response.status_code}")
