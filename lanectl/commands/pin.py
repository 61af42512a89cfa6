"""`lanectl pin check VERSION`: what moving each lane's vLLM pin to VERSION would break, before any box boots it."""

from __future__ import annotations

import re

from lanectl.errors import EXIT_FAILED, EXIT_OK, BadInput
from lanectl.image.in_image.patching import PatchFormatError
from lanectl.image.upstream import Progress
from lanectl.output import Result
from lanectl.pin.check import check_pin
from lanectl.project import Project, cache_dir
from lanectl.recipe.catalog import load_catalog
from lanectl.recipe.model import VLLM_RELEASE


def check_pin_command(project: Project, version: str, progress: Progress | None = None) -> Result:
    """Exit 0 when nothing breaks, 1 with the findings that do, 2 for a version that is not one or a project
    without a lane that names its vLLM release (`image.vllm`)."""
    if not re.fullmatch(VLLM_RELEASE, version):
        raise BadInput(f"{version!r} is not a vLLM release version (e.g. 0.32.0)")
    catalog = load_catalog(project, [])
    if not any(lane.spec.image.vllm for lane in catalog.lanes.values()):
        raise BadInput("no lane names its vLLM release: set image.vllm (e.g. \"0.31.0\") in the recipes whose base "
                       "image carries vLLM")
    try:
        report = check_pin(catalog, version, cache_dir(), progress)
    except PatchFormatError as exc:
        raise BadInput(str(exc)) from None
    return Result("pin.check", report.to_json(), exit_code=EXIT_FAILED if report.breaking else EXIT_OK)


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "pin check": {
        "example": """\
$ lanectl pin check 0.32.0
""",
        "exit": {
            0: "nothing breaks at that release",
            1: "something breaks (each finding names the lane, the file and the fix)",
            2: "not a vLLM release lanectl can fetch, or an invalid recipe",
        },
    },
}
