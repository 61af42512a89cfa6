"""The fleet's switch as a plan: the pure planner over one snapshot, and the executor that runs exactly its steps,
over an in-memory Swarm behind the interface of `dockerapi/swarm.py` (the real swarm: test_fleet_swarm.py)."""

from __future__ import annotations

import copy
import dataclasses
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from lanectl.dockerapi.labels import LEASE_LABEL
from lanectl.dockerapi.swarm import NodeInfo, ServiceState, TaskInfo, _with_secrets
from lanectl.errors import BadInput, OperationFailed, RecipeInvalid
from lanectl.fleet.plan import FleetSnapshot, plan_data, plan_fleet_rollback, plan_fleet_up
from lanectl.fleet.rollout import MONITOR_SECONDS_ENV, FleetRollout
from lanectl.fleet.services import gated_label
from lanectl.fleet.status import left_over_services, summarize
from lanectl.health.gate import INTERRUPTED, GateResult
from lanectl.lanes.execute import SIGNAL_AFTER_STEP_ENV
from lanectl.lanes.interrupt import Interrupt
from lanectl.lanes.plan import Phase, Plan, Step
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from lanectl.state.journal import Journal
from tests.test_fleet_plan import RECIPE

PUSHED = {"f1": "reg:5000/fleet-t@sha256:" + "1" * 64, "f2": "reg:5000/fleet-t@sha256:" + "2" * 64}
SECRETS = {"HF_TOKEN": "d1"}  # their keyed digests, as the snapshot has them
SECRET_VALUES = {"HF_TOKEN": "hf_t0ken"}  # lanectl's environment
DRAINED = ("(EngineCore pid=7) INFO 12-03 10:16:21 [core.py:1452] [shutdown] EngineCore: draining in-flight requests "
           "count=2 timeout=105s\n(EngineCore pid=7) INFO 12-03 10:16:30 [core.py:1463] [shutdown] EngineCore: request "
           "processing complete; starting resource teardown\n")


class Killed(BaseException):
    """lanectl's process was killed (SIGKILL): nothing of the run happens after this point."""


