"""Building lane images: one content-addressed tag per set of rendered inputs.

A build whose inputs are unchanged does nothing. Images of lanes whose base is built on this
host (`make base-image`) also record the base's image id, so a rebuilt base is a changed input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lanectl.dockerapi.containers import BuildLog, DockerEngine
from lanectl.dockerapi.labels import LABEL_PREFIX
from lanectl.errors import OperationFailed
from lanectl.image.render import ImagePlan, plan_image
from lanectl.recipe.catalog import Lane

LOCAL_IMAGES_LABEL = LABEL_PREFIX + "local-images"


@dataclass(frozen=True)
class BuildOutcome:
    lane: str
    tag: str
    status: Literal["built", "unchanged", "failed"]
    steps_total: int = 0
    steps_run: int = 0
    seconds: float = 0.0
    message: str = ""
    log_tail: tuple[str, ...] = field(default_factory=tuple)
    steps_ran: tuple[str, ...] = field(default_factory=tuple)
    pushed: bool = False


def local_image_ids(engine: DockerEngine, plan: ImagePlan) -> str:
    """`name=id` of each host-built image the build starts from; raises when one is missing."""
    parts = []
    for ref in plan.local_images:
        image_id = engine.image_id(ref)
        if image_id is None:
            raise OperationFailed(
                f"lane {plan.lane}: base image {ref} is not on this host; build it with `make base-image`"
            )
        parts.append(f"{ref}={image_id}")
    return ",".join(parts)


def is_built(engine: DockerEngine, plan: ImagePlan) -> bool:
    labels = engine.image_labels(plan.tag)
    if labels is None or labels.get(LABEL_PREFIX + "inputs") != plan.input_hash:
        return False
    if plan.local_images:
        try:
            return labels.get(LOCAL_IMAGES_LABEL) == local_image_ids(engine, plan)
        except OperationFailed:
            return False
    return True


def fetch_kernel_sources(lane: Lane, cache_dir: Path, say: Callable[[str], None]) -> dict[str, Path]:
    """Each git kernel's pinned tree, fetched on this host into the cache (once)."""
    from lanectl.image.kernel_source import fetch_source

    return {kernel.name: fetch_source(kernel, cache_dir, say).path
            for kernel in lane.kernels if kernel.source.git is not None}


def build_lane(engine: DockerEngine, lane: Lane, *, no_cache: bool = False, push: bool = False,
               on_progress: Callable[[str, BuildLog], None] = lambda lane, log: None,
               clock: Callable[[], float] | None = None, cache_dir: Path | None = None,
               say: Callable[[str], None] = lambda message: None) -> BuildOutcome:
    import time

    from lanectl.project import cache_dir as default_cache_dir

    now = clock or time.monotonic
    plan = plan_image(lane)
    labels = dict(plan.labels)
    if plan.local_images:
        labels[LOCAL_IMAGES_LABEL] = local_image_ids(engine, plan)
    started = now()
    if not no_cache and is_built(engine, plan):
        engine.tag(plan.tag, plan.moving_tag)
        outcome = BuildOutcome(lane.name, plan.tag, "unchanged", seconds=now() - started,
                               message=f"{plan.tag} is up to date; inputs unchanged, nothing built")
    else:
        if plan.fetched_trees:
            plan = plan_image(lane, fetch_kernel_sources(lane, cache_dir or default_cache_dir(), say))
        log = engine.build(plan.context_tar(), plan.tag, labels, no_cache=no_cache,
                           on_progress=lambda log: on_progress(lane.name, log))
        seconds = now() - started
        if log.error is not None:
            return BuildOutcome(lane.name, plan.tag, "failed", log.steps_total, log.steps_run, seconds,
                                message=f"step {log.steps_total} ({log.current_step}) failed: {log.error}",
                                log_tail=tuple(log.tail()), steps_ran=tuple(log.ran))
        engine.tag(plan.tag, plan.moving_tag)
        outcome = BuildOutcome(lane.name, plan.tag, "built", log.steps_total, log.steps_run, seconds,
                               message=f"built {plan.tag} ({log.steps_run} of {log.steps_total} steps run, "
                                       f"the rest from cache)", steps_ran=tuple(log.ran))
    if push:
        engine.push(plan.tag)
        engine.push(plan.moving_tag)
        outcome = BuildOutcome(**{**outcome.__dict__, "pushed": True})
    return outcome
