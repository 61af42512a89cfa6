from __future__ import annotations

from typing import Protocol

from lanectl.dockerapi.containers import BuildLog, DockerEngine
from lanectl.errors import EXIT_FAILED, EXIT_OK
from lanectl.image.build import BuildOutcome, build_lane
from lanectl.output import Result
from lanectl.recipe.catalog import Lane


class BuildReporter(Protocol):
    """What a build tells the person watching, lane by lane; the CLI's draws a progress bar or plain lines."""

    def started(self, lane: str) -> None: ...

    def progress(self, lane: str, log: BuildLog) -> None:
        """The engine's build log so far: steps planned, steps done, the current step."""

    def say(self, lane: str, message: str) -> None:
        """Work before the engine build, e.g. fetching a pinned kernel source."""

    def finished(self, lane: str, outcome: BuildOutcome) -> None: ...


def build_lanes(lanes: list[Lane], *, no_cache: bool, push: bool, reporter: BuildReporter) -> Result:
    """Build each lane in turn; a failure stops the rest, so the first error is the one shown. Exit 1 on one."""
    engine = DockerEngine()
    outcomes: list[BuildOutcome] = []
    for lane in lanes:
        reporter.started(lane.name)

        def say(message: str, name: str = lane.name) -> None:
            reporter.say(name, message)

        outcome = build_lane(engine, lane, no_cache=no_cache, push=push, on_progress=reporter.progress, say=say)
        reporter.finished(lane.name, outcome)
        outcomes.append(outcome)
        if outcome.status == "failed":
            break
    failed = any(o.status == "failed" for o in outcomes)
    return Result("build", {"builds": [o.__dict__ | {"log_tail": list(o.log_tail)} for o in outcomes]},
                  exit_code=EXIT_FAILED if failed else EXIT_OK)
