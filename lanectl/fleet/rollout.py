"""Running a fleet plan: each step as the plan says, nothing else, one node at a time, canary first.

Per node, Swarm does the work: a stop-first update of each role's service, held to the recipe's health check,
rolled back by Swarm itself when the new task fails it (`UpdateStatus` then reads `rollback_completed`). lanectl
then holds the node to the same health gate as a local `up` (models list, startup log, fatal lines, a generated
token), because Swarm's check only sees /health. The first step that fails stops the rollout, and the plan's way
back runs for every node this run changed, the last one first.

Every step is journaled under its plan key behind an intent that names them all (`fleet-journal.jsonl`), so
`--dry-run --json` lists what the journal then shows. A first Ctrl-C or SIGTERM lets the step in progress finish,
then stops: the message says what serves on each node and the way back, the journal keeps the switch
unfinished, and the next `up --fleet` (which plans the rest from what the Swarm shows) or `rollback --fleet`
(which takes back exactly the nodes it moved) continues from the record. A second signal stops at once.
Each node is leased (a node label) while it changes.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from lanectl.dockerapi.swarm import ServiceState, SwarmEngine, TaskInfo
from lanectl.errors import BadInput, OperationFailed
from lanectl.fleet.node_lease import (
    LEGACY_LEASE_SECONDS,
    NodeLease,
    closed_switches,
    pid_alive,
    read_lease,
    why_left_behind,
)
from lanectl.fleet.plan import FLEET_ROLLBACK, FLEET_UP, not_pushed
from lanectl.fleet.services import (
    ROLLED_BACK,
    SECOND_NS,
    UPDATE_DONE,
    UPDATE_FAILED_STATES,
    UPDATE_IN_PROGRESS,
    NodeInfo,
    current_task,
    service_name,
    spec_mark,
    task_problem,
    why_swarm_rolled_back,
)
from lanectl.health.drain import DrainReport, drain_report
from lanectl.health.engine_http import engine_url
from lanectl.health.engine_log import log_lines
from lanectl.health.gate import (
    INTERRUPTED,
    PROBE_ACCESS_LINE,
    Clock,
    CompanionGate,
    ContainerStatus,
    GateResult,
    HealthGate,
    MonotonicClock,
)
from lanectl.health.lane_gate import gate_lane
from lanectl.image.render import plan_image
from lanectl.lanes.execute import Reporter, StepSeams, announce_notes
from lanectl.lanes.interrupt import Interrupt, SwitchAborted
from lanectl.lanes.plan import Phase, Plan, Step
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.records import frozen
from lanectl.state.journal import Journal, current_user_at_host
from lanectl.state.pushes import PushStore

# How long past the startup budget a node's lease counts as held: a lease older than that was left
# by a run that died, and is taken over.
LEASE_MARGIN_SECONDS = 300
# Swarm's UpdateStatus.StartedAt comes from the manager's clock; allow it to be a little behind ours.
CLOCK_SLACK_SECONDS = 2.0
SWARM_ROLLED_BACK = "Swarm rolled back the update: "
# Test seam: the window (seconds) Swarm watches a new task after its first healthy answer, in place of the one the
# health check implies (three missed checks and a timeout, 8 s for the test lanes). The two-node Swarm tests pay it
# at each of their ~25 updates and rollbacks and none of their lanes falls over after its first healthy answer,
# which is all the window watches for. Swarm's health check, and its rollback of a task that fails it, are as sent.
MONITOR_SECONDS_ENV = "LANECTL_TEST_SWARM_MONITOR_SECONDS"


@frozen
class NodeOutcome:
    node: str
    result: str  # ok | unchanged | failed | rolled-back-by-swarm | rolled-back | not-reached
    detail: str


@frozen
class FleetOutcome:
    result: str  # ok | noop | rolled-back | failed | interrupted | aborted
    message: str
    lane: str | None
    nodes: tuple[NodeOutcome, ...] = ()
    diagnostics: dict[str, Any] = field(default_factory=dict)
    steps: tuple[str, ...] = ()  # the plan keys journaled, in order
    drains: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> role -> its requests in flight
    signum: int | None = None  # the signal that interrupted it

    @property
    def exit_code(self) -> int:
        if self.signum is not None:
            return 128 + self.signum  # as on the box: a shell reports a command ended by that signal so
        return 0 if self.result in ("ok", "noop") else 1

    def as_dict(self) -> dict[str, Any]:
        return {"result": self.result, "message": self.message, "lane": self.lane,
                "nodes": [vars(n) for n in self.nodes], "diagnostics": self.diagnostics, "steps": list(self.steps),
                "drains": self.drains}


class GateInterrupted(Exception):
    """A node's gate stopped waiting for a first signal: not a failed step, nor a done one (the rollout that
    continues the switch gates the node)."""


class StepFailed(Exception):
    def __init__(self, message: str, *, check: str, exit_code: int | None = None,
                 log_tail: list[str] | None = None, logs_tell: bool = True):
        super().__init__(message)
        self.check = check
        self.exit_code = exit_code
        self.log_tail = log_tail or []
        self.logs_tell = logs_tell  # whether the service's log can say why (not for a refusal before any start)


class SwarmLogSource:
    """The log of the service's current task from its start; a task Swarm replaced starts afresh."""

    def __init__(self, swarm: SwarmEngine, service_id: str):
        self.swarm, self.service_id, self.task_id, self.seen = swarm, service_id, "", 0

    def new_lines(self) -> list[str]:
        task = current_task(self.swarm.tasks(self.service_id))
        if task is None:
            return []
        if task.id != self.task_id:
            self.task_id, self.seen = task.id, 0
        lines = log_lines(self.swarm.task_logs(task.id))
        fresh, self.seen = lines[self.seen:], len(lines)
        return fresh


