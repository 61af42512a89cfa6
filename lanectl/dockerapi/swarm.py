"""Docker Swarm, through the manager's engine, behind the few operations a fleet rollout needs.

Service specs go over the wire as the Engine API's JSON (`fleet.services.plan_service` builds them), so
there is one description of a lane's service, not a second one in SDK objects.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from lanectl.dockerapi.containers import DockerEngine, docker_epoch
from lanectl.dockerapi.engine_api import EngineAPI, EngineError, NotFound, filters
from lanectl.dockerapi.labels import FLEET_LABEL, GATED_LABEL_PREFIX, LABEL_PREFIX, LEASE_LABEL
from lanectl.errors import OperationFailed
from lanectl.records import frozen


@frozen
class NodeInfo:
    """A Swarm node as the manager reports it."""

    id: str
    hostname: str
    state: str  # ready | down | unknown | disconnected
    availability: str  # active | pause | drain
    role: str  # manager | worker
    addr: str
    labels: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)  # generic resource kind -> how many
    engine_version: str = ""

    @property
    def schedulable(self) -> bool:
        return self.state == "ready" and self.availability == "active"


@frozen
class TaskInfo:
    id: str
    node_id: str
    state: str  # new … running, complete, failed, shutdown, rejected, orphaned, remove
    desired_state: str
    message: str
    error: str
    exit_code: int | None
    created: str
    container_id: str | None = None


@frozen
class ServiceState:
    id: str
    name: str
    version: int
    spec: dict[str, Any]
    previous_spec: dict[str, Any] | None
    update_state: str | None  # updating | paused | completed | rollback_started | rollback_paused | rollback_completed
    update_started: float | None  # UNIX time
    update_message: str

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.spec.get("Labels") or {})

    @property
    def lane(self) -> str:
        return self.labels.get(LABEL_PREFIX + "lane", "")

    @property
    def role(self) -> str:
        return self.labels.get(LABEL_PREFIX + "role", "")

    @property
    def node(self) -> str:
        return self.labels.get(LABEL_PREFIX + "node", "")

    @property
    def recipe(self) -> str:
        return self.labels.get(LABEL_PREFIX + "recipe", "")

    @property
    def previous_lane(self) -> str | None:
        if not self.previous_spec:
            return None
        return (self.previous_spec.get("Labels") or {}).get(LABEL_PREFIX + "lane")


class SwarmEngine(DockerEngine):
    """The manager's view: nodes, lanectl's services and their tasks."""

    def __init__(self, api: EngineAPI | None = None):
        super().__init__(api)
        info = self.info()
        swarm = info.get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active":
            raise OperationFailed("this Docker engine is not part of a Swarm; create one with `docker swarm init` "
                                  "(and `docker swarm join` on the other boxes), or run lanes locally without "
                                  "--fleet")
        if not swarm.get("ControlAvailable"):
            raise OperationFailed("this Docker engine is a Swarm worker; run lanectl --fleet on a manager node "
                                  "(`docker node ls` there lists them)")
        self.node_id = str(swarm.get("NodeID", ""))

    # -- nodes -------------------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        return [_node(raw) for raw in self.api.get("/nodes")]

    def take_lease(self, node: NodeInfo, lease: str, *, left_behind: Callable[[str], str | None]) -> str | None:
        """Mark `node` as being changed: the label `lease`, so every manager and operator sees it.

        Swarm's node version makes it atomic: two lanectl runs racing for one node cannot both succeed. A lease
        held already is taken over when `left_behind` says why its run is over; that reason, with the holder,
        is returned. Otherwise the node is refused."""
        raw = self._inspect_node(node.id)
        labels = dict(raw["Spec"].get("Labels") or {})
        held = labels.get(LEASE_LABEL)
        why = left_behind(held) if held else None
        if held and why is None:
            raise OperationFailed(f"node {node.hostname} is being changed by {held.split(' @', 1)[0]}; wait for "
                                  f"it, or clear a dead run's lease with `docker node update --label-rm "
                                  f"{LEASE_LABEL} {node.hostname}`")
        labels[LEASE_LABEL] = lease
        self._update_node_labels(raw, labels)
        return f"{held}: {why}" if held else None

    def release_lease(self, node: NodeInfo) -> None:
        try:
            raw = self._inspect_node(node.id)
            labels = dict(raw["Spec"].get("Labels") or {})
            if labels.pop(LEASE_LABEL, None) is not None:
                self._update_node_labels(raw, labels)
        except (EngineError, OperationFailed):
            pass  # a node that went away keeps a stale lease; the next run takes it over

    def record_gated(self, node: NodeInfo, marks: Mapping[str, str | None]) -> None:
        """Note on `node`, per service, the mark of the spec its gate just passed (None: forget the service)."""
        raw = self._inspect_node(node.id)
        labels = dict(raw["Spec"].get("Labels") or {})
        for service, mark in marks.items():
            if mark is None:
                labels.pop(GATED_LABEL_PREFIX + service, None)
            else:
                labels[GATED_LABEL_PREFIX + service] = mark
        self._update_node_labels(raw, labels)

    def _inspect_node(self, node_id: str) -> dict[str, Any]:
        return dict(self.api.get(self.api.url("/nodes/{}", node_id)))

    def _update_node_labels(self, raw: dict[str, Any], labels: dict[str, str]) -> None:
        spec = dict(raw["Spec"])
        spec["Labels"] = labels
        try:
            self.api.post(self.api.url("/nodes/{}/update", raw["ID"]), params={"version": raw["Version"]["Index"]},
                          body=spec)
        except EngineError as exc:
            raise OperationFailed(f"could not update node {raw['Description'].get('Hostname')}: "
                                  f"{exc.explanation} (another manager changed it; retry)") from None

    # -- services ----------------------------------------------------------------------------------

    def lane_services(self) -> list[ServiceState]:
        return [_service(raw) for raw in self.api.get("/services", params={"filters": filters(label=FLEET_LABEL)})]

    def service_names(self) -> list[str]:
        """Every service in the Swarm, lanectl's or not: a lane-looking one lanectl did not create is refused."""
        return [str(raw["Spec"]["Name"]) for raw in self.api.get("/services")]

    def service(self, service_id: str) -> ServiceState | None:
        try:
            return _service(self.api.get(self.api.url("/services/{}", service_id)))
        except NotFound:
            return None

    def create_service(self, spec: dict[str, Any], environ: Mapping[str, str]) -> str:
        body = _with_secrets(spec, environ)
        try:
            created = self.api.post("/services/create", body=body)
        except EngineError as exc:
            raise OperationFailed(f"Swarm refused service {spec['Name']}: {exc.explanation}") from None
        return str(created["ID"])

    def update_service(self, current: ServiceState, spec: dict[str, Any], environ: Mapping[str, str]) -> None:
        """Replace the spec; Swarm runs the update (stop-first) and rolls it back by itself if it fails."""
        body = _with_secrets(spec, environ)
        # Bumping ForceUpdate makes Swarm replace the task even when only labels changed.
        task = body["TaskTemplate"]
        task["ForceUpdate"] = int((current.spec.get("TaskTemplate") or {}).get("ForceUpdate", 0)) + 1
        self._post_update(current, body, {})

    def rollback_service(self, current: ServiceState) -> None:
        """Swarm's own rollback to the service's previous spec, as `docker service rollback` asks for it."""
        self._post_update(current, current.spec, {"rollback": "previous"})

    def _post_update(self, current: ServiceState, body: dict[str, Any], extra: dict[str, str]) -> None:
        params = {"version": current.version, **extra}
        try:
            self.api.post(self.api.url("/services/{}/update", current.id), params=params, body=body)
        except EngineError as exc:
            raise OperationFailed(f"Swarm refused to update {current.name}: {exc.explanation}") from None

    def remove_service(self, service_id: str) -> None:
        try:
            self.api.delete(self.api.url("/services/{}", service_id))
        except NotFound:
            pass

    def tasks(self, service_id: str) -> list[TaskInfo]:
        return [_task(raw) for raw in self.api.get("/tasks", params={"filters": filters(service=service_id)})]

    def service_logs(self, service_id: str, *, since: float) -> str:
        """Every task's lines since `since`: what a failed update printed, for its diagnostics."""
        return self._logs("/services/{}/logs", service_id, since)

    def task_logs(self, task_id: str) -> str:
        """One task's whole log: a gate judges the current run only, not the failed one before it."""
        return self._logs("/tasks/{}/logs", task_id, 0)

    def _logs(self, path: str, ident: str, since: float) -> str:
        params = {"stdout": True, "stderr": True, "since": int(since), "timestamps": False, "follow": False}
        try:
            # Both endpoints answer the same multiplexed stream.
            return self.api.logs(self.api.url(path, ident), params=params).decode(errors="replace")
        except EngineError:
            return ""  # the node holding the task is unreachable: no lines is the honest answer


