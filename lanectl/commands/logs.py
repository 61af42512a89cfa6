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


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "logs": {
        "example": """\
$ lanectl logs h2-REF --since 10m
$ lanectl logs h2-REF --role rtx -f    # a companion, followed
""",
        "exit": {
            0: "the logs were printed",
            1: "the container is not there",
            2: "an unknown lane or role",
        },
    },
}
