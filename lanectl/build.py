"""Building lane images: one content-addressed tag per set of rendered inputs.

A build whose inputs are unchanged does nothing. Images of lanes whose base is built on this
host (`make base-image`) also record the base's image id, so a rebuilt base is a changed input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from lanectl.docker_engine import BuildLog, DockerEngine
from lanectl.errors import OperationFailed
from lanectl.recipe.catalog import Lane
from lanectl.render import LABEL_PREFIX, ImagePlan, plan_image

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


def build_lane(engine: DockerEngine, lane: Lane, *, no_cache: bool = False, push: bool = False,
               on_progress: Callable[[str, BuildLog], None] = lambda lane, log: None,
               clock: Callable[[], float] | None = None) -> BuildOutcome:
    import time

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
