"""Planning a fleet rollout: a pure function from one snapshot of the Swarm to a whole plan, as on the box.

`plan_fleet_up` and `plan_fleet_rollback` take what `fleet/snapshot.py` read (nodes, services, tasks, pushed
digests, the fleet journal's unfinished switch) and return the box's `Plan`: one phase per node, canary first
(each role's service created or updated, then the node's health gate), and the way back per node (Swarm's
rollback of every service the switch changed, then the previous lane's gate there). The executor
(`fleet/rollout.py`) runs exactly these steps and journals each under its key, so `up --fleet --dry-run --json`
lists the keys the rollout then journals. What a service's spec is, and how Swarm's answers read, is
`fleet/services.py`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from lanectl.dockerapi.containers import ContainerSpec
from lanectl.dockerapi.swarm import NodeInfo, ServiceState, TaskInfo
from lanectl.errors import BadInput, OperationFailed
from lanectl.fleet.services import (
    UPDATE_DONE,
    choose_nodes,
    not_carried,
    plan_service,
    service_drift,
    service_fields,
    service_name,
    task_problem,
    ungated_services,
)
from lanectl.image.containers import plan_containers
from lanectl.image.render import plan_image
from lanectl.lanes.plan import Kind, Phase, Plan, Step
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.records import frozen

FLEET_UP = "fleet-up"
FLEET_ROLLBACK = "fleet-rollback"


@frozen
class FleetSnapshot:
    """What one look at the Swarm (and lanectl's records of it) showed; a plan is made from nothing else."""

    nodes: tuple[NodeInfo, ...]
    services: tuple[ServiceState, ...]  # lanectl's own (labelled) services
    tasks: Mapping[str, tuple[TaskInfo, ...]]  # service ID -> its tasks
    service_names: tuple[str, ...] = ()  # every service in the Swarm, lanectl's or not
    pushed: Mapping[str, str] = field(default_factory=dict)  # lane -> repository@sha256:… its build was pushed as
    secret_digests: Mapping[str, str] = field(default_factory=dict)
    unfinished: Mapping[str, Any] | None = None  # the fleet journal's intent that has no outcome


def foreign_services(snapshot: FleetSnapshot, lane: Lane) -> list[str]:
    """Services named as lanectl names the recipe's services that lanectl did not create (no fleet labels)."""
    own = {s.name for s in snapshot.services}
    prefix = f"{lane.recipe.id}-"
    roles = {f"{prefix}{role}-" for role in lane.roles}
    return sorted(name for name in snapshot.service_names if name not in own and name.startswith(tuple(roles)))


def refuse_foreign(snapshot: FleetSnapshot, lane: Lane) -> None:
    foreign = foreign_services(snapshot, lane)
    if foreign:
        raise OperationFailed(f"service(s) {', '.join(foreign)} look like {lane.recipe.id}'s but lanectl did not "
                              "create them (no io.lanectl.fleet label); lanectl neither updates nor removes them: "
                              "rename or remove them (`docker service rm NAME`), then run this again")


def pushed_reference(snapshot: FleetSnapshot, lane: Lane) -> str:
    """The lane's build as its registry holds it; a lane never pushed is refused before any change."""
    reference = snapshot.pushed.get(lane.name)
    if reference is None:
        raise not_pushed(lane)
    return reference


def not_pushed(lane: Lane) -> OperationFailed:
    where = "" if lane.spec.image.registry else " --registry HOST:PORT"
    return OperationFailed(f"{lane.name}: image {plan_image(lane).tag} has not been pushed to a registry, and fleet "
                           f"nodes pull it by digest from one; push it with `lanectl build {lane.name} --push{where}`")


def fleet_containers(lane: Lane, reference: str, *, with_gpus: bool) -> list[ContainerSpec]:
    """Each role's container spec as its service runs it: the lane's own image by its pushed digest; a
    companion's own digest-pinned image as it is."""
    tag = plan_image(lane).tag
    return [dataclasses.replace(c, image=reference) if c.image == tag else c
            for c in plan_containers(lane, plan_image(lane), with_gpus=with_gpus)]


def gate_seconds(lane: Lane) -> float:
    return lane.spec.health.startup_budget_minutes * 60


def plan_fleet_up(catalog: Catalog, snapshot: FleetSnapshot, lane: Lane, *, nodes: tuple[str, ...] = (),
                  canary: str | None = None, with_gpus: bool = True, rollback: bool = False) -> Plan:
    """Bring `lane` to the chosen nodes, canary first, each node gated before the next is touched."""
    refuse_foreign(snapshot, lane)
    order = choose_nodes(lane, snapshot.nodes, nodes, canary)
    containers = fleet_containers(lane, pushed_reference(snapshot, lane), with_gpus=with_gpus)
    inputs = plan_image(lane).input_hash
    existing = {(s.recipe, s.role, s.node): s for s in snapshot.services}
    notes = [note for c in containers for note in not_carried(c)]
    phases: list[Phase] = []
    way_back: list[Phase] = []
    for node in order:
        steps: list[Step] = []
        back: list[Step] = []
        # A role the lane does not have goes first: it may hold the ports or GPUs the lane's own roles need.
        for left in left_over(snapshot, lane, node.hostname):
            steps.append(Step("service-remove", lane.name, left.name, left.role, node=node.hostname,
                              why=f"its role {left.role} is not in {lane.name}'s recipe"))
            back.insert(0, Step("service-create", lane.name, left.name, left.role, gate_seconds(lane),
                                node=node.hostname, why=f"put back as it was ({left.lane})",
                                service=dict(left.spec)))
        for container in containers:
            fields = service_fields(container, snapshot.secret_digests)
            wanted = plan_service(lane, container, node.hostname, with_gpus=with_gpus, inputs=inputs, fields=fields)
            current = existing.get((lane.recipe.id, container.role, node.hostname))
            step = _service_step(lane, node, container, wanted, fields, current, snapshot)
            if step is None:
                continue
            steps.append(step)
            back.insert(0, _undo_step(catalog, lane, node, step, current))
        primary = service_name(lane, ROLE_PRIMARY, node.hostname)
        ungated = _ungated(snapshot, lane, node)
        if not steps and not ungated:
            continue
        steps.append(Step("node-gate", lane.name, primary, ROLE_PRIMARY, gate_seconds(lane), node=node.hostname,
                          why=_not_gated(ungated) if not steps else ""))
        phases.append(Phase(tuple(steps)))
        if back:  # a node only gated (its services were already as the recipe says) has nothing to put back
            way_back.insert(0, Phase(tuple(back) + _restored_gate(catalog, node, back)))
    hosts = ", ".join(n.hostname for n in order)
    kind: Kind = "rollback" if rollback else "up"
    if not phases:
        return Plan("noop", lane.name, message=f"{lane.name} already serves on {hosts} as its recipe says; "
                    "nothing to do", notes=tuple(notes), with_gpus=with_gpus)
    return Plan(kind, lane.name, _previous_lane(snapshot, lane, order), tuple(phases), tuple(way_back),
                notes=tuple(notes), with_gpus=with_gpus, budget_seconds=gate_seconds(lane))


def left_over(snapshot: FleetSnapshot, lane: Lane, host: str) -> list[ServiceState]:
    """The recipe's services on `host` for a role `lane` does not have: a companion the recipe dropped, or one of
    the lane the node ran before. Left there, it would run beside the lane, holding its ports and GPUs."""
    return [s for s in snapshot.services
            if s.recipe == lane.recipe.id and s.node == host and s.role not in lane.roles]


def _not_gated(services: list[str]) -> str:
    return f"{', '.join(services)} changed since the node last passed its gate"


def _ungated(snapshot: FleetSnapshot, lane: Lane, node: NodeInfo) -> list[str]:
    """The recipe's services on `node` that differ from what the node's last passed gate saw.

    Decided from the services as they are, never from the journal: an update Swarm finished after lanectl
    died, a rollback interrupted before its gate, or an edit by hand all leave a node that no gate has seen
    serve. A service Swarm updated is no proof that the node serves, so the rollout gates it."""
    mine = [s for s in snapshot.services if s.recipe == lane.recipe.id and s.node == node.hostname]
    return ungated_services(node, mine)


def _service_step(lane: Lane, node: NodeInfo, container: ContainerSpec, wanted: dict[str, Any],
                  fields: Mapping[str, Any], current: ServiceState | None, snapshot: FleetSnapshot) -> Step | None:
    name = wanted["Name"]
    seconds = gate_seconds(lane)
    if current is None:
        return Step("service-create", lane.name, name, container.role, seconds, node=node.hostname, service=wanted)
    changes = service_drift(current.labels, lane, fields)
    problem = task_problem(snapshot.tasks.get(current.id, ()))
    if not changes and problem is None:
        return None
    why = ", ".join(changes) if changes else f"its task is not serving: {problem}"
    return Step("service-update", lane.name, name, container.role, seconds, why, node=node.hostname, service=wanted)


def _undo_step(catalog: Catalog, lane: Lane, node: NodeInfo, step: Step, current: ServiceState | None) -> Step:
    if current is None:
        return Step("service-remove", lane.name, step.container, step.role, node=node.hostname,
                    why="created by this switch")
    return Step("service-rollback", current.lane or lane.name, step.container, step.role,
                gate_seconds(catalog.lanes.get(current.lane, lane)), node=node.hostname)


def _restored_gate(catalog: Catalog, node: NodeInfo, back: list[Step]) -> tuple[Step, ...]:
    """Swarm calls a rollback complete once the old task starts; the previous lane must serve again."""
    for step in back:
        if step.action == "service-rollback" and step.role == ROLE_PRIMARY and step.lane in catalog.lanes:
            previous = catalog.lanes[step.lane]
            return (Step("node-gate", previous.name, step.container, ROLE_PRIMARY, gate_seconds(previous),
                         node=node.hostname),)
    return ()


def _previous_lane(snapshot: FleetSnapshot, lane: Lane, order: list[NodeInfo]) -> str | None:
    hosts = {n.hostname for n in order}
    lanes = {s.lane for s in snapshot.services
             if s.recipe == lane.recipe.id and s.role == ROLE_PRIMARY and s.node in hosts}
    return lanes.pop() if len(lanes) == 1 else None


def plan_fleet_rollback(catalog: Catalog, snapshot: FleetSnapshot, to: Lane | None, *, nodes: tuple[str, ...] = (),
                        canary: str | None = None, with_gpus: bool = True) -> Plan:
    """Back to the lane before the last completed update, by Swarm's rollback, canary first; with `to`, a
    rollout of that lane. After an interrupted `up --fleet`, exactly the nodes it moved go back.

    A service whose last update Swarm already rolled back is left alone: its PreviousSpec is then the lane that
    failed."""
    services = snapshot.services
    if to is not None:
        on = tuple(nodes) or tuple(sorted({s.node for s in services if s.recipe == to.recipe.id}))
        return plan_fleet_up(catalog, snapshot, to, nodes=on, canary=canary, with_gpus=with_gpus, rollback=True)
    if (snapshot.unfinished or {}).get("action") == FLEET_ROLLBACK:
        rest = _rest_of_rollback(catalog, snapshot, snapshot.unfinished or {}, nodes=nodes, canary=canary,
                                 with_gpus=with_gpus)
        if rest is not None:
            return rest
    interrupted = snapshot.unfinished if (snapshot.unfinished or {}).get("action") == FLEET_UP else None
    primaries = [s for s in services if s.role == ROLE_PRIMARY and s.update_state == UPDATE_DONE
                 and s.previous_spec and (not nodes or s.node in nodes)
                 and (interrupted is None or s.lane == interrupted.get("to"))]
    if not primaries:
        raise BadInput("nothing to roll back on the fleet: no lane's last update completed (Swarm and lanectl "
                       "already undid failed ones, and a rollback is not undone by another); name a lane "
                       "with --to")
    targets = {(s.recipe, s.previous_lane) for s in primaries}
    if len(targets) != 1:
        shown = ", ".join(sorted(f"{lane} ({recipe})" for recipe, lane in targets))
        raise BadInput(f"the fleet's nodes would go back to different lanes ({shown}); name one with --to")
    ((recipe, target_name),) = targets
    if target_name is None or target_name not in catalog.lanes:
        raise BadInput(f"the previous lane {target_name} is not in the recipes; name one with --to")
    target = catalog.lanes[target_name]
    refuse_foreign(snapshot, target)
    hosts = sorted({s.node for s in primaries}, key=lambda h: (h != canary, h))
    # Companions go back with their primary when their last update was the same switch.
    candidates = [s for s in services if s.node in hosts and s.recipe == recipe and s.update_state == UPDATE_DONE
                  and s.previous_lane == target_name]
    phases = []
    for host in hosts:
        mine = sorted((s for s in candidates if s.node == host), key=lambda s: s.role != ROLE_PRIMARY)
        steps = [Step("service-rollback", target.name, s.name, s.role, gate_seconds(target), node=host)
                 for s in mine]
        primary = service_name(target, ROLE_PRIMARY, host)
        steps.append(Step("node-gate", target.name, primary, ROLE_PRIMARY, gate_seconds(target), node=host))
        phases.append(Phase(tuple(steps)))
    return Plan("rollback", target.name, primaries[0].lane, tuple(phases), with_gpus=with_gpus,
                budget_seconds=gate_seconds(target))


def _rest_of_rollback(catalog: Catalog, snapshot: FleetSnapshot, intent: Mapping[str, Any], *,
                      nodes: tuple[str, ...], canary: str | None, with_gpus: bool) -> Plan | None:
    """What an interrupted or killed `rollback --fleet` left undone, decided from what the services are: on each
    node it named, every service that has not gone back yet goes back, and the node is gated unless its
    services are the ones its last passed gate saw."""
    target = catalog.lanes.get(str(intent.get("to")))
    if target is None:
        return None
    refuse_foreign(snapshot, target)
    named = {str(key).partition(":")[2] for key in intent.get("steps") or []}
    hosts = sorted({s.node for s in snapshot.services if s.name in named and (not nodes or s.node in nodes)},
                   key=lambda h: (h != canary, h))
    by_host = {n.hostname: n for n in snapshot.nodes}
    phases = []
    for host in hosts:
        mine = sorted((s for s in snapshot.services if s.node == host and s.recipe == target.recipe.id),
                      key=lambda s: s.role != ROLE_PRIMARY)
        steps = [Step("service-rollback", target.name, s.name, s.role, gate_seconds(target), node=host)
                 for s in mine if s.lane != target.name and s.previous_lane == target.name
                 and s.update_state == UPDATE_DONE]
        ungated = _ungated(snapshot, target, by_host[host]) if host in by_host else []
        if not steps and host in by_host and not ungated:
            continue
        primary = service_name(target, ROLE_PRIMARY, host)
        steps.append(Step("node-gate", target.name, primary, ROLE_PRIMARY, gate_seconds(target), node=host,
                          why=_not_gated(ungated) if not steps and ungated else ""))
        phases.append(Phase(tuple(steps)))
    if not phases:
        return Plan("noop", target.name, message=f"the rollback to {target.name} is done and gated on "
                    f"{', '.join(hosts) or 'its nodes'}; nothing to do", with_gpus=with_gpus)
    return Plan("rollback", target.name, intent.get("from"), tuple(phases), with_gpus=with_gpus,
                budget_seconds=gate_seconds(target))


def plan_lines(plan: Plan) -> list[str]:
    """The plan as `--dry-run` prints it: notes, each node's steps in order, then what a failure and an interrupt
    do."""
    if plan.kind == "noop":
        return [f"note: {note}" for note in plan.notes] + [f"would do nothing: {plan.message}"]
    lines = [f"note: {note}" for note in plan.notes]
    for index, phase in enumerate(plan.phases):
        node = phase.steps[0].node
        lines.append(f"{'canary' if index == 0 else 'then'} {node}:")
        lines += [f"  would {step.describe()}" + (f" ({step.why})" if step.action == "node-gate" and step.why else "")
                  for step in phase.steps]
    if plan.way_back:
        lines.append("on a failed step: stop, and put back every node changed so far, the last one first:")
        lines += [f"  would {step.describe()}" for phase in plan.way_back for step in phase.steps]
    lines.append(f"on Ctrl-C or SIGTERM: stop after the step in progress, say what serves on each node; "
                 f"`lanectl up {plan.lane} --fleet` continues, `lanectl rollback --fleet` goes back")
    return lines


def drift_by_node(plan: Plan) -> dict[str, dict[str, str]]:
    """node -> service -> what changes (for `--dry-run --json`)."""
    drift: dict[str, dict[str, str]] = {}
    for step in plan.steps:
        if step.action in ("service-create", "service-update"):
            drift.setdefault(step.node, {})[step.container] = step.why or "created"
    return drift


def plan_data(plan: Plan) -> dict[str, Any]:
    return {**plan.as_dict(), "steps": plan_lines(plan), "drift": drift_by_node(plan)}
