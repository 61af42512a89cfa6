from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lanectl.dockerapi.containers import BuildLog, DockerEngine
from lanectl.image.build import BuildOutcome, build_lane
from lanectl.recipe.catalog import Lane


def build_lanes(lanes: list[Lane], *, no_cache: bool, push: bool, console: Console,
                live: bool) -> list[BuildOutcome]:
    """Build each lane in turn; a failure stops the rest, so the first error is the one shown."""
    engine = DockerEngine()
    outcomes: list[BuildOutcome] = []
    if live and console.is_terminal:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("[dim]{task.fields[step]}"))
        with Progress(*columns, console=console, transient=False) as progress:
            for lane in lanes:
                task = progress.add_task(f"build {lane.name}", total=None, step="")

                def show(_lane: str, log: BuildLog, task=task) -> None:
                    progress.update(task, completed=log.steps_total, total=log.steps_planned,
                                    step=log.current_step[:60])

                def say(message: str, task=task) -> None:
                    progress.update(task, step=message[:60])

                outcome = build_lane(engine, lane, no_cache=no_cache, push=push, on_progress=show, say=say)
                progress.update(task, total=max(outcome.steps_total, 1), completed=max(outcome.steps_total, 1))
                outcomes.append(outcome)
                if outcome.status == "failed":
                    break
        return outcomes
    for lane in lanes:
        last_step = [0]

        def show_plain(name: str, log: BuildLog, last_step: list[int] = last_step) -> None:
            if live and log.steps_total != last_step[0]:
                last_step[0] = log.steps_total
                step = log.current_step if len(log.current_step) <= 100 else log.current_step[:97] + "..."
                console.print(f"{name}: step {log.steps_total}/{log.steps_planned}: {step}", markup=False)

        def say_plain(message: str, name: str = lane.name) -> None:
            if live:
                console.print(f"{name}: {message}", markup=False)

        outcome = build_lane(engine, lane, no_cache=no_cache, push=push, on_progress=show_plain, say=say_plain)
        outcomes.append(outcome)
        if outcome.status == "failed":
            break
    return outcomes

