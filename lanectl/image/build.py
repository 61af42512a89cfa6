"""Building lane images: one content-addressed tag per set of rendered inputs.

A build whose inputs are unchanged does nothing. Images of lanes whose base is built on this
host (`make base-image`) also record the base's image id, so a rebuilt base is a changed input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, fields, replace
from pathlib import Path
from typing import Any, Literal

from lanectl.dockerapi.containers import BuildLog, DockerEngine, PushProgress
from lanectl.dockerapi.labels import LABEL_PREFIX
from lanectl.errors import OperationFailed
from lanectl.image.render import ImagePlan, plan_image
from lanectl.recipe.catalog import Lane
from lanectl.records import frozen

LOCAL_IMAGES_LABEL = LABEL_PREFIX + "local-images"


@frozen
class BuildOutcome:
    lane: str
    tag: str
    # built | unchanged (inputs unchanged, nothing built) | skipped (the registry already holds the content tag:
    # nothing built, nothing pushed) | failed (the build, the push, or the registry check)
    status: Literal["built", "unchanged", "skipped", "failed"]
    steps_total: int = 0
    steps_run: int = 0
    seconds: float = 0.0
    message: str = ""
    log_tail: tuple[str, ...] = field(default_factory=tuple)
    steps_ran: tuple[str, ...] = field(default_factory=tuple)
    recipe: str = ""
    inputs: str = ""
    # None without --push; pushed | skipped (already there, same image) | refused (there as another image) | failed
    push: Literal["pushed", "skipped", "refused", "failed"] | None = None
    registry: str | None = None
    remote_tag: str | None = None  # <registry>/lanectl/<recipe>:<lane>-<12 hex>
    digest: str | None = None  # the manifest digest the registry holds for remote_tag
    build_seconds: float = 0.0
    push_seconds: float = 0.0

    @property
    def reference(self) -> str | None:
        """What a node pulls: the repository pinned by digest."""
        if self.remote_tag is None or self.digest is None:
            return None
        return f"{self.remote_tag.rpartition(':')[0]}@{self.digest}"

    def as_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "log_tail": list(self.log_tail),
                "steps_ran": list(self.steps_ran), "reference": self.reference}


def remote_tag(plan: ImagePlan, registry: str) -> str:
    """The content tag under a registry: `<registry>/lanectl/<recipe>:<lane>-<12 hex>`."""
    return f"{registry}/{plan.tag}"


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


def build_lane(engine: DockerEngine, lane: Lane, *, no_cache: bool = False, registry: str | None = None,
               on_progress: Callable[[str, BuildLog], None] = lambda lane, log: None,
               on_push: Callable[[str, PushProgress], None] = lambda lane, progress: None,
               clock: Callable[[], float] | None = None, cache_dir: Path | None = None,
               say: Callable[[str], None] = lambda message: None, plan: ImagePlan | None = None) -> BuildOutcome:
    """Build the lane's image unless its inputs are unchanged; with `registry`, push its content tag there.

    The registry is asked first: a content tag it already holds is not built or pushed again (the tag names
    every input, so it is these inputs' image), and one it holds as another image than this host's is refused,
    because content tags never move. The outcome carries the digest the registry answered with; recording it
    is the caller's, and only an outcome with a digest may be recorded.
    """
    import time

    now = clock or time.monotonic
    started = now()
    plan = plan or plan_image(lane)  # the caller's, when it planned every lane up front
    target = remote_tag(plan, registry) if registry is not None else None

    def about(outcome: BuildOutcome, *, seconds: float, build_seconds: float = 0.0,
              push_seconds: float = 0.0) -> BuildOutcome:
        return replace(outcome, recipe=lane.recipe.id, inputs=plan.input_hash, registry=registry, remote_tag=target,
                       seconds=seconds, build_seconds=build_seconds, push_seconds=push_seconds)

    if target is not None:
        try:
            held = engine.registry_digest(target)
        except OperationFailed as exc:
            failed = BuildOutcome(lane.name, plan.tag, "failed", push="failed",
                                  message=f"nothing built or pushed: {exc}")
            return about(failed, seconds=now() - started, push_seconds=now() - started)
        if held is not None:
            return about(_already_in_registry(engine, plan, target, held), seconds=now() - started,
                         push_seconds=now() - started)
    outcome = _build(engine, lane, plan, no_cache=no_cache, on_progress=on_progress, cache_dir=cache_dir, say=say)
    outcome = about(outcome, build_seconds=now() - started, seconds=now() - started)
    if target is None or outcome.status == "failed":
        return outcome
    push_started = now()
    try:
        engine.tag(plan.tag, target)
        # Between the registry check above and this push, another builder may push the same content tag; a
        # registry cannot refuse a tag that moves, so the CI workflow runs one image build at a time.
        digest = engine.push(target, lambda progress: on_push(lane.name, progress))
    except OperationFailed as exc:
        return replace(outcome, status="failed", push="failed", push_seconds=now() - push_started,
                       seconds=now() - started, message=f"{outcome.message}; push failed, nothing recorded: {exc}")
    return replace(outcome, push="pushed", digest=digest, push_seconds=now() - push_started, seconds=now() - started,
                   message=f"{outcome.message}; pushed {target} as {digest}")


def _already_in_registry(engine: DockerEngine, plan: ImagePlan, target: str, held: str) -> BuildOutcome:
    """The registry holds the content tag: this host's image is that one, or absent (skipped), or another (refused)."""
    repository = target.rpartition(":")[0]
    here = engine.image_labels(plan.tag) is not None
    if here and f"{repository}@{held}" not in engine.repo_digests(plan.tag):
        return BuildOutcome(
            plan.lane, plan.tag, "failed", push="refused",
            message=(f"{target} is in the registry as {held}, another image than this host's {plan.tag}; content "
                     f"tags never move, so nothing was pushed or recorded. The registry's is the image of these "
                     f"inputs: to record it, remove this host's copy (`docker rmi {plan.tag}`) and run again"))
    if here:
        engine.tag(plan.tag, plan.moving_tag)
    where = "this host's image is that one" if here else "nothing built here"
    return BuildOutcome(plan.lane, plan.tag, "skipped", push="skipped", digest=held,
                        message=f"{target} is already in the registry as {held} ({where}); not pushed again")


def _build(engine: DockerEngine, lane: Lane, plan: ImagePlan, *, no_cache: bool,
           on_progress: Callable[[str, BuildLog], None], cache_dir: Path | None,
           say: Callable[[str], None]) -> BuildOutcome:
    from lanectl.project import cache_dir as default_cache_dir

    labels = dict(plan.labels)
    if plan.local_images:
        labels[LOCAL_IMAGES_LABEL] = local_image_ids(engine, plan)
    if not no_cache and is_built(engine, plan):
        engine.tag(plan.tag, plan.moving_tag)
        return BuildOutcome(lane.name, plan.tag, "unchanged",
                            message=f"{plan.tag} is up to date; inputs unchanged, nothing built")
    if plan.fetched_trees:
        plan = plan_image(lane, fetch_kernel_sources(lane, cache_dir or default_cache_dir(), say))
    log = engine.build(plan.context_tar(labels), plan.tag, no_cache=no_cache,
                       on_progress=lambda log: on_progress(lane.name, log))
    if log.error is not None:
        return BuildOutcome(lane.name, plan.tag, "failed", log.steps_total, log.steps_run,
                            message=f"step {log.steps_total} ({log.current_step}) failed: {log.error}",
                            log_tail=tuple(log.tail()), steps_ran=tuple(log.ran))
    engine.tag(plan.tag, plan.moving_tag)
    return BuildOutcome(lane.name, plan.tag, "built", log.steps_total, log.steps_run,
                        message=f"built {plan.tag} ({log.steps_run} of {log.steps_total} steps run, "
                                f"the rest from cache)", steps_ran=tuple(log.ran))
