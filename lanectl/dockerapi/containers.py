"""The Docker engine, behind the few operations lanectl needs.

Everything that talks to Docker goes through `DockerEngine`, so the domain code reads as a
sequence of intentions and the tests of the pure core never need an engine.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from lanectl.dockerapi.engine_api import (
    TIMEOUT_SECONDS,
    EngineAPI,
    EngineError,
    NotFound,
    Stream,
    engine_api,
    filters,
    registry_auth,
    registry_config,
)
from lanectl.dockerapi.labels import STATE_DIR_LABEL
from lanectl.dockerapi.sizes import size_in_bytes
from lanectl.errors import OperationFailed
from lanectl.records import frozen


@frozen
class ContainerSpec:
    """One container as lanectl creates it: what the domain planned, in the engine's terms."""
    name: str
    role: str
    image: str
    command: list[str] | None
    entrypoint: list[str] | None
    env: dict[str, str]
    secret_env: list[str]
    ports: list[dict[str, Any]]
    volumes: list[dict[str, Any]]
    gpus: dict[str, Any] | None
    shm_size: str | None
    ipc: str | None
    init: bool
    user: str | None
    stop_timeout_seconds: int
    labels: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def owned_by(self, state_folder: Path) -> ContainerSpec:
        """This spec labelled with the state folder whose journal and state files count on the container
        (STATE_DIR_LABEL, its real path): every container lanectl creates on a box carries it."""
        return replace(self, labels={**self.labels, STATE_DIR_LABEL: os.path.realpath(state_folder)})


STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")


@dataclass
class BuildLog:
    """What the classic builder said: steps run, steps answered from cache, and the output tail."""

    steps_total: int = 0
    steps_planned: int | None = None
    steps_cached: int = 0
    current_step: str = ""
    instructions: dict[int, str] = field(default_factory=dict)
    cached: set[int] = field(default_factory=set)
    lines: list[str] = field(default_factory=list)
    image_id: str | None = None
    error: str | None = None

    @property
    def steps_run(self) -> int:
        return len(self.ran)

    @property
    def ran(self) -> list[str]:
        """The instructions executed rather than answered from the layer cache.

        FROM only selects a base and never reports "Using cache", so it is not counted.
        """
        return [text for number, text in sorted(self.instructions.items())
                if number not in self.cached and not text.startswith("FROM ")]

    def tail(self, count: int = 30) -> list[str]:
        return self.lines[-count:]


