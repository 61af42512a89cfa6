"""Switching the box between lanes, health-gated, locked, journaled and crash-safe.

Every mutation goes through `LaneSwitcher`: it takes the host lock, finishes or undoes a switch
an earlier run left unfinished, writes an intent before touching anything and a journal record
after every step, and on a failed gate brings the previous lane back. The engine's labels are
the truth of what exists; `state.json` only remembers which lane is active and known-good.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from lanectl.dockerapi.containers import ContainerEngine, ContainerSpec, ContainerState, DockerEngine, NoGpuRuntime
from lanectl.errors import BadInput, OperationFailed
from lanectl.health.engine_exit import exit_detail
from lanectl.health.gate import (
    PROBE_ACCESS_LINE,
    ContainerStatus,
    GateProgress,
    GateResult,
    HealthGate,
    MonotonicClock,
)
from lanectl.host.gpu_memory import memory_mib
from lanectl.host.host_memory import available_gib
from lanectl.image.containers import plan_containers
from lanectl.image.render import plan_image
from lanectl.lanes.plan import (
    StandbyFacts,
    Step,
    bring_up_steps,
    gpu_memory_shortfall,
    plan_switch,
    sleep_steps,
    stop_steps,
    wake_steps,
)
from lanectl.lanes.standby import SleepEndpoints, StandbyError, lost_standbys, resident_gib, role_base_url
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneState, LaneStateStore
from lanectl.state.paths import StateFiles
from lanectl.state.standby import Fingerprint, StandbyRecord, StandbyStore

# Test seam for crash safety: after the Nth step is journaled, the process kills itself with
# SIGKILL, exactly as an operator's kill -9 would. Never set outside tests.
CRASH_AFTER_STEP_ENV = "LANECTL_TEST_CRASH_AFTER_STEP"
# A switch disarms the watchdog for the gate's budget plus this margin; re-armed when done.
LEASE_MARGIN_SECONDS = 300


@dataclass(frozen=True)
class SwitchOutcome:
    result: str  # ok | noop | failed | rolled-back | planned
    message: str
    lane: str | None
    steps: tuple[str, ...] = ()
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 0 if self.result in ("ok", "noop", "planned") else 1


class Reporter(Protocol):
    """What a switch tells the person watching; the CLI gives one that prints with rich."""

    def step(self, text: str, *, ok: bool = True) -> None:
        """A step that ran; `ok=False` when it ran and failed (a gate that did not pass)."""

    def gate(self, progress: GateProgress) -> None: ...

    def note(self, text: str) -> None: ...


class DockerLogSource:
    """New log lines of a container since a moment, fetched again on each poll (startup logs are short)."""

    def __init__(self, engine: ContainerEngine, name: str, since: float):
        self.engine, self.name, self.since, self.seen = engine, name, since, 0

    def new_lines(self) -> list[str]:
        lines = self.engine.logs(self.name, since=self.since).splitlines()
        fresh, self.seen = lines[self.seen:], len(lines)
        return fresh


class DockerContainerWatch:
    def __init__(self, engine: ContainerEngine, name: str):
        self.engine, self.name = engine, name

    def status(self) -> ContainerStatus:
        state = self.engine.container(self.name)
        if state is None:
            return ContainerStatus(running=False, exit_code=None, detail="gone (removed)")
        if state.running:
            return ContainerStatus(running=True, exit_code=None, detail="running")
        return ContainerStatus(running=False, exit_code=state.exit_code,
                               detail=exit_detail(state.status, state.exit_code))


def built_tag(engine: DockerEngine, lane: Lane) -> str:
    """The lane's current image tag; refuses, before any change, when it has not been built."""
    tag = plan_image(lane).tag
    if engine.image_labels(tag) is None:
        raise OperationFailed(f"{lane.name}: image {tag} is not built; run `lanectl build {lane.name}` first")
    return tag


def gate_lane(engine: ContainerEngine, lane: Lane, reporter: Reporter) -> GateResult:
    """Hold the lane's primary to its health gate, judging the log of its current run from its start.

    The container may have been started by an earlier, killed run of lanectl: its startup lines
    then predate this command, and must still count.
    """
    from lanectl.health.probe import EndpointProbe, probe_base_url

    name = lane.container_name()
    state = engine.container(name)
    started = state.started_epoch if state else None
    since = started - 1.0 if started else time.time()
    endpoints = EndpointProbe(probe_base_url(lane), lane.spec.health)
    gate = HealthGate(lane.spec.health, endpoints, DockerLogSource(engine, name, since),
                      DockerContainerWatch(engine, name), MonotonicClock(), reporter.gate)
    return gate.wait()