class SwarmTaskWatch:
    def __init__(self, swarm: SwarmEngine, service_id: str):
        self.swarm, self.service_id = swarm, service_id

    def status(self) -> ContainerStatus:
        tasks = self.swarm.tasks(self.service_id)
        problem = task_problem(tasks) if tasks else None
        task = current_task(tasks)
        if problem is None and task is not None and task.state == "running":
            return ContainerStatus(running=True)
        if problem is None:  # being (re)started by Swarm: not a failure yet
            return ContainerStatus(running=True, detail=task.state if task else "no task")
        return ContainerStatus(running=False, exit_code=task.exit_code if task else None, detail=problem)


def _seamed(spec: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """`spec` as sent to Swarm: with MONITOR_SECONDS_ENV set, its update and rollback monitor that long."""
    raw = environ.get(MONITOR_SECONDS_ENV)
    if not raw:
        return spec
    monitor = int(float(raw) * SECOND_NS)
    return {**spec, "UpdateConfig": {**spec["UpdateConfig"], "Monitor": monitor},
            "RollbackConfig": {**spec["RollbackConfig"], "Monitor": monitor}}


def node_base_url(lane: Lane, node: NodeInfo) -> str:
    return engine_url(node.addr, lane.spec.engine.ports[0].published)


def gate_on_node(swarm: SwarmEngine, lane: Lane, node: NodeInfo, service_id: str, reporter: Reporter,
                 interrupted: Callable[[], str | None] = lambda: None) -> GateResult:
    """The box's gate on the node (`gate_lane`): the primary's checks against its published port and the log of
    the service's current task, and beside them each companion's (the lane serves only once its companions
    answer)."""
    from lanectl.health.probe import EndpointProbe

    health = lane.spec.health

    def primary(stop: Callable[[], str | None]) -> GateResult:
        return HealthGate(health, EndpointProbe(node_base_url(lane, node), health),
                          SwarmLogSource(swarm, service_id), SwarmTaskWatch(swarm, service_id), MonotonicClock(),
                          reporter.gate, interrupted=stop).wait()

    def companion(role: str, budget_seconds: float, clock: Clock, stop: Callable[[], str | None]) -> GateResult:
        engine = lane.spec.companions[role].engine
        service = swarm.service(service_name(lane, role, node.hostname))
        if not engine.ports or service is None:
            return GateResult(True, None, f"{role}: not checked (it publishes no port)", 0.0, (), ())
        url = engine_url(node.addr, engine.ports[0].published)
        return CompanionGate(role, health, EndpointProbe(url, health), SwarmLogSource(swarm, service.id),
                             SwarmTaskWatch(swarm, service.id), clock, budget_seconds, interrupted=stop).wait()

    return gate_lane(primary, [functools.partial(companion, role) for role in lane.roles[1:]],
                     health.startup_budget_minutes * 60, interrupted)


class NodeGate(Protocol):
    def __call__(self, swarm: SwarmEngine, lane: Lane, node: NodeInfo, service_id: str, reporter: Reporter,
                 interrupted: Callable[[], str | None] = ...) -> GateResult: ...
InFlight = Callable[[Lane, NodeInfo, ServiceState], "int | None"]


def in_flight_on_node(lane: Lane, node: NodeInfo, service: ServiceState) -> int | None:
    """Requests the role's engine on the node runs or has waiting before its stop (vLLM's /metrics), as on the
    box; None when it publishes no port or does not say."""
    from lanectl.lanes.standby import METRICS_TIMEOUT_SECONDS, SleepEndpoints

    engine = lane.spec.engine if service.role == ROLE_PRIMARY else lane.spec.companions[service.role].engine
    if not engine.ports:
        return None
    url = engine_url(node.addr, engine.ports[0].published)
    return SleepEndpoints(url, METRICS_TIMEOUT_SECONDS).in_flight()


def pushed_image(pushes: PushStore, lane: Lane) -> str:
    """The lane's current build as its registry holds it, `repository@sha256:…`, as `build --push` recorded it.

    Nodes pull by digest, so every node runs the same bytes; a lane never pushed is refused before any change."""
    tag = plan_image(lane).tag
    record = pushes.find(tag, lane.spec.image.registry)
    if record is None:
        raise not_pushed(lane)
    return record.reference


@dataclass
class _Run:
    """What one execution of a fleet plan has seen so far."""

    switch: str
    plan: Plan
    done: list[str] = field(default_factory=list)
    changed: dict[str, list[str]] = field(default_factory=dict)  # node -> services this run created or updated
    by_swarm: set[str] = field(default_factory=set)  # services whose update Swarm rolled back itself
    created: set[str] = field(default_factory=set)  # services this run created (their way back removes them)
    drains: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> role -> its requests in flight
    results: dict[str, NodeOutcome] = field(default_factory=dict)


def _ways_on(plan: Plan) -> str:
    """The commands that continue a stopped run, and that go back, as the next run plans them."""
    if plan.kind == "rollback" and not plan.way_back:
        back = f"`lanectl up {plan.previous} --fleet`" if plan.previous else "an `up --fleet` of the lane wanted"
        return f"To continue the rollback: `lanectl rollback --fleet`; to go forward again: {back}"
    return f"To continue: `lanectl up {plan.lane} --fleet`; to go back: `lanectl rollback --fleet`"


class FleetRollout:
    def __init__(self, catalog: Catalog, swarm: SwarmEngine, journal: Journal, *, reporter: Reporter,
                 interrupt: Interrupt | None = None, environ: Mapping[str, str] | None = None,
                 gate: NodeGate = gate_on_node, in_flight: InFlight = in_flight_on_node, poll_seconds: float = 0.5,
                 clock: Callable[[], float] = time.time):
        self.catalog = catalog
        self.swarm = swarm
        self.journal = journal
        self.reporter = reporter
        self.interrupt = interrupt or Interrupt()
        self.environ = os.environ if environ is None else environ
        self.gate = gate
        self.in_flight = in_flight
        self.poll_seconds = poll_seconds
        self.holder = current_user_at_host()
        self.clock = clock
        self._seams = StepSeams(self.environ)
        self._acknowledged = False

    def run(self, plan: Plan, *, why: str, unfinished: Mapping[str, Any] | None = None) -> FleetOutcome:
        """Run `plan`. An unfinished switch in the record is continued by this one: its intent is closed with
        what continues it."""
        if unfinished is not None:
            done = len(unfinished.get("done_steps") or [])
            message = (f"the {unfinished['action']} to {unfinished.get('to')} started {unfinished['ts']} stopped "
                       f"after {done} of {len(unfinished.get('steps') or [])} step(s); `{why}` continues it from "
                       "what the Swarm shows")
            self.journal.record_outcome(unfinished["switch"], "continued", message)
            self.reporter.note(message)
        if plan.kind == "noop":
            return FleetOutcome("noop", plan.message, plan.lane)
        self._refuse_missing_secrets(plan)
        action = FLEET_ROLLBACK if plan.kind == "rollback" and not plan.way_back else FLEET_UP
        switch = self.journal.record_intent(action=action, from_lane=plan.previous, to_lane=plan.lane, why=why,
                                            steps=plan.keys)["switch"]
        run = _Run(switch, plan)
        try:
            with self.interrupt.catching():
                announce_notes(plan, switch, self.journal, self.reporter)
                return self._run(run)
        except SwitchAborted as exc:
            return self._aborted(run, exc.signum)

    def _refuse_missing_secrets(self, plan: Plan) -> None:
        """Every secret a service step sends must be in lanectl's environment before the first change: found
        mid-rollout, it would stop there with nodes changed and the rest never reached."""
        missing: dict[str, list[str]] = {}
        for step in plan.steps:
            container = ((step.service or {}).get("TaskTemplate") or {}).get("ContainerSpec") or {}
            for name in container.get("lanectl_secret_env") or []:
                if name not in self.environ:
                    missing.setdefault(name, []).append(step.container)
        if missing:
            named = "; ".join(f"{name} (for {', '.join(services)})" for name, services in sorted(missing.items()))
            raise BadInput(f"secret(s) not set in lanectl's environment: {named}; nothing was changed. Export "
                           "them and run the command again")

    def _run(self, run: _Run) -> FleetOutcome:
        nodes = {n.hostname: n for n in self.swarm.nodes()}
        for index, phase in enumerate(run.plan.phases):
            host = phase.steps[0].node
            if self.interrupt.pending():
                return self._interrupted(run)
            label = "canary" if index == 0 else f"node {index + 1}/{len(run.plan.phases)}"
            self.reporter.step(f"{label} {host}: {run.plan.lane}")
            failure = self._leased(run, nodes.get(host), phase)
            if failure is not None:
                return self._go_back(run, failure, nodes, label)
            if self.interrupt.pending() and (index + 1 < len(run.plan.phases) or not self._whole(run, phase)):
                return self._interrupted(run)
            drained = [f"{role}: {text}" for role, text in run.drains.get(host, {}).items()]
            detail = "; ".join(("serving, passed its gate", *drained))
            run.results[host] = NodeOutcome(host, "ok", detail)
        message = f"{run.plan.lane} is serving on {', '.join(run.results)}"
        self.journal.record_outcome(run.switch, "ok", message)
        return self._outcome(run, "ok", message, run.plan.lane)

    def _whole(self, run: _Run, phase: Phase) -> bool:
        return all(step.key in run.done for step in phase.steps)

    def _leased(self, run: _Run, node: NodeInfo | None, phase: Phase) -> StepFailed | None:
        if node is None or not node.schedulable:
            return StepFailed(f"node {phase.steps[0].node} is not ready and active", check="node", logs_tell=False)
        lease = NodeLease(self.holder, os.getpid(), run.switch, self.clock(), self._lease_seconds(phase))
        try:
            replaced = self.swarm.take_lease(node, lease.label(), left_behind=self._left_behind)
        except OperationFailed as exc:
            return StepFailed(str(exc), check="lease", logs_tell=False)
        if replaced is not None:
            message = f"{node.hostname}: took over the lease {replaced}"
            self.journal.append("note", switch=run.switch, lane=run.plan.lane, node=node.hostname, message=message)
            self.reporter.note(message)
        try:
            for step in phase.steps:
                if self.interrupt.pending():
                    return None
                self._step(run, node, step)
        except StepFailed as failed:
            return failed
        except GateInterrupted as stopped:
            self.reporter.note(f"{node.hostname}: gate not finished, {stopped}")
        finally:
            self.swarm.release_lease(node)
        return None

    # -- one step ----------------------------------------------------------------------------------------

    def _step(self, run: _Run, node: NodeInfo, step: Step) -> None:
        facts: dict[str, Any] = {}
        try:
            detail = self._do(run, node, step, facts)
        except OperationFailed as exc:
            self._done(run, step, f"failed: {exc}", facts, ok=False)
            raise StepFailed(f"{step.describe()}: {exc}", check="swarm", logs_tell=False) from None
        except StepFailed as failed:
            self._done(run, step, f"failed: {failed}", facts, ok=False)
            raise
        self._done(run, step, detail, facts)

    def _do(self, run: _Run, node: NodeInfo, step: Step, facts: dict[str, Any]) -> str:
        lane = self.catalog.lanes[step.lane]
        if step.action == "service-create":
            assert step.service is not None, "a plan's service step carries its spec"
            service_id = self.swarm.create_service(_seamed(step.service, self.environ), self.environ)
            run.changed.setdefault(node.hostname, []).append(step.container)
            run.created.add(step.container)
            problem = self._wait_created(lane, service_id, step.key)
            if problem is not None:
                raise StepFailed(problem, check="swarm")
            return "created; its task runs"
        if step.action == "service-update":
            return self._update(run, node, lane, step, facts)
        if step.action == "service-rollback":
            return self._rollback(run, lane, step)
        if step.action == "service-remove":
            if step.container not in run.created:  # a left-over service: its way back creates it again
                run.changed.setdefault(node.hostname, []).append(step.container)
            self.swarm.remove_service(step.container)
            self.swarm.record_gated(node, {step.container: None})
            return "removed"
        if step.action == "node-gate":
            return self._gate(lane, node, step)
        raise AssertionError(f"not a fleet step: {step.action}")

    def _update(self, run: _Run, node: NodeInfo, lane: Lane, step: Step, facts: dict[str, Any]) -> str:
        """Swarm's stop-first update; then what the stopped task's engine did with the requests it held."""
        assert step.service is not None, "a plan's service step carries its spec"
        current = self.swarm.service(step.container)
        if current is None:
            raise StepFailed(f"service {step.container} is gone since the plan was made; run the command again",
                             check="swarm")
        old = current_task(self.swarm.tasks(current.id))
        before = self.in_flight(self.catalog.lanes.get(current.lane, lane), node, current)
        mark = time.time()
        self.swarm.update_service(current, _seamed(step.service, self.environ), self.environ)
        run.changed.setdefault(node.hostname, []).append(step.container)
        problem = self._wait_update(lane, current.id, mark, step.key, rollback=False)
        drain = self._drain(old, before)
        if drain is not None:
            facts.update(in_flight=drain.in_flight, cut=drain.cut)
            run.drains.setdefault(node.hostname, {})[step.role] = drain.describe()
        if problem is not None:
            if problem.startswith(SWARM_ROLLED_BACK):
                run.by_swarm.add(step.container)
            raise StepFailed(problem, check="swarm")
        # The step's own line already lists the changes (`describe`); the journal keeps them beside the outcome.
        facts["changes"] = step.why
        return "updated" + (f"; {drain.describe()}" if drain is not None else "")

    def _drain(self, old: TaskInfo | None, before: int | None) -> DrainReport | None:
        if old is None:
            return None
        report = drain_report(log_lines(self.swarm.task_logs(old.id))[-200:], before)
        return None if report.in_flight is None and report.how == "not said" else report

    def _rollback(self, run: _Run, lane: Lane, step: Step) -> str:
        service = self.swarm.service(step.container)
        if service is None:
            return "the service is gone"
        if step.container in run.by_swarm:
            return f"Swarm had already rolled it back to {service.lane}"
        mark = time.time()
        self.swarm.rollback_service(service)
        problem = self._wait_update(lane, service.id, mark, step.key, rollback=True)
        if problem is not None:
            raise StepFailed(problem, check="swarm")
        return f"back on {lane.name}"

    def _gate(self, lane: Lane, node: NodeInfo, step: Step) -> str:
        service = self.swarm.service(step.container)
        if service is None:
            raise StepFailed(f"service {step.container} is gone", check="swarm")
        problem = self._wait_settled(lane, node, step.key)
        if problem is not None:
            raise StepFailed(problem, check="swarm")
        # The marks are taken before the gate: a service changed while the gate ran is not called gated.
        marks = self._marks(lane, node)
        missing = [name for name, mark in marks.items() if mark is None]
        if missing:  # the gate would pass over a role with no service as one that publishes no port
            raise StepFailed(f"{lane.name} cannot serve on {node.hostname}: its service(s) {', '.join(missing)} "
                             f"are missing; `lanectl up {lane.name} --fleet` creates them", check="companion",
                             logs_tell=False)
        result = self.gate(self.swarm, lane, node, service.id, self.reporter, self.interrupt.pending)
        if result.failed_check == INTERRUPTED:
            raise GateInterrupted(result.detail)
        if not result.passed:
            raise StepFailed(f"failed its health gate ({result.failed_check}): {result.detail}",
                             check=result.failed_check or "gate", exit_code=result.exit_code,
                             log_tail=[line for line in result.log_tail if not PROBE_ACCESS_LINE.search(line)][-30:])
        self.swarm.record_gated(node, marks)
        return "; ".join(("passed", *result.companions))

    def _marks(self, lane: Lane, node: NodeInfo) -> dict[str, str | None]:
        """Each of the lane's services on `node` by the mark of its spec now; a role without one, None."""
        marks: dict[str, str | None] = {}
        for role in lane.roles:
            name = service_name(lane, role, node.hostname)
            service = self.swarm.service(name)
            marks[name] = None if service is None else spec_mark(service.spec)
        return marks

    def _done(self, run: _Run, step: Step, detail: str, facts: dict[str, Any], *, ok: bool = True) -> None:
        """Journal a step that ran, show it, and honour the test seams."""
        try:
            self.journal.record_step(run.switch, step.key, detail, node=step.node, **facts)
        finally:
            run.done.append(step.key)
            self.reporter.step(f"{step.describe()} ({detail})", ok=ok)
        self._seams.step_done()

    # -- endings -----------------------------------------------------------------------------------------

    def _go_back(self, run: _Run, failure: StepFailed, nodes: Mapping[str, NodeInfo], label: str) -> FleetOutcome:
        """The plan's way back for every node this run changed, the last first; nodes not reached stay as they
        were."""
        plan = run.plan
        self.interrupt.take()  # the way back runs whole; only a second signal stops it
        host = next(p.steps[0].node for p in plan.phases if p.steps[0].node not in run.results)
        diagnostics = {"failed": str(failure), "check": failure.check, "exit_code": failure.exit_code,
                       "log_tail": failure.log_tail or (self._log_tail(plan, host) if failure.logs_tell else [])}
        self.journal.append("diagnostics", switch=run.switch, lane=plan.lane, node=host, failed=str(failure),
                            log_tail=diagnostics["log_tail"])
        if failure.check in ("lease", "node"):
            run.results[host] = NodeOutcome(host, "failed", f"left as it was: {failure}")
        elif host not in run.changed:
            run.results[host] = NodeOutcome(host, "failed", f"does not serve, and this run changed nothing there "
                                            f"to put back: {failure}")
        for phase in plan.way_back:
            back_host = phase.steps[0].node
            changed = run.changed.get(back_host)
            if not changed:
                continue
            run.results[back_host] = self._undo_node(run, nodes[back_host], phase, changed)
        reached = [p.steps[0].node for p in plan.phases]
        for other in reached:
            run.results.setdefault(other, NodeOutcome(other, "not-reached", "left as it was"))
        back = [r.node for r in run.results.values() if r.result in ("rolled-back", "rolled-back-by-swarm")]
        message = (f"{plan.lane} failed on {label} {host}: {failure}. Rollout stopped; back on the previous spec: "
                   f"{', '.join(back) or 'nothing to undo'}")
        result = "failed" if any(r.result == "failed" for r in run.results.values()) else "rolled-back"
        if plan.kind == "rollback" and not plan.way_back:
            message = f"rollback to {plan.lane} failed on {host}: {failure}; stopped there"
            result = "failed"
        self.journal.record_outcome(run.switch, result, message)
        return self._outcome(run, result, message, None, diagnostics)

    def _undo_node(self, run: _Run, node: NodeInfo, phase: Phase, changed: list[str]) -> NodeOutcome:
        notes = []
        failed = ""
        for step in phase.steps:
            if step.action != "node-gate" and step.container not in changed:
                continue
            try:
                self._step(run, node, step)
            except (StepFailed, GateInterrupted) as exc:
                failed = str(exc)
                break
            if step.action == "node-gate":
                notes.append(f"{step.lane} is serving again")
            elif step.container in run.by_swarm:
                notes.append(f"Swarm rolled {step.container} back to {step.lane}")
            else:
                notes.append(f"{'removed new service' if step.action == 'service-remove' else 'rolled back'} "
                             f"{step.container}")
        detail = "; ".join(notes) or "nothing had changed"
        if failed:
            return NodeOutcome(node.hostname, "failed", f"{detail}; {failed}".lstrip("; "))
        by_swarm = bool(run.by_swarm & set(changed)) and all(n in run.by_swarm or n in run.created for n in changed)
        return NodeOutcome(node.hostname, "rolled-back-by-swarm" if by_swarm else "rolled-back", detail)

    def _interrupted(self, run: _Run) -> FleetOutcome:
        """Stopped between two steps: what serves where, and the way back; the switch stays unfinished in the
        journal so that the next `up --fleet` or `rollback --fleet` continues it."""
        name = self.interrupt.take()
        plan = run.plan
        where = []
        for phase in plan.phases:
            host = phase.steps[0].node
            keys = [s.key for s in phase.steps]
            done = [k for k in keys if k in run.done]
            if len(done) == len(keys):
                state = f"{plan.lane} (switched, passed its gate)"
            elif done:
                state = f"mid-switch ({len(done)} of {len(keys)} steps done; Swarm finished each service it began)"
            else:
                state = f"{plan.previous or 'as it was'} (not reached)"
            where.append(f"{host}: {state}")
            run.results[host] = NodeOutcome(host, "interrupted" if done and len(done) < len(keys) else
                                            ("ok" if done else "not-reached"), state)
        message = (f"interrupted by {name} after {len(run.done)} of {len(plan.keys)} step(s); serving now: "
                   f"{'; '.join(where)}. {_ways_on(plan)}")
        self.journal.append("note", switch=run.switch, lane=plan.lane, message=message)
        self.reporter.note(message)
        return self._outcome(run, "interrupted", message, None, signum=self.interrupt.signum)

    def _aborted(self, run: _Run, signum: int) -> FleetOutcome:
        name = signal.Signals(signum).name
        message = (f"stopped at once by a second signal ({name}) after {len(run.done)} step(s); Swarm finishes or "
                   "rolls back the service it was updating on its own; `lanectl fleet status` shows each node. "
                   f"{_ways_on(run.plan)}")
        try:
            self.journal.append("note", switch=run.switch, lane=run.plan.lane, message=message)
        except Exception:  # the journal may be what failed; the message still reaches the operator
            pass
        return self._outcome(run, "aborted", message, None, signum=signum)

    def _outcome(self, run: _Run, result: str, message: str, lane: str | None,
                 diagnostics: dict[str, Any] | None = None, signum: int | None = None) -> FleetOutcome:
        order = [p.steps[0].node for p in run.plan.phases]
        nodes = tuple(run.results[h] for h in order if h in run.results)
        drains = {host: dict(roles) for host, roles in run.drains.items()}
        return FleetOutcome(result, message, lane, nodes, diagnostics or {}, tuple(run.done), drains, signum)

    # -- waiting on Swarm --------------------------------------------------------------------------

    def _wait_update(self, lane: Lane, service_id: str, mark: float, step: str, *, rollback: bool) -> str | None:
        """Until Swarm reports the update (or rollback) begun after `mark` finished: None, or what went wrong."""
        deadline = time.monotonic() + self._budget_seconds(lane)
        wanted = ROLLED_BACK if rollback else UPDATE_DONE
        last = ""
        while time.monotonic() < deadline:
            self._acknowledge_stop(step)
            service = self.swarm.service(service_id)
            if service is None:
                return "the service was removed while lanectl waited for it"
            fresh = service.update_started is not None and service.update_started >= mark - CLOCK_SLACK_SECONDS
            state = service.update_state if fresh else "pending"
            if state == wanted:
                return None
            if not rollback and state == ROLLED_BACK:
                # Swarm's own message by then is only "rollback completed"; its record of the tasks says why.
                return SWARM_ROLLED_BACK + why_swarm_rolled_back(self.swarm.tasks(service_id))
            if state in UPDATE_FAILED_STATES:
                return f"Swarm update {state}: {service.update_message}"
            task = current_task(self.swarm.tasks(service_id))
            now = f"{state}; task {task.state if task else 'none'}" + (
                f" ({task.error})" if task and task.error else "")
            if now != last:
                self.reporter.step(f"  {step}: {now}")
                last = now
            time.sleep(self.poll_seconds)
        return f"Swarm did not finish within {self._budget_seconds(lane):.0f} s (last: {last})"

    def _wait_settled(self, lane: Lane, node: NodeInfo, step: str) -> str | None:
        """Until Swarm has finished every update of the lane's services on `node` (one a killed run began goes
        on without it): a gate that ran meanwhile could pass on the task being replaced."""
        deadline = time.monotonic() + self._budget_seconds(lane)
        names = [service_name(lane, role, node.hostname) for role in lane.roles]
        last = ""
        while time.monotonic() < deadline:
            busy = [s for n in names if (s := self.swarm.service(n)) is not None
                    and s.update_state in UPDATE_IN_PROGRESS]
            if not busy:
                return None
            if self.interrupt.pending():
                raise GateInterrupted(f"Swarm was still updating {busy[0].name}")
            now = f"  {step}: Swarm is still updating {', '.join(s.name for s in busy)}"
            if now != last:
                self.reporter.step(now)
                last = now
            self.interrupt.sleep(self.poll_seconds)
        return f"Swarm did not finish updating the services on {node.hostname} within " \
               f"{self._budget_seconds(lane):.0f} s"

    def _wait_created(self, lane: Lane, service_id: str, step: str) -> str | None:
        """A new service has no previous spec to roll back to: its first task must reach running."""
        deadline = time.monotonic() + self._budget_seconds(lane)
        last = ""
        while time.monotonic() < deadline:
            self._acknowledge_stop(step)
            tasks = self.swarm.tasks(service_id)
            problem = task_problem(tasks) if tasks else None  # Swarm creates the first task a moment later
            if problem is not None:
                return problem
            task = current_task(tasks)
            if task is not None and task.state == "running":
                return None
            now = task.state if task else "no task yet"
            if now != last:
                self.reporter.step(f"  {step}: task {now}")
                last = now
            time.sleep(self.poll_seconds)
        return f"the first task did not start within {self._budget_seconds(lane):.0f} s (last: {last})"

    def _acknowledge_stop(self, step: str) -> None:
        """Say at once that a first signal was heard: the step in progress (a Swarm update, minutes on a real
        model) runs to its end before the run stops, and a silent wait reads as a signal ignored."""
        name = self.interrupt.pending()
        if name is None or self._acknowledged:
            return
        self._acknowledged = True
        self.reporter.note(f"{name}: stopping once {step} ends (Swarm is running it); a second {name} stops at "
                           "once and leaves Swarm to finish it")

    # -- helpers -----------------------------------------------------------------------------------

    def _budget_seconds(self, lane: Lane) -> float:
        # Swarm waits out the health check's start period (the startup budget) and then its monitor.
        return lane.spec.health.startup_budget_minutes * 60 + 60

    def _left_behind(self, held: str) -> str | None:
        closed = closed_switches(self.journal.read().records)
        return why_left_behind(read_lease(held), now=self.clock(), host=self.holder.rpartition("@")[2],
                               pid_alive=pid_alive, switch_closed=closed.__contains__,
                               term_seconds=LEGACY_LEASE_SECONDS)

    def _lease_seconds(self, phase: Phase) -> float:
        return 2 * sum(step.seconds + 60 for step in phase.steps) + LEASE_MARGIN_SECONDS

    def _log_tail(self, plan: Plan, host: str) -> list[str]:
        lane = self.catalog.lanes.get(plan.lane or "")
        if lane is None:
            return []
        service = self.swarm.service(service_name(lane, ROLE_PRIMARY, host))
        if service is None:
            return []
        lines = log_lines(self.swarm.service_logs(service.id, since=time.time() - 600))
        return [line for line in lines if not PROBE_ACCESS_LINE.search(line)][-30:]