class DockerEngine:
    def __init__(self, api: EngineAPI | None = None):
        # The process's one client (its first use asks the engine's API version, and fails here, with
        # what to do, when the engine is not there), unless the caller names an engine.
        self.api = api or engine_api()

    def info(self) -> dict[str, Any]:
        """`docker info`: the engine's version, runtimes, Swarm membership."""
        return dict(self.api.get("/info"))

    def _image(self, ref: str) -> dict[str, Any] | None:
        try:
            return dict(self.api.get(self.api.url("/images/{}/json", ref)))
        except NotFound:
            return None

    def image_labels(self, ref: str) -> dict[str, str] | None:
        """The labels of a local image, or None when the image is not here."""
        image = self._image(ref)
        return None if image is None else dict((image.get("Config") or {}).get("Labels") or {})

    def image_id(self, ref: str) -> str | None:
        image = self._image(ref)
        return None if image is None else str(image["Id"])

    def image_env(self, ref: str) -> dict[str, str] | None:
        """The environment a local image sets (its `ENV` lines and its base's), or None when it is not here."""
        image = self._image(ref)
        if image is None:
            return None
        pairs = (str(item).partition("=") for item in (image.get("Config") or {}).get("Env") or ())
        return {name: value for name, _, value in pairs}

    def build(self, context_tar: bytes, tag: str, *, no_cache: bool,
              on_progress: Callable[[BuildLog], None] = lambda log: None) -> BuildLog:
        """Build from a tar context; never pulls (hosts here reach no registry, and bases are pinned). The image's
        labels are in its Dockerfile (lanectl.image.render.label_line), one build step for them all."""
        log = BuildLog()
        headers = {"Content-Type": "application/x-tar"}
        logins = registry_config()
        if logins:
            headers["X-Registry-Config"] = logins
        params = {"t": tag, "rm": True, "forcerm": True, "nocache": no_cache, "pull": False}
        try:
            stream = self.api.stream("POST", "/build", params=params, body=context_tar, headers=headers)
        except EngineError as exc:
            raise OperationFailed(f"build of {tag}: the engine refused it: {exc.explanation}") from None
        for chunk in stream.json_objects():
            if "stream" in chunk:
                for line in str(chunk["stream"]).splitlines():
                    if not line.strip():
                        continue
                    log.lines.append(line)
                    step = STEP.match(line)
                    if step:
                        log.steps_total = int(step.group(1))
                        log.steps_planned = int(step.group(2))
                        log.current_step = step.group(3)
                        log.instructions[log.steps_total] = log.current_step
                    elif line.strip() == "---> Using cache":
                        log.steps_cached += 1
                        log.cached.add(log.steps_total)
                on_progress(log)
            elif "error" in chunk:
                log.error = str(chunk["error"]).strip()
                log.lines.append(log.error)
            elif "aux" in chunk and "ID" in chunk["aux"]:
                log.image_id = chunk["aux"]["ID"]
        if log.error is None and log.image_id is None:
            log.image_id = self.image_id(tag)
        return log

    def tag(self, source: str, target: str) -> None:
        repository, _, tag = target.rpartition(":")
        self.api.post(self.api.url("/images/{}/tag", source), params={"repo": repository, "tag": tag})

    def repo_digests(self, ref: str) -> list[str]:
        """`repository@sha256:…` of each registry a local image was pushed to (or pulled from); [] if absent."""
        image = self._image(ref)
        return [str(d) for d in (image or {}).get("RepoDigests") or []]

    def registry_digest(self, ref: str) -> str | None:
        """The manifest digest the registry holds for `repository:tag`, or None when it has no such tag.

        Asked through the engine, so the registry is reached exactly as a push reaches it (TLS, certs.d,
        insecure registries, `docker login` credentials)."""
        login = registry_auth(ref)
        try:
            answer = self.api.get(self.api.url("/distribution/{}/json", ref),
                                  headers={"X-Registry-Auth": login})
        except NotFound:
            return None  # "manifest unknown" / "repository name not known to registry"
        except EngineError as exc:
            raise OperationFailed(explain_registry_error(ref, exc.explanation)) from None
        return str(answer["Descriptor"]["digest"])

    def push(self, ref: str, on_progress: Callable[[PushProgress], None] = lambda progress: None) -> str:
        """Push `repository:tag`; returns the manifest digest the registry answered with.

        Raises OperationFailed with the registry's cause; the engine has by then retried what it retries."""
        repository, _, tag = ref.rpartition(":")
        digest: str | None = None
        login = registry_auth(ref)
        try:
            stream = self.api.stream("POST", self.api.url("/images/{}/push", repository), params={"tag": tag},
                                     headers={"X-Registry-Auth": login})
            for chunk in stream.json_objects():
                if "error" in chunk:
                    raise OperationFailed(explain_registry_error(ref, str(chunk["error"])))
                aux = chunk.get("aux") or {}
                if aux.get("Digest") and aux.get("Tag") == tag:
                    digest = str(aux["Digest"])
                if "status" in chunk:
                    detail = chunk.get("progressDetail") or {}
                    on_progress(PushProgress(str(chunk.get("id", "")), str(chunk["status"]),
                                             detail.get("current"), detail.get("total")))
        except EngineError as exc:
            raise OperationFailed(explain_registry_error(ref, exc.explanation)) from None
        if digest is None:
            raise OperationFailed(f"push of {ref}: the engine reported no digest, so the registry's copy cannot be "
                                  "pinned; nothing was recorded")
        return digest


@frozen
class PushProgress:
    """One status line of a push: a layer (`layer` is its short id) or the push as a whole (`layer` empty)."""

    layer: str
    status: str  # Preparing | Waiting | Pushing | Pushed | Layer already exists | Retrying in N seconds | …
    current: int | None = None
    total: int | None = None


