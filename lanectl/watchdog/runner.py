"""The watchdog's passes: observe the active lane, decide (watchdog_policy), act through the lanes
code path, and record everything. `check` is one pass (cron); `run` is passes triggered by Docker
events and kernel-log lines as they arrive, and by the answers of probes issued at the probe
interval (a service)."""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lanectl.dockerapi.containers import ContainerEngine, ContainerState
from lanectl.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, LanectlError
from lanectl.health.engine_exit import exit_code_text
from lanectl.health.engine_log import fatal_engine_lines, log_lines
from lanectl.health.probe import EndpointProbe, ProbeResult, probe_base_url
from lanectl.host.xid import Gpu, LaneGpus, XidEvent, believed_xid, xid_on_lane
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.records import frozen
from lanectl.state.journal import Journal, utc_timestamp
from lanectl.state.lanes import SWITCH_LEASE_PREFIX, LaneState, LaneStateStore
from lanectl.state.paths import StateFiles, check_state_file
from lanectl.state.standby import StandbyState, StandbyStore
from lanectl.watchdog.policy import Decision, Observation, decide
from lanectl.watchdog.state import WatchdogRecord, WatchdogStateStore

if TYPE_CHECKING:
    # The switcher (and the image rendering it brings) is needed only when a pass acts.
    from lanectl.lanes.execute import SwitchOutcome
    from lanectl.lanes.plan import Plan
    from lanectl.lanes.switcher import LaneSwitcher, Reporter

# A pass that must act waits this long for a command holding the host lock (a switch in progress
# has disarmed the watchdog anyway); past it the pass skips acting and says so.
ACT_LOCK_WAIT_SECONDS = 5.0
RUN_DEFAULT_INTERVAL_SECONDS = 5.0


def _exit(state: ContainerState) -> str:
    """`exited (exit code 137)`; an exit 0 (or the exit guard's 70) says why it is a death all the same. A container
    that did not exit says what it is instead: paused (`docker pause`), restarting, created and never started."""
    if state.exit_code is None:
        return {"paused": "is paused (docker pause): it answers nothing until `docker unpause`",
                "restarting": "is restarting (a restart policy lanectl did not set)",
                "created": "was created and never started"}.get(state.status, state.status)
    return f"{state.status} ({exit_code_text(state.exit_code)})"


@frozen
class PassResult:
    """One watchdog pass: its exit code for cron, the lane it watched, and what it did."""

    exit_code: int
    lane: str | None
    action: str
    reason: str
    outcome: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "lane": self.lane, "action": self.action, "reason": self.reason,
                "outcome": self.outcome}


@frozen
class ProbeRound:
    """The endpoint probes of one run of a lane's primary: /health, then the generation when due."""

    lane: str
    started_at: str | None  # the primary run probed: an answer about an earlier run is stale
    health: ProbeResult
    generation: ProbeResult | None
    finished: float  # UNIX time
    # `run` mode: how many other rounds were still waiting for their answers when this one came (rounds overlap,
    # so a hung engine's timeouts are not waited out one after another).
    overlapping: int = 0


def probe_round(endpoints: EndpointProbe, lane: str, started_at: str | None, generate: bool) -> ProbeRound:
    health = endpoints.health_ok()
    generation = endpoints.generate() if health.ok and generate else None
    return ProbeRound(lane, started_at, health, generation, time.time())


