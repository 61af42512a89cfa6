"""Lanes on Docker Swarm: which nodes, in what order, and the service spec each role runs as. Pure.

Swarm does the running, restarting and rolling back; lanectl decides what to ask of it. A lane is
one Swarm service per role *and node*, each with one replica pinned to its node. One service per
role spanning all nodes would leave the update order to Swarm, which cannot be told to update a
canary first; a service per node keeps Swarm's stop-first update, health-gated automatic rollback
and restart policy on every node, while lanectl decides the order and stops at the first failure.

A service is named for its recipe, role and node, not for its lane: switching a node from h1-REF
to h2-REF is an *update* of the same service, so Swarm's rollback (`PreviousSpec`) is the way back.
Specs are the Engine API's ServiceSpec JSON, so what `lanectl render --fleet` prints is what Swarm gets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from lanectl.dockerapi.containers import ContainerSpec
from lanectl.dockerapi.labels import FLEET_LABEL, GATED_LABEL_PREFIX, LABEL_PREFIX, SPEC_FIELDS_LABEL, SPEC_LABEL
from lanectl.dockerapi.swarm import NodeInfo, ServiceState, TaskInfo
from lanectl.errors import BadInput, OperationFailed
from lanectl.health.engine_exit import exit_code_text
from lanectl.image.containers import spec_changes, spec_digest, spec_fields
from lanectl.recipe.catalog import Lane

SECOND_NS = 1_000_000_000
HEALTH_RETRIES = 3
# Docker runs a task's health check (a python3 process in the task) for its whole life, not only while a switch
# waits: at a recipe's sub-second gate poll that is several process starts a second per service, on every node,
# and on a busy node a check that misses its timeout three times in a row gets a healthy engine killed. lanectl's
# own gate still polls at the recipe's interval; Swarm's check runs no more often than this.
SWARM_CHECK_MIN_INTERVAL_SECONDS = 2.0
SERVICE_NAME_MAX = 63


def service_name(lane: Lane, role: str, node: str) -> str:
    """`<recipe>-<role>-<node>`, shortened with a hash when Swarm's 63-character limit needs it."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{lane.recipe.id}-{role}-{node}")
    if len(name) <= SERVICE_NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:SERVICE_NAME_MAX - 9]}-{digest}"


def service_labels(lane: Lane, role: str, node: str, inputs: str,
                   fields: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The service's own marks; with `fields`, the box's spec digest and fields, so drift is judged as there."""
    labels = {
        FLEET_LABEL: "1",
        LABEL_PREFIX + "recipe": lane.recipe.id,
        LABEL_PREFIX + "lane": lane.name,
        LABEL_PREFIX + "role": role,
        LABEL_PREFIX + "node": node,
        LABEL_PREFIX + "inputs": inputs,
    }
    if fields is not None:
        labels[SPEC_LABEL] = spec_digest(fields)
        labels[SPEC_FIELDS_LABEL] = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return labels


# What the box's spec digest covers that a Swarm service cannot carry. `ipc` has no field in a service spec: a
# Swarm lane that sets it is refused by the recipe's validation. A host IP other than every address is named in
# the plan's notes.
HOST_IP_NOT_CARRIED = "a host-mode port binds on every address of the node; Swarm has no host IP for it"
EVERY_ADDRESS = "0.0.0.0"


def service_fields(container: ContainerSpec, secret_digests: Mapping[str, str]) -> dict[str, Any]:
    """The box's spec fields of one role as its service carries them: the image by its pushed digest (every node
    pulls the same bytes), ports without a host IP and no ipc (Swarm has neither; see above)."""
    ports = [{k: v for k, v in p.items() if k != "host_ip"} for p in container.ports]
    shm = canonical_size(container.shm_size) if container.shm_size is not None else None
    fields = spec_fields(dataclasses.replace(container, ports=ports, ipc=None, shm_size=shm), container.image,
                         secret_digests)
    del fields["ipc"]
    return fields


def canonical_size(size: str) -> str:
    """One spelling per size (`1G`, `1g` and `1024m` are one tmpfs): the largest unit that holds it exactly,
    lower case, so rewriting the recipe's size without changing it is no change."""
    count = _bytes(size)
    for unit, factor in (("g", 1024**3), ("m", 1024**2), ("k", 1024)):
        if count and count % factor == 0:
            return f"{count // factor}{unit}"
    return str(count)


def not_carried(container: ContainerSpec) -> list[str]:
    """What the recipe asks of `container` that Swarm cannot carry."""
    addresses = sorted({str(p["host_ip"]) for p in container.ports if p.get("host_ip") not in (None, EVERY_ADDRESS)})
    return [f"{container.role}: host_ip {a} is not carried: {HOST_IP_NOT_CARRIED}" for a in addresses]


