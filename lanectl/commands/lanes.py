from __future__ import annotations

from typing import Any

from lanectl.errors import OperationFailed
from lanectl.image.render import plan_images
from lanectl.output import Result
from lanectl.recipe.catalog import Catalog


def list_lanes(catalog: Catalog) -> Result:
    """One row per lane; `built` is None when the Docker engine cannot be asked."""
    from lanectl.dockerapi.containers import DockerEngine
    from lanectl.image.build import is_built

    engine: DockerEngine | None
    note = None
    try:
        engine = DockerEngine()
    except OperationFailed as exc:
        engine, note = None, f"built? unknown: {exc}"
    rows: list[dict[str, Any]] = []
    lanes = sorted(catalog.lanes.values(), key=lambda lane: (lane.recipe.id, lane.name))
    plans = plan_images(lanes)
    for lane in lanes:
        plan = plans[lane.name]
        rows.append({
            "lane": lane.name,
            "recipe": lane.recipe.id,
            "image": plan.tag,
            "built": is_built(engine, plan) if engine else None,
            "containers": [lane.container_name(role) for role in lane.roles],
            "companions": list(lane.spec.companions),
            "kernels": [k.name for k in lane.kernels],
            "patches": [p.path for p in lane.spec.patches],
        })
    return Result("lanes", {"lanes": rows, "note": note})


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "lanes": {
        "example": """\
$ lanectl lanes
LANE    RECIPE  IMAGE                             BUILT  COMPANIONS
stub-a  demo    lanectl/demo:stub-a-8c64cdec2fc2  no     -
stub-b  demo    lanectl/demo:stub-b-e0461b1ad595  no     -
""",
        "exit": {
            0: "the lanes are listed",
            2: "a recipe is invalid",
        },
    },
}