class Watchdog:
    def __init__(self, catalog: Catalog, directory: Path, *, engine: ContainerEngine, reporter: Reporter,
                 kernel_log: Any | None = None, kernel_log_problem: str | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 gpu_wait: Callable[[list[str] | None, float, int], str] | None = None,
                 gpu_inventory: Callable[[], list[Gpu] | None] | None = None):
        self.catalog = catalog
        self.directory = directory
        self.engine = engine
        self.reporter = reporter
        self.kernel_log = kernel_log
        self.kernel_log_problem = kernel_log_problem
        self.now = now
        self.files = StateFiles(directory)
        self.journal = Journal(self.files.journal)
        self.lanes = LaneStateStore(self.files.lanes)
        self.memory = WatchdogStateStore(self.files.watchdog)
        if gpu_wait is None:
            from lanectl.host.gpu_memory import wait_for_release

            gpu_wait = wait_for_release
        self.gpu_wait = gpu_wait
        if gpu_inventory is None:
            from lanectl.host.gpu_inventory import query_gpus

            gpu_inventory = query_gpus
        self.gpu_inventory = gpu_inventory

    # -- arm state -----------------------------------------------------------------------------------

    def arm(self) -> LaneState:
        return self.lanes.update(LaneState.armed)

    def rearm(self) -> tuple[LaneState, str]:
        """For cron: re-arm only when a lease has run out; an operator's live lease is respected."""
        state = self.lanes.load()
        now = self.now()
        if state.watchdog_lease is not None and state.lease_expired(now):
            state = self.lanes.update(LaneState.armed)
            self.journal.append("watchdog", event="rearmed", message="maintenance lease expired; re-armed")
            return state, "re-armed: the maintenance lease had expired"
        if state.watchdog_lease is not None:
            return state, f"still disarmed until {state.watchdog_lease.until} ({state.watchdog_lease.reason})"
        return state, "armed" if state.watchdog_armed else "disarmed (no lease: `lanectl watchdog arm` arms it)"

    def disarm(self, seconds: float, reason: str, by: str) -> LaneState:
        had_file = self.lanes.path.exists()
        before = self.lanes.load()
        state = self.lanes.update(lambda s: s.disarmed_for(seconds, reason, by, self.now()))
        try:
            self.journal.append("watchdog", event="disarmed", message=f"disarmed for {seconds:.0f} s: {reason}")
        except Exception:
            # Both or neither: an unguarded box that its journal does not explain is worse than a refused
            # disarm. Only the watchdog's own fields go back, so a pass that ran meanwhile keeps its changes.
            if had_file:
                self.lanes.update(lambda s: replace(s, watchdog_armed=before.watchdog_armed,
                                                    watchdog_lease=before.watchdog_lease))
            else:
                self.lanes.path.unlink(missing_ok=True)
            raise
        return state

    # -- one pass ------------------------------------------------------------------------------------

    def check(self, probes: ProbeRound | None = None, *, probe: bool = True) -> PassResult:
        """One pass. Passes never overlap: a cron pass that finds another still running (a restart
        waiting out a long startup budget) skips, and leaves the lane to it.

        The pass probes the lane's endpoints itself, unless `probe` is False: `run` probes in rounds
        of its own and hands each answer to one pass as `probes` (see `run`).

        A pass that fails (a state file it cannot use, an engine error, a bug) does not raise: it is
        journaled where the journal can be written and comes back as a result saying why, with the
        error's exit code (2 for bad state or set-up, and for anything unexpected), so `run` goes on
        to its next pass and `check` exits with the cause instead of a traceback.
        """
        try:
            return self._guarded_check(probes, probe)
        except Exception as exc:
            exit_code = exc.exit_code if isinstance(exc, LanectlError) else EXIT_BAD_INPUT
            detail = str(exc) if isinstance(exc, LanectlError) else f"{type(exc).__name__}: {exc}"
            result = PassResult(exit_code, None, "none", f"pass failed: {detail}")
            try:
                self.journal.append("watchdog", event="pass-failed", message=result.reason)
            except Exception as journal_error:  # the journal itself may be what is broken
                self.reporter.note(f"the failed pass could not be journaled either: {journal_error}")
            return result

    def _guarded_check(self, probes: ProbeRound | None, probe: bool) -> PassResult:
        import fcntl

        guard_path = self.files.watchdog_pass_lock
        check_state_file(guard_path)
        fd = os.open(guard_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return PassResult(EXIT_OK, None, "none", "skipped: another watchdog pass is still running")
            return self._check(probes, probe)
        finally:
            os.close(fd)

    def _load_memory(self) -> WatchdogRecord:
        record = self.memory.load()
        if self.memory.problem:
            self.reporter.note(self.memory.problem)
            self.journal.append("watchdog", event="state-moved-aside", message=self.memory.problem)
        return record

    def _check(self, probes: ProbeRound | None, probe: bool) -> PassResult:
        started = time.monotonic()
        record = self._load_memory()
        state = self.lanes.load()
        switching = self._switch_in_progress(state)
        if switching is not None:
            # The switch stops and starts lanes on purpose: what this pass would see is its work, not a death.
            result = PassResult(EXIT_OK, state.active, "none", f"a switch is in progress ({switching}); its lanes "
                                "are not judged until it ends")
            self._finish(record, result, started, self.now(), False, None)
            return result
        reconciled = self._reconcile_dead_switch(state)
        if reconciled is not None:
            # What the reconciled state says is active is what this pass watches; it acts from the next pass on.
            result = PassResult(EXIT_FAILED, reconciled.lane, "reconcile", reconciled.message, reconciled.result)
            self._finish(record, result, started, self.now(), True, None)
            return result
        now = self.now()
        armed = state.watchdog_armed_at(now)
        standbys = self._check_standbys(armed)
        if state.active is not None and standbys.load().standby(state.active) is not None:
            # A lane recorded asleep is never probed or restarted: vLLM queues a request to it, unanswered until
            # a wake. Only a switch killed between the sleep and the new lane's gate leaves the active lane
            # asleep; the next up/rollback ends it.
            result = PassResult(EXIT_FAILED, state.active, "none",
                                f"the active lane {state.active} is recorded asleep (a standby): an unfinished switch? "
                                "not acting; the next `lanectl up` or `rollback` finishes or undoes it")
            self._finish(record, result, started, now, armed, None)
            return result
        if state.active is None:
            result = PassResult(EXIT_OK, None, "none", "no active lane: nothing to watch")
            self._finish(record, result, started, now, armed, None)
            return result
        lane = self.catalog.lanes.get(state.active)
        if lane is None:
            result = PassResult(EXIT_BAD_INPUT, state.active, "none",
                                f"the active lane {state.active} is not in the recipes; fix LANECTL_RECIPES")
            self._finish(record, result, started, now, armed, None)
            return result
        observation, record = self._observe(lane, record, now, probes, probe)
        decision = decide(observation, record.memory, lane.spec.watchdog, now=now, armed=armed,
                          startup_budget_seconds=lane.spec.health.startup_budget_minutes * 60)
        record = self._count_xids(replace(record, memory=decision.memory), decision)
        outcome = None
        xids = (*decision.xid_application, *decision.xid_hardware, *decision.xid_unlisted)
        if decision.failing or decision.action != "none" or xids:
            self.journal.append("watchdog", event="observation", lane=lane.name, action=decision.action,
                                armed=armed, reason="; ".join((decision.reason, *observation.xid_notes)),
                                xids=[x.line for x in xids],
                                **({"rounds_overlapping": probes.overlapping} if probes is not None else {}))
        if armed and decision.action in ("restart", "rollback", "stop"):
            outcome, record = self._act(lane, decision, record)
        exit_code = EXIT_OK if not decision.failing and decision.action == "none" else EXIT_FAILED
        reason = "; ".join((decision.reason, *observation.xid_notes))
        result = PassResult(exit_code, lane.name, decision.action, reason, outcome)
        self._finish(record, result, started, now, armed, lane)
        return result

    def _check_standbys(self, armed: bool) -> StandbyStore:
        """Lanes waiting asleep are not watched like the active lane (no probe, restart or alert: asleep, they
        leave every request unanswered until a wake, by design), but one that died, was removed or was paused is
        dropped, and what is left of it live is stopped with its own drain (`plan_drop_lost_standbys`): the next
        rollback to it says it starts cold rather than trying to wake a process that cannot answer, and its GPUs
        are free for the active lane's restart. Disarmed, the pass only says so: a switch or the next armed pass
        drops it."""
        store = StandbyStore(StateFiles(self.directory).standby)
        if not store.load().standbys or self.engine is None:
            return store
        from lanectl.state.lock import LockBusy, engine_lock

        switcher = self._switcher(None)
        found = switcher.drop_lost_standbys(act=False)
        if found is None:
            return store
        if not armed:
            for name, reason in _forgotten(found[0]):
                self.reporter.note(f"the standby of {name} is gone: {reason}; the watchdog is disarmed, so the next "
                                   "armed pass or switch drops it")
            return store
        lock = engine_lock("lanectl watchdog: drop a lost standby")
        try:
            lock.acquire(ACT_LOCK_WAIT_SECONDS)
        except LockBusy as exc:
            self.reporter.note(f"a standby is lost; not dropped this pass: {exc}")
            return store
        try:
            dropped = switcher.drop_lost_standbys()  # looked at again, under the lock: what it acts on
        finally:
            lock.release()
        if dropped is None:
            return store
        plan, outcome = dropped
        for name, reason in _forgotten(plan):
            message = (f"the standby of {name} is gone: {reason}; dropped, a rollback to it will be a cold start"
                       + (f" ({outcome.message})" if outcome is not None else ""))
            self.journal.append("watchdog", event="standby-lost", lane=name, message=message)
            self.reporter.note(message)
        return store

    def _observe(self, lane: Lane, record: WatchdogRecord, now: datetime, probes: ProbeRound | None,
                 probe: bool) -> tuple[Observation, WatchdogRecord]:
        states = {role: self.engine.container(lane.container_name(role)) for role in lane.roles}
        down = [(role, s) for role, s in states.items() if s is None or not s.running]
        container_detail = "; ".join(f"{role} {'is gone' if s is None else _exit(s)}" for role, s in down)
        primary = states[ROLE_PRIMARY]
        started = primary.started_epoch if primary else None
        health_ok = generation_ok = None
        health_detail = generation_detail = ""
        if primary is not None and primary.running:
            endpoints = EndpointProbe(probe_base_url(lane), lane.spec.health)
            if probe:
                # While failures are counted, every pass generates: /health can answer 200 for an engine
                # that no longer steps (vllm#39863), so it alone must not clear a failed generation.
                failing = record.memory.for_lane(lane.name).consecutive_failures > 0
                due = (failing or record.last_generation_probe is None or time.time() - record.last_generation_probe
                       >= lane.spec.health.generation_probe.interval_seconds)
                probes = probe_round(endpoints, lane.name, primary.started_at, due)
            if probes is not None and (probes.lane, probes.started_at) == (lane.name, primary.started_at):
                health_ok, health_detail = probes.health.ok, probes.health.detail
                if probes.generation is not None:
                    generation_ok, generation_detail = probes.generation.ok, probes.generation.detail
                    record = replace(record, last_generation_probe=probes.finished)
        fatal: list[str] = []
        if primary is not None:
            since = record.log_since if record.log_since and started and record.log_since > started else started
            if since:
                fatal = fatal_engine_lines(log_lines(self.engine.logs(lane.container_name(), since=since)),
                                           lane.spec.watchdog.fatal_log_lines)
        xids, record = self._read_xids(record)
        xids, xid_notes, record = self._xids_on_lane(lane, xids, record)
        memory = record.memory.for_lane(lane.name)
        if memory.ready_since_start and started and record.log_since and started > record.log_since:
            memory = replace(memory, ready_since_start=False)  # a new run of the container: a new startup
        record = replace(record, log_since=now.timestamp(), memory=memory)
        observation = Observation(
            lane=lane.name, containers_running=not down, container_detail=container_detail,
            health_ok=health_ok, health_detail=health_detail, generation_ok=generation_ok,
            generation_detail=generation_detail, fatal_lines=tuple(fatal), xids=tuple(xids),
            started_at=datetime.fromtimestamp(started, UTC) if started else None, xid_notes=tuple(xid_notes),
        )
        return observation, record

    def _read_xids(self, record: WatchdogRecord) -> tuple[list[XidEvent], WatchdogRecord]:
        if self.kernel_log is None:
            return [], record
        lines, cursor = self.kernel_log.read_new(record.kernel_cursor)
        events = [event for line in lines if (event := believed_xid(line)) is not None]
        return events, replace(record, kernel_cursor=cursor)

    def _xids_on_lane(self, lane: Lane, events: list[XidEvent], record: WatchdogRecord
                      ) -> tuple[list[XidEvent], list[str], WatchdogRecord]:
        """The Xids on the lane's GPUs, and notes where that was a guess; the others are journaled
        and counted, and never stop or restart the lane."""
        if not events:
            return [], [], record
        gpus = self.gpu_inventory()
        wanted = _lane_gpus(lane)
        on_lane: list[XidEvent] = []
        notes: list[str] = []
        totals = dict(record.xid_total)
        for event in events:
            ours, note = xid_on_lane(event, wanted, gpus)
            if ours:
                on_lane.append(event)
                if note and note not in notes:
                    notes.append(note)
                continue
            totals[str(event.code)] = totals.get(str(event.code), 0) + 1
            self.journal.append("watchdog", event="xid-elsewhere", lane=lane.name, xid=event.code, pci=event.pci,
                                message=f"{note}: recorded, not acted on", line=event.line)
        return on_lane, notes, replace(record, xid_total=totals)

    def _count_xids(self, record: WatchdogRecord, decision: Decision) -> WatchdogRecord:
        totals = dict(record.xid_total)
        for event in (*decision.xid_application, *decision.xid_hardware, *decision.xid_unlisted):
            totals[str(event.code)] = totals.get(str(event.code), 0) + 1
        return replace(record, xid_total=totals, xid_hardware_total=record.xid_hardware_total
                       + len(decision.xid_hardware))

    # -- acting --------------------------------------------------------------------------------------

    def _switch_in_progress(self, state: LaneState) -> str | None:
        """Who is switching, when a switch's lease is on and its engine lock is held."""
        lease = state.watchdog_lease
        if lease is None or not lease.reason.startswith(SWITCH_LEASE_PREFIX) or state.lease_expired(self.now()):
            return None
        from lanectl.state.lock import engine_lock

        holder = engine_lock("lanectl watchdog").holder_now()
        return None if holder is None else f"{lease.reason}, by {holder}"

    def _reconcile_dead_switch(self, state: LaneState) -> SwitchOutcome | None:
        """A switch disarms the watchdog for its lease. When the switch that set the lease is dead (its engine
        lock is free), the box must not stay unguarded for the rest of the lease: the switch is finished or
        undone now, under the lock, before anything is decided (a killed switch must never be followed by a
        restart of the lane it was leaving: two lanes on one GPU). A switch killed past its last step has
        cleared its lease already and left its intent without an outcome: it is finished the same way (the
        journal's last switch record says so, read from the end)."""
        if self.engine is None:
            return None
        lease = state.watchdog_lease
        if lease is None or not lease.reason.startswith(SWITCH_LEASE_PREFIX):
            if not Journal(self.files.journal).last_switch_open():
                return None
        elif state.lease_expired(self.now()) and Journal(self.files.journal).unfinished_intent() is None:
            return None
        from lanectl.state.lock import LockBusy, engine_lock

        lock = engine_lock("lanectl watchdog reconcile")
        try:
            lock.acquire(0)
        except LockBusy:
            return None  # the switch is alive and will re-arm the watchdog itself
        try:
            outcome = self._switcher(None).reconcile()
        finally:
            lock.release()
        if outcome is None:
            return None
        if outcome.signum is not None:
            raise SystemExit(128 + outcome.signum)
        self.journal.append("watchdog", event="reconciled", lane=outcome.lane, message=outcome.message)
        self.reporter.note(f"reconciled a switch that died with its lease: {outcome.message}")
        return outcome

    def _switcher(self, lane: Lane | None) -> LaneSwitcher:
        from lanectl.lanes.switcher import LaneSwitcher

        return LaneSwitcher(self.catalog, self.engine, self.journal, self.lanes, reporter=self.reporter,
                            no_gpu=lane is not None and self._lane_ran_without_gpus(lane))

    def _act(self, lane: Lane, decision: Decision, record: WatchdogRecord) -> tuple[str, WatchdogRecord]:
        from lanectl.state.lock import LockBusy, engine_lock

        lock = engine_lock(f"lanectl watchdog {decision.action} {lane.name}")
        try:
            lock.acquire(ACT_LOCK_WAIT_SECONDS)
        except LockBusy as exc:
            return f"skipped: {exc}", record
        try:
            switcher = self._switcher(lane)
            reconciled = switcher.reconcile()
            if reconciled is not None:
                # The lane this pass judged may not be the active one any more: the next pass judges again.
                message = f"reconciled an unfinished switch first ({reconciled.message}); not acting this pass"
                self.journal.append("watchdog", event="reconciled", lane=reconciled.lane, message=message)
                return message, record
            if decision.action == "restart":
                gpus = lane.spec.engine.gpus.device_ids if lane.spec.engine.gpus else None
                # Counted before it runs: a pass killed mid-restart has used one of the budget's restarts, and the
                # next pass, which finishes or undoes it, must not count it again.
                memory = replace(record.memory, restarts=(*record.memory.restarts, utc_timestamp(self.now())),
                                 consecutive_failures=0, ready_since_start=False)
                totals = {**record.restarts_total, lane.name: record.restarts_total.get(lane.name, 0) + 1}
                uncounted, record = record, replace(record, memory=memory, restarts_total=totals,
                                                    last_generation_probe=None)
                self.memory.save(record)
                try:
                    kept = kept_asleep_mib(self.catalog, StandbyStore(self.files.standby).load(), lane)
                    outcome = switcher.restart(lane, before_start=lambda: self.gpu_wait(
                        gpus, lane.spec.watchdog.gpu_memory_release_timeout_seconds, kept))
                except LanectlError as exc:
                    # Refused before any change (another lane holds its GPUs, a foreign container): no restart ran,
                    # so none is counted; a refusal that used the budget would send a lane nobody restarted to
                    # its rollback.
                    message = f"not restarted: {exc}"
                    self.memory.save(uncounted)
                    self._alert("critical", lane, f"watchdog could not restart {lane.name}", message, decision)
                    return message, self._after_action(uncounted, decision, message)
                severity = "warning" if outcome.result == "ok" else "critical"
            elif decision.action == "rollback":
                try:
                    outcome = switcher.rollback(None)
                except LanectlError as exc:
                    switcher.down(lane.name)
                    outcome_message = f"no way back ({exc}); {lane.name} stopped"
                    record = replace(record, rollbacks_total=record.rollbacks_total + 1)
                    self._alert("critical", lane, "crash loop and no lane to roll back to", outcome_message,
                                decision)
                    return outcome_message, self._after_action(record, decision, outcome_message)
                record = replace(record, rollbacks_total=record.rollbacks_total + 1,
                                 memory=replace(record.memory, lane=None))
                severity = "critical"
            else:
                outcome = switcher.down(lane.name)
                severity = "critical"
        finally:
            lock.release()
        self._alert(severity, lane, f"watchdog {decision.action} of {lane.name}", outcome.message, decision)
        record = self._after_action(record, decision, outcome.message)
        if outcome.signum is not None:
            # The signal that interrupted the action (the service manager stopping the watchdog, Ctrl-C) was taken
            # by the switch for its way back; it still ends this watchdog, once the pass is recorded.
            self.memory.save(record)
            raise SystemExit(128 + outcome.signum)
        return f"{outcome.result}: {outcome.message}", record

    def _after_action(self, record: WatchdogRecord, decision: Decision, outcome: str) -> WatchdogRecord:
        return replace(record, last_action={"ts": utc_timestamp(self.now()), "action": decision.action,
                                            "reason": decision.reason, "outcome": outcome})

    def _lane_ran_without_gpus(self, lane: Lane) -> bool:
        """Restart a lane the way it was started: a lane brought up with --no-gpu has no device requests."""
        state = self.engine.container(lane.container_name())
        return lane.spec.engine.gpus is not None and state is not None and not state.device_requests

    def _alert(self, severity: str, lane: Lane, title: str, detail: str, decision: Decision) -> None:
        from lanectl.state.journal import current_user_at_host
        from lanectl.watchdog.alerts import Alert, WebhookAlerter

        facts = {"reason": decision.reason}
        for event in decision.xid_hardware or decision.xid_application:
            facts.update({"xid": str(event.code), "pci": event.pci or "?"})
        alert = Alert(severity=severity, lane=lane.name, title=title, detail=detail,
                      host=current_user_at_host().split("@")[-1], ts=utc_timestamp(self.now()), facts=facts)
        # Well under the poll interval, so an alert never costs the next probe; at least a second to connect.
        deadline = min(10.0, max(1.0, lane.spec.health.poll_interval_seconds / 2))
        delivery = WebhookAlerter(lane.spec.watchdog.alert.webhook_url_env, deadline_seconds=deadline).send(alert)
        self.journal.append("watchdog", event="alert", lane=lane.name, severity=severity, title=title,
                            delivered=delivery.delivered, detail=delivery.detail)

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _finish(self, record: WatchdogRecord, result: PassResult, started: float, now: datetime, armed: bool,
                lane: Lane | None) -> None:
        seconds = time.monotonic() - started
        record = replace(record, last_pass=utc_timestamp(now), last_pass_result=f"{result.action}: {result.reason}",
                         last_pass_seconds=round(seconds, 3), heartbeat=utc_timestamp(self.now()))
        self.memory.save(record)
        if lane is not None and lane.spec.watchdog.alert.textfile_dir:
            self._write_metrics(lane, record, result, seconds, now, armed)

    def _write_metrics(self, lane: Lane, record: WatchdogRecord, result: PassResult, seconds: float, now: datetime,
                       armed: bool) -> None:
        from lanectl.watchdog.alerts import PrometheusTextfile, WatchdogMetrics

        metrics = WatchdogMetrics(
            lanes_up={lane.name: result.exit_code == EXIT_OK}, restarts_total=dict(record.restarts_total),
            rollbacks_total=record.rollbacks_total, xid_total={int(k): v for k, v in record.xid_total.items()},
            xid_hardware_total=record.xid_hardware_total, last_pass_timestamp=now.timestamp(),
            last_pass_duration_seconds=seconds, armed=armed, heartbeat_timestamp=time.time())
        try:
            PrometheusTextfile(Path(lane.spec.watchdog.alert.textfile_dir or "")).write(metrics)
        except LanectlError as exc:  # metrics are a report; failing to write them must not stop the watchdog
            self.journal.append("watchdog", event="metrics-not-written", message=str(exc))

    # -- the long-running mode -----------------------------------------------------------------------

    def run(self, stop: threading.Event, on_pass: Callable[[PassResult, str], None] = lambda r, why: None) -> None:
        """Passes on Docker events (a container died, stopped, got unhealthy), on kernel-log lines,
        and on the answer of each probe round; survives the engine restarting (reconnects with backoff).

        A round of probes is issued at every poll interval, each in its own thread, without waiting
        for the rounds before it, and its answer, when it comes, is one pass's observation. So a hung
        engine, whose every generation probe waits out its timeout, is acted on after N failed rounds
        in interval x N + timeout, not N x timeout. At most N rounds (the policy's
        failures_before_action) are in flight: more could not bring the decision sooner. An interval
        that issues no round (no lane serving, N rounds still out) has a pass without probes.
        """
        wake: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._follow_docker_events, args=(wake, stop), daemon=True).start()
        if self.kernel_log is not None:
            threading.Thread(target=self._follow_kernel_log, args=(wake, stop), daemon=True).start()
        rounds = _ProbeRounds(lambda: wake.put("interval"))
        why = "start"
        next_round = time.monotonic()
        while not stop.is_set():
            # Never raises: a failed pass is journaled and the next one runs.
            result = self.check(rounds.answered(), probe=False)
            on_pass(result, why)
            if rounds.waiting():
                continue  # each answered round has its pass
            why = "stop"
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_round:
                    interval, target = self._probe_target()
                    next_round = now + interval
                    if target is None or not rounds.issue(*target):
                        why = "interval"
                        break
                try:
                    why = wake.get(timeout=next_round - now if now < next_round else 0)
                except queue.Empty:
                    continue
                while not wake.empty():  # one pass answers a burst of events
                    wake.get_nowait()
                break

    def _probe_target(self) -> tuple[float, tuple[Lane, str | None, EndpointProbe] | None]:
        """The poll interval, and the lane to probe now with the primary run it is on, if one serves."""
        try:
            active = self.lanes.load().active
            lane = self.catalog.lanes.get(active) if active else None
            if lane is None:
                return RUN_DEFAULT_INTERVAL_SECONDS, None
            interval = lane.spec.health.poll_interval_seconds
            primary = self.engine.container(lane.container_name())
            if primary is None or not primary.running:
                return interval, None
            endpoints = EndpointProbe(probe_base_url(lane), lane.spec.health)
        except Exception:  # the pass reports it; the watchdog keeps its rhythm meanwhile
            return RUN_DEFAULT_INTERVAL_SECONDS, None
        return interval, (lane, primary.started_at, endpoints)

    def _follow_docker_events(self, wake: queue.Queue[str], stop: threading.Event) -> None:
        backoff = 0.5
        while not stop.is_set():
            try:
                events = self.engine.container_events("io.lanectl.lane")
                backoff = 0.5
                for event in events.json_objects():
                    if stop.is_set():
                        events.close()
                        return
                    status = str(event.get("status", ""))
                    if status in ("die", "stop", "kill", "oom") or status.startswith("health_status"):
                        wake.put(f"docker {status} {event.get('Actor', {}).get('Attributes', {}).get('name', '')}")
            except Exception:  # the engine went away (restart, upgrade): reconnect with backoff
                wake.put("engine connection lost")
                stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _follow_kernel_log(self, wake: queue.Queue[str], stop: threading.Event) -> None:
        """Wakes a pass on each Xid line; the pass itself reads the lines again from its cursor."""
        assert self.kernel_log is not None
        while not stop.is_set():
            try:
                for line in self.kernel_log.follow(None, stop):
                    if believed_xid(line) is not None:
                        wake.put(f"kernel log: {line.text.strip()[:120]}")
            except Exception as exc:  # a source that fails now may work in a moment (log rotation, dmesg)
                wake.put(f"kernel log unreadable: {type(exc).__name__}: {exc}"[:200])
                stop.wait(RUN_DEFAULT_INTERVAL_SECONDS)