class FakeSwarm:
    """Services, tasks and node leases as the manager keeps them; an update completes at once, unless its
    service is named in `fail_updates` (Swarm then rolls it back itself, as for a failed health check)."""

    def __init__(self, hosts: list[str]):
        self.node_list = [NodeInfo(id=f"id-{h}", hostname=h, state="ready", availability="active", role="manager",
                                   addr="10.0.0.1", labels={"gpu": "gb300"}) for h in hosts]
        self.specs: dict[str, dict[str, Any]] = {}
        self.previous: dict[str, dict[str, Any] | None] = {}
        self.states: dict[str, str | None] = {}
        self.task_list: dict[str, list[TaskInfo]] = {}
        self.foreign: list[str] = []
        self.fail_updates: set[str] = set()
        self.calls: list[str] = []
        self.stopped: set[str] = set()  # tasks an update stopped: their engine logged its drain
        self.started: dict[str, float] = {}  # service -> when its last update began (UNIX time, as Swarm says)
        self.clock = 1000.0
        # A call ("update fleet-t-rtx-s2") -> what happens to lanectl right after Swarm took it (a kill, signals).
        self.after_call: dict[str, Callable[[], None]] = {}
        self.dead = False  # lanectl was killed: what it had in hand (a lease) stays as it was

    def kill_after(self, call: str) -> None:
        def kill() -> None:
            self.dead = True
            raise Killed(call)
        self.after_call[call] = kill


    def nodes(self) -> list[NodeInfo]:
        return list(self.node_list)

    def take_lease(self, node: NodeInfo, lease: str, *, left_behind: Callable[[str], str | None]) -> str | None:
        self.calls.append(f"lease {node.hostname}")
        held = self._node(node.id).labels.get(LEASE_LABEL)
        why = left_behind(held) if held else None
        if held and why is None:
            raise OperationFailed(f"node {node.hostname} is being changed by {held.split(' @', 1)[0]}")
        self._label(node.id, LEASE_LABEL, lease)
        return f"{held}: {why}" if held else None

    def release_lease(self, node: NodeInfo) -> None:
        self.calls.append(f"release {node.hostname}")
        if not self.dead:  # a killed process gives nothing back
            self._label(node.id, LEASE_LABEL, None)

    def _node(self, node_id: str) -> NodeInfo:
        return next(n for n in self.node_list if n.id == node_id)

    def _label(self, node_id: str, key: str, value: str | None) -> None:
        index = next(i for i, n in enumerate(self.node_list) if n.id == node_id)
        labels = {k: v for k, v in self.node_list[index].labels.items() if k != key}
        if value is not None:
            labels[key] = value
        self.node_list[index] = dataclasses.replace(self.node_list[index], labels=labels)

    def record_gated(self, node: NodeInfo, marks: dict[str, str | None]) -> None:
        self.calls.append(f"gated {node.hostname}")
        for service, mark in marks.items():
            self._label(node.id, gated_label(service), mark)
        self._maybe_die(f"gated {node.hostname}")

    def lane_services(self) -> list[ServiceState]:
        return [s for name in self.specs if (s := self.service(name)) is not None]

    def service_names(self) -> list[str]:
        return [*self.specs, *self.foreign]

    def service(self, service_id: str) -> ServiceState | None:
        if service_id not in self.specs:
            return None
        return ServiceState(id=service_id, name=service_id, version=1, spec=self.specs[service_id],
                            previous_spec=self.previous[service_id], update_state=self.states[service_id],
                            update_started=self.started.get(service_id), update_message="")

    def create_service(self, spec: dict[str, Any], environ: Any) -> str:
        name = spec["Name"]
        self.calls.append(f"create {name}")
        _with_secrets(spec, environ)  # as the adapter sends it: a secret missing from the environment is refused
        self.specs[name], self.previous[name], self.states[name] = copy.deepcopy(spec), None, None
        self.task_list[name] = [self._task(name)]
        self._maybe_die(f"create {name}")
        return str(name)

    def update_service(self, current: ServiceState, spec: dict[str, Any], environ: Any) -> None:
        name = current.name
        self.calls.append(f"update {name}")
        _with_secrets(spec, environ)
        self.started[name] = time.time()
        self._stop_task(name)
        if name in self.fail_updates:
            self.states[name] = "rollback_completed"
            self.task_list[name].append(self._task(name, state="failed", desired="shutdown", error="unhealthy"))
        else:
            self.previous[name], self.specs[name], self.states[name] = self.specs[name], copy.deepcopy(spec), \
                "completed"
        self.task_list[name].append(self._task(name))
        self._maybe_die(f"update {name}")

    def rollback_service(self, current: ServiceState) -> None:
        name = current.name
        self.calls.append(f"rollback {name}")
        self.started[name] = time.time()
        self._stop_task(name)
        self.specs[name], self.previous[name] = self.previous[name] or self.specs[name], self.specs[name]
        self.states[name] = "rollback_completed"
        self.task_list[name].append(self._task(name))
        self._maybe_die(f"rollback {name}")

    def remove_service(self, service_id: str) -> None:
        self.calls.append(f"remove {service_id}")
        self.specs.pop(service_id, None)

    def tasks(self, service_id: str) -> list[TaskInfo]:
        return list(self.task_list.get(service_id, []))

    def service_logs(self, service_id: str, *, since: float) -> str:
        return ""

    def task_logs(self, task_id: str) -> str:
        return DRAINED if task_id in self.stopped else ""

    def lane_of(self, name: str) -> str:
        return str(self.specs[name]["Labels"]["io.lanectl.lane"])

    def _task(self, name: str, *, state: str = "running", desired: str = "running", error: str = "") -> TaskInfo:
        self.clock += 1
        return TaskInfo(id=f"{name}-{self.clock:.0f}", node_id="n", state=state, desired_state=desired, message="",
                        error=error, exit_code=None, created=f"{self.clock:09.0f}")

    def _maybe_die(self, call: str) -> None:
        then = self.after_call.pop(call, None)
        if then is not None:
            then()

    def _stop_task(self, name: str) -> None:
        self.stopped |= {t.id for t in self.task_list[name] if t.state == "running"}
        self.task_list[name] = [
            TaskInfo(id=t.id, node_id=t.node_id, state="shutdown", desired_state="shutdown", message="", error="",
                     exit_code=0, created=t.created) if t.state == "running" else t for t in self.task_list[name]]


class Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, text: str, *, ok: bool = True) -> None:
        self.lines.append(text)

    def gate(self, progress: Any) -> None:
        pass

    def note(self, text: str) -> None:
        self.lines.append(text)


@pytest.fixture
def catalog(project, write_recipe):
    write_recipe(RECIPE)
    return load_catalog(Project.locate())


def snapshot_of(swarm: FakeSwarm, journal: Journal | None = None) -> FleetSnapshot:
    services = tuple(swarm.lane_services())
    return FleetSnapshot(nodes=tuple(swarm.nodes()), services=services,
                         tasks={s.id: tuple(swarm.tasks(s.id)) for s in services},
                         service_names=tuple(swarm.service_names()), pushed=PUSHED, secret_digests=SECRETS,
                         unfinished=journal.unfinished_intent() if journal else None)


def passing_gate(failing: set[tuple[str, str]] = frozenset()):  # type: ignore[assignment]
    def gate(swarm, lane, node, service_id, reporter, interrupted=lambda: None) -> GateResult:
        passed = (lane.name, node.hostname) not in failing
        return GateResult(passed, None if passed else "generation", "" if passed else "no tokens", 0.0, (), ())
    return gate


def rollout(catalog, swarm: FakeSwarm, journal: Journal, *, environ=None, gate=None,
            interrupt: Interrupt | None = None) -> FleetRollout:
    swarm.dead = False  # a new lanectl process
    environ = {**SECRET_VALUES, **(environ or {})}
    return FleetRollout(catalog, swarm, journal, reporter=Reporter(), environ=environ,  # type: ignore[arg-type]
                        gate=gate or passing_gate(), in_flight=lambda lane, node, service: 2, poll_seconds=0,
                        interrupt=interrupt)