def choose_nodes(lane: Lane, inventory: Sequence[NodeInfo], requested: Sequence[str] = (),
                 canary: str | None = None) -> list[NodeInfo]:
    """The nodes a fleet `up` changes, canary first, then the rest by hostname.

    Refuses, before anything changes, a node that is unknown, does not carry the lane's labels,
    or cannot take a task now (down, paused, drained).
    """
    placement = lane.spec.placement
    if placement.backend != "swarm":
        raise BadInput(f"lane {lane.name} is not placed on Swarm (placement.backend is 'local'); "
                       f"add `placement: {{backend: swarm}}` to its recipe, or run `lanectl up {lane.name}` "
                       "without --fleet")
    by_host: dict[str, list[NodeInfo]] = {}
    for node in inventory:
        by_host.setdefault(node.hostname, []).append(node)
    twins = sorted(host for host, nodes in by_host.items() if len(nodes) > 1)
    if twins:
        raise OperationFailed(f"several Swarm nodes share the hostname {', '.join(twins)}; lanectl places lanes "
                              "by hostname, so remove the stale node (`docker node rm`) or rename the host")
    eligible = [n for n in inventory if all(n.labels.get(k) == v for k, v in placement.node_labels.items())]
    names = list(requested) or list(placement.nodes)
    if names:
        chosen = []
        for name in dict.fromkeys(names):
            if name not in by_host:
                known = ", ".join(sorted(by_host)) or "none"
                raise BadInput(f"no Swarm node {name!r}; the nodes are: {known}")
            node = by_host[name][0]
            if node not in eligible:
                wanted = ", ".join(f"{k}={v}" for k, v in placement.node_labels.items())
                raise BadInput(f"node {name} lacks the labels lane {lane.name} requires ({wanted}); add them with "
                               f"`docker node update --label-add KEY=VALUE {name}` or choose other nodes")
            chosen.append(node)
    else:
        chosen = sorted((n for n in eligible if n.schedulable), key=lambda n: n.hostname)
        if not chosen:
            raise OperationFailed(f"no ready, active Swarm node matches lane {lane.name}'s placement")
    unavailable = [f"{n.hostname} ({n.state}, {n.availability})" for n in chosen if not n.schedulable]
    if unavailable:
        raise OperationFailed(f"cannot place {lane.name} on {', '.join(unavailable)}: a node must be ready and "
                              "active; bring it back or leave it out with --nodes")
    first = canary or placement.canary
    if first is not None:
        if first not in {n.hostname for n in chosen}:
            raise BadInput(f"canary {first!r} is not one of the chosen nodes "
                           f"({', '.join(n.hostname for n in chosen)})")
        chosen.sort(key=lambda n: n.hostname != first)  # stable: the rest keep their order
    return chosen