def _with_secrets(spec: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    body = copy.deepcopy(spec)
    container = body["TaskTemplate"]["ContainerSpec"]
    for name in container.pop("lanectl_secret_env", []):
        if name not in environ:
            raise OperationFailed(f"{spec['Name']}: secret {name} is not set in lanectl's environment")
        container["Env"].append(f"{name}={environ[name]}")
    return body


def _node(raw: dict[str, Any]) -> NodeInfo:
    description = raw.get("Description") or {}
    resources = (description.get("Resources") or {}).get("GenericResources") or []
    gpus: dict[str, int] = {}
    for resource in resources:
        if "DiscreteResourceSpec" in resource:
            kind = resource["DiscreteResourceSpec"]["Kind"]
            gpus[kind] = gpus.get(kind, 0) + int(resource["DiscreteResourceSpec"]["Value"])
        elif "NamedResourceSpec" in resource:
            kind = resource["NamedResourceSpec"]["Kind"]
            gpus[kind] = gpus.get(kind, 0) + 1
    status = raw.get("Status") or {}
    addr = str(status.get("Addr") or "")
    manager = raw.get("ManagerStatus") or {}
    if addr in ("", "0.0.0.0") and manager.get("Addr"):
        addr = str(manager["Addr"]).rsplit(":", 1)[0]
    spec = raw.get("Spec") or {}
    return NodeInfo(
        id=raw["ID"], hostname=str(description.get("Hostname", "")), state=str(status.get("State", "unknown")),
        availability=str(spec.get("Availability", "active")), role=str(spec.get("Role", "worker")), addr=addr,
        labels=dict(spec.get("Labels") or {}), gpus=gpus,
        engine_version=str((description.get("Engine") or {}).get("EngineVersion", "")),
    )


def _service(raw: dict[str, Any]) -> ServiceState:
    update = raw.get("UpdateStatus") or {}
    return ServiceState(
        id=raw["ID"], name=raw["Spec"]["Name"], version=int(raw["Version"]["Index"]), spec=raw["Spec"],
        previous_spec=raw.get("PreviousSpec"), update_state=update.get("State"),
        update_started=docker_epoch(update.get("StartedAt")), update_message=str(update.get("Message", "")),
    )


def _task(raw: dict[str, Any]) -> TaskInfo:
    status = raw.get("Status") or {}
    container = status.get("ContainerStatus") or {}
    return TaskInfo(
        id=raw["ID"], node_id=str(raw.get("NodeID", "")), state=str(status.get("State", "")),
        desired_state=str(raw.get("DesiredState", "")), message=str(status.get("Message", "")),
        error=str(status.get("Err", "")), exit_code=container.get("ExitCode"),
        created=str(raw.get("CreatedAt", "")), container_id=container.get("ContainerID"),
    )