def up(catalog, swarm: FakeSwarm, journal: Journal, lane: str, **kw):
    hosts = tuple(n.hostname for n in swarm.nodes())
    nodes = hosts if len(hosts) == 1 else ()
    plan = plan_fleet_up(catalog, snapshot_of(swarm, journal), catalog.lane(lane), canary="s2", nodes=nodes)
    return plan, rollout(catalog, swarm, journal, **kw).run(plan, why=f"up {lane} --fleet",
                                                          unfinished=journal.unfinished_intent())


def journaled_steps(journal: Journal, switch: str | None = None) -> list[str]:
    return [r["step"] for r in journal.read().records if r["kind"] == "step" and switch in (None, r["switch"])]


def switches(journal: Journal) -> list[dict]:
    return [r for r in journal.read().records if r["kind"] in ("intent", "outcome")]


@pytest.fixture
def swarm() -> FakeSwarm:
    return FakeSwarm(["s1", "s2"])


@pytest.fixture
def journal(tmp_path) -> Journal:
    return Journal(tmp_path / "fleet-journal.jsonl")


def test_the_dry_run_lists_the_step_keys_the_rollout_then_journals(catalog, swarm, journal):
    plan, outcome = up(catalog, swarm, journal, "f1")
    assert outcome.result == "ok", outcome.message
    assert plan.keys == [
        "service-create:fleet-t-primary-s2", "service-create:fleet-t-rtx-s2", "node-gate:fleet-t-primary-s2",
        "service-create:fleet-t-primary-s1", "service-create:fleet-t-rtx-s1", "node-gate:fleet-t-primary-s1"]
    assert journaled_steps(journal) == plan.keys == list(outcome.steps)
    assert plan_data(plan)["keys"] == plan.keys

    plan, outcome = up(catalog, swarm, journal, "f2")
    assert outcome.result == "ok"
    assert [k.split(":")[0] for k in plan.keys] == ["service-update"] * 2 + ["node-gate"] + ["service-update"] * 2 \
        + ["node-gate"]
    assert journaled_steps(journal)[6:] == plan.keys
    assert {swarm.lane_of(n) for n in swarm.specs} == {"f2"}
    again = plan_fleet_up(catalog, snapshot_of(swarm), catalog.lane("f2"))
    assert again.kind == "noop" and again.keys == []


