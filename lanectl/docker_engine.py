"""The Docker engine, behind the few operations lanectl needs.

Everything that talks to Docker goes through `DockerEngine`, so the domain code reads as a
sequence of intentions and the tests of the pure core never need an engine.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors

from lanectl.errors import OperationFailed

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
            self.client = client or docker.from_env()
            self.client.ping()
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

    def push(self, ref: str, on_line: Callable[[str], None] = lambda line: None) -> None:
        repository, _, tag = ref.rpartition(":")
        for chunk in self.client.api.push(repository, tag=tag, stream=True, decode=True):
            if "error" in chunk:
                raise OperationFailed(f"push of {ref} failed: {chunk['error']}")
            if "status" in chunk:
                on_line(f"{chunk.get('id', '')} {chunk['status']}".strip())