def explain_registry_error(ref: str, error: str) -> str:
    """The engine's words about a registry failure, with what they usually mean: its own words rarely say."""
    registry = ref.split("/", 1)[0]
    lowered = error.lower()
    if any(s in lowered for s in ("connection refused", "no such host", "i/o timeout", "no route to host",
                                  "network is unreachable", "connection reset")):
        hint = f"cannot reach the registry {registry}; is it running, and is this the right address?"
    elif "http response to https client" in lowered:
        hint = (f"the registry {registry} speaks plain HTTP; Docker trusts that only for loopback addresses or one "
                "listed under insecure-registries in the engine's daemon.json")
    elif "405" in lowered or "method not allowed" in lowered or "unsupported" in lowered:
        hint = f"the registry {registry} refuses writes (read-only, or in maintenance)"
    elif any(s in lowered for s in ("denied", "unauthorized", "authentication required")):
        hint = f"the registry {registry} refused the credentials; log in with `docker login {registry}`"
    elif "500 internal server error" in lowered or "unknown error" in lowered:
        hint = (f"the registry {registry} failed to store the upload (a full or unwritable storage answers this "
                "way; its own log says which)")
    else:
        hint = f"the registry {registry} failed"
    return f"{ref}: {hint} (Docker: {error.strip()})"


SWARM_TASK_LABEL = "com.docker.swarm.task.id"
START_RETRY_SECONDS = (0.5, 1.0, 2.0)  # an engine error (5xx) at start is asked again after each of these
GPU_DRIVER_MISSING = re.compile(r"could not select device driver .* with capabilities: \[\[gpu\]\]")


@frozen
class ContainerState:
    """A lanectl container as the engine reports it; labels are the truth of what exists."""

    name: str
    id: str
    lane: str
    role: str
    recipe: str
    inputs: str
    image: str
    status: str  # created | running | restarting | paused | exited | dead
    exit_code: int | None
    started_at: str | None
    finished_at: str | None
    restart_count: int
    device_requests: tuple[dict[str, Any], ...]
    # Config.StopTimeout: what a stop without `t` gives it, set when it was created (None: the engine's 10 s).
    stop_timeout: int | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def started_epoch(self) -> float | None:
        """When the current (or last) run started, as a UNIX time; None if it never started."""
        return docker_epoch(self.started_at)


def docker_epoch(stamp: str | None) -> float | None:
    """A Docker timestamp as a UNIX time; None for Docker's zero time ("0001-01-01…") or none at all."""
    if not stamp or stamp.startswith("0001-"):
        return None
    # Docker reports nanoseconds ("2026-11-30T08:48:03.123456789Z"); datetime takes microseconds.
    head, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(fraction + '000000')[:6]}+00:00").timestamp()


# The states in which a container holds its GPUs and ports: running, on its way (restarting), frozen (paused).
LIVE_STATES = ("running", "restarting", "paused")


class NoGpuRuntime(OperationFailed):
    pass


@frozen
class ListedContainer:
    """A container as the engine's listing shows it: enough to plan a switch, with no inspect per container."""

    name: str
    id: str
    image: str  # the reference it was created from
    image_id: str
    state: str  # created | running | paused | restarting | exited | removing | dead
    status: str  # the engine's words: "Up 3 minutes", "Exited (137) 2 seconds ago"
    labels: dict[str, str]
    host_ports: tuple[tuple[str, int], ...]  # (protocol, host port) it publishes while it runs

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def live(self) -> bool:
        """Running, or on its way (restarting) or frozen (paused): holding its GPUs and ports either way."""
        return self.state in LIVE_STATES

    @property
    def exit_code(self) -> int | None:
        """The exit code the listing's status text carries ("Exited (137) …"); None while it runs."""
        found = EXITED.match(self.status)
        return int(found.group(1)) if found and not self.live else None


EXITED = re.compile(r"^Exited \((-?\d+)\)")


