"""Progress of long work, drawn for people on stderr: the reporters the CLI hands to commands.

Text from outside lanectl (step names, engine build steps, log lines) is printed as parts or with
markup=False, never parsed as rich markup. Only the build's bars on a terminal import rich.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from lanectl.cli.terminal import Console
    from lanectl.commands.build import BuildReporter
    from lanectl.dockerapi.containers import BuildLog, PushProgress
    from lanectl.health.gate import GateProgress
    from lanectl.image.build import BuildOutcome


class ConsoleReporter:
    """Switch progress: one line per step, a line every few seconds while the gate waits."""

    def __init__(self, console: Console, quiet: bool = False):
        self.console = console
        self.quiet = quiet
        self.last_gate_print = 0.0

    def step(self, text: str, *, ok: bool = True) -> None:
        if not self.quiet:
            mark = ("✓", "green") if ok else ("✗", "red")
            self.console.lines([(mark, " ", text)])

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.lines([(("!", "yellow"), " ", text)])

    def gate(self, progress: GateProgress) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        # A line every 5 s (not every poll): readable in a terminal, a CI log and the cron mail alike.
        if now - self.last_gate_print < 5 and progress.missing:
            return
        self.last_gate_print = now
        waiting = "; ".join(progress.missing) or "all checks satisfied"
        self.console.print(f"  gate {progress.elapsed:5.0f}/{progress.budget:.0f} s  waiting for: {waiting}",
                           markup=False, highlight=False)


def say(console: Console) -> Callable[[str], None]:
    """Progress as plain lines (bench and gate arms)."""
    return lambda text: console.print(text, markup=False, highlight=False)


class DownloadProgress:
    """The one-time download of a pinned source (vLLM's sdist is ~43 MB), in 10% steps."""

    def __init__(self, console: Console):
        self.console = console
        self.shown = -1

    def __call__(self, done: int, total: int) -> None:
        if not total:
            return
        tenth = done * 10 // total
        if tenth != self.shown:
            self.shown = tenth
            self.console.print(f"downloading pinned upstream source: {done / 1e6:.1f}/{total / 1e6:.1f} MB")


@contextmanager
def build_reporter(console: Console, *, live: bool) -> Iterator[BuildReporter]:
    """A progress bar per lane on a terminal, a line per build step elsewhere (CI logs), nothing when not
    `live` (--json)."""
    if live and console.is_terminal:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from lanectl.cli.rich_console import TerminalConsole

        assert isinstance(console, TerminalConsole)  # what lanectl.cli.terminal.console gives a terminal
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[amount]}"),
                   TimeElapsedColumn(), TextColumn("[dim]{task.fields[step]}"))
        with Progress(*columns, console=console, transient=False) as progress:
            yield _BuildBars(progress)
        return
    yield _BuildLines(console, live=live)


# Layer states after which a layer's bar is full: the registry has its bytes.
LAYER_DONE = ("Pushed", "Layer already exists", "Mounted from")


def megabytes(size: int | None) -> str:
    return f"{(size or 0) / 1e6:.{1 if (size or 0) >= 1e6 else 3}f}"


class _BuildBars:
    """A bar per lane (build steps), and while it pushes, a bar per layer (bytes)."""

    def __init__(self, bars: Progress):
        self.bars = bars
        self.tasks: dict[str, TaskID] = {}
        self.layers: dict[tuple[str, str], TaskID] = {}

    def started(self, lane: str) -> None:
        self.tasks[lane] = self.bars.add_task(f"build {lane}", total=None, step="", amount="")

    def progress(self, lane: str, log: BuildLog) -> None:
        self.bars.update(self.tasks[lane], completed=log.steps_total, total=log.steps_planned,
                         amount=f"{log.steps_total}/{log.steps_planned or '?'}",
                         step=_markup_free(log.current_step[:60]))

    def say(self, lane: str, message: str) -> None:
        self.bars.update(self.tasks[lane], step=_markup_free(message[:60]))

    def push(self, lane: str, event: PushProgress) -> None:
        if not event.layer:
            self.bars.update(self.tasks[lane], step=_markup_free(event.status[:60]))
            return
        key = (lane, event.layer)
        if key not in self.layers:
            self.layers[key] = self.bars.add_task(f"  layer {event.layer}", total=None, step="", amount="")
        done = event.status.startswith(LAYER_DONE)
        total = event.total or (1 if done else None)
        current = total if done else (event.current or 0)
        amount = f"{megabytes(current)}/{megabytes(event.total)} MB" if event.total else ""
        self.bars.update(self.layers[key], total=total, completed=current, amount=amount,
                         step=_markup_free(event.status[:40]))

    def finished(self, lane: str, outcome: BuildOutcome) -> None:
        steps = max(outcome.steps_total, 1)
        pushed = "" if outcome.push is None else f", push {outcome.push}"
        self.bars.update(self.tasks[lane], total=steps, completed=steps, step=_markup_free(f"{outcome.status}{pushed}"))


class _BuildLines:
    def __init__(self, console: Console, *, live: bool):
        self.console = console
        self.live = live
        self.last_step: dict[str, int] = {}
        self.layer_states: dict[tuple[str, str], str] = {}

    def started(self, lane: str) -> None:
        self.last_step[lane] = 0

    def progress(self, lane: str, log: BuildLog) -> None:
        if self.live and log.steps_total != self.last_step[lane]:
            self.last_step[lane] = log.steps_total
            step = log.current_step if len(log.current_step) <= 100 else log.current_step[:97] + "..."
            self.console.print(f"{lane}: step {log.steps_total}/{log.steps_planned}: {step}", markup=False)

    def say(self, lane: str, message: str) -> None:
        if self.live:
            self.console.print(f"{lane}: {message}", markup=False)

    def push(self, lane: str, event: PushProgress) -> None:
        # One line per layer and state (not per chunk of bytes): a CI log stays readable.
        state = event.status.split(" in ", 1)[0]  # "Retrying in 5 seconds" counts down once a second
        key = (lane, event.layer or "")
        if self.live and event.layer and self.layer_states.get(key) != state:
            self.layer_states[key] = state
            size = f" ({megabytes(event.total)} MB)" if event.total and state == "Pushing" else ""
            self.console.print(f"{lane}: push layer {event.layer}: {state}{size}", markup=False)

    def finished(self, lane: str, outcome: BuildOutcome) -> None:
        pass


def _markup_free(text: str) -> str:
    # The step column is a markup template ("[dim]{step}"): a Dockerfile line such as `RUN [ -f x ]` is
    # escaped so that it shows as written.
    from rich.markup import escape

    return escape(text)
