"""Running a plan: each step as the plan says, nothing else; a failed step takes the plan's own fallback or way
back. Every step is journaled after it ran, behind an intent record that names the plan's steps, so a run
killed at any point leaves a trail the next command finishes or undoes (`plan_reconcile`).

A first Ctrl-C or SIGTERM lets the step in progress finish and takes the way back (once the lane passed its
gate, only the bookkeeping after it remains, and it runs); a second stops at once (`lanes/interrupt.py`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from lanectl.dockerapi.containers import LIVE_STATES, ContainerSpec, ContainerState, ListedContainer, NoGpuRuntime
from lanectl.errors import OperationFailed
from lanectl.health.drain import drain_report
from lanectl.health.engine_log import log_lines
from lanectl.health.gate import INTERRUPTED, PROBE_ACCESS_LINE, GateResult
from lanectl.lanes.engine_calls import EngineCalls
from lanectl.lanes.interrupt import Interrupt, SwitchAborted
from lanectl.lanes.invariants import awake_beside, own_stop_timeout
from lanectl.lanes.inventory import as_published
from lanectl.lanes.plan import Phase, Plan, Step, gpu_memory_shortfall
from lanectl.lanes.standby import StandbyError, resident_gib
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.records import frozen
from lanectl.state.journal import Journal, current_user_at_host
from lanectl.state.lanes import SWITCH_LEASE_PREFIX, LaneState, LaneStateStore
from lanectl.state.standby import Fingerprint, StandbyRecord, StandbyState, StandbyStore

# Test seams, never set outside tests: after the Nth step is journaled the process kills itself with SIGKILL
# (an operator's kill -9), or sends itself the named signals ("3:INT" or "3:INT,5:TERM"; "end:INT" once the run
# has ended, its own signal handling with it).
CRASH_AFTER_STEP_ENV = "LANECTL_TEST_CRASH_AFTER_STEP"
SIGNAL_AFTER_STEP_ENV = "LANECTL_TEST_SIGNAL_AFTER_STEP"
# How long a sleep step looks in the engine's log for what it still holds asleep (`_logged_resident_gib`).
RESIDENT_LOG_WAIT_SECONDS = 2.0


class Engine(Protocol):
    """The Docker operations a plan's steps make (ContainerEngine; an in-memory engine in the tests)."""

    def create(self, spec: ContainerSpec, *, with_gpus: bool, environ: Mapping[str, str]) -> str: ...

    def start(self, name: str) -> bool:
        """False when the container was already running."""
        ...

    def stop(self, name: str, timeout: int) -> None: ...

    def remove(self, name: str) -> None: ...

    def rename(self, name: str, new_name: str) -> None: ...

    def container(self, name: str) -> ContainerState | None: ...

    def logs(self, name: str, *, since: float | None = None, tail: int | None = None) -> str: ...

    def list_containers(self) -> list[ListedContainer]: ...


class Reporter(Protocol):
    """What a switch tells the person watching; the CLI gives one that prints with rich."""

    def step(self, text: str, *, ok: bool = True) -> None:
        """A step that ran; `ok=False` when it ran and failed (a gate that did not pass)."""

    def gate(self, progress: Any) -> None: ...

    def note(self, text: str) -> None: ...


@frozen
class SwitchOutcome:
    result: str  # ok | noop | failed | rolled-back | finished | undone | interrupted | aborted
    message: str
    lane: str | None
    steps: tuple[str, ...] = ()
    diagnostics: dict[str, Any] = field(default_factory=dict)
    signum: int | None = None  # the signal that interrupted it

    @property
    def exit_code(self) -> int:
        if self.signum is not None:
            return 128 + self.signum  # as a shell reports a command ended by that signal: cron and CI can tell
        return 0 if self.result in ("ok", "noop", "finished", "undone") else 1


class StepFailed(Exception):
    def __init__(self, message: str, gate: GateResult | None = None, *, cause: str = "", step: Step | None = None):
        super().__init__(message)
        self.gate = gate
        self.cause = cause or message  # what went wrong, without the step's name
        self.step = step  # the step that failed; None for a signal or a journal that could not be written


# The steps whose failure is the engine's to explain: its log tail goes with the failure.
ENGINE_STEPS = ("create", "start", "sleep", "wake", "wake-check")
# The steps that change a container. A switch that attempted none of them left the engine as its snapshot saw it.
CONTAINER_STEPS = frozenset({"stop", "remove", "set-aside", "put-back", "create", "start", "sleep", "wake"})
# What is left of a way back when nothing on the engine changed: the previous lane's gate (is it serving, as it
# was?) and the state files.
BOOKKEEPING_STEPS = frozenset({"gate", "activate", "deactivate", "arm"})