def standby_facts(catalog: Catalog, store: StandbyStore, observed: list[ContainerState], *, rollback: bool,
                  host_memory: Callable[[], float | None] = available_gib) -> StandbyFacts:
    """What a plan needs to know about standbys: the recorded ones whose containers all run, the lanes with a
    wake-check fingerprint, and the host memory a new standby's weights would go to."""
    record = store.load()
    running = {s.name for s in observed if s.running}
    asleep = frozenset(r.lane for r in record.standbys if r.lane in catalog.lanes and all(
        catalog.lanes[r.lane].container_name(role) in running for role in catalog.lanes[r.lane].roles))
    return StandbyFacts(asleep=asleep, fingerprinted=frozenset(record.fingerprints),
                        host_available_gib=host_memory(), rollback=rollback)


def rollback_target(catalog: Catalog, state: LaneState) -> Lane:
    """The last known-good lane before the active one."""
    name = state.last_known_good_before(state.active)
    if name is None:
        raise BadInput("no known-good lane to roll back to (none recorded before "
                       f"{state.active or 'the current state'}); name one with --to")
    if name not in catalog.lanes:
        raise BadInput(f"the last known-good lane {name} is no longer in the recipes; name one with --to")
    return catalog.lanes[name]


class LaneSwitcher:
    def __init__(self, catalog: Catalog, engine: ContainerEngine, journal: Journal, states: LaneStateStore, *,
                 reporter: Reporter, no_gpu: bool = False, environ: Mapping[str, str] | None = None,
                 gate: Callable[[ContainerEngine, Lane, Reporter], GateResult] = gate_lane,
                 standbys: StandbyStore | None = None,
                 host_memory: Callable[[], float | None] = available_gib,
                 gpu_memory: Callable[[], dict[str, tuple[int, int]] | None] = memory_mib):
        self.catalog = catalog
        self.engine = engine
        self.journal = journal
        self.states = states
        self.standbys = standbys or StandbyStore(StateFiles(states.path.parent).standby)
        self.host_memory = host_memory
        self.gpu_memory = gpu_memory
        self._slept: list[Lane] = []  # lanes this switch left asleep
        self._waking: set[str] = set()  # lanes being woken: their gate has the wake's budget
        self._woken: dict[str, str] = {}  # how each woken lane came back, for the outcome
        self.reporter = reporter
        self.no_gpu = no_gpu
        self.environ = os.environ if environ is None else environ
        self.gate = gate
        self._steps_done = 0
        crash_after = (environ or os.environ).get(CRASH_AFTER_STEP_ENV)
        self._crash_after = int(crash_after) if crash_after else None

    # -- the verbs ---------------------------------------------------------------------------------

    def plan_up(self, lane: Lane) -> list[Step]:
        tag = self._built_tag(lane)
        observed = self.engine.lane_containers()
        return plan_switch(lane, tag, self.catalog, observed, active=self.states.load().active,
                           standby=standby_facts(self.catalog, self.standbys, observed, rollback=False,
                                                 host_memory=self.host_memory))

    def up(self, lane: Lane, *, rollback_on_failure: bool = True, why: str = "up",
           rollback: bool = False) -> SwitchOutcome:
        """Make `lane` the serving lane. The caller holds the host lock."""
        self.reconcile()
        tag = self._built_tag(lane)
        observed = self.engine.lane_containers()
        state = self.states.load()
        if state.active == lane.name and self._serving(lane, tag, observed):
            return SwitchOutcome("noop", f"{lane.name} is already active and healthy; nothing to do", lane.name)
        facts = self._standby_facts(observed, rollback=rollback)
        dropped = self.standbys.load().dropped.get(lane.name)
        if lane.spec.standby is not None and lane.name not in facts.asleep and (dropped or rollback):
            self.reporter.note(f"{lane.name} has no standby to wake"
                               + (f" (dropped {dropped.at}: {dropped.reason})" if dropped else "")
                               + "; starting it cold")
        steps = plan_switch(lane, tag, self.catalog, observed, active=state.active, standby=facts)
        left = [s for s in steps if s.action in ("stop", "sleep") and s.lane != lane.name]
        previous = self._previous_lane(state, left)
        return self._run_switch(lane, steps, previous, why=why, rollback_on_failure=rollback_on_failure)

    def rollback(self, to: Lane | None) -> SwitchOutcome:
        self.reconcile()
        state = self.states.load()
        target = to or rollback_target(self.catalog, state)
        return self.up(target, why=f"rollback from {state.active or 'no active lane'}", rollback=True)

    def restart(self, lane: Lane, *, before_start: Callable[[], str] = lambda: "") -> SwitchOutcome:
        """The watchdog's restart: stop the lane, let `before_start` wait (GPU memory), start it, gate it.

        Uses the images the containers already run: a restart repairs, it does not upgrade. A lane
        that fails its gate after a restart is stopped again, so the next watchdog pass counts it.
        """
        self.reconcile()
        observed = {s.name: s for s in self.engine.lane_containers()}
        primary = observed.get(lane.container_name())
        tag = primary.image if primary is not None else built_tag(self.engine, lane)
        stops = stop_steps(lane, observed)
        stopped = {name: _as_stopped(state) for name, state in observed.items()}
        steps = [*stops, *bring_up_steps(lane, tag, stopped), Step("gate", lane.name)]
        intent = self.journal.record_intent(action="restart", from_lane=lane.name, to_lane=lane.name,
                                            why="watchdog restart", steps=[s.key for s in steps])
        switch = intent["switch"]
        result: GateResult | None = None
        failure = None
        try:
            for step in stops:
                self._execute(switch, step, lane)
            waited = before_start()
            if waited:
                self.journal.record_step(switch, "gpu-memory", waited)
                self.reporter.note(waited)
            for step in steps[len(stops):]:
                result = self._execute(switch, step, lane, tag=tag)
        except Exception as exc:  # the lane must not be left half-started
            failure = f"{type(exc).__name__}: {exc}"
        if failure is None and result is not None and result.passed:
            self._after_gate(lane)
            self.journal.record_outcome(switch, "ok", f"{lane.name} restarted and passed its gate")
            return SwitchOutcome("ok", f"{lane.name} restarted and passed its gate", lane.name)
        if failure is None and result is not None:
            failure = f"{lane.name} failed its health gate after the restart ({result.failed_check}): {result.detail}"
        for step in stop_steps(lane, {s.name: s for s in self.engine.lane_containers()}):
            self._execute(switch, step, lane)
        message = f"{failure}; {lane.name} is stopped"
        self.journal.record_outcome(switch, "failed", message)
        return SwitchOutcome("failed", message, None)

    def down(self, lane: Lane | None, *, with_standbys: bool = False) -> SwitchOutcome:
        """Stop `lane`, and with `with_standbys` every lane waiting asleep too (`lanectl down` of the box)."""
        self.reconcile()
        targets = [lane] if lane is not None else []
        if with_standbys:
            targets += [self.catalog.lanes[r.lane] for r in self.standbys.load().standbys
                        if r.lane in self.catalog.lanes and r.lane not in {t.name for t in targets}]
        if not targets:
            raise BadInput("no active lane and no standby; name the lane to stop")
        messages, keys = [], []
        for target in targets:
            message, steps = self._down(target)
            messages.append(message)
            keys += [s.key for s in steps]
        return SwitchOutcome("ok", "; ".join(messages), None, tuple(keys))

    def _down(self, lane: Lane) -> tuple[str, list[Step]]:
        observed = {s.name: s for s in self.engine.lane_containers()}
        asleep = self.standbys.load().standby(lane.name) is not None
        steps = stop_steps(lane, observed, "down" if asleep else "")
        intent = self.journal.record_intent(action="down", from_lane=lane.name, to_lane=None, why="down",
                                            steps=[s.key for s in steps])
        for step in steps:
            self._execute(intent["switch"], step, lane)
        self.standbys.drop(lane.name, None)
        state = self.states.load()
        if state.active == lane.name:
            self.states.save(state.with_inactive())
        what = f"{lane.name} (standby)" if asleep else lane.name
        message = f"{what} stopped" if steps else f"{lane.name} was not running"
        self.journal.record_outcome(intent["switch"], "ok", message)
        return message, steps

    # -- crash safety ------------------------------------------------------------------------------

    def reconcile(self) -> str | None:
        """Finish or undo the switch a killed run left unfinished, against what the engine shows."""
        intent = self.journal.unfinished_intent()
        if intent is None:
            return None
        switch, to_name, from_name = intent["switch"], intent.get("to"), intent.get("from")
        self.reporter.note(f"found an unfinished {intent['action']} ({from_name or '-'} -> {to_name or '-'}) "
                           f"started {intent['ts']} by {intent['who']}, after {len(intent['done_steps'])} of "
                           f"{len(intent['steps'])} steps; reconciling")
        target = self.catalog.lanes.get(to_name) if to_name else None
        if intent["action"] == "down":
            lane = self.catalog.lanes.get(from_name) if from_name else None
            if lane is not None:
                for step in stop_steps(lane, {s.name: s for s in self.engine.lane_containers()}):
                    self._execute(switch, step, lane)
            self.states.update(lambda s: s.with_inactive() if s.active == from_name else s)
            message = f"finished the interrupted down of {from_name}"
            self.journal.record_outcome(switch, "finished", message)
            return message
        if target is not None:
            primary = self.engine.container(target.container_name())
            if primary is not None and primary.running:
                result = self.gate(self.engine, target, self.reporter)
                if result.passed:
                    self._mark_serving(target)
                    self.states.update(LaneState.armed)  # the killed switch's lease would outlive it
                    message = f"finished the interrupted switch: {target.name} passed its gate"
                    self.journal.record_outcome(switch, "finished", message)
                    self.reporter.note(message)
                    return message
            for step in stop_steps(target, {s.name: s for s in self.engine.lane_containers()}):
                self._execute(switch, step, target)
        previous = self.catalog.lanes.get(from_name) if from_name else None
        message = f"undid the interrupted switch to {to_name}"
        if previous is not None:
            restored = self._restore(switch, previous)
            if restored.passed:
                self.states.update(LaneState.armed)
            message += f"; {previous.name} " + ("is serving again" if restored.passed
                                                 else f"did not come back: {restored.detail}")
        self.journal.record_outcome(switch, "undone", message)
        self.reporter.note(message)
        return message

    # -- internals ---------------------------------------------------------------------------------

    def _run_switch(self, lane: Lane, steps: list[Step], previous: Lane | None, *, why: str,
                    rollback_on_failure: bool) -> SwitchOutcome:
        intent = self.journal.record_intent(action="up", from_lane=previous.name if previous else None,
                                            to_lane=lane.name, why=why, steps=[s.key for s in steps])
        switch = intent["switch"]
        budget = lane.spec.health.startup_budget_minutes * 60
        self.states.update(lambda s: s.disarmed_for(budget + LEASE_MARGIN_SECONDS, f"switch to {lane.name}",
                                                    _who(), datetime.now(UTC)))
        result: GateResult | None = None
        failure: str | None = None
        whole: set[str] = set()  # lanes whose sleep, or wake, ran as one phase (falling back as one)
        for step in steps:
            if step.lane in whole and step.action in ("sleep", "wake", "gate", "wake-check"):
                continue
            try:
                if step.action == "sleep":
                    whole.add(step.lane)
                    self._sleep_or_stop(switch, self.catalog.lanes[step.lane])
                    continue
                if step.action == "wake":
                    whole.add(step.lane)
                    result = self._wake_or_cold(switch, lane)
                else:
                    result = self._execute(switch, step, lane)
            except NoGpuRuntime as exc:
                failure = str(exc)
                break
            except Exception as exc:  # whatever broke, the previous lane must come back
                failure = f"{step.describe()}: {exc}" if isinstance(exc, OperationFailed) else (
                    f"{step.describe()}: {type(exc).__name__}: {exc}")
                break
            if result is not None and not result.passed:
                failure = f"{lane.name} failed its health gate ({result.failed_check}): {result.detail}"
                break
        if failure is None:
            self.states.update(LaneState.armed)
            message = f"{lane.name} is serving" + (f" (was {previous.name})" if previous else "")
            if lane.name in self._woken:
                message += f"; {self._woken[lane.name]}"
            if self._slept:
                message += f"; {', '.join(slept.name for slept in self._slept)} waits asleep as a standby"
            self.journal.record_outcome(switch, "ok", message)
            self._prune_stopped(lane)
            return SwitchOutcome("ok", message, lane.name, tuple(s.key for s in steps))
        return self._fail(switch, lane, previous, failure, result, rollback_on_failure)

    def _fail(self, switch: str, lane: Lane, previous: Lane | None, failure: str, result: GateResult | None,
              rollback_on_failure: bool) -> SwitchOutcome:
        state = self.engine.container(lane.container_name())
        diagnostics = {
            "failed": failure,
            "check": result.failed_check if result else None,
            "exit_code": (result.exit_code if result and result.exit_code is not None
                          else state.exit_code if state else None),
            "log_tail": [line for line in (result.log_tail if result else
                                           self.engine.logs(lane.container_name(), tail=60).splitlines())
                         if not PROBE_ACCESS_LINE.search(line)][-30:],
        }
        self.journal.append("diagnostics", switch=switch, lane=lane.name, **diagnostics)
        for step in stop_steps(lane, {s.name: s for s in self.engine.lane_containers()}):
            self._execute(switch, step, lane)
        if not rollback_on_failure or previous is None:
            # The failed lane is stopped, and so is whatever it replaced: nothing this switch touched serves.
            touched = {lane.name} | ({previous.name} if previous else set())
            self.states.update(lambda s: s.with_inactive() if s.active in touched else s)
            why = "--no-rollback" if previous is not None else "there was no lane before it"
            message = f"{failure}. {lane.name} is stopped for debugging; nothing else was started ({why})"
            self.journal.record_outcome(switch, "failed", message)
            return SwitchOutcome("failed", message, None, diagnostics=diagnostics)
        restored = self._restore(switch, previous)
        if restored.passed:
            self.states.update(LaneState.armed)
            message = f"{failure}. Rolled back: {previous.name} is serving again"
            if previous.name in self._woken:
                message += f" ({self._woken[previous.name]})"
            self.journal.record_outcome(switch, "rolled-back", message)
            return SwitchOutcome("rolled-back", message, previous.name, diagnostics=diagnostics)
        message = (f"{failure}. Rolling back to {previous.name} FAILED too ({restored.failed_check}: "
                   f"{restored.detail}); no lane is serving")
        self.states.update(lambda s: s.with_inactive())
        self.journal.record_outcome(switch, "failed", message)
        return SwitchOutcome("failed", message, None, diagnostics=diagnostics)

    def _restore(self, switch: str, lane: Lane) -> GateResult:
        """Bring a previous lane back: wake it if it waits asleep, else start its kept containers, or
        recreate them from its image."""
        self.reporter.note(f"bringing {lane.name} back")
        if self._asleep(lane):
            result = self._wake_or_cold(switch, lane)
            if result.passed:
                self._mark_serving(lane)
            return result
        observed = {s.name: s for s in self.engine.lane_containers()}
        tag = plan_image(lane).tag
        if self.engine.image_labels(tag) is None:
            existing = observed.get(lane.container_name())
            tag = existing.image if existing else tag
        for step in bring_up_steps(lane, tag, observed):
            self._execute(switch, step, lane, tag=tag)
        result = self.gate(self.engine, lane, self.reporter)
        self.journal.record_step(switch, f"gate:{lane.name}", "passed" if result.passed else result.detail)
        if result.passed:
            self._mark_serving(lane)
        return result

    # -- standbys ----------------------------------------------------------------------------------

    def _standby_facts(self, observed: list[ContainerState], *, rollback: bool) -> StandbyFacts:
        """What the plan needs: which standbys can still be woken (the lost ones dropped and said), which
        lanes have a fingerprint, and the host memory a new standby's weights would go to."""
        for name, reason in lost_standbys(self.catalog, self.engine, self.standbys):
            message = f"dropped the standby of {name}: {reason}; a rollback to it is a cold start"
            self.journal.append("note", lane=name, message=message)
            self.reporter.note(message)
        return standby_facts(self.catalog, self.standbys, observed, rollback=rollback, host_memory=self.host_memory)

    def _asleep(self, lane: Lane) -> bool:
        if self.standbys.load().standby(lane.name) is None:
            return False
        states = [self.engine.container(lane.container_name(role)) for role in lane.roles]
        return all(state is not None and state.running for state in states)

    def _sleep_or_stop(self, switch: str, lane: Lane) -> None:
        """Put `lane` to sleep, role by role; if anything fails, stop it instead: today's switch."""
        fingerprint = self.standbys.load().fingerprints.get(lane.name)
        if fingerprint is None:
            self._stop_standby(switch, lane, "no wake-check fingerprint is recorded for it")
            return
        # Recorded before the first sleep request: a run killed mid-sleep leaves a lane lanectl knows of.
        record = StandbyRecord(lane=lane.name, since=self.standbys.timestamp(), fingerprint=fingerprint)
        self.standbys.update(lambda s: s.with_standby(record))
        started = time.time()
        try:
            for step in sleep_steps(lane):
                self._execute(switch, step, lane)
        except Exception as exc:  # whatever the engine did, the lane must not be left half asleep
            reason = f"sleep failed: {exc}"
            self.journal.record_step(switch, f"sleep:{lane.name}", f"failed: {exc}")
            self.reporter.step(f"put {lane.name} to sleep: {exc}", ok=False)
            self._stop_standby(switch, lane, reason)
            return
        resident = resident_gib(self.engine.logs(lane.container_name(), since=started - 1))
        if resident is not None:
            self.standbys.update(lambda s: s.with_standby(record.model_copy(update={"resident_gib": resident})))
        self._slept.append(lane)

    def _stop_standby(self, switch: str, lane: Lane, reason: str) -> None:
        """Cold path for a lane that would have waited asleep: stop it, forget its standby, say why."""
        message = f"{lane.name} is stopped instead of left asleep: {reason}"
        self.reporter.note(message)
        self.journal.append("note", switch=switch, lane=lane.name, message=message)
        for step in stop_steps(lane, {s.name: s for s in self.engine.lane_containers()}, f"cold path: {reason}"):
            self._execute(switch, step, lane)
        self.standbys.drop(lane.name, reason)
        if lane in self._slept:
            self._slept.remove(lane)

    def _check_memory(self, switch: str, target: Lane) -> str:
        """Before `target` starts beside a sleeping lane: its GPUs must have the memory vLLM will ask for."""
        if not self._slept:
            return "no lane was left asleep"
        if self.no_gpu:
            return "not checked: the lanes run without GPUs (--no-gpu)"
        memory = self.gpu_memory()
        if memory is None:
            return "not checked: nvidia-smi not found"
        shortfall = gpu_memory_shortfall(target, memory)
        if shortfall is None:
            return "enough"
        for lane in list(self._slept):
            self._stop_standby(switch, lane, f"GPU memory beside it: {shortfall}")
        return f"short ({shortfall}); the standby was stopped"

    def _wake_or_cold(self, switch: str, lane: Lane) -> GateResult:
        """Wake `lane`, hold it to its gate and the wake check; on any failure, the cold path (stop, start,
        gate), so a rollback through a standby is never worse than one without."""
        self._waking.add(lane.name)
        started = time.monotonic()
        gate: GateResult | None = None
        try:
            steps = wake_steps(lane)
            self._wake_roles(switch, lane, [step for step in steps if step.action == "wake"])
            for step in (step for step in steps if step.action != "wake"):
                result = self._execute(switch, step, lane)
                if result is not None and not result.passed:
                    raise StandbyError(f"failed its gate after the wake ({result.failed_check}): {result.detail}")
                gate = result or gate
        except Exception as exc:  # a wake error, a timeout, a mismatch: the lane starts afresh
            self._waking.discard(lane.name)
            message = f"wake of {lane.name} failed ({exc}); cold path: stop, start, gate"
            self.reporter.note(message)
            self.journal.append("note", switch=switch, lane=lane.name, message=message)
            self.standbys.drop(lane.name, f"wake failed: {exc}")
            self._woken[lane.name] = f"its wake failed ({exc}), so it was started cold"
            return self._cold_start(switch, lane)
        self._waking.discard(lane.name)
        self._woken[lane.name] = (f"woken from its standby in {time.monotonic() - started:.1f} s, gate and wake "
                                  "check included")
        assert gate is not None  # the wake steps hold a gate, and it passed
        return gate

    def _cold_start(self, switch: str, lane: Lane) -> GateResult:
        observed = {s.name: s for s in self.engine.lane_containers()}
        primary = observed.get(lane.container_name())
        tag = primary.image if primary is not None else built_tag(self.engine, lane)
        for step in stop_steps(lane, observed, "cold path"):
            self._execute(switch, step, lane)
        stopped = {name: _as_stopped(state) for name, state in observed.items()}
        for step in bring_up_steps(lane, tag, stopped):
            self._execute(switch, step, lane, tag=tag)
        result = self._execute(switch, Step("gate", lane.name), lane)
        assert result is not None
        return result

    def _wake_check(self, lane: Lane) -> str:
        record = self.standbys.load().standby(lane.name)
        if record is None:
            raise StandbyError("its standby record (and fingerprint) is gone")
        from lanectl.health.probe import probe_base_url

        fingerprint = record.fingerprint
        timeout = lane.spec.health.generation_probe.timeout_seconds
        text = SleepEndpoints(probe_base_url(lane), timeout).greedy_text(
            lane.spec.health.served_model_name, fingerprint.prompt, fingerprint.max_tokens)
        if text != fingerprint.text:
            raise StandbyError(f"wake check: greedy output {text!r} differs from the fingerprint {fingerprint.text!r} "
                               f"recorded {fingerprint.recorded}")
        return f"output matches the fingerprint recorded {fingerprint.recorded}"

    def _after_gate(self, lane: Lane) -> None:
        """A lane that passed its gate serves: it is no standby now, and (when its recipe asks for standbys)
        its greedy output for the wake-check prompt is what any later wake must reproduce."""
        state = self.standbys.load()
        if lane.spec.standby is None:
            if state.standby(lane.name) is not None or lane.name in state.dropped:
                self.standbys.update(lambda s: s.serving(lane.name))
            return
        from lanectl.health.probe import probe_base_url

        check = lane.spec.standby.wake_check
        try:
            endpoints = SleepEndpoints(probe_base_url(lane), lane.spec.health.generation_probe.timeout_seconds)
            text = endpoints.greedy_text(lane.spec.health.served_model_name, check.prompt, check.max_tokens)
        except StandbyError as exc:
            message = f"no wake-check fingerprint for {lane.name} ({exc}): it will be stopped, not left asleep"
            self.reporter.note(message)
            self.journal.append("note", lane=lane.name, message=message)
            self.standbys.update(lambda s: s.serving(lane.name).model_copy(
                update={"fingerprints": {k: v for k, v in s.fingerprints.items() if k != lane.name}}))
            return
        fingerprint = Fingerprint(prompt=check.prompt, max_tokens=check.max_tokens, text=text,
                                  recorded=self.standbys.timestamp())
        self.standbys.update(lambda s: s.serving(lane.name).with_fingerprint(lane.name, fingerprint))

    def _execute(self, switch: str, step: Step, lane: Lane, *, tag: str | None = None) -> GateResult | None:
        clock = time.monotonic()
        result: GateResult | None = None
        note = ""
        target = self.catalog.lanes.get(step.lane, lane)
        if step.action == "stop":
            self.engine.stop(step.container, step.timeout)
            if step.role == ROLE_PRIMARY and self.standbys.load().standby(step.lane) is not None:
                self.standbys.drop(step.lane, step.why or "stopped")
        elif step.action == "sleep":
            standby = target.spec.standby
            if standby is None:
                raise StandbyError(f"{target.name}'s recipe asks for no standby")
            SleepEndpoints(role_base_url(target, step.role), standby.wake_timeout_seconds).sleep(standby.level)
        elif step.action == "wake":
            raise StandbyError("a lane's containers wake together (_wake_roles), not one step at a time")
        elif step.action == "wake-check":
            note = self._wake_check(target)
        elif step.action == "check-memory":
            note = self._check_memory(switch, target)
        elif step.action == "remove":
            self.engine.remove(step.container)
        elif step.action == "create":
            self.engine.create(self._spec(target, step.role, tag), with_gpus=not self.no_gpu, environ=self.environ)
        elif step.action == "start":
            self.engine.start(step.container)
        elif step.action == "gate":
            result = self.gate(self.engine, self._gated(target), self.reporter)
        elif step.action == "activate":
            self._mark_serving(target)
        detail = f"{time.monotonic() - clock:.2f} s" + (f"; {note}" if note else "")
        if result is not None:
            detail += "; passed" if result.passed else f"; failed {result.failed_check}: {result.detail}"
        self._done(switch, step, detail, ok=result is None or result.passed)
        return result

    def _done(self, switch: str, step: Step, detail: str, *, ok: bool = True) -> None:
        """Journal a step that ran, show it, and honour the crash seam."""
        self.journal.record_step(switch, step.key, detail)
        self.reporter.step(f"{step.describe()} ({detail})", ok=ok)
        self._steps_done += 1
        if self._crash_after is not None and self._steps_done == self._crash_after:
            os.kill(os.getpid(), signal.SIGKILL)

    def _wake_roles(self, switch: str, lane: Lane, steps: list[Step]) -> None:
        """Wake every container of the lane at once: they are separate engines on separate GPUs, and waking
        them one after another would add each one's wake time to the rollback. Journaled in start order."""
        from concurrent.futures import ThreadPoolExecutor

        standby = lane.spec.standby
        if standby is None:
            raise StandbyError(f"{lane.name}'s recipe asks for no standby")

        def wake(step: Step) -> tuple[float, Exception | None]:
            clock = time.monotonic()
            try:
                SleepEndpoints(role_base_url(lane, step.role), standby.wake_timeout_seconds).wake_up()
            except Exception as exc:  # reported with its step, below
                return time.monotonic() - clock, exc
            return time.monotonic() - clock, None

        with ThreadPoolExecutor(max_workers=len(steps)) as pool:
            outcomes = list(pool.map(wake, steps))
        for step, (seconds, error) in zip(steps, outcomes, strict=True):
            if error is not None:
                self.journal.record_step(switch, step.key, f"{seconds:.2f} s; failed: {error}")
                self.reporter.step(f"{step.describe()} ({seconds:.2f} s; {error})", ok=False)
                raise StandbyError(f"{step.describe()}: {error}")
            self._done(switch, step, f"{seconds:.2f} s")

    def _spec(self, lane: Lane, role: str, tag: str | None) -> ContainerSpec:
        plan = plan_image(lane)
        specs = {spec.role: spec for spec in plan_containers(lane, plan)}
        spec = specs[role]
        if tag is not None and spec.image == plan.tag:
            from dataclasses import replace

            spec = replace(spec, image=tag)
        return spec

    def _mark_serving(self, lane: Lane) -> None:
        self.states.update(lambda s: s.with_active(lane.name).with_known_good(lane.name))
        self._after_gate(lane)

    def _gated(self, lane: Lane) -> Lane:
        """A woken lane is held to its gate within the wake's budget, not the model's startup budget: a wake that
        left the engine broken must fall back to the cold path in seconds, not after 20 minutes."""
        if lane.name not in self._waking or lane.spec.standby is None:
            return lane
        from dataclasses import replace

        budget = lane.spec.standby.wake_timeout_seconds / 60
        health = lane.spec.health.model_copy(update={"startup_budget_minutes": budget})
        return replace(lane, spec=lane.spec.model_copy(update={"health": health}))

    def _built_tag(self, lane: Lane) -> str:
        return built_tag(self.engine, lane)

    def _serving(self, lane: Lane, tag: str, observed: list[ContainerState]) -> bool:
        by_name = {s.name: s for s in observed}
        for role in lane.roles:
            state = by_name.get(lane.container_name(role))
            if state is None or not state.running:
                return False
            if role == ROLE_PRIMARY and state.image != tag:
                return False
        from lanectl.health.probe import EndpointProbe, probe_base_url

        return EndpointProbe(probe_base_url(lane), lane.spec.health).health_ok().ok

    def _previous_lane(self, state: LaneState, stopped: list[Step]) -> Lane | None:
        """The lane a failed switch goes back to: the active one if this switch stops it."""
        stopped_lanes = list(dict.fromkeys(s.lane for s in stopped))
        if state.active in stopped_lanes:
            return self.catalog.lanes[state.active]
        return self.catalog.lanes[stopped_lanes[0]] if stopped_lanes else None

    def _prune_stopped(self, active: Lane) -> None:
        """Keep the stopped containers of the last few lanes (a rollback is then a start); remove older ones."""
        keep = active.recipe.keep_stopped_lanes
        state = self.states.load()
        recent = [name for name in reversed(state.known_good) if name != active.name][:keep]
        for container in self.engine.lane_containers(active.recipe.id):
            if container.lane == active.name or container.lane in recent or container.running:
                continue
            self.engine.remove(container.name)
            self.reporter.note(f"removed {container.name}: older than the last {keep} lanes kept for rollback")


def _as_stopped(state: ContainerState) -> ContainerState:
    from dataclasses import replace

    return replace(state, status="exited")


def _who() -> str:
    from lanectl.state.journal import current_user_at_host

    return f"{current_user_at_host()} pid {os.getpid()}"
