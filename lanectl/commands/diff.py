"""`lanectl diff A B`: what differs between two lanes' rendered inputs, and what is the same."""

from __future__ import annotations

from lanectl.errors import BadInput
from lanectl.image.render import plan_image
from lanectl.lanes.diff import LaneInputs, diff_lanes, lane_inputs
from lanectl.output import Result
from lanectl.recipe.catalog import Catalog, Lane


def inputs_of(lane: Lane) -> LaneInputs:
    """The lane's inputs, its patch headers read from patches/ (a patch that cannot be read has none)."""
    texts = {}
    for patch in lane.spec.patches:
        path = lane.recipe.project_root / "patches" / patch.path
        try:
            texts[patch.path] = path.read_text(errors="replace")
        except OSError:
            texts[patch.path] = ""
    return lane_inputs(lane, plan_image(lane), texts)


def diff(catalog: Catalog, a: str, b: str) -> Result:
    """Exit 0 whatever differs; 2 on an unknown lane (the error names the known ones)."""
    for name in (a, b):
        if name not in catalog.lanes:
            raise BadInput(f"no lane {name!r}; known lanes: {', '.join(sorted(catalog.lanes))}")
    return Result("diff", diff_lanes(inputs_of(catalog.lane(a)), inputs_of(catalog.lane(b))).as_dict())


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "diff": {
        "example": """\
$ lanectl diff stub-a stub-b
stub-a -> stub-b
  image  lanectl/demo:stub-a-8c64cdec2fc2 -> lanectl/demo:stub-b-e0461b1ad595
  env  ~ STUB_DECODE_TOKENS_PER_S: 100 -> 150
  same base image (lanectl/base-python:bookworm, built on this host: no registry digest)
  same serve flags
""",
        "exit": {
            0: "compared (whether or not the lanes differ)",
            2: "an unknown lane or an invalid recipe",
        },
    },
}
