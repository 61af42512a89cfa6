from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from lanectl.dockerapi.containers import BuildLog, DockerEngine, PushProgress
from lanectl.errors import BadInput, OperationFailed
from lanectl.image.build import BuildOutcome, build_lane
from lanectl.image.render import plan_image
from lanectl.recipe.catalog import Lane
from lanectl.recipe.model import registry_name
from lanectl.state.journal import Journal, utc_now, utc_timestamp
from lanectl.state.paths import StateFiles, state_dir
from lanectl.state.pushes import PushRecord, PushStore

# Layer states after which a layer's bar is full: the registry has its bytes.
LAYER_DONE = ("Pushed", "Layer already exists", "Mounted from")


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


def build_lanes(lanes: list[Lane], *, no_cache: bool, push: bool, registry: str | None, console: Console,
                live: bool) -> list[BuildOutcome]:
    """Build (and with `push`, push) each lane in turn; every lane is attempted, each one reported.

    A pushed or already-held content tag is recorded (`state_dir/pushes/`, and a journal note) only once the
    registry has answered with its digest, so a failed or partial push leaves no record.
    """
    registries = push_registries(lanes, registry) if push else {}
    # A recipe path that leads out of the project is bad input: refused before anything is built or pushed.
    plans = {lane.name: plan_image(lane) for lane in lanes}
    engine = DockerEngine()
    directory = state_dir()
    pushes, journal = PushStore(directory), Journal(StateFiles(directory).journal)
    outcomes: list[BuildOutcome] = []

    def one(lane: Lane, show: Callable[[str, BuildLog], None], say: Callable[[str], None],
            on_push: Callable[[str, PushProgress], None]) -> BuildOutcome:
        try:
            outcome = build_lane(engine, lane, no_cache=no_cache, registry=registries.get(lane.name),
                                 on_progress=show, on_push=on_push, say=say, plan=plans[lane.name])
        except OperationFailed as exc:  # a missing base image, a kernel source that cannot be fetched
            return BuildOutcome(lane.name, plans[lane.name].tag, "failed", message=str(exc), recipe=lane.recipe.id,
                                inputs=plans[lane.name].input_hash, registry=registries.get(lane.name))
        return record_push(outcome, pushes, journal) if outcome.digest is not None else outcome

    if live and console.is_terminal:
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[amount]}"),
                   TimeElapsedColumn(), TextColumn("[dim]{task.fields[step]}"))
        with Progress(*columns, console=console, transient=False) as progress:
            for lane in lanes:
                task = progress.add_task(f"build {lane.name}", total=None, step="", amount="")

                def show(_lane: str, log: BuildLog, task: TaskID = task) -> None:
                    progress.update(task, completed=log.steps_total, total=log.steps_planned,
                                    amount=f"{log.steps_total}/{log.steps_planned or '?'}", step=log.current_step[:60])

                def say(message: str, task: TaskID = task) -> None:
                    progress.update(task, step=message[:60])

                layers: dict[str, TaskID] = {}

                def on_push(name: str, event: PushProgress, task: TaskID = task,
                            layers: dict[str, TaskID] = layers) -> None:
                    if not event.layer:
                        progress.update(task, step=event.status[:60])
                        return
                    if event.layer not in layers:
                        layers[event.layer] = progress.add_task(f"  layer {event.layer}", total=None, step="",
                                                                amount="")
                    done = event.status.startswith(LAYER_DONE)
                    total = event.total or (1 if done else None)
                    current = total if done else (event.current or 0)
                    amount = f"{megabytes(current)}/{megabytes(event.total)} MB" if event.total else ""
                    progress.update(layers[event.layer], total=total, completed=current, amount=amount,
                                    step=event.status[:40])

                outcome = one(lane, show, say, on_push)
                steps = max(outcome.steps_total, 1)
                pushed = "" if outcome.push is None else f", push {outcome.push}"
                progress.update(task, total=steps, completed=steps, step=f"{outcome.status}{pushed}")
                outcomes.append(outcome)
        return outcomes
    for lane in lanes:
        last_step = [0]
        layer_states: dict[str, str] = {}

        def show_plain(name: str, log: BuildLog, last_step: list[int] = last_step) -> None:
            if live and log.steps_total != last_step[0]:
                last_step[0] = log.steps_total
                step = log.current_step if len(log.current_step) <= 100 else log.current_step[:97] + "..."
                console.print(f"{name}: step {log.steps_total}/{log.steps_planned}: {step}", markup=False)

        def say_plain(message: str, name: str = lane.name) -> None:
            if live:
                console.print(f"{name}: {message}", markup=False)

        def push_plain(name: str, event: PushProgress, layer_states: dict[str, str] = layer_states) -> None:
            # One line per layer and state (not per chunk of bytes): a CI log stays readable.
            state = event.status.split(" in ", 1)[0]  # "Retrying in 5 seconds" counts down once a second
            if live and event.layer and layer_states.get(event.layer) != state:
                layer_states[event.layer] = state
                size = f" ({megabytes(event.total)} MB)" if event.total and state == "Pushing" else ""
                console.print(f"{name}: push layer {event.layer}: {state}{size}", markup=False)

        outcomes.append(one(lane, show_plain, say_plain, push_plain))
    return outcomes


def megabytes(size: int | None) -> str:
    return f"{(size or 0) / 1e6:.{1 if (size or 0) >= 1e6 else 3}f}"


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