class _ProbeRounds:
    """`run`'s probe rounds in flight, and their answers in the order they came."""

    def __init__(self, on_answer: Callable[[], None]):
        self.on_answer = on_answer
        self.lock = threading.Lock()
        self.in_flight = 0
        self.answers: deque[ProbeRound] = deque()
        self.last_generation: tuple[str, str | None, float] | None = None  # lane, primary run, monotonic
        self.failing = False  # the last answer had a failed probe: generate in every round until one passes

    def issue(self, lane: Lane, started_at: str | None, endpoints: EndpointProbe) -> bool:
        """Start a round in its own thread; False when the lane's N rounds are all still out."""
        with self.lock:
            if self.in_flight >= lane.spec.watchdog.failures_before_action:
                return False
            self.in_flight += 1
        now = time.monotonic()
        last = self.last_generation
        generate = (self.failing or last is None or last[:2] != (lane.name, started_at)
                    or now - last[2] >= lane.spec.health.generation_probe.interval_seconds)
        if generate:
            self.last_generation = (lane.name, started_at, now)
        threading.Thread(target=self._round, args=(endpoints, lane.name, started_at, generate), daemon=True).start()
        return True

    def _round(self, endpoints: EndpointProbe, lane: str, started_at: str | None, generate: bool) -> None:
        try:
            answer = probe_round(endpoints, lane, started_at, generate)
        except Exception as exc:  # probes answer failures as results; anything else is a failed round
            answer = ProbeRound(lane, started_at, ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}",
                                                              0.0), None, time.time())
        with self.lock:
            self.in_flight -= 1
            self.answers.append(replace(answer, overlapping=self.in_flight))
            if answer.generation is not None or not answer.health.ok:  # /health alone never clears it
                self.failing = not answer.health.ok or not (answer.generation and answer.generation.ok)
        self.on_answer()

    def answered(self) -> ProbeRound | None:
        with self.lock:
            return self.answers.popleft() if self.answers else None

    def waiting(self) -> bool:
        with self.lock:
            return bool(self.answers)