def plan_service(lane: Lane, container: ContainerSpec, node: str, *, with_gpus: bool,
                 inputs: str, fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ServiceSpec for one role of `lane` on `node`.

    Secret variables are listed by name under `lanectl_secret_env`; the adapter fills their values
    from lanectl's environment when it sends the spec, and strips the key.
    """
    health = lane.spec.health
    placement = lane.spec.placement
    poll_ns = swarm_check_interval_ns(lane)
    task: dict[str, Any] = {
        "ContainerSpec": _container_spec(lane, container, node, health_port=_health_port(container)),
        "Placement": {"Constraints": [f"node.hostname=={node}",
                                      *(f"node.labels.{k}=={v}" for k, v in sorted(placement.node_labels.items()))],
                      "MaxReplicas": 1},
        # Swarm restarts a crashed task (the watchdog's first remedy) within the recipe's budget. vLLM's API
        # server exits 0 when its engine core dies (gpu/record), and on-failure never restarts an exit 0, so the
        # image runs the engine under lanectl's exit guard, which turns that unasked 0 into 70. "any" would
        # restart it too, but on the two-node swarm it broke Swarm's own rollback of a lane that fails its
        # health check (a stopped task came back and held the host port; the rollback paused).
        "RestartPolicy": {"Condition": "on-failure",
                          "Delay": int(lane.spec.watchdog.restart.backoff_initial_seconds * SECOND_NS),
                          "MaxAttempts": lane.spec.watchdog.restart.max_restarts,
                          "Window": int(lane.spec.watchdog.restart.window_minutes * 60 * SECOND_NS)},
        "Resources": {},
    }
    if with_gpus and container.gpus is not None:
        count = container.gpus.get("count") or len(container.gpus.get("device_ids") or [])
        # Swarm hands out GPUs as counted generic resources: it picks the devices, not the recipe.
        task["Resources"]["Reservations"] = {
            "GenericResources": [{"DiscreteResourceSpec": {"Kind": placement.gpu_resource, "Value": int(count)}}]
        }
    # A rollout waits until the task is healthy; watching this long after catches a lane that falls over
    # right after its first healthy answer (three missed polls).
    monitor_ns = HEALTH_RETRIES * poll_ns + int(health.request_timeout_seconds * SECOND_NS)
    update = {"Parallelism": 1, "Delay": 0, "FailureAction": "rollback", "Monitor": monitor_ns,
              "MaxFailureRatio": 0, "Order": "stop-first"}  # one GPU cannot hold two lanes
    return {
        "Name": service_name(lane, container.role, node),
        "Labels": service_labels(lane, container.role, node, inputs, fields),
        "TaskTemplate": task,
        "Mode": {"Replicated": {"Replicas": 1}},
        "UpdateConfig": update,
        "RollbackConfig": {**update, "FailureAction": "pause"},
        "EndpointSpec": {"Mode": "vip", "Ports": [
            # The routing mesh needs IPVS and would hide which node answered; host mode binds on the node.
            {"Protocol": p["protocol"], "TargetPort": p["container"], "PublishedPort": p["host"],
             "PublishMode": "host"} for p in container.ports]},
    }


def _health_port(container: ContainerSpec) -> int | None:
    return int(container.ports[0]["container"]) if container.ports else None


def _container_spec(lane: Lane, container: ContainerSpec, node: str, *, health_port: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "Image": container.image,
        "Labels": {LABEL_PREFIX + "fleet-lane": lane.name, LABEL_PREFIX + "fleet-role": container.role,
                   LABEL_PREFIX + "fleet-node": node},
        "Env": [f"{k}={v}" for k, v in container.env.items()],
        "Init": container.init,
        "StopGracePeriod": container.stop_timeout_seconds * SECOND_NS,
        "Mounts": [_mount(v) for v in container.volumes],
        "lanectl_secret_env": list(container.secret_env),
    }
    if container.entrypoint is not None:
        spec["Command"] = list(container.entrypoint)
    if container.command is not None:
        spec["Args"] = list(container.command)
    if container.user is not None:
        spec["User"] = container.user
    if container.shm_size is not None:
        spec["Mounts"].append({"Type": "tmpfs", "Target": "/dev/shm",
                               "TmpfsOptions": {"SizeBytes": _bytes(container.shm_size)}})
    if health_port is not None:
        spec["Healthcheck"] = _healthcheck(lane, health_port)
    return spec


def _healthcheck(lane: Lane, port: int) -> dict[str, Any]:
    """The recipe's /health check, run by Docker inside the task, so Swarm itself sees an unhealthy lane.

    Python's urllib rather than curl: vLLM images and the stub image both have python3, not all have curl.
    Failures inside the startup budget do not count: a model loads for minutes.
    """
    health = lane.spec.health
    url = f"http://127.0.0.1:{port}{health.health_path}"
    probe = f"import urllib.request; urllib.request.urlopen({url!r}, timeout={health.request_timeout_seconds})"
    return {"Test": ["CMD", "python3", "-c", probe],
            "Interval": swarm_check_interval_ns(lane),
            "Timeout": int(health.request_timeout_seconds * SECOND_NS),
            "Retries": HEALTH_RETRIES,
            "StartPeriod": int(health.startup_budget_minutes * 60 * SECOND_NS)}


def swarm_check_interval_ns(lane: Lane) -> int:
    """How often Swarm runs the task's health check: the recipe's poll interval, but never below
    SWARM_CHECK_MIN_INTERVAL_SECONDS."""
    return int(max(lane.spec.health.poll_interval_seconds, SWARM_CHECK_MIN_INTERVAL_SECONDS) * SECOND_NS)


def _mount(volume: dict[str, Any]) -> dict[str, Any]:
    if "volume" in volume:
        return {"Type": "volume", "Source": volume["volume"], "Target": volume["target"],
                "ReadOnly": bool(volume.get("read_only"))}
    return {"Type": "bind", "Source": volume["source"], "Target": volume["target"],
            "ReadOnly": bool(volume.get("read_only"))}


def _bytes(size: str) -> int:
    units = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    if size[-1].lower() in units:
        return int(size[:-1]) * units[size[-1].lower()]
    return int(size)


def service_drift(labels: Mapping[str, str], lane: Lane, fields: Mapping[str, Any]) -> list[str]:
    """How a service (by its labels) differs from what `lane`'s recipe asks now, field by field as on the box."""
    changes = []
    was = labels.get(LABEL_PREFIX + "lane", "")
    if was != lane.name:
        changes.append(f"lane {was or 'none'} → {lane.name}")
    if labels.get(SPEC_LABEL) == spec_digest(fields):
        return changes
    raw = labels.get(SPEC_FIELDS_LABEL)
    recorded = json.loads(raw) if raw else None
    return changes + [c for c in spec_changes(recorded, fields) if c not in changes]


# -- the last gated state of each service ---------------------------------------------------------------

def gated_label(service: str) -> str:
    """The node label that holds the mark of `service`'s spec as the node's last passed gate saw it."""
    return GATED_LABEL_PREFIX + service


def spec_mark(spec: Mapping[str, Any]) -> str:
    """A short digest of a service's whole spec as Swarm holds it: any update, by lanectl, by Swarm's own
    rollback or by hand, changes it; Swarm's rollback to a spec restores that spec's mark."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ungated_services(node: NodeInfo, services: Sequence[ServiceState]) -> list[str]:
    """Those of `services` whose spec is not the one `node`'s last passed gate saw: changed since (an update
    lanectl began and Swarm finished, a rollback, an edit by hand), or never gated at all."""
    return [s.name for s in services if node.labels.get(gated_label(s.name)) != spec_mark(s.spec)]


# -- what Swarm reports --------------------------------------------------------------------------------

UPDATE_DONE = "completed"
ROLLED_BACK = "rollback_completed"
UPDATE_FAILED_STATES = ("paused", "rollback_paused", ROLLED_BACK)
# Swarm is still replacing the service's task (an update or rollback a killed lanectl began, or one by hand).
UPDATE_IN_PROGRESS = ("updating", "rollback_started")


def current_task(tasks: Sequence[TaskInfo]) -> TaskInfo | None:
    """The task Swarm wants running (the newest such); else the newest task at all."""
    wanted = [t for t in tasks if t.desired_state == "running"]
    pool = wanted or list(tasks)
    return max(pool, key=lambda t: t.created) if pool else None


def task_problem(tasks: Sequence[TaskInfo]) -> str | None:
    """Why the newest task is not serving, in Swarm's words, or None while it is running or getting there."""
    task = current_task(tasks)
    if task is None:
        return "no task"
    if task.state in ("failed", "rejected", "orphaned") or (task.state == "shutdown" and task.desired_state
                                                             == "running"):
        code = f" ({exit_code_text(task.exit_code)})" if task.exit_code not in (None, 0) else ""
        return f"task {task.state}{code}: {task.error or task.message}"
    if task.state == "complete":
        # A serving engine never completes: an exit 0 is vLLM's after its engine core died (an image
        # built before the exit guard; with it, that exit is 70 and the task failed).
        return f"task complete ({exit_code_text(0)}): {task.error or task.message}"
    return None


