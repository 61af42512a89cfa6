from __future__ import annotations

from collections.abc import Callable

from lanectl.errors import BadInput
from lanectl.output import Result
from lanectl.recipe.catalog import Catalog


def lane_logs(catalog: Catalog, lane: str, *, role: str, since_seconds: float | None, follow: bool,
              write: Callable[[str], None]) -> Result:
    """The container log of a lane's primary or companion, handed to `write` as it comes (with `follow`,
    until the container stops or the reader interrupts); the log itself is not kept in the result."""
    import time

    from lanectl.dockerapi.containers import ContainerEngine

    target = catalog.lane(lane)
    if role not in target.roles:
        raise BadInput(f"lane {lane} has no role {role!r}; it has: {', '.join(target.roles)}")
    name = target.container_name(role)
    engine = ContainerEngine()
    if engine.container(name) is None:
        raise BadInput(f"{name} does not exist; `lanectl up {lane}` creates it")
    since = time.time() - since_seconds if since_seconds is not None else None
    if follow:
        for chunk in engine.follow_logs(name, since=since):
            write(chunk.decode(errors="replace"))
    else:
        write(engine.logs(name, since=since))
    return Result("logs", {"lane": lane, "role": role, "container": name})
