from __future__ import annotations

from typing import Protocol

from lanectl.dockerapi.containers import BuildLog, DockerEngine, PushProgress
from lanectl.errors import EXIT_FAILED, EXIT_OK, BadInput, OperationFailed
from lanectl.image.build import BuildOutcome, build_lane
from lanectl.image.render import plan_images
from lanectl.output import Result
from lanectl.recipe.catalog import Lane
from lanectl.recipe.model import registry_name
from lanectl.state.journal import Journal, utc_now, utc_timestamp
from lanectl.state.paths import StateFiles, state_dir
from lanectl.state.pushes import PushRecord, PushStore


class BuildReporter(Protocol):
    """What a build tells the person watching, lane by lane; the CLI's draws a progress bar or plain lines."""

    def started(self, lane: str) -> None: ...

    def progress(self, lane: str, log: BuildLog) -> None:
        """The engine's build log so far: steps planned, steps done, the current step."""

    def say(self, lane: str, message: str) -> None:
        """Work before the engine build, e.g. fetching a pinned kernel source."""

    def push(self, lane: str, event: PushProgress) -> None:
        """The engine's push progress: one event per layer state or chunk of bytes."""

    def finished(self, lane: str, outcome: BuildOutcome) -> None: ...


def push_registries(lanes: list[Lane], registry: str | None) -> dict[str, str]:
    """Each lane's registry for --push: `--registry`, else its recipe's `image.registry`.

    Checked for every lane before anything is built, so a lane with nowhere to go fails the command up front."""
    if registry is not None:
        try:
            registry_name(registry)
        except ValueError as exc:
            raise BadInput(f"--registry: {exc}") from None
    chosen = {lane.name: registry or lane.spec.image.registry for lane in lanes}
    missing = sorted(name for name, where in chosen.items() if where is None)
    if missing:
        raise BadInput(f"nowhere to push {', '.join(missing)}: set image.registry in the recipe, or pass "
                       "--registry HOST:PORT")
    return {name: where for name, where in chosen.items() if where is not None}


def build_lanes(lanes: list[Lane], *, no_cache: bool, push: bool, registry: str | None,
                reporter: BuildReporter) -> Result:
    """Build (and with `push`, push) each lane in turn; every lane is attempted, each one reported. Exit 1 on a failure.

    A pushed or already-held content tag is recorded (`state_dir/pushes/`, and a journal note) only once the
    registry has answered with its digest, so a failed or partial push leaves no record.
    """
    registries = push_registries(lanes, registry) if push else {}
    # A recipe path that leads out of the project is bad input: refused before anything is built or pushed.
    plans = plan_images(lanes)
    engine = DockerEngine()
    directory = state_dir()
    pushes, journal = PushStore(directory), Journal(StateFiles(directory).journal)
    outcomes: list[BuildOutcome] = []
    for lane in lanes:
        reporter.started(lane.name)

        def say(message: str, name: str = lane.name) -> None:
            reporter.say(name, message)

        try:
            outcome = build_lane(engine, lane, no_cache=no_cache, registry=registries.get(lane.name),
                                 on_progress=reporter.progress, on_push=reporter.push, say=say,
                                 plan=plans[lane.name])
        except OperationFailed as exc:  # a missing base image, a kernel source that cannot be fetched
            outcome = BuildOutcome(lane.name, plans[lane.name].tag, "failed", message=str(exc), recipe=lane.recipe.id,
                                   inputs=plans[lane.name].input_hash, registry=registries.get(lane.name))
        if outcome.digest is not None:
            outcome = record_push(outcome, pushes, journal)
        reporter.finished(lane.name, outcome)
        outcomes.append(outcome)
    failed = any(o.status == "failed" for o in outcomes)
    return Result("build", {"builds": [o.as_dict() for o in outcomes]},
                  exit_code=EXIT_FAILED if failed else EXIT_OK)


def record_push(outcome: BuildOutcome, pushes: PushStore, journal: Journal) -> BuildOutcome:
    """Make a digest the registry answered with the lane's provenance; a failure to record fails the lane."""
    from dataclasses import replace

    assert outcome.digest is not None and outcome.registry is not None and outcome.remote_tag is not None
    known = pushes.find(outcome.tag, outcome.registry)
    if known is not None and known.registry == outcome.registry and known.digest == outcome.digest:
        return outcome  # recorded by an earlier run: a no-op build adds nothing to the journal
    repository, _, tag = outcome.remote_tag.rpartition(":")
    record = PushRecord(registry=outcome.registry, repository=repository, tag=tag, digest=outcome.digest,
                        local_tag=outcome.tag, recipe=outcome.recipe, lane=outcome.lane, inputs=outcome.inputs,
                        at=utc_timestamp(utc_now()))
    try:
        # The journal first: it says what happened; the record is what `up --fleet` trusts, so it comes last.
        journal.append("note", message=f"{outcome.lane}: {outcome.remote_tag} is {outcome.digest} in the registry "
                                       f"({'pushed' if outcome.push == 'pushed' else 'already there'})",
                       event="push", lane=outcome.lane, recipe=outcome.recipe, inputs=outcome.inputs,
                       registry=outcome.registry, reference=record.reference, digest=outcome.digest,
                       pushed=outcome.push == "pushed")
        pushes.record(record)
    except OperationFailed as exc:
        return replace(outcome, status="failed", message=f"{outcome.message}; but the digest was not recorded: {exc}")
    return outcome


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "build": {
        "example": """\
$ lanectl build --all
$ lanectl build h2-REF --push --registry registry.lan:5000   # for the fleet: push and record the digest
""",
        "exit": {
            0: "every lane asked for is built (or was already)",
            1: "a build or a push failed (the others were still attempted)",
            2: "an unknown lane, no lane named and no --all, or an invalid recipe",
        },
    },
}