def last_task_error(tasks: Sequence[TaskInfo]) -> str | None:
    """The newest error any task reported: after Swarm's rollback, why the new task did not make it.

    A task still waiting to be placed ("no suitable node (host-mode port already in use …)") is the rollback's
    own task queuing behind the failed one for its port, on a busy node: it says nothing about why the update
    failed, so a task that actually ran or was rejected is preferred."""
    failed = [t for t in tasks if t.error]
    settled = [t for t in failed if t.state not in SCHEDULING_STATES]
    pick = settled or failed
    return max(pick, key=lambda t: t.created).error if pick else None


SCHEDULING_STATES = frozenset({"new", "pending", "assigned"})


def why_swarm_rolled_back(tasks: Sequence[TaskInfo]) -> str:
    """Why the new task did not make it, read from Swarm's final record of the service's tasks once its own
    rollback completed (never from states lanectl's polls happened to catch: a busy machine misses them).

    A task that Docker stopped for failing its health check carries no error when the engine then exits 0:
    Docker's Swarm executor reports the health failure only with a non-zero exit (moby's
    daemon/cluster/executor/container/controller.go, Start and Wait), and records an exit 0 as state
    `complete`, message `finished` (seen on this machine's two-node swarm, the t-unhealthy lane). An
    engine in a lanectl image exits 0 only when asked to stop (the exit guard turns any other 0 into 70),
    so the update's task ending that way with no error is a failed health check."""
    error = last_task_error(tasks)
    if error:
        return error
    stopped = [t for t in tasks if t.desired_state != "running"]
    if not stopped:
        return "Swarm's record names no task that stopped"
    task = max(stopped, key=lambda t: t.created)  # the update's task: the rollback's own task is wanted running
    if task.state in ("complete", "shutdown") and task.exit_code in (None, 0):
        return (f"the new task failed its health check and Swarm stopped it (it ended {task.state}, exit 0, "
                "with no error)")
    code = f", {exit_code_text(task.exit_code)}" if task.exit_code not in (None, 0) else ""
    return f"the new task ended {task.state}{code}: {task.message or 'Swarm gave no message'}"