class ContainerEngine(DockerEngine):
    """Container operations on lane containers, all addressed by name."""

    def list_containers(self) -> list[ListedContainer]:
        """Every container on the engine, running or not, in one request and without inspecting any.

        Unfiltered on purpose: lane containers are picked out by their labels, and the others are read only
        for the name or host port of a lane they may hold (a hand-run container has no lanectl label)."""
        listed = []
        for item in self.api.get("/containers/json", params={"all": True}):
            labels = dict(item.get("Labels") or {})
            if SWARM_TASK_LABEL in labels:
                continue  # Swarm runs it, not the local lane code (a task inherits its image's lane labels)
            ports = sorted({(str(port.get("Type") or "tcp"), int(port["PublicPort"]))
                            for port in item.get("Ports") or () if port.get("PublicPort")})
            listed.append(ListedContainer(
                name=str((item.get("Names") or ["/"])[0]).lstrip("/"), id=str(item["Id"]),
                image=str(item.get("Image") or ""), image_id=str(item.get("ImageID") or ""),
                state=str(item.get("State") or ""), status=str(item.get("Status") or ""), labels=labels,
                host_ports=tuple(ports)))
        return listed

    def lane_images(self) -> dict[str, str]:
        """Every local image built for a lane, by tag: tag -> image ID (one request for all of them)."""
        found: dict[str, str] = {}
        for image in self.api.get("/images/json", params={"filters": filters(label="io.lanectl.lane")}):
            for tag in image.get("RepoTags") or ():
                found[str(tag)] = str(image["Id"])
        return found

    def lane_containers(self, recipe: str | None = None) -> list[ContainerState]:
        label = f"io.lanectl.recipe={recipe}" if recipe else "io.lanectl.lane"
        raw = self.api.get("/containers/json", params={"all": True, "filters": filters(label=label)})
        # One inspect per container: `containers()` lacks exit code, start time and restart count.
        # A container removed between the list and its inspect (by an operator, another tool) is gone.
        states = []
        for item in raw:
            if SWARM_TASK_LABEL in (item.get("Labels") or {}):
                continue  # a Swarm task inherits the image's lane labels, but Swarm runs it, not the local lane code
            try:
                states.append(self._state(self._inspect(item["Id"])))
            except NotFound:
                continue
        return states

    def container(self, name: str) -> ContainerState | None:
        try:
            return self._state(self._inspect(name))
        except NotFound:
            return None

    def _inspect(self, name: str) -> dict[str, Any]:
        return dict(self.api.get(self.api.url("/containers/{}/json", name)))

    @staticmethod
    def _state(attrs: dict[str, Any]) -> ContainerState:
        labels = attrs["Config"].get("Labels") or {}
        state = attrs["State"]
        return ContainerState(
            name=attrs["Name"].lstrip("/"),
            id=attrs["Id"],
            lane=labels.get("io.lanectl.lane", ""),
            role=labels.get("io.lanectl.role", ""),
            recipe=labels.get("io.lanectl.recipe", ""),
            inputs=labels.get("io.lanectl.inputs", ""),
            image=attrs["Config"].get("Image", ""),
            status=state.get("Status", ""),
            exit_code=state.get("ExitCode") if state.get("Status") in ("exited", "dead") else None,
            started_at=state.get("StartedAt"),
            finished_at=state.get("FinishedAt"),
            restart_count=int(attrs.get("RestartCount") or 0),
            stop_timeout=attrs["Config"].get("StopTimeout"),
            device_requests=tuple(attrs["HostConfig"].get("DeviceRequests") or ()),
        )

    def create(self, spec: ContainerSpec, *, with_gpus: bool, environ: Mapping[str, str]) -> str:
        """Create (not start) a container from a spec; secret values are read from `environ` here only."""
        env = dict(spec.env)
        for name in spec.secret_env:
            if name not in environ:
                raise OperationFailed(f"{spec.name}: secret {name} is not set in lanectl's environment")
            env[name] = environ[name]
        host_config: dict[str, Any] = {
            "NetworkMode": "default", "Init": spec.init,
            "PortBindings": {f"{p['container']}/{p['protocol']}": [{"HostIp": p["host_ip"] or "",
                                                                    "HostPort": str(p["host"])}]
                             for p in spec.ports},
            "Binds": [f"{v.get('source') or v['volume']}:{v['target']}:{'ro' if v.get('read_only') else 'rw'}"
                      for v in spec.volumes],
        }
        if with_gpus and spec.gpus:
            if "device_ids" in spec.gpus:
                count, device_ids = 0, list(spec.gpus["device_ids"])
            else:
                count, device_ids = (-1 if spec.gpus["count"] == "all" else int(spec.gpus["count"])), []
            host_config["DeviceRequests"] = [{"Driver": "", "Count": count, "DeviceIDs": device_ids,
                                              "Capabilities": [["gpu"]], "Options": {}}]
        if spec.shm_size is not None:
            host_config["ShmSize"] = size_in_bytes(spec.shm_size)
        if spec.ipc is not None:
            host_config["IpcMode"] = spec.ipc
        # The stop timeout lives on the container, so `docker stop` by hand also gives the engine its time.
        config: dict[str, Any] = {
            "Image": spec.image, "Env": [f"{key}={value}" for key, value in env.items()],
            "ExposedPorts": {f"{p['container']}/{p['protocol']}": {} for p in spec.ports},
            "Labels": spec.labels, "StopTimeout": spec.stop_timeout_seconds, "HostConfig": host_config,
            "Tty": False, "OpenStdin": False, "StdinOnce": False, "AttachStdin": False, "AttachStdout": False,
            "AttachStderr": False, "NetworkDisabled": False,
        }
        for key, value in (("Cmd", spec.command), ("Entrypoint", spec.entrypoint), ("User", spec.user)):
            if value is not None:
                config[key] = value
        created = self.api.post("/containers/create", params={"name": spec.name}, body=config)
        return str(created["Id"])

    def start(self, name: str) -> bool:
        """Start the container; False when it was already running (the engine answers 304 and does nothing)."""
        for delay in (*START_RETRY_SECONDS, None):
            try:
                return self.api.post_status(self.api.url("/containers/{}/start", name)) != 304
            except EngineError as exc:
                error = exc
            if GPU_DRIVER_MISSING.search(error.explanation):
                # Docker creates the container and only fails at start; leave nothing behind.
                self.remove(name)
                raise NoGpuRuntime(
                    f"{name}: this host has no NVIDIA container runtime (Docker: {error.explanation}); install "
                    "the NVIDIA Container Toolkit, or run the lane without GPUs with --no-gpu"
                ) from None
            if error.status < 500 or delay is None:
                break
            # An engine that has just restarted answers before it can start containers ("failed to update
            # store for object type *libnetwork.endpoint"); a watchdog reacting to the restart would spend its
            # restart budget on that in milliseconds. Starting is idempotent, so it is asked again.
            time.sleep(delay)
        raise OperationFailed(f"{name}: start failed: {error.explanation}") from None

    def stop(self, name: str, timeout: int) -> None:
        try:
            # The engine answers once the container is down: give it the stop timeout, then the usual wait.
            self.api.post(self.api.url("/containers/{}/stop", name), params={"t": timeout},
                          timeout=timeout + TIMEOUT_SECONDS)
        except NotFound:
            pass

    def remove(self, name: str) -> None:
        try:
            self.api.delete(self.api.url("/containers/{}", name), params={"force": True})
        except NotFound:
            pass

    def rename(self, name: str, new_name: str) -> None:
        try:
            self.api.post(self.api.url("/containers/{}/rename", name), params={"name": new_name})
        except EngineError as exc:
            raise OperationFailed(f"{name}: could not rename it {new_name}: {exc.explanation}") from None

    def logs(self, name: str, *, since: float | None = None, tail: int | None = None) -> str:
        params: dict[str, Any] = {"stdout": True, "stderr": True, "timestamps": False,
                                  "since": since if since and since > 0 else None,
                                  "tail": tail if tail is not None and tail >= 0 else "all"}
        try:
            return self.api.logs(self.api.url("/containers/{}/logs", name), params=params).decode(errors="replace")
        except NotFound:
            return ""

    def container_events(self, label: str) -> Stream:
        """The engine's container events (die, stop, kill, oom, health_status…) for containers with `label`, as
        they happen; `.json_objects()` reads them, `.close()` ends the stream."""
        return self.api.stream("GET", "/events", params={"filters": filters(type="container", label=label)})

    def log_stream(self, name: str, *, since: float) -> Stream:
        """The container's output from `since` (a UNIX time) as it comes, until the container stops; `close()`
        ends it early. Raises NotFound for a container that is not there."""
        params = {"stdout": True, "stderr": True, "follow": True, "since": since if since > 0 else None,
                  "tail": "all"}
        return self.api.stream("GET", self.api.url("/containers/{}/logs", name), params=params)

    def follow_logs(self, name: str, *, since: float | None = None, tail: int | str = "all") -> Iterator[bytes]:
        params = {"stdout": True, "stderr": True, "follow": True, "since": since if since and since > 0 else None,
                  "tail": tail}
        return self.api.stream("GET", self.api.url("/containers/{}/logs", name), params=params).log_chunks()