def test_the_way_back_of_a_dry_run_is_swarms_rollback_node_by_node_last_first(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    plan = plan_fleet_up(catalog, snapshot_of(swarm), catalog.lane("f2"), canary="s2")
    assert [s.key for p in plan.way_back for s in p.steps] == [
        "service-rollback:fleet-t-rtx-s1", "service-rollback:fleet-t-primary-s1", "node-gate:fleet-t-primary-s1",
        "service-rollback:fleet-t-rtx-s2", "service-rollback:fleet-t-primary-s2", "node-gate:fleet-t-primary-s2"]
    lines = plan_data(plan)["steps"]
    assert lines[0] == "canary s2:"
    assert f"would update service fleet-t-primary-s2 on s2 to f2 (lane f1 → f2, image sha256:{'1' * 12}… → " \
           f"sha256:{'2' * 12}…" in lines[1], "the image by its digest, not the registry's name cut short"
    assert lines[-1].startswith("on Ctrl-C or SIGTERM: stop after the step in progress")


@pytest.mark.parametrize("change, drift", [
    ("        args: [/model, --port, \"8001\"]", "env +C"),
    ("      - {container: 8000, host: 18000}", "ports [18000->8000/tcp] → [18002->8000/tcp]"),
    ("    stop_timeout_seconds: 120", "stop_timeout_seconds 120 → 90"),
    ("    shm_size: 2g", "volumes [] → [/srv/models:/models:ro]"),
    ("secret", "secret_env HF_TOKEN (value)"),
])
def test_a_container_only_change_reaches_every_nodes_service_and_names_the_field(
        catalog, swarm, journal, write_recipe, change, drift):
    up(catalog, swarm, journal, "f1")
    if change == "secret":
        SECRETS["HF_TOKEN"] = "d2"
        changed = catalog
    else:
        replacement = {"        args: [/model, --port, \"8001\"]": "        args: [/model, --port, \"8001\"]\n"
                                                              "        env: {C: \"2\"}",
                       "      - {container: 8000, host: 18000}": "      - {container: 8000, host: 18002}",
                       "    stop_timeout_seconds: 120": "    stop_timeout_seconds: 90",
                       "    shm_size: 2g": "    shm_size: 2g\n    volumes: [{source: /srv/models, target: /models, "
                                         "read_only: true}]"}[change]
        assert change in RECIPE
        write_recipe(RECIPE.replace(change, replacement))
        changed = load_catalog(Project.locate())
    try:
        plan = plan_fleet_up(changed, snapshot_of(swarm), changed.lane("f1"))
        updates = [s for s in plan.steps if s.action == "service-update"]
        assert {s.node for s in updates} == {"s1", "s2"}, "every node"
        assert any(drift in s.why for s in updates), [s.why for s in updates]
        assert {s.node for s in updates if drift in s.why} == {"s1", "s2"}
        outcome = rollout(changed, swarm, journal).run(plan, why="up")
        assert outcome.result == "ok"
        assert plan_fleet_up(changed, snapshot_of(swarm), changed.lane("f1")).kind == "noop"
    finally:
        SECRETS["HF_TOKEN"] = "d1"


def test_a_fleet_update_reports_each_nodes_drain_from_the_stopped_tasks_engine_log(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    plan, outcome = up(catalog, swarm, journal, "f2")
    assert set(outcome.drains) == {"s1", "s2"}
    assert all(set(roles) == {"primary", "rtx"} for roles in outcome.drains.values()), outcome.drains
    assert all("2" in text and "drained" in text for roles in outcome.drains.values() for text in roles.values())
    step = next(r for r in journal.read().records if r.get("step") == "service-update:fleet-t-primary-s2"
                and r["switch"] == switches(journal)[-1]["switch"])
    assert (step["in_flight"], step["cut"]) == (2, 0)


def test_a_failure_on_the_second_node_puts_the_canary_back_too(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    plan, outcome = up(catalog, swarm, journal, "f2", gate=passing_gate({("f2", "s1")}))
    assert outcome.result == "rolled-back", outcome.message
    assert [(n.node, n.result) for n in outcome.nodes] == [("s2", "rolled-back"), ("s1", "rolled-back")]
    assert {swarm.lane_of(n) for n in swarm.specs} == {"f1"}
    assert outcome.diagnostics["check"] == "generation"


def test_swarms_own_rollback_is_not_asked_for_twice(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    swarm.fail_updates.add("fleet-t-primary-s2")
    plan, outcome = up(catalog, swarm, journal, "f2")
    assert outcome.result == "rolled-back"
    assert outcome.nodes[0].result == "rolled-back-by-swarm" and outcome.nodes[1].result == "not-reached"
    assert "rollback fleet-t-primary-s2" not in swarm.calls
    assert not [c for c in swarm.calls if c.endswith("-s1") and not c.startswith(("lease", "release"))][4:]


def test_an_interrupt_after_any_step_stops_there_says_what_serves_and_a_second_up_continues(
        catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    keys = plan_fleet_up(catalog, snapshot_of(swarm), catalog.lane("f2"), canary="s2").keys
    for count in range(1, len(keys) + 1):
        each = FakeSwarm(["s1", "s2"])
        log = Journal(journal.path.with_name(f"j{count}.jsonl"))
        up(catalog, each, log, "f1")
        plan, outcome = up(catalog, each, log, "f2", environ={SIGNAL_AFTER_STEP_ENV: f"{count}:INT"})
        if count == len(keys):
            assert outcome.result == "ok", "the last step done is the rollout done"
            continue
        assert outcome.result == "interrupted" and outcome.exit_code == 128 + signal.SIGINT
        assert list(outcome.steps) == keys[:count], "stops after the step in progress"
        assert "s2: " in outcome.message and "s1: " in outcome.message
        assert "`lanectl up f2 --fleet`" in outcome.message and "`lanectl rollback --fleet`" in outcome.message
        assert log.unfinished_intent() is not None, "the record stays unfinished for the next command"

        plan, again = up(catalog, each, log, "f2")
        assert again.result == "ok", again.message
        assert set(plan.keys).isdisjoint(k for k in keys[:count] if not k.startswith("node-gate")
                                         and keys.index(k) < count), "what was done is not redone"
        assert {each.lane_of(n) for n in each.specs} == {"f2"}
        outcomes = [r["result"] for r in switches(log) if r["kind"] == "outcome"]
        assert outcomes[-2:] == ["continued", "ok"]


def test_a_signal_during_a_nodes_gate_stops_it_and_the_continuing_rollout_gates_that_node_first(
        catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    interrupt = Interrupt()

    def gate(swarm, lane, node, service_id, reporter, interrupted=lambda: None) -> GateResult:
        interrupt.arrived(signal.SIGTERM)  # as the signal handler does, while the gate waits
        why = interrupted()
        assert why == "SIGTERM", "the gate is told"
        return GateResult(False, INTERRUPTED, f"interrupted ({why})", 0.0, (), ())

    plan = plan_fleet_up(catalog, snapshot_of(swarm, journal), catalog.lane("f2"), canary="s2")
    outcome = rollout(catalog, swarm, journal, gate=gate, interrupt=interrupt).run(plan, why="up")
    assert outcome.result == "interrupted" and outcome.exit_code == 128 + signal.SIGTERM
    assert list(outcome.steps) == plan.keys[:2], "the gate that did not finish is not journaled as done"
    assert "s2: mid-switch" in outcome.message
    rest = plan_fleet_up(catalog, snapshot_of(swarm, journal), catalog.lane("f2"), canary="s2")
    assert rest.keys == ["node-gate:fleet-t-primary-s2", *plan.keys[3:]]


def test_rollback_after_an_interrupted_up_takes_back_exactly_the_nodes_it_moved(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    up(catalog, swarm, journal, "f2")
    up(catalog, swarm, journal, "f1")  # s1 and s2 completed f2 -> f1: previous f2 on both
    plan, outcome = up(catalog, swarm, journal, "f2", environ={SIGNAL_AFTER_STEP_ENV: "3:INT"})
    assert outcome.result == "interrupted"
    assert swarm.lane_of("fleet-t-primary-s2") == "f2" and swarm.lane_of("fleet-t-primary-s1") == "f1"
    back = plan_fleet_rollback(catalog, snapshot_of(swarm, journal), None)
    assert [s.node for s in back.steps] == ["s2"] * 3 and back.lane == "f1"
    result = rollout(catalog, swarm, journal).run(back, why="rollback --fleet", unfinished=journal.unfinished_intent())
    assert result.result == "ok"
    assert {swarm.lane_of(n) for n in swarm.specs} == {"f1"}
    assert journal.unfinished_intent() is None


def test_a_lane_looking_service_lanectl_did_not_create_is_named_and_refused(catalog, swarm, journal):
    swarm.foreign.append("fleet-t-primary-s1")
    with pytest.raises(OperationFailed, match="fleet-t-primary-s1 look like fleet-t's but lanectl did not create"):
        plan_fleet_up(catalog, snapshot_of(swarm), catalog.lane("f1"))
    assert swarm.calls == []


def test_a_swarm_lanes_port_limited_to_one_address_is_refused_with_why_unless_the_recipe_says_it_may_be_public(
        project, write_recipe):
    loopback = RECIPE.replace("{container: 8000, host: 18000}", "{container: 8000, host: 18000, host_ip: 127.0.0.1}")
    loopback = loopback.replace("{container: 8000, host: 19000}", "{container: 8000, host: 19000, host_ip: 127.0.0.1}")
    write_recipe(loopback.replace('env: {PLAIN: "1"}', 'env: {PLAIN: "1", VLLM_SERVER_DEV_MODE: "1"}'))
    with pytest.raises(RecipeInvalid) as refused:
        load_catalog(Project.locate())
    message = str(refused.value)
    assert [": ".join(str(p).split(": ")[:2]) for p in refused.value.problems] == [
        "recipes/r.yaml:14:49: defaults.engine.ports[0].host_ip"], "only the Swarm lanes' port; a local lane keeps it"
    assert "host_ip 127.0.0.1 limits the primary's port 18000 to that address, but Swarm publishes a port on every " \
           "address of its node (it has no host address); with VLLM_SERVER_DEV_MODE=1 vLLM serves its development " \
           "routes there, so anyone who reaches the node can POST /sleep" in message
    assert message.endswith("Keep this lane local (placement.backend: local), or say that the port may be public: "
                            "`public: true` on it")
    write_recipe(loopback.replace("host_ip: 127.0.0.1}", "host_ip: 127.0.0.1, public: true}"))
    assert load_catalog(Project.locate()).lane("f1").spec.engine.ports[0].public


def test_what_swarm_cannot_carry_is_said_not_dropped(catalog, write_recipe):
    write_recipe(RECIPE.replace("{container: 8000, host: 18000}",
                                "{container: 8000, host: 18000, host_ip: 127.0.0.1, public: true}"))
    changed = load_catalog(Project.locate())
    plan = plan_fleet_up(changed, snapshot_of(FakeSwarm(["s1"])), changed.lane("f1"))
    assert "note: primary: host_ip 127.0.0.1 is not carried: a host-mode port binds on every address of the node; " \
           "Swarm has no host IP for it" in plan_data(plan)["steps"]
    assert plan_fleet_up(catalog, snapshot_of(FakeSwarm(["s1"])), catalog.lane("f1")).notes == ()


def test_the_monitor_seam_shortens_only_swarms_watch_after_the_first_healthy_answer(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    plan, outcome = up(catalog, swarm, journal, "f2", environ={MONITOR_SECONDS_ENV: "1.5"})
    assert outcome.result == "ok", outcome.message
    for name, spec in swarm.specs.items():
        planned = next(s.service for s in plan.steps if s.container == name)
        assert spec["UpdateConfig"] == {**planned["UpdateConfig"], "Monitor": 1_500_000_000}
        assert spec["RollbackConfig"] == {**planned["RollbackConfig"], "Monitor": 1_500_000_000}
        assert spec["TaskTemplate"] == planned["TaskTemplate"], "the health check is as planned"
    assert planned["UpdateConfig"]["Monitor"] != 1_500_000_000, "the plan itself is unchanged"


# -- a node is gated before any run calls it serving ---------------------------------------------------------

HANGS = passing_gate({("f1", "s2")})  # f1 answers /health on s2 but generates nothing (the hp-hang)


def fleet_healthy(swarm: FakeSwarm) -> bool:
    """`fleet status`'s verdict from what Swarm shows (every task answers its probe)."""
    services = swarm.lane_services()
    return bool(summarize(swarm.nodes(), services, {s.id: swarm.tasks(s.id) for s in services}, {})["healthy"])


def rollback_run(catalog, swarm: FakeSwarm, journal: Journal, **kw):
    plan = plan_fleet_rollback(catalog, snapshot_of(swarm, journal), None)
    return plan, rollout(catalog, swarm, journal, **kw).run(plan, why="rollback --fleet",
                                                          unfinished=journal.unfinished_intent())


@pytest.fixture
def one_node() -> FakeSwarm:
    return FakeSwarm(["s2"])


def hang_left_behind_then_h2(catalog, swarm: FakeSwarm, journal: Journal) -> None:
    """The issue's start: a killed `up f1` leaves f1 on both services before the node's gate; `up f2` then
    serves and passes its gate, so `rollback --fleet` goes back to f1."""
    up(catalog, swarm, journal, "f2")
    swarm.kill_after("update fleet-t-rtx-s2")
    with pytest.raises(Killed):
        up(catalog, swarm, journal, "f1", gate=HANGS)
    assert {swarm.lane_of(n) for n in swarm.specs} == {"f1"}
    assert up(catalog, swarm, journal, "f2")[1].result == "ok"


def test_a_rollback_interrupted_before_its_gate_leaves_a_node_that_up_gates_and_status_calls_degraded(
        catalog, one_node, journal):
    hang_left_behind_then_h2(catalog, one_node, journal)
    back, outcome = rollback_run(catalog, one_node, journal, environ={SIGNAL_AFTER_STEP_ENV: "2:INT"})
    assert back.lane == "f1" and outcome.result == "interrupted"
    assert list(outcome.steps) == ["service-rollback:fleet-t-primary-s2", "service-rollback:fleet-t-rtx-s2"]
    assert outcome.message.endswith("To continue the rollback: `lanectl rollback --fleet`; to go forward again: "
                                    "`lanectl up f2 --fleet`")
    assert plan_fleet_rollback(catalog, snapshot_of(one_node, journal), None).keys == [
        "node-gate:fleet-t-primary-s2"], "the command it suggests is not refused"
    assert not fleet_healthy(one_node), "f1 was never gated on s2"
    plan, again = up(catalog, one_node, journal, "f1", gate=HANGS)
    assert plan.keys == ["node-gate:fleet-t-primary-s2"]
    assert again.result == "failed" and again.exit_code == 1, again.message
    assert again.nodes[0].result == "failed"


def test_a_rollback_killed_during_its_companion_step_is_continued_with_the_gate(catalog, one_node, journal):
    hang_left_behind_then_h2(catalog, one_node, journal)
    one_node.kill_after("rollback fleet-t-rtx-s2")
    with pytest.raises(Killed):
        rollback_run(catalog, one_node, journal, gate=HANGS)
    assert not fleet_healthy(one_node)
    assert plan_fleet_up(catalog, snapshot_of(one_node, journal), catalog.lane("f1"), nodes=("s2",)).keys == [
        "node-gate:fleet-t-primary-s2"]
    back, again = rollback_run(catalog, one_node, journal, gate=HANGS)
    assert back.keys == ["node-gate:fleet-t-primary-s2"], "the rollback it continues has only its gate left"
    assert again.result == "failed", again.message


@pytest.mark.parametrize("stop", ["kill", "two signals"])
def test_an_up_stopped_during_its_only_service_update_plans_the_gate_it_skipped(
        catalog, one_node, journal, write_recipe, stop):
    up(catalog, one_node, journal, "f1")
    write_recipe(RECIPE.replace("ports: [{container: 8001, host: 18001}]", "ports: [{container: 8001, host: 18003}]"))
    changed = load_catalog(Project.locate())
    interrupt = Interrupt()
    if stop == "kill":
        one_node.kill_after("update fleet-t-rtx-s2")
    else:
        def two_signals() -> None:
            interrupt.arrived(signal.SIGINT)
            interrupt.arrived(signal.SIGINT)
        one_node.after_call["update fleet-t-rtx-s2"] = two_signals
    plan = plan_fleet_up(changed, snapshot_of(one_node, journal), changed.lane("f1"))
    assert plan.keys == ["service-update:fleet-t-rtx-s2", "node-gate:fleet-t-primary-s2"]
    if stop == "kill":
        with pytest.raises(Killed):
            rollout(changed, one_node, journal, interrupt=interrupt).run(plan, why="up")
    else:
        assert rollout(changed, one_node, journal, interrupt=interrupt).run(plan, why="up").result == "aborted"
    # Swarm finished the update on its own; the dry run must still show the gate.
    rest = plan_fleet_up(changed, snapshot_of(one_node, journal), changed.lane("f1"))
    assert plan_data(rest)["keys"] == ["node-gate:fleet-t-primary-s2"]
    assert plan_data(rest)["steps"][1] == ("  would hold f1 on s2 to its health gate (within 600 s) (fleet-t-rtx-s2 "
                                           "changed since the node last passed its gate)")
    assert not fleet_healthy(one_node)
    outcome = rollout(changed, one_node, journal).run(rest, why="up", unfinished=journal.unfinished_intent())
    assert outcome.result == "ok" and fleet_healthy(one_node)
    assert plan_fleet_up(changed, snapshot_of(one_node, journal), changed.lane("f1")).kind == "noop"


# -- leases of runs that are over ----------------------------------------------------------------------------

def test_a_killed_runs_lease_is_named_and_taken_over_by_the_next_run(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    swarm.kill_after("update fleet-t-rtx-s2")
    with pytest.raises(Killed):
        up(catalog, swarm, journal, "f2")
    held = next(n for n in swarm.nodes() if n.hostname == "s2").labels[LEASE_LABEL]
    assert f" pid {os.getpid()} switch " in held, "the lease names the process and the run"
    plan, outcome = up(catalog, swarm, journal, "f2")
    assert outcome.result == "ok", outcome.message
    [note] = [r["message"] for r in journal.read().records if "took over the lease" in str(r.get("message"))]
    assert note.startswith(f"s2: took over the lease {held}: its process (pid {os.getpid()} on ")
    assert all(LEASE_LABEL not in n.labels for n in swarm.nodes()), "given back at the end"


def test_a_lease_whose_run_ended_is_taken_over_and_one_of_a_live_run_elsewhere_is_not(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    switch = switches(journal)[-1]["switch"]
    alive_elsewhere = f"ops@other-manager pid {os.getpid()} switch {'a' * 32} @{time.time():.0f} +3600"
    swarm._label("id-s2", LEASE_LABEL, alive_elsewhere)
    plan, outcome = up(catalog, swarm, journal, "f2")
    assert outcome.result == "failed" and outcome.nodes[0].result == "failed"
    assert swarm.calls[-1] == "lease s2", "refused before any change"
    assert "s2 is being changed by ops@other-manager pid" in outcome.message
    ended = f"ops@other-manager pid 1 switch {switch} @{time.time():.0f} +3600"
    swarm._label("id-s2", LEASE_LABEL, ended)
    plan, outcome = up(catalog, swarm, journal, "f2")
    assert outcome.result == "ok", outcome.message
    assert any(f"its run (switch {switch}) has ended" in str(r.get("message")) for r in journal.read().records)


# -- services of a role the recipe no longer has ------------------------------------------------------------

WITHOUT_RTX = RECIPE.replace("""  companions:
    rtx:
      engine:
        args: [/model, --port, "8001"]
        ports: [{container: 8001, host: 18001}]
""", "").replace("""    companions:
      rtx:
        engine:
          ports: [{container: 8001, host: 19001}]
""", "")


def test_a_companion_dropped_from_the_recipe_is_removed_by_the_next_switch_and_shown_until_then(
        catalog, swarm, journal, write_recipe):
    up(catalog, swarm, journal, "f1")
    write_recipe(WITHOUT_RTX)
    dropped = load_catalog(Project.locate())
    services = swarm.lane_services()
    left = left_over_services(services, dropped)
    assert sorted(swarm.service(i).name for i in left) == ["fleet-t-rtx-s1", "fleet-t-rtx-s2"]
    seen = summarize(swarm.nodes(), services, {s.id: swarm.tasks(s.id) for s in services}, {}, left_over=left)
    assert "s2: fleet-t-rtx-s2 (rtx of f1) is left over: f1 has no rtx; `lanectl up f1 --fleet` removes it" \
        in seen["problems"]
    plan, outcome = up(dropped, swarm, journal, "f1")
    assert plan.keys == ["service-remove:fleet-t-rtx-s2", "node-gate:fleet-t-primary-s2",
                         "service-remove:fleet-t-rtx-s1", "node-gate:fleet-t-primary-s1"]
    assert outcome.result == "ok", outcome.message
    assert sorted(swarm.specs) == ["fleet-t-primary-s1", "fleet-t-primary-s2"]
    assert left_over_services(swarm.lane_services(), dropped) == {} and fleet_healthy(swarm)
    assert plan_fleet_up(dropped, snapshot_of(swarm, journal), dropped.lane("f1")).kind == "noop"


def test_a_left_over_service_the_switch_removed_is_put_back_when_the_switch_fails(
        catalog, swarm, journal, write_recipe):
    up(catalog, swarm, journal, "f1")
    before = copy.deepcopy(swarm.specs["fleet-t-rtx-s2"])
    write_recipe(WITHOUT_RTX)
    dropped = load_catalog(Project.locate())
    plan, outcome = up(dropped, swarm, journal, "f2", gate=passing_gate({("f2", "s2")}))
    assert outcome.result == "rolled-back", outcome.message
    assert swarm.specs["fleet-t-rtx-s2"] == before, "created again from the spec it had"
    assert swarm.lane_of("fleet-t-primary-s2") == "f1"


def test_a_cut_primary_request_is_not_hidden_by_its_companions_drain(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    cut = DRAINED.split("\n")[0] + "\n"  # the drain began and never said it completed
    swarm.task_logs = lambda task_id: cut if "primary" in task_id else ""  # type: ignore[method-assign]
    plan = plan_fleet_up(catalog, snapshot_of(swarm, journal), catalog.lane("f2"), canary="s2")
    outcome = FleetRollout(catalog, swarm, journal, reporter=Reporter(), environ=SECRET_VALUES,  # type: ignore[arg-type]
                           gate=passing_gate(), poll_seconds=0,
                           in_flight=lambda lane, node, service: 2 if service.role == "primary" else 0
                           ).run(plan, why="up")
    assert outcome.drains["s2"] == {
        "primary": "2 request(s) in flight CUT: the drain's 105 s ran out before they finished",
        "rtx": "no request in flight"}
    assert "primary: 2 request(s) in flight CUT" in outcome.nodes[0].detail


@pytest.mark.parametrize("option", ["--nodes", "--canary"])
def test_an_empty_nodes_or_canary_is_refused_not_read_as_every_node_or_none(project, write_recipe, option):
    from tests.test_cli import lanectl

    write_recipe(RECIPE)
    for verb in (["up", "f1"], ["rollback"]):
        result = lanectl(*verb, "--fleet", option, " ", "--dry-run", cwd=project)
        assert result.returncode == 2, result.stderr
        assert f"lanectl: {option} names no node" in result.stderr


def test_a_secret_missing_from_lanectls_environment_is_refused_before_any_change(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    calls = list(swarm.calls)
    plan = plan_fleet_up(catalog, snapshot_of(swarm, journal), catalog.lane("f2"), canary="s2")
    with pytest.raises(BadInput, match=r"secret\(s\) not set in lanectl's environment: HF_TOKEN \(for "
                                       r"fleet-t-primary-s2, fleet-t-primary-s1\); "
                                       "nothing was changed"):
        FleetRollout(catalog, swarm, journal, reporter=Reporter(), environ={},  # type: ignore[arg-type]
                     gate=passing_gate(), poll_seconds=0).run(plan, why="up")
    assert swarm.calls == calls and journal.unfinished_intent() is None


def test_an_updates_change_list_is_printed_once_and_journaled_once(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    plan = plan_fleet_up(catalog, snapshot_of(swarm, journal), catalog.lane("f2"), canary="s2")
    runner = rollout(catalog, swarm, journal)
    runner.run(plan, why="up")
    why = plan.steps[0].why
    printed = [line for line in runner.reporter.lines if "update service fleet-t-primary-s2" in line]  # type: ignore[attr-defined]
    assert len(printed) == 1 and printed[0].count(why) == 1, printed
    [record] = [r for r in journal.read().records if r.get("step") == plan.steps[0].key]
    assert record["changes"] == why and why not in record["detail"]


def test_a_refused_node_carries_no_unrelated_log_tail(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    swarm.service_logs = lambda service_id, since: "INFO an old line of the lane that still serves\n"  # type: ignore
    swarm._label("id-s2", LEASE_LABEL, f"ops@other-manager pid 1 switch {'a' * 32} @{time.time():.0f} +3600")
    plan, outcome = up(catalog, swarm, journal, "f2")
    assert outcome.diagnostics["check"] == "lease" and outcome.diagnostics["log_tail"] == []


@pytest.mark.parametrize("spelling", ["2G", "2048m", "2097152k"])
def test_the_same_shm_size_spelled_otherwise_is_no_change(catalog, swarm, journal, write_recipe, spelling):
    up(catalog, swarm, journal, "f1")
    write_recipe(RECIPE.replace("    shm_size: 2g", f"    shm_size: {spelling}"))
    respelled = load_catalog(Project.locate())
    assert plan_fleet_up(respelled, snapshot_of(swarm, journal), respelled.lane("f1")).kind == "noop"
    write_recipe(RECIPE.replace("    shm_size: 2g", "    shm_size: 3g"))
    bigger = load_catalog(Project.locate())
    steps = plan_fleet_up(bigger, snapshot_of(swarm, journal), bigger.lane("f1")).steps
    assert "shm_size 2g → 3g" in steps[0].why


def test_a_first_signal_during_a_swarm_update_is_acknowledged_at_once(catalog, swarm, journal):
    up(catalog, swarm, journal, "f1")
    interrupt = Interrupt()
    swarm.after_call["update fleet-t-primary-s2"] = lambda: interrupt.arrived(signal.SIGINT)
    plan = plan_fleet_up(catalog, snapshot_of(swarm, journal), catalog.lane("f2"), canary="s2")
    runner = rollout(catalog, swarm, journal, interrupt=interrupt)
    outcome = runner.run(plan, why="up")
    assert outcome.result == "interrupted"
    lines = runner.reporter.lines  # type: ignore[attr-defined]
    heard = [i for i, line in enumerate(lines) if line.startswith("SIGINT: stopping once")]
    done = [i for i, line in enumerate(lines) if line.startswith("update service fleet-t-primary-s2")]
    assert heard and heard[0] < done[0], lines
    assert lines[heard[0]] == ("SIGINT: stopping once service-update:fleet-t-primary-s2 ends (Swarm is running it); "
                               "a second SIGINT stops at once and leaves Swarm to finish it")


def test_a_wait_for_the_engine_lock_is_said_not_silent():
    from lanectl.commands.fleet import engine_lock_held
    from lanectl.state.lock import LockBusy, engine_lock

    other = engine_lock("lanectl up f1 --fleet")
    other.acquire(0)
    reporter = Reporter()
    try:
        with pytest.raises(LockBusy), engine_lock_held("lanectl rollback --fleet", 0.2, reporter):  # type: ignore[arg-type]
            pass
    finally:
        other.release()
    assert reporter.lines == [f"waiting up to 0.2 s for the lock of this Docker engine, held by pid {os.getpid()} "
                              "(lanectl up f1 --fleet)"]


def test_a_node_missing_one_of_its_lanes_services_is_never_called_gated(catalog, one_node, journal):
    up(catalog, one_node, journal, "f1")
    one_node.remove_service("fleet-t-rtx-s2")  # by hand, or by a switch to a lane without it
    gate_only = Plan("up", "f1", "f1", (Phase((Step("node-gate", "f1", "fleet-t-primary-s2", "primary", 600.0,
                                                     node="s2"),)),))
    outcome = rollout(catalog, one_node, journal).run(gate_only, why="up")
    assert outcome.result == "failed", outcome.message
    assert "its service(s) fleet-t-rtx-s2 are missing; `lanectl up f1 --fleet` creates them" in outcome.message
