"""Rolling a lane across a fleet of boxes on Docker Swarm: canary first, one node at a time.

Per node, Swarm does the work: a stop-first update of each role's service, held to the recipe's
health check, rolled back by Swarm itself when the new task fails it (`UpdateStatus` then reads
`rollback_completed`). lanectl then holds the node to the same health gate as a local `up`
(models list, startup log, fatal lines, a generated token), because Swarm's check only sees /health.
The first node that fails stops the rollout, and every node this run changed goes back.

Each node is leased (a node label) while it changes, and every step is journaled with its node in
`fleet-journal.jsonl`; the box's own journal and state are for its local lanes.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lanectl.dockerapi.swarm import ServiceState, SwarmEngine
from lanectl.errors import BadInput, OperationFailed
from lanectl.fleet.plan import (
    ROLLED_BACK,
    UPDATE_DONE,
    UPDATE_FAILED_STATES,
    NodeInfo,
    choose_nodes,
    current_task,
    plan_service,
    spec_matches,
    task_problem,
    why_swarm_rolled_back,
)
from lanectl.health.engine_http import engine_url
from lanectl.health.engine_log import log_lines
from lanectl.health.gate import PROBE_ACCESS_LINE, ContainerStatus, GateResult, HealthGate, MonotonicClock
from lanectl.image.containers import plan_containers
from lanectl.image.render import plan_image
from lanectl.lanes.switcher import Reporter
from lanectl.recipe.catalog import ROLE_PRIMARY, Catalog, Lane
from lanectl.state.journal import Journal, current_user_at_host
from lanectl.state.pushes import PushStore

# How long past the startup budget a node's lease counts as held: a lease older than that was left
# by a run that died, and is taken over.
LEASE_MARGIN_SECONDS = 300
# Swarm's UpdateStatus.StartedAt comes from the manager's clock; allow it to be a little behind ours.
CLOCK_SLACK_SECONDS = 2.0
SWARM_ROLLED_BACK = "Swarm rolled back the update: "


@dataclass(frozen=True)
class NodeOutcome:
    node: str
    result: str  # ok | unchanged | failed | rolled-back-by-swarm | rolled-back | not-reached
    detail: str


@dataclass(frozen=True)
class FleetOutcome:
    result: str  # ok | noop | rolled-back | failed
    message: str
    lane: str | None
    nodes: tuple[NodeOutcome, ...] = ()
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 0 if self.result in ("ok", "noop") else 1

    def as_dict(self) -> dict[str, Any]:
        return {"result": self.result, "message": self.message, "lane": self.lane,
                "nodes": [vars(n) for n in self.nodes], "diagnostics": self.diagnostics}


@dataclass
class _Change:
    """What this run did to one service: the way back is Swarm's rollback, or removal of a new service."""

    service_id: str
    created: bool
    rolled_back_by_swarm: bool = False


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


def node_base_url(lane: Lane, node: NodeInfo) -> str:
    return engine_url(node.addr, lane.spec.engine.ports[0].published)


def gate_on_node(swarm: SwarmEngine, lane: Lane, node: NodeInfo, service_id: str, reporter: Reporter) -> GateResult:
    """The local `up` gate, against the node's published port and the log of the service's current task."""
    from lanectl.health.probe import EndpointProbe

    endpoints = EndpointProbe(node_base_url(lane, node), lane.spec.health)
    gate = HealthGate(lane.spec.health, endpoints, SwarmLogSource(swarm, service_id),
                      SwarmTaskWatch(swarm, service_id), MonotonicClock(), reporter.gate)
    return gate.wait()


NodeGate = Callable[[SwarmEngine, Lane, NodeInfo, str, Reporter], GateResult]


def pushed_image(pushes: PushStore, lane: Lane) -> str:
    """The lane's current build as its registry holds it, `repository@sha256:…`, as `build --push` recorded it.

    Nodes pull by digest, so every node runs the same bytes; a lane never pushed is refused before any change."""
    tag = plan_image(lane).tag
    record = pushes.find(tag, lane.spec.image.registry)
    if record is None:
        where = "" if lane.spec.image.registry else " --registry HOST:PORT"
        raise OperationFailed(f"{lane.name}: image {tag} has not been pushed to a registry, and fleet nodes pull it "
                              f"by digest from one; push it with `lanectl build {lane.name} --push{where}`")
    return record.reference