@dataclass
class _Run:
    """What one execution of a plan has seen so far."""

    switch: str
    plan: Plan
    done: list[str] = field(default_factory=list)
    started: dict[str, float] = field(default_factory=dict)  # lane -> when its primary was started (UNIX time)
    slept: list[str] = field(default_factory=list)
    woken: dict[str, str] = field(default_factory=dict)  # lane -> how it came back
    warnings: list[str] = field(default_factory=list)
    wake_started: dict[str, float] = field(default_factory=dict)
    never_slept: set[str] = field(default_factory=set)  # lanes a wake found awake with no standby recorded
    changed: set[str] = field(default_factory=set)  # containers this run created, started or woke
    touched: bool = False  # a step that changes a container was attempted
    unchanged_back: bool = False  # the way back found the engine as the snapshot saw it, and changed nothing
    unjournaled: str | None = None  # why the journal could not record a step (a full disk), once it could not


class Executor:
    def __init__(self, catalog: Catalog, engine: Engine, journal: Journal, states: LaneStateStore,
                 standbys: StandbyStore, calls: EngineCalls, reporter: Reporter, *, interrupt: Interrupt,
                 environ: Mapping[str, str] = os.environ,
                 gpu_memory: Callable[[], dict[str, tuple[int, int]] | None] = lambda: None,
                 before_start: Callable[[], str] = lambda: "", now: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.catalog = catalog
        self.engine = engine
        self.journal = journal
        self.states = states
        self.standbys = standbys
        self.calls = calls
        self.reporter = reporter
        self.interrupt = interrupt
        self.environ = environ
        self.gpu_memory = gpu_memory
        self.before_start = before_start
        self.now = now
        self._seams = StepSeams(environ)
        self._facts: dict[str, Any] = {}  # what the step that just ran measured, for its journal record

    # -- a plan ----------------------------------------------------------------------------------------------

    def run(self, plan: Plan, *, why: str, switch: str | None = None, state: LaneState | None = None,
            standby: StandbyState | None = None) -> SwitchOutcome:
        """Run `plan`; `switch` continues an unfinished switch's journal (a reconcile) instead of a new intent.
        `state` and `standby` are the state files as the plan's snapshot read them: under the engine lock nobody
        else changes them, so each is written after every change and never read again."""
        if plan.kind == "noop":
            return SwitchOutcome("noop", plan.message, plan.lane)
        self.lane_state = state if state is not None else self.states.load()
        self.standby_state = standby if standby is not None else self.standbys.load()
        if switch is None:
            action = "up" if plan.kind == "rollback" else plan.kind
            from_lane = plan.lane if plan.kind == "down" else plan.previous
            to_lane = None if plan.kind == "down" else plan.lane
            switch = self.journal.record_intent(action=action, from_lane=from_lane, to_lane=to_lane, why=why,
                                                steps=plan.keys)["switch"]
        run = _Run(switch, plan)
        announce_notes(plan, switch, self.journal, self.reporter)
        try:
            with self.interrupt.catching():
                outcome = self._run(run)
        except SwitchAborted as exc:
            return self._aborted(run, exc.signum)
        self._seams.run_done()
        return outcome

    def _run(self, run: _Run) -> SwitchOutcome:
        plan = run.plan
        failure: StepFailed | None = None
        for phase in plan.phases:
            if not phase.optional and self.interrupt.pending():
                failure = StepFailed(f"interrupted by {self.interrupt.pending()}")
                break
            failure = self._phase(run, phase)
            if failure is not None:
                break
        if failure is None:
            return self._succeeded(run)
        return self._go_back(run, failure)

    def _phase(self, run: _Run, phase: Phase, *, way_back: bool = False) -> StepFailed | None:
        """Run one phase; the failure that sends the plan back, or None (done, or replaced by its fallback). On the
        way back a first signal changes nothing: the way back is what it asks for (a second one aborts)."""
        for step in phase.steps:
            if not phase.optional and not way_back and self.interrupt.pending():
                return StepFailed(f"interrupted by {self.interrupt.pending()}")
            if not phase.optional and not way_back and run.unjournaled and run.plan.kind != "undo":
                # A switch goes no further than its journal: a kill past the last step it recorded would leave the
                # next command a trail that stops short of what runs. A way back (an undo is one) goes on without it.
                run.warnings.remove(run.unjournaled)
                return StepFailed(run.unjournaled)
            try:
                self._step(run, step)
            except StepFailed as failed:
                if phase.optional:
                    run.warnings.append(str(failed))
                    continue
                if not phase.fallback or (self.interrupt.pending() and not way_back):
                    return failed
                return self._fallback(run, step, phase, failed)
        return None

    def _fallback(self, run: _Run, step: Step, phase: Phase, failed: StepFailed) -> StepFailed | None:
        lane = phase.fallback[0].lane
        if step.action == "sleep":
            message = f"{lane} is stopped instead of left asleep: sleep failed: {failed.cause}"
        elif step.action == "check-memory":
            message = f"{lane} is stopped instead of left asleep: {failed.cause}"
        else:
            message = f"wake of {lane} failed ({failed.cause}); cold path: stop, start, gate"
            run.woken[lane] = f"its wake failed ({failed.cause}), so it was started cold"
            run.wake_started.pop(lane, None)
        if lane in run.slept:
            run.slept.remove(lane)
        self.reporter.note(message)
        try:
            self.journal.append("note", switch=run.switch, lane=step.lane, message=message)
        except OperationFailed as exc:
            self._unjournaled(run, exc)
        for fallback in phase.fallback:
            try:
                self._step(run, fallback, cause=failed.cause)
            except StepFailed as again:
                return again
        return None

    def _succeeded(self, run: _Run) -> SwitchOutcome:
        plan = run.plan
        result = "ok"
        if plan.kind in ("down", "finish-down"):
            message = "; ".join(self._down_messages(run))
            if plan.kind == "finish-down":
                message, result = f"finished the interrupted down of {plan.lane}", "finished"
            self._outcome(run, result, message)
            return SwitchOutcome(result, message, None, tuple(run.done))
        if plan.kind == "restart":
            message = f"{plan.lane} restarted and passed its gate"
        elif plan.kind == "finish":
            message, result = f"finished the interrupted switch: {plan.lane} passed its gate", "finished"
        elif plan.kind == "undo":
            message, result = self._undone(run, None), "undone"
        else:
            message = f"{plan.lane} is serving" + (f" (was {plan.previous})" if plan.previous else "")
            if plan.lane in run.woken:
                message += f"; {run.woken[plan.lane]}"
            if run.slept:
                message += f"; {', '.join(run.slept)} waits asleep as a standby"
        if run.warnings:
            # Past its gate the lane serves whatever failed after it; undoing that would take a healthy lane down.
            message += (f". BUT: {'; '.join(w.rstrip('.') for w in run.warnings)}. {plan.lane} serves and passed its "
                        "gate; fix the cause, "
                        f"then `lanectl up {plan.lane}` records it")
            result = "failed"
        self._outcome(run, result, message)
        serving = plan.previous if plan.kind == "undo" else plan.lane
        return SwitchOutcome(result, message, serving, tuple(run.done))

    def _undone(self, run: _Run, back: str | None) -> str:
        plan = run.plan
        message = f"undid the interrupted switch to {plan.lane or '-'}"
        if plan.previous:
            message += f"; {plan.previous} " + ("is serving again" if back is None else f"did not come back: {back}")
        return message

    def _go_back(self, run: _Run, failure: StepFailed) -> SwitchOutcome:
        plan = run.plan
        signal_name = self.interrupt.take()
        signum = self.interrupt.signum if signal_name else None
        diagnostics = self._diagnostics(run, failure)
        if plan.kind in ("down", "finish-down"):
            message = "; ".join(self._down_messages(run)) + f"; then {failure}"
            result = "interrupted" if signal_name else "failed"
            self._outcome(run, result, message)
            return SwitchOutcome(result, message, None, tuple(run.done), signum=signum)
        if plan.kind == "undo":
            # An undo's phases are themselves the way back: one that failed is a way back that failed.
            self._abandon(run)
            back: str | None = _why(failure)
        else:
            back = self._way_back(run)
        serving = plan.previous if back is None and plan.previous else None
        if plan.kind == "restart":
            message, result = f"{failure}; {plan.lane} is stopped", "failed"
        elif plan.kind in ("finish", "undo"):
            message, result = self._undone(run, back), "undone" if back is None else "failed"
        elif back is not None:
            going_back = f"Rolling back to {plan.previous}" if plan.previous else f"Stopping {plan.lane}"
            message, result = f"{failure}. {going_back} FAILED too ({back}); no lane is serving", "failed"
        elif run.unchanged_back:
            message = f"{failure}. No container was changed"
            message += f": {plan.previous} serves as it did and passed its gate" if plan.previous else ""
            result = "rolled-back" if plan.previous else "failed"
            if run.warnings:
                message += f". BUT: {'; '.join(w.rstrip('.') for w in run.warnings)}"
        elif plan.previous:
            message, result = f"{failure}. Rolled back: {plan.previous} is serving again", "rolled-back"
            if plan.previous in run.woken:
                message += f" ({run.woken[plan.previous]})"
            if run.warnings:
                message += f". BUT: {'; '.join(w.rstrip('.') for w in run.warnings)}"
        else:
            message = f"{failure}. {plan.lane} is stopped for debugging; nothing else was started ({plan.alone})"
            result = "failed"
        if signal_name:
            result = "interrupted"
            if serving is None:
                message += "; nothing serves now"
        self._outcome(run, result, message)
        return SwitchOutcome(result, message, serving, tuple(run.done), diagnostics, signum=signum)

    def _way_back(self, run: _Run) -> str | None:
        """Run the way back; None when it brought what it must back, else why not (after the plan's abandon)."""
        if not run.touched and run.plan.previous and run.plan.kind in ("up", "rollback") \
                and self._bookkeeping_back(run):
            return None
        for phase in run.plan.way_back:
            failed = self._phase(run, self._undoing(run, phase), way_back=True)
            if failed is not None:
                self._abandon(run)
                return _why(failed)
        return None

    def _bookkeeping_back(self, run: _Run) -> bool:
        """The way back of a switch that failed before any step that changes a container (its first state write
        on a full disk, a refusal, a signal): the containers are as the snapshot saw them, so it changes none
        (the full way back would stop and start again what serves, and may be refused doing it). It holds the
        previous lane to its gate, then puts the state files back. False when that lane did not serve before
        this run either (a standby recorded asleep, an engine of it asleep, a gate it does not pass): the full
        way back brings it back."""
        if run.plan.previous and self.standby_state.standby(run.plan.previous) is not None:
            return False
        gated = [self.catalog.lanes[step.lane] for phase in run.plan.way_back for step in phase.steps
                 if step.action == "gate"]
        listed = self.engine.list_containers()
        if any(self._asleep(lane, listed) for lane in gated):
            return False  # gated asleep, a primary would hold the gate its whole budget: vLLM queues the probe
        for phase in run.plan.way_back:
            steps = tuple(step for step in phase.steps if step.action in BOOKKEEPING_STEPS)
            if steps and self._phase(run, replace(phase, steps=steps, fallback=()), way_back=True) is not None:
                return False
        run.unchanged_back = True
        return True

    def _abandon(self, run: _Run) -> None:
        for step in run.plan.abandon:
            try:
                self._step(run, step)
            except StepFailed as again:
                run.warnings.append(str(again))

    def _undoing(self, run: _Run, phase: Phase) -> Phase:
        """The way back undoes only what this run changed: a target still recorded asleep whose containers this
        run never created, started or woke is the standby it was about to wake, and it stays asleep rather than
        being stopped (a state folder that filled up failed the first step of a rollback, and its way back
        dropped the standby). A continuation (`finish`, `undo`) goes back from what a killed run changed, so it
        stops everything its plan names."""
        if run.plan.kind in ("finish", "undo") or self.standby_state.standby(run.plan.lane or "") is None:
            return phase
        steps = tuple(step for step in phase.steps if not (
            step.action == "stop" and step.lane == run.plan.lane and step.container not in run.changed))
        return replace(phase, steps=steps)

    def _aborted(self, run: _Run, signum: int) -> SwitchOutcome:
        name = signal.Signals(signum).name
        message = (f"stopped at once by a second signal ({name}) after {len(run.done)} step(s); the switch is "
                   f"left unfinished: the next `lanectl up`, `rollback` or watchdog pass finishes or undoes it "
                   f"(`lanectl status` shows it)")
        try:
            self.journal.append("note", switch=run.switch, lane=run.plan.lane, message=message)
        except Exception:  # the journal may be what failed; the message still reaches the operator
            pass
        return SwitchOutcome("aborted", message, None, tuple(run.done), signum=signum)

    def _outcome(self, run: _Run, result: str, message: str) -> None:
        try:
            self.journal.record_outcome(run.switch, result, message)
        except Exception as exc:  # the lanes are as the message says whatever the journal could keep
            self.reporter.note(f"the outcome could not be journaled ({exc}); the next command reconciles the "
                               "switch against what the engine shows")

    def _down_messages(self, run: _Run) -> list[str]:
        messages = []
        for phase in run.plan.phases:
            if not phase.steps:
                continue
            lane = phase.steps[0].lane
            removed = [s for s in phase.steps if s.action == "remove"]
            stopped = [s for s in phase.steps if s.action == "stop"]
            if removed:
                # A role its recipe no longer has, or a lane no recipe that loads has: the removal's why says which.
                messages.append(f"{', '.join(s.container for s in removed)} {'stopped and ' if stopped else ''}"
                                f"removed: {removed[0].why}")
                continue
            standby = any(s.action == "forget-standby" for s in phase.steps)
            what = f"{lane} (standby)" if standby else lane
            messages.append(f"{what} stopped" if stopped else f"{lane} was not running")
        return messages or [f"{run.plan.lane} was not running"]

    def _diagnostics(self, run: _Run, failure: StepFailed) -> dict[str, Any]:
        lane = self.catalog.lanes.get(run.plan.lane or "")
        if lane is None or run.plan.kind == "down":
            return {}
        gate = failure.gate
        name = lane.container_name()
        diagnostics: dict[str, Any] = {"failed": str(failure), "check": gate.failed_check if gate else None,
                                       "exit_code": None, "log_tail": []}
        # A state file that could not be written, a signal, a step on another lane: no doing of this lane's engine,
        # whose log would then be shown as the failed lane's.
        if gate is not None or (failure.step is not None and failure.step.lane == lane.name
                                and failure.step.action in ENGINE_STEPS):
            state = self.engine.container(name) if gate is None or gate.exit_code is None else None
            tail = list(gate.log_tail) if gate else log_lines(self.engine.logs(name, tail=60))
            exit_code = gate.exit_code if gate and gate.exit_code is not None else None
            diagnostics["exit_code"] = exit_code if exit_code is not None else (state.exit_code if state else None)
            diagnostics["log_tail"] = [line for line in tail if not PROBE_ACCESS_LINE.search(line)][-30:]
        try:
            self.journal.append("diagnostics", switch=run.switch, lane=lane.name, **diagnostics)
        except Exception:
            pass
        return diagnostics

    # -- one step --------------------------------------------------------------------------------------------

    def _step(self, run: _Run, step: Step, *, cause: str = "") -> None:
        clock = time.monotonic()
        run.touched = run.touched or step.action in CONTAINER_STEPS
        try:
            note = self._do(run, step, cause)
        except StepFailed as failed:
            failed.step = failed.step or step
            gate = failed.gate
            reason = f"{gate.failed_check}: {gate.detail}" if gate and gate.failed_check else f": {failed}"
            self._done(run, step, f"{time.monotonic() - clock:.2f} s; failed {reason}".replace("failed :", "failed:"),
                       ok=False)
            raise
        except NoGpuRuntime as exc:
            self._done(run, step, f"failed: {exc}", ok=False)
            raise StepFailed(str(exc), step=step) from None
        except (OperationFailed, StandbyError, OSError, ValueError) as exc:
            self._done(run, step, f"{time.monotonic() - clock:.2f} s; failed: {exc}", ok=False)
            raise StepFailed(f"{step.describe()}: {exc}", cause=str(exc), step=step) from None
        except Exception as exc:  # whatever broke, the plan's way back must still run
            self._done(run, step, f"failed: {type(exc).__name__}: {exc}", ok=False)
            raise StepFailed(f"{step.describe()}: {type(exc).__name__}: {exc}",
                             cause=f"{type(exc).__name__}: {exc}", step=step) from None
        self._done(run, step, f"{time.monotonic() - clock:.2f} s" + (f"; {note}" if note else ""))

    def _do(self, run: _Run, step: Step, cause: str) -> str:
        lane = self.catalog.lanes.get(step.lane)
        action = step.action
        if action == "disarm":
            self._lanes(lambda s: s.disarmed_for(step.seconds, f"{SWITCH_LEASE_PREFIX}{step.lane}", _who(), self.now()))
        elif action == "arm":
            self._lanes(LaneState.armed)
        elif action == "deactivate":
            self._lanes(lambda s: s.with_inactive() if s.active == step.lane else s)
        elif action == "forget-standby":
            reason = f"{step.why}: {cause}" if cause else step.why
            self._standbys(lambda s: s.without(step.lane, reason, self.now()))
        elif action == "stop":
            return self._stop(run, step)
        elif action == "remove":
            return self._remove(step)
        elif action == "set-aside":
            return self._set_aside(run, step)
        elif action == "put-back":
            return self._put_back(run, step)
        elif action == "create":
            assert step.spec is not None, "a plan's create step carries its spec"
            run.changed.add(step.container)
            self.engine.create(step.spec.owned_by(self.states.path.parent), with_gpus=True, environ=self.environ)
        elif action == "start":
            state = self.engine.container(step.container)
            if state is None or not state.running:
                self._refuse_awake_beside(step)  # a container that runs already is not being started
            moment = time.time()
            # The gate judges the log of the run this step began; a primary that was already running (a way back
            # taken before its lane was stopped) is judged from its own start.
            started = self.engine.start(step.container)
            if started:
                run.changed.add(step.container)
            if step.role == ROLE_PRIMARY and started:
                run.started[step.lane] = moment
            elif step.role == ROLE_PRIMARY:
                run.started.pop(step.lane, None)
            return "" if started else "it was running"
        elif action == "gpu-memory":
            return self.before_start() or "not waited: no GPU memory to release here"
        else:
            assert lane is not None, f"{step.lane} is in the plan, so in the catalog"
            return self._engine_step(run, step, lane)
        return ""

    def _stop(self, run: _Run, step: Step) -> str:
        """Stop a container, giving its engine its stop timeout, and say what became of the requests it was
        answering: counted before the stop (/metrics), judged from the engine's shutdown records after it."""
        lane = self.catalog.lanes.get(step.lane)
        state = self.engine.container(step.container)
        if state is None:
            return "it is gone"
        # A role the recipe no longer has (an orphan) has no recipe port to ask.
        before = self.calls.in_flight(lane, step.role) if lane is not None and step.role in lane.roles else None
        stopped_at = time.time()
        self.engine.stop(step.container, own_stop_timeout(state.stop_timeout, step.seconds))
        report = drain_report(log_lines(self.engine.logs(step.container, since=stopped_at - 1)), before)
        if report.in_flight is None and report.how == "not said":
            return ""
        self._facts = {"in_flight": report.in_flight, "cut": report.cut}
        return report.describe()

    def _set_aside(self, run: _Run, step: Step) -> str:
        """Rename a container being replaced. The plan stops it first when it ran at the snapshot; one started since
        (by hand) is stopped here, with its own drain, so that it never runs beside its replacement."""
        state = self.engine.container(step.container)
        stopped = ""
        if state is not None and state.status in LIVE_STATES:
            stopped = self._stop(run, replace(step, action="stop", why="it runs again")) or "it ran: stopped"
        self.engine.rename(step.container, step.rename_to)
        return stopped

    def _put_back(self, run: _Run, step: Step) -> str:
        """The replacement goes and the container set aside takes its name again. A replacement the way back
        stopped but someone started again since is stopped first, with its own drain (invariant 4: a removal
        removes only what is stopped)."""
        if self.engine.container(step.container) is None:
            return "nothing was set aside"
        replacement = self.engine.container(step.rename_to)
        stopped = ""
        if replacement is not None and replacement.status in LIVE_STATES:
            stopped = self._stop(run, replace(step, action="stop", container=step.rename_to,
                                              why="it runs again")) or "its replacement ran: stopped"
        self.engine.remove(step.rename_to)  # its replacement, if it was made
        self.engine.rename(step.container, step.rename_to)
        return stopped

    def _remove(self, step: Step) -> str:
        """Invariant 4 (`lanes/invariants.py`): a container is removed only while it is stopped. The plan chose it
        from a listing where it was; one that runs now (started by hand, or by another state folder) is kept."""
        state = self.engine.container(step.container)
        if state is None:
            return "it is gone"
        if state.status in LIVE_STATES:
            return f"kept: it is {state.status} now"
        self.engine.remove(step.container)
        return ""

    def _refuse_awake_beside(self, step: Step) -> None:
        """Invariant 1 (`lanes/invariants.py`), from a fresh listing: whatever the plan believed, a start or a wake
        never puts a second lane awake on a GPU or a host port."""
        lane = self.catalog.lanes.get(step.lane)
        if lane is None:
            return
        holding = awake_beside(self.catalog, lane, self.engine.list_containers(), self.calls.is_sleeping_in)
        if holding:
            raise StepFailed(f"refused to {step.describe()}: {'; '.join(holding)}, and the box runs one lane awake "
                             "per GPU and host port")

    def _engine_step(self, run: _Run, step: Step, lane: Lane) -> str:
        action = step.action
        if action == "gate":
            # Held to its gate where its containers really publish (their own spec, not the recipe's now).
            result = self.calls.gate(as_published(lane, self.engine.list_containers()), step.seconds,
                                     run.started.get(lane.name))
            if result.failed_check == INTERRUPTED:
                raise StepFailed(f"interrupted by {self.interrupt.name} while {lane.name} was held to its gate",
                                 result)
            if not result.passed:
                raise StepFailed(f"{lane.name} failed its health gate ({result.failed_check}): {result.detail}",
                                 result)
            self._refuse_asleep(lane, self.engine.list_containers())
            if lane.name in run.wake_started:
                seconds = time.monotonic() - run.wake_started[lane.name]
                run.woken[lane.name] = f"woken from its standby in {seconds:.1f} s, gate and wake check included"
            return "; ".join(("passed", *result.companions))
        if action == "activate":
            self._lanes(lambda s: s.with_active(lane.name).with_known_good(lane.name))
            return self._fingerprint(lane)
        if action == "sleep":
            return self._sleep(run, step, lane)
        if action == "check-memory":
            return self._check_memory(run, lane)
        if action == "wake":
            if self._never_slept(lane):
                # A way back taken before the switch put the lane to sleep (a Ctrl-C while it stopped an older
                # standby): it still serves as it was. Its gate follows; a wake check or a cold path would not.
                run.never_slept.add(lane.name)
                return "it was never put to sleep: nothing to wake"
            self._refuse_awake_beside(step)
            run.changed.update(lane.container_name(role) for role in lane.roles)
            run.wake_started[lane.name] = time.monotonic()
            self.calls.wake(lane)
            return ""
        if action == "wake-check":
            return self._wake_check(run, lane)
        raise AssertionError(f"unknown step {step.action}")

    def _refuse_asleep(self, lane: Lane, listed: list[ListedContainer]) -> None:
        """Invariant 3 (`lanes/invariants.py`) where a gate passes: vLLM answers `/health` 200 asleep, so a
        companion's readiness (its /health) passes a companion someone put to sleep. Each engine of the lane is
        asked `/is_sleeping` where it publishes; one that says it sleeps fails the gate."""
        asleep = self._asleep(lane, listed)
        if asleep:
            raise StepFailed(f"{lane.name} failed its health gate (asleep): {', '.join(asleep)} answers /health "
                             "but sleeps (GET /is_sleeping true); a lane serves only with every engine awake")

    def _asleep(self, lane: Lane, listed: list[ListedContainer]) -> list[str]:
        """The lane's running containers whose engine says it sleeps, asked where each publishes."""
        names = {lane.container_name(role) for role in lane.roles}
        return sorted(c.name for c in listed if c.name in names and c.running and self.calls.is_sleeping_in(c) is True)

    def _sleep(self, run: _Run, step: Step, lane: Lane) -> str:
        recorded = self.standby_state
        if recorded.standby(lane.name) is None:
            fingerprint = recorded.fingerprints.get(lane.name)
            if fingerprint is None:
                raise StepFailed("no wake-check fingerprint is recorded for it")
            # Recorded before the first sleep request: a run killed mid-sleep leaves a lane lanectl knows of.
            record = StandbyRecord(lane=lane.name, since=self.standbys.timestamp(), fingerprint=fingerprint)
            self._standbys(lambda s: s.with_standby(record))
        started = time.time()
        drained = self.calls.sleep(lane, step.role)
        if step.role == ROLE_PRIMARY:
            run.slept.append(lane.name)
            resident = self._logged_resident_gib(step.container, since=started - 1)
            if resident is not None:
                def with_resident(s: StandbyState) -> StandbyState:
                    record = s.standby(lane.name)
                    return s if record is None else s.with_standby(replace(record, resident_gib=resident))

                self._standbys(with_resident)
                return f"{drained}; {resident:g} GiB still in use on the GPU"
        return drained

    def _logged_resident_gib(self, container: str, since: float) -> float | None:
        """What the engine logged it still holds asleep. The engine writes the line before it answers the sleep
        request, but Docker's log copier may store it a moment later (seen under load): looked for up to 2 s."""
        deadline = time.monotonic() + RESIDENT_LOG_WAIT_SECONDS
        while True:
            resident = resident_gib(self.engine.logs(container, since=since))
            if resident is not None or time.monotonic() >= deadline:
                return resident
            time.sleep(0.1)

    def _check_memory(self, run: _Run, target: Lane) -> str:
        if not run.slept:
            return "no lane was left asleep"
        if not run.plan.with_gpus:
            return "not checked: the lanes run without GPUs (--no-gpu)"
        memory = self.gpu_memory()
        if memory is None:
            return "not checked: nvidia-smi not found"
        shortfall = gpu_memory_shortfall(target, memory)
        if shortfall is not None:
            run.slept.clear()  # the fallback stops the standby
            raise StepFailed(f"GPU memory beside it: {shortfall}")
        return "enough"

    def _never_slept(self, lane: Lane) -> bool:
        """No standby recorded, and every engine of the lane runs and says it is awake."""
        if self.standby_state.standby(lane.name) is not None:
            return False
        return all(self.calls.is_sleeping(lane, role) is False for role in lane.roles)

    def _wake_check(self, run: _Run, lane: Lane) -> str:
        if lane.name in run.never_slept:
            return "not needed: it never slept"
        record = self.standby_state.standby(lane.name)
        if record is None:
            raise StepFailed("its standby record (and fingerprint) is gone")
        fingerprint = record.fingerprint
        try:
            text = self.calls.greedy(lane, fingerprint.prompt, fingerprint.max_tokens)
        except StandbyError as exc:
            raise StepFailed(f"wake check: {exc}") from None
        if text != fingerprint.text:
            raise StepFailed(f"wake check: greedy output {text!r} differs from the fingerprint "
                             f"{fingerprint.text!r} recorded {fingerprint.recorded}")
        return f"output matches the fingerprint recorded {fingerprint.recorded}"

    def _fingerprint(self, lane: Lane) -> str:
        """A lane that passed its gate serves: it is no standby now, and (when its recipe asks for standbys) its
        greedy output for the wake-check prompt is what any later wake must reproduce."""
        state = self.standby_state
        if lane.spec.standby is None:
            if state.standby(lane.name) is not None or lane.name in state.dropped:
                self._standbys(lambda s: s.serving(lane.name))
            return ""
        check = lane.spec.standby.wake_check
        try:
            text = self.calls.greedy(lane, check.prompt, check.max_tokens)
        except StandbyError as exc:
            message = f"no wake-check fingerprint for {lane.name} ({exc}): it will be stopped, not left asleep"
            self.reporter.note(message)
            self.journal.append("note", lane=lane.name, message=message)
            self._standbys(lambda s: replace(s.serving(lane.name),
                                             fingerprints={k: v for k, v in s.fingerprints.items() if k != lane.name}))
            return "no fingerprint"
        fingerprint = Fingerprint(prompt=check.prompt, max_tokens=check.max_tokens, text=text,
                                  recorded=self.standbys.timestamp())
        self._standbys(lambda s: s.serving(lane.name).with_fingerprint(lane.name, fingerprint))
        return "wake-check fingerprint recorded"

    def _lanes(self, change: Callable[[LaneState], LaneState]) -> None:
        self.lane_state = self.states.save(change(self.lane_state))

    def _standbys(self, change: Callable[[StandbyState], StandbyState]) -> None:
        self.standby_state = self.standbys.save(change(self.standby_state))

    def _done(self, run: _Run, step: Step, detail: str, *, ok: bool = True) -> None:
        """Journal a step that ran, show it, and honour the test seams."""
        facts, self._facts = self._facts, {}
        try:
            self.journal.record_step(run.switch, step.key, detail, **facts)
        except OperationFailed as exc:
            self._unjournaled(run, exc)
        finally:
            run.done.append(step.key)
            self.reporter.step(f"{step.describe()} ({detail})", ok=ok)
        self._seams.step_done()

    def _unjournaled(self, run: _Run, exc: OperationFailed) -> None:
        """The journal could not be written (a full disk): the step ran whatever it kept. The run goes on to its
        way back (`_phase`), and its last message says so; the lanes are as that message says."""
        if run.unjournaled is None:
            run.unjournaled = str(exc)
            run.warnings.append(str(exc))


def _why(failed: StepFailed) -> str:
    gate = failed.gate
    return f"{gate.failed_check}: {gate.detail}" if gate and gate.failed_check else str(failed)


def announce_notes(plan: Plan, switch: str, journal: Journal, reporter: Reporter) -> None:
    """What the planner noticed, shown and journaled before the plan's first step (box or fleet)."""
    for note in plan.notes:
        reporter.note(note)
        journal.append("note", switch=switch, lane=plan.lane, message=note)


class StepSeams:
    """The test seams of a plan's executor (box or fleet): after the Nth step, the signals the environment names."""

    def __init__(self, environ: Mapping[str, str]):
        self.signals = _seams(environ)
        self.done = 0

    def step_done(self) -> None:
        self.done += 1
        for signum in self.signals.get(self.done, ()):
            os.kill(os.getpid(), signum)

    def run_done(self) -> None:
        for signum in self.signals.get(RUN_DONE, ()):
            os.kill(os.getpid(), signum)


RUN_DONE = -1  # the seams' key for "end": after the run, outside its signal handling


def _seams(environ: Mapping[str, str]) -> dict[int, list[int]]:
    seams: dict[int, list[int]] = {}
    crash = environ.get(CRASH_AFTER_STEP_ENV)
    if crash:
        seams.setdefault(int(crash), []).append(signal.SIGKILL)
    for item in filter(None, environ.get(SIGNAL_AFTER_STEP_ENV, "").split(",")):
        count, _, name = item.partition(":")
        seams.setdefault(RUN_DONE if count == "end" else int(count), []).append(signal.Signals[f"SIG{name}"])
    return seams


def _who() -> str:
    return f"{current_user_at_host()} pid {os.getpid()}"
