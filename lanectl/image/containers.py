"""Container specs: what each role of a lane runs as, resolved from the recipe and the image tag.

Pure. The engine adapter turns a spec into a create call; `lanectl render` prints it.
Secret variables appear here by name only: their values are read from lanectl's environment
at the moment a container is created.
"""

from __future__ import annotations

from lanectl.dockerapi.containers import ContainerSpec
from lanectl.dockerapi.labels import LABEL_PREFIX
from lanectl.image.render import EXIT_GUARD, ImagePlan
from lanectl.recipe.catalog import ROLE_PRIMARY, Lane
from lanectl.recipe.model import Engine


def plan_containers(lane: Lane, image: ImagePlan) -> list[ContainerSpec]:
    """In start order: the primary, then its companions (stop in reverse)."""
    specs = []
    for role in lane.roles:
        if role == ROLE_PRIMARY:
            engine, image_ref = lane.spec.engine, image.tag
            # The image already carries the primary's env and serve flags (CMD); repeating them
            # here would let the two drift apart.
            command, env = None, {}
        else:
            companion = lane.spec.companions[role]
            engine, image_ref = companion.engine, companion.image or image.tag
            command, env = list(companion.engine.args), dict(companion.engine.env)
        entrypoint = None if role == ROLE_PRIMARY else engine.entrypoint
        if entrypoint is not None and image_ref == image.tag:
            # The lane's own image has the exit guard; an entrypoint given here replaces the image's,
            # so it runs under the guard too (_lane/engine.j2). Another image has no guard to run.
            entrypoint = [*EXIT_GUARD, *entrypoint]
        specs.append(_spec(lane, role, engine, image_ref, command, entrypoint, env, image.input_hash))
    return specs


def _spec(lane: Lane, role: str, engine: Engine, image_ref: str, command: list[str] | None,
          entrypoint: list[str] | None, env: dict[str, str], input_hash: str) -> ContainerSpec:
    return ContainerSpec(
        name=lane.container_name(role),
        role=role,
        image=image_ref,
        command=command,
        entrypoint=entrypoint,
        env=env,
        secret_env=list(engine.secret_env),
        ports=[p.model_dump() | {"host": p.published} for p in engine.ports],
        volumes=[v.model_dump(exclude_none=True) for v in engine.volumes],
        gpus=engine.gpus.model_dump(exclude_none=True) if engine.gpus else None,
        shm_size=engine.shm_size,
        ipc=engine.ipc,
        init=engine.init,
        user=engine.user,
        stop_timeout_seconds=engine.stop_timeout_seconds,
        labels={
            LABEL_PREFIX + "recipe": lane.recipe.id,
            LABEL_PREFIX + "lane": lane.name,
            LABEL_PREFIX + "role": role,
            LABEL_PREFIX + "inputs": input_hash,
        },
    )