class FleetRollout:
    def __init__(self, catalog: Catalog, swarm: SwarmEngine, journal: Journal, *, reporter: Reporter,
                 pushes: PushStore, no_gpu: bool = False, environ: Mapping[str, str] | None = None,
                 gate: NodeGate = gate_on_node, poll_seconds: float = 0.5):
        self.catalog = catalog
        self.pushes = pushes
        self.swarm = swarm
        self.journal = journal
        self.reporter = reporter
        self.no_gpu = no_gpu
        self.environ = os.environ if environ is None else environ
        self.gate = gate
        self.poll_seconds = poll_seconds
        self.holder = f"{current_user_at_host()} pid {os.getpid()}"

    # -- up ----------------------------------------------------------------------------------------

    def up(self, lane: Lane, *, nodes: Sequence[str] = (), canary: str | None = None,
           why: str = "up --fleet") -> FleetOutcome:
        order = choose_nodes(lane, self.swarm.nodes(), nodes, canary)
        image = pushed_image(self.pushes, lane)  # refuse an unpushed lane before anything changes
        self._note_unfinished()
        names = [n.hostname for n in order]
        intent = self.journal.record_intent(action="fleet-up", from_lane=None, to_lane=lane.name, why=why,
                                            steps=[f"{n}:update" for n in names])
        switch = intent["switch"]
        self.reporter.note(f"rolling {lane.name} out to {', '.join(names)} (canary {names[0]}, then one at a time)")
        done: list[tuple[NodeInfo, list[_Change]]] = []
        results: list[NodeOutcome] = []
        for index, node in enumerate(order):
            label = "canary" if index == 0 else f"node {index + 1}/{len(order)}"
            self.reporter.step(f"{label} {node.hostname}: updating to {lane.name}")
            outcome, changes, failure = self._update_node(switch, lane, image, node)
            results.append(outcome)
            if failure is None:
                self.journal.append("step", switch=switch, step=f"{node.hostname}:update", node=node.hostname,
                                    detail=outcome.detail)
                done.append((node, changes))
                continue
            self.journal.append("diagnostics", switch=switch, lane=lane.name, node=node.hostname,
                                failed=failure["message"], log_tail=failure["log_tail"])
            for position, (earlier, earlier_changes) in reversed(list(enumerate(done))):
                results[position] = self._undo_node(switch, lane, earlier, earlier_changes, None)
            results += [NodeOutcome(n.hostname, "not-reached", "left as it was") for n in order[index + 1:]]
            back = [r.node for r in results if r.result in ("rolled-back", "rolled-back-by-swarm")]
            message = (f"{lane.name} failed on {label} {node.hostname}: {failure['message']}. Rollout stopped; "
                       f"back on the previous spec: {', '.join(back) or 'nothing to undo'}")
            self.journal.record_outcome(switch, "rolled-back", message)
            return FleetOutcome("rolled-back", message, None, tuple(results), diagnostics=failure)
        changed = [r.node for r in results if r.result == "ok"]
        if not changed:
            self.journal.record_outcome(switch, "noop", f"{lane.name} already serves on {', '.join(names)}")
            return FleetOutcome("noop", f"{lane.name} already serves on {', '.join(names)}; nothing to do",
                                lane.name, tuple(results))
        message = f"{lane.name} is serving on {', '.join(names)}"
        self.journal.record_outcome(switch, "ok", message)
        return FleetOutcome("ok", message, lane.name, tuple(results))

    def _update_node(self, switch: str, lane: Lane, image: str,
                     node: NodeInfo) -> tuple[NodeOutcome, list[_Change], dict[str, Any] | None]:
        """Lease `node`, bring it to `lane`, and on a failure put it back: its outcome, changes and failure."""
        changes: list[_Change] = []
        try:
            self.swarm.take_lease(node, self.holder, stale_after_seconds=self._lease_seconds(lane))
        except OperationFailed as exc:
            return (NodeOutcome(node.hostname, "failed", f"left as it was: {exc}"), changes,
                    {"message": str(exc), "check": "lease", "log_tail": []})
        try:
            try:
                failure = self._bring_node_to(switch, lane, image, node, changes)
            except OperationFailed as exc:  # Swarm refused a spec, a secret is missing: undo as for a failed gate
                failure = {"message": str(exc), "check": "swarm", "log_tail": []}
            if failure is None:
                detail = "serving, passed its gate" if changes else "unchanged: already serving"
                return NodeOutcome(node.hostname, "ok" if changes else "unchanged", detail), changes, None
            return self._undo_node(switch, lane, node, changes, failure), changes, failure
        finally:
            self.swarm.release_lease(node)

    def _bring_node_to(self, switch: str, lane: Lane, image: str, node: NodeInfo,
                       changes: list[_Change]) -> dict[str, Any] | None:
        """Update every role's service on `node` to `lane` (its build pulled as `image`), then gate it; the failure,
        or None."""
        plan = plan_image(lane)
        existing = {(s.recipe, s.role, s.node): s for s in self.swarm.lane_services()}
        primary_id = ""
        for container in plan_containers(lane, plan):
            if container.image == plan.tag:  # a companion's own digest-pinned image is pulled as it is
                container = dataclasses.replace(container, image=image)
            wanted = plan_service(lane, container, node.hostname, with_gpus=not self.no_gpu, inputs=plan.input_hash)
            current = existing.get((lane.recipe.id, container.role, node.hostname))
            step = f"{node.hostname}:{container.role}"
            if current is not None and spec_matches(current.spec, wanted) and task_problem(
                    self.swarm.tasks(current.id)) is None:
                if container.role == ROLE_PRIMARY:
                    primary_id = current.id
                continue
            mark = time.time()
            if current is None:
                service_id = self.swarm.create_service(wanted, self.environ)
                changes.append(_Change(service_id, created=True))
                self._journal(switch, f"{step}:create", node, f"service {wanted['Name']} created")
                failure = self._wait_created(lane, service_id, step)
            else:
                service_id = current.id
                self.swarm.update_service(current, wanted, self.environ)
                changes.append(_Change(service_id, created=False))
                self._journal(switch, f"{step}:update", node, f"{current.lane} -> {lane.name}")
                failure = self._wait_update(lane, service_id, mark, step, rollback=False)
                if failure is not None and failure.startswith(SWARM_ROLLED_BACK):
                    changes[-1].rolled_back_by_swarm = True
            if container.role == ROLE_PRIMARY:
                primary_id = service_id
            if failure is not None:
                return {"message": failure, "check": "swarm", "log_tail": self._log_tail(service_id, mark)}
        if not changes:
            return None
        result = self.gate(self.swarm, lane, node, primary_id, self.reporter)
        self._journal(switch, f"{node.hostname}:gate", node, "passed" if result.passed else result.detail,
                      ok=result.passed)
        if result.passed:
            return None
        return {"message": f"failed its health gate ({result.failed_check}): {result.detail}",
                "check": result.failed_check, "exit_code": result.exit_code,
                "log_tail": [line for line in result.log_tail if not PROBE_ACCESS_LINE.search(line)][-30:]}

    def _undo_node(self, switch: str, lane: Lane, node: NodeInfo, changes: list[_Change],
                   failure: dict[str, Any] | None) -> NodeOutcome:
        """Put back what this run changed on `node`, newest first."""
        notes = []
        for change in reversed(changes):
            service = self.swarm.service(change.service_id)
            if service is None:
                continue
            if change.created:
                self.swarm.remove_service(change.service_id)
                notes.append(f"removed new service {service.name}")
            elif change.rolled_back_by_swarm:
                notes.append(f"Swarm rolled {service.name} back to {service.lane}")
            else:
                mark = time.time()
                self.swarm.rollback_service(service)
                problem = self._wait_update(lane, service.id, mark, f"{node.hostname}:{service.role}", rollback=True)
                after = self.swarm.service(service.id)
                notes.append(f"rolled {service.name} back to {after.lane if after else '?'}"
                             + (f" ({problem})" if problem else ""))
        restored = self._check_restored(node, changes)
        if restored:
            notes.append(restored)
        detail = "; ".join(notes) or "nothing had changed"
        self._journal(switch, f"{node.hostname}:undo", node, detail)
        self.reporter.note(f"{node.hostname}: {detail}")
        if restored and not restored.endswith("is serving again"):
            return NodeOutcome(node.hostname, "failed", detail)
        by_swarm = failure is not None and all(c.rolled_back_by_swarm or c.created for c in changes) and any(
            c.rolled_back_by_swarm for c in changes)
        return NodeOutcome(node.hostname, "rolled-back-by-swarm" if by_swarm else "rolled-back", detail)

    def _check_restored(self, node: NodeInfo, changes: list[_Change]) -> str:
        """Swarm calls a rollback complete once the old task starts; lanectl waits for it to serve again."""
        for change in changes:
            service = self.swarm.service(change.service_id)
            if change.created or service is None or service.role != ROLE_PRIMARY:
                continue
            previous = self.catalog.lanes.get(service.lane)
            if previous is None:
                return f"{service.lane} is not in the recipes; its health was not checked"
            result = self.gate(self.swarm, previous, node, service.id, self.reporter)
            return (f"{previous.name} is serving again" if result.passed
                    else f"{previous.name} did not come back ({result.failed_check}: {result.detail})")
        return ""

    # -- rollback ----------------------------------------------------------------------------------

    def rollback(self, to: Lane | None, *, nodes: Sequence[str] = (), canary: str | None = None) -> FleetOutcome:
        """Back to the lane before the last completed update, by Swarm's rollback, canary first.

        With `to`, a forward rollout of that lane instead. A service whose last update Swarm already
        rolled back is left alone: its PreviousSpec is then the lane that failed.
        """
        services = self.swarm.lane_services()
        if to is not None:
            on = nodes or sorted({s.node for s in services if s.recipe == to.recipe.id})
            return self.up(to, nodes=list(on), canary=canary, why="rollback --fleet --to")
        primaries = [s for s in services if s.role == ROLE_PRIMARY and s.update_state == UPDATE_DONE
                     and s.previous_spec and (not nodes or s.node in nodes)]
        if not primaries:
            raise BadInput("nothing to roll back on the fleet: no lane's last update completed (Swarm and lanectl "
                           "already undid failed ones, and a rollback is not undone by another); name a lane "
                           "with --to")
        targets = {(s.recipe, s.previous_lane) for s in primaries}
        if len(targets) != 1:
            shown = ", ".join(sorted(f"{lane} ({recipe})" for recipe, lane in targets))
            raise BadInput(f"the fleet's nodes would go back to different lanes ({shown}); name one with --to")
        ((recipe, target_name),) = targets
        if target_name is None or target_name not in self.catalog.lanes:
            raise BadInput(f"the previous lane {target_name} is not in the recipes; name one with --to")
        target = self.catalog.lanes[target_name]
        hosts = sorted({s.node for s in primaries}, key=lambda h: (h != canary, h))
        # Companions go back with their primary when their last update was the same switch.
        candidates = [s for s in services if s.node in hosts and s.recipe == recipe and s.update_state == UPDATE_DONE
                      and s.previous_lane == target_name]
        inventory = {n.hostname: n for n in self.swarm.nodes()}
        self._note_unfinished()
        intent = self.journal.record_intent(action="fleet-rollback", from_lane=candidates[0].lane,
                                            to_lane=target.name, why="rollback --fleet",
                                            steps=[f"{h}:rollback" for h in hosts])
        switch = intent["switch"]
        results: list[NodeOutcome] = []
        for index, host in enumerate(hosts):
            node = inventory.get(host)
            if node is None or not node.schedulable:
                results.append(NodeOutcome(host, "failed", "node is not ready; skipped"))
                continue
            try:
                self.swarm.take_lease(node, self.holder, stale_after_seconds=self._lease_seconds(target))
            except OperationFailed as exc:
                problem: str | None = str(exc)
            else:
                try:
                    problem = self._rollback_node(switch, target, node, [s for s in candidates if s.node == host])
                except OperationFailed as exc:
                    problem = str(exc)
                finally:
                    self.swarm.release_lease(node)
            if problem is not None:
                results.append(NodeOutcome(host, "failed", problem))
                results += [NodeOutcome(h, "not-reached", "left as it was") for h in hosts[index + 1:]]
                message = f"rollback to {target.name} failed on {host}: {problem}; stopped there"
                self.journal.record_outcome(switch, "failed", message)
                return FleetOutcome("failed", message, None, tuple(results))
            results.append(NodeOutcome(host, "ok", f"back on {target.name}, passed its gate"))
        message = f"{target.name} is serving again on {', '.join(r.node for r in results if r.result == 'ok')}"
        failed = [r for r in results if r.result == "failed"]
        result = "failed" if failed else "ok"
        if failed:
            message += f"; not on {', '.join(r.node for r in failed)} (not ready)"
        self.journal.record_outcome(switch, result, message)
        return FleetOutcome(result, message, target.name if not failed else None, tuple(results))

    def _rollback_node(self, switch: str, target: Lane, node: NodeInfo, services: list[ServiceState]) -> str | None:
        self.reporter.step(f"{node.hostname}: Swarm rollback to {target.name}")
        primary_id = ""
        for service in sorted(services, key=lambda s: s.role != ROLE_PRIMARY):
            mark = time.time()
            self.swarm.rollback_service(service)
            problem = self._wait_update(target, service.id, mark, f"{node.hostname}:{service.role}", rollback=True)
            self._journal(switch, f"{node.hostname}:{service.role}:rollback", node, problem or "rollback_completed",
                          ok=problem is None)
            if problem is not None:
                return problem
            if service.role == ROLE_PRIMARY:
                primary_id = service.id
        if not primary_id:
            return None
        result = self.gate(self.swarm, target, node, primary_id, self.reporter)
        self._journal(switch, f"{node.hostname}:gate", node, "passed" if result.passed else result.detail,
                      ok=result.passed)
        return None if result.passed else f"failed its health gate ({result.failed_check}): {result.detail}"

    # -- waiting on Swarm --------------------------------------------------------------------------

    def _wait_update(self, lane: Lane, service_id: str, mark: float, step: str, *, rollback: bool) -> str | None:
        """Until Swarm reports the update (or rollback) begun after `mark` finished: None, or what went wrong."""
        deadline = time.monotonic() + self._budget_seconds(lane)
        wanted = ROLLED_BACK if rollback else UPDATE_DONE
        last = ""
        while time.monotonic() < deadline:
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

    def _wait_created(self, lane: Lane, service_id: str, step: str) -> str | None:
        """A new service has no previous spec to roll back to: its first task must reach running."""
        deadline = time.monotonic() + self._budget_seconds(lane)
        last = ""
        while time.monotonic() < deadline:
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

    # -- helpers -----------------------------------------------------------------------------------

    def _budget_seconds(self, lane: Lane) -> float:
        # Swarm waits out the health check's start period (the startup budget) and then its monitor.
        return lane.spec.health.startup_budget_minutes * 60 + 60

    def _lease_seconds(self, lane: Lane) -> float:
        return 2 * self._budget_seconds(lane) + LEASE_MARGIN_SECONDS

    def _log_tail(self, service_id: str, since: float) -> list[str]:
        lines = log_lines(self.swarm.service_logs(service_id, since=since - 1.0))
        return [line for line in lines if not PROBE_ACCESS_LINE.search(line)][-30:]

    def _journal(self, switch: str, step: str, node: NodeInfo, detail: str, *, ok: bool = True) -> None:
        self.journal.append("step", switch=switch, step=step, node=node.hostname, detail=detail)
        self.reporter.step(f"{step} ({detail})", ok=ok)

    def _note_unfinished(self) -> None:
        """A killed fleet run leaves no half-state lanectl must repair: Swarm finished or rolled back each
        service on its own, and a rollout is re-runnable. Record that the old run is over."""
        intent = self.journal.unfinished_intent()
        if intent is not None:
            message = (f"the {intent['action']} to {intent.get('to')} started {intent['ts']} by {intent['who']} "
                       "did not finish; Swarm completed or rolled back each service it had begun")
            self.journal.record_outcome(intent["switch"], "abandoned", message)
            self.reporter.note(message)


def require_placement(lane: Lane, fleet: bool) -> None:
    """A lane runs where its recipe places it; the flag must agree, so nothing lands on the wrong engine."""
    on_swarm = lane.spec.placement.backend == "swarm"
    if on_swarm and not fleet:
        raise BadInput(f"lane {lane.name} is placed on Swarm (placement.backend: swarm); run "
                       f"`lanectl up {lane.name} --fleet`")
    if fleet and not on_swarm:
        raise BadInput(f"lane {lane.name} runs on the local engine (no `placement: {{backend: swarm}}` in its "
                       f"recipe); run `lanectl up {lane.name}` without --fleet")
