"""The Docker engine, behind the few operations lanectl needs.

Everything that talks to Docker goes through `DockerEngine`, so the domain code reads as a
sequence of intentions and the tests of the pure core never need an engine.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import docker
import docker.errors
import docker.types

from lanectl.errors import OperationFailed


@dataclass(frozen=True)
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
    def __init__(self, client: docker.DockerClient | None = None):
        try:
            if client is None:
                # Negotiating the API version is the first request: it fails here, with the same
                # message, when the engine is not there, so no ping is needed.
                client = docker.from_env()
                if client.api.base_url.startswith("http+docker://"):
                    # A local socket takes no proxy: without this, requests looks for proxy settings
                    # in the environment on every call (~2 ms each; status makes one per lane).
                    client.api.trust_env = False
            else:
                client.ping()
            self.client = client
        except docker.errors.DockerException as exc:
            raise OperationFailed(
                f"cannot reach the Docker engine ({exc}); start it (e.g. `dockerd &`) or set DOCKER_HOST"
            ) from None

    def image_labels(self, ref: str) -> dict[str, str] | None:
        """The labels of a local image, or None when the image is not here."""
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        return dict(image.labels or {})

    def image_id(self, ref: str) -> str | None:
        try:
            return str(self.client.images.get(ref).id)
        except docker.errors.ImageNotFound:
            return None

    def build(self, context_tar: bytes, tag: str, labels: dict[str, str], *, no_cache: bool,
              on_progress: Callable[[BuildLog], None] = lambda log: None) -> BuildLog:
        """Build from a tar context; never pulls (hosts here reach no registry, and bases are pinned)."""
        log = BuildLog()
        stream: Iterator[dict[str, Any]] = self.client.api.build(
            fileobj=io.BytesIO(context_tar), custom_context=True, tag=tag, labels=labels, rm=True,
            forcerm=True, nocache=no_cache, pull=False, decode=True,
        )
        for chunk in stream:
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
        self.client.api.tag(source, repository, tag, force=True)

    def repo_digests(self, ref: str) -> list[str]:
        """`repository@sha256:…` of each registry a local image was pushed to (or pulled from); [] if absent."""
        try:
            return [str(d) for d in self.client.images.get(ref).attrs.get("RepoDigests") or []]
        except docker.errors.ImageNotFound:
            return []

    def registry_digest(self, ref: str) -> str | None:
        """The manifest digest the registry holds for `repository:tag`, or None when it has no such tag.

        Asked through the engine, so the registry is reached exactly as a push reaches it (TLS, certs.d,
        insecure registries, `docker login` credentials)."""
        try:
            answer = self.client.api.inspect_distribution(ref)
        except docker.errors.NotFound:
            return None  # "manifest unknown" / "repository name not known to registry"
        except docker.errors.APIError as exc:
            raise OperationFailed(explain_registry_error(ref, str(exc.explanation or exc))) from None
        return str(answer["Descriptor"]["digest"])

    def push(self, ref: str, on_progress: Callable[[PushProgress], None] = lambda progress: None) -> str:
        """Push `repository:tag`; returns the manifest digest the registry answered with.

        Raises OperationFailed with the registry's cause; the engine has by then retried what it retries."""
        repository, _, tag = ref.rpartition(":")
        digest: str | None = None
        try:
            for chunk in self.client.api.push(repository, tag=tag, stream=True, decode=True):
                if "error" in chunk:
                    raise OperationFailed(explain_registry_error(ref, str(chunk["error"])))
                aux = chunk.get("aux") or {}
                if aux.get("Digest") and aux.get("Tag") == tag:
                    digest = str(aux["Digest"])
                if "status" in chunk:
                    detail = chunk.get("progressDetail") or {}
                    on_progress(PushProgress(str(chunk.get("id", "")), str(chunk["status"]),
                                             detail.get("current"), detail.get("total")))
        except docker.errors.APIError as exc:
            raise OperationFailed(explain_registry_error(ref, str(exc.explanation or exc))) from None
        if digest is None:
            raise OperationFailed(f"push of {ref}: the engine reported no digest, so the registry's copy cannot be "
                                  "pinned; nothing was recorded")
        return digest


@dataclass(frozen=True)
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
GPU_DRIVER_MISSING = re.compile(r"could not select device driver .* with capabilities: \[\[gpu\]\]")


@dataclass(frozen=True)
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


class NoGpuRuntime(OperationFailed):
    pass