def _forgotten(plan: Plan) -> list[tuple[str, str]]:
    """The standbys a plan forgets, with why."""
    return [(step.lane, step.why) for phase in plan.phases for step in phase.steps if step.action == "forget-standby"]


def _lane_gpus(lane: Lane) -> LaneGpus:
    """Every GPU the lane's containers ask for, the companions' included."""
    requests = [lane.spec.engine.gpus, *(companion.engine.gpus for companion in lane.spec.companions.values())]
    device_ids: list[str] = []
    count = 0
    every = False
    for request in requests:
        if request is None:
            continue
        device_ids += request.device_ids or []
        if request.count == "all":
            every = True
        elif isinstance(request.count, int):
            count = max(count, request.count)
    return LaneGpus(device_ids=tuple(device_ids), count=count, all=every)


def kept_asleep_mib(catalog: Catalog, standbys: StandbyState, lane: Lane) -> int:
    """GPU memory the standbys asleep on the lane's GPUs said they still hold (vLLM logs it as it falls asleep,
    and the sleep step records it): a restart beside them waits for the crashed engine's memory alone."""
    from lanectl.lanes.invariants import gpus_overlap

    kept = 0.0
    for record in standbys.standbys:
        standby = catalog.lanes.get(record.lane)
        if standby is not None and record.resident_gib and gpus_overlap(standby, lane):
            kept += record.resident_gib
    return math.ceil(kept * 1024)