class ContainerEngine(DockerEngine):
    """Container operations on lane containers, all addressed by name."""

    def lane_containers(self, recipe: str | None = None) -> list[ContainerState]:
        label = f"io.lanectl.recipe={recipe}" if recipe else "io.lanectl.lane"
        raw = self.client.api.containers(all=True, filters={"label": label})
        # One inspect per container: `containers()` lacks exit code, start time and restart count.
        # A container removed between the list and its inspect (by an operator, another tool) is gone.
        states = []
        for item in raw:
            if SWARM_TASK_LABEL in (item.get("Labels") or {}):
                continue  # a Swarm task inherits the image's lane labels, but Swarm runs it, not the local lane code
            try:
                states.append(self._state(self.client.api.inspect_container(item["Id"])))
            except docker.errors.NotFound:
                continue
        return states

    def container(self, name: str) -> ContainerState | None:
        try:
            return self._state(self.client.api.inspect_container(name))
        except docker.errors.NotFound:
            return None

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
            device_requests=tuple(attrs["HostConfig"].get("DeviceRequests") or ()),
        )

    def create(self, spec: ContainerSpec, *, with_gpus: bool, environ: Mapping[str, str]) -> str:
        """Create (not start) a container from a spec; secret values are read from `environ` here only."""
        env = dict(spec.env)
        for name in spec.secret_env:
            if name not in environ:
                raise OperationFailed(f"{spec.name}: secret {name} is not set in lanectl's environment")
            env[name] = environ[name]
        port_bindings = {f"{p['container']}/{p['protocol']}": (p["host_ip"], p["host"]) for p in spec.ports}
        binds = {
            (v.get("source") or v["volume"]): {"bind": v["target"], "mode": "ro" if v.get("read_only") else "rw"}
            for v in spec.volumes
        }
        device_requests = []
        if with_gpus and spec.gpus:
            if "device_ids" in spec.gpus:
                request = docker.types.DeviceRequest(device_ids=spec.gpus["device_ids"], capabilities=[["gpu"]])
            else:
                count = spec.gpus["count"]
                request = docker.types.DeviceRequest(count=-1 if count == "all" else count, capabilities=[["gpu"]])
            device_requests.append(request)
        # The low-level API: the high-level `containers.create` has no stop_timeout, and the stop
        # timeout must live on the container so `docker stop` by hand also gives the engine its time.
        host_config = self.client.api.create_host_config(
            port_bindings=port_bindings, binds=binds, device_requests=device_requests or None,
            shm_size=spec.shm_size, ipc_mode=spec.ipc, init=spec.init,
        )
        created = self.client.api.create_container(
            spec.image, command=spec.command, entrypoint=spec.entrypoint, name=spec.name, environment=env,
            ports=[(p["container"], p["protocol"]) for p in spec.ports], labels=spec.labels, user=spec.user,
            stop_timeout=spec.stop_timeout_seconds, host_config=host_config, detach=True,
        )
        return str(created["Id"])

    def start(self, name: str) -> None:
        try:
            self.client.api.start(name)
        except docker.errors.APIError as exc:
            if GPU_DRIVER_MISSING.search(str(exc)):
                # Docker creates the container and only fails at start; leave nothing behind.
                self.remove(name)
                raise NoGpuRuntime(
                    f"{name}: this host has no NVIDIA container runtime (Docker: {exc.explanation}); install "
                    "the NVIDIA Container Toolkit, or run the lane without GPUs with --no-gpu"
                ) from None
            raise OperationFailed(f"{name}: start failed: {exc.explanation or exc}") from None

    def stop(self, name: str, timeout: int) -> None:
        try:
            self.client.api.stop(name, timeout=timeout)
        except docker.errors.NotFound:
            pass

    def remove(self, name: str) -> None:
        try:
            self.client.api.remove_container(name, force=True)
        except docker.errors.NotFound:
            pass

    def logs(self, name: str, *, since: float | None = None, tail: int | None = None) -> str:
        kwargs: dict[str, Any] = {"stdout": True, "stderr": True, "timestamps": False}
        if since is not None:
            kwargs["since"] = since
        if tail is not None:
            kwargs["tail"] = tail
        try:
            return self.client.api.logs(name, **kwargs).decode(errors="replace")
        except docker.errors.NotFound:
            return ""

    def follow_logs(self, name: str, *, since: float | None = None, tail: int | str = "all") -> Iterator[bytes]:
        return self.client.api.logs(name, stream=True, follow=True, since=since, tail=tail)
