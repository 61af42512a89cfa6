"""The fleet's promises under any interleaving of the operator's and the world's moves, over the in-memory Swarm.

A Hypothesis state machine. Its rules: `up --fleet` and `rollback --fleet` (run whole, interrupted after step k by
one or two signals, or killed right after any call Swarm took); Swarm finishing or rolling back an update on its
own, after lanectl died or while it watched; recipe edits (a companion's port moved, the companion removed);
another manager's lease, and leases expiring. After every rule: no run ends ok (or noop) for a node whose
services changed since a gate last saw them serve, and `fleet status` never calls such a node healthy, nor a
node a killed run left leased. A failure prints the shrunk sequence of rules.

CI runs a bounded, derandomized search (over 2,000 rules); `HYPOTHESIS_PROFILE=long` (`make fuzz`) searches far
longer with fresh randomness.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from lanectl.dockerapi.labels import LEASE_LABEL
from lanectl.dockerapi.swarm import NodeInfo, ServiceState
from lanectl.errors import BadInput, OperationFailed
from lanectl.fleet.node_lease import (
    LEGACY_LEASE_SECONDS,
    NodeLease,
    closed_switches,
    pid_alive,
    read_lease,
    why_left_behind,
)
from lanectl.fleet.plan import FleetSnapshot, plan_fleet_rollback, plan_fleet_up
from lanectl.fleet.rollout import FleetRollout
from lanectl.fleet.services import spec_mark
from lanectl.fleet.status import left_over_services, summarize
from lanectl.health.gate import GateResult
from lanectl.lanes.execute import SIGNAL_AFTER_STEP_ENV
from lanectl.lanes.plan import Plan
from lanectl.project import Project
from lanectl.recipe.catalog import Catalog, load_catalog
from lanectl.state.journal import Journal, current_user_at_host
from tests.conftest import REPO
from tests.test_fleet_plan import RECIPE
from tests.test_fleet_rollout import PUSHED, SECRET_VALUES, SECRETS, WITHOUT_RTX, FakeSwarm, Killed, Reporter

# Named for this module: the box's fuzzer registers its own "ci" and "long" in the same process.
settings.register_profile("fleet-ci", derandomize=True, deadline=None, max_examples=150, stateful_step_count=20,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile("fleet-long", deadline=None, max_examples=5000, stateful_step_count=40, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
PROFILE = settings.get_profile("fleet-long" if os.environ.get("HYPOTHESIS_PROFILE") == "long" else "fleet-ci")

HOSTS = ["s1", "s2"]
FUZZ_PUSHED = {**PUSHED, "hang": "reg:5000/fleet-t@sha256:" + "3" * 64}
GOOD = {"f1", "f2"}  # `hang` answers /health and generates nothing: its gate never passes
LANES = ["f1", "f2", "hang"]
FUZZ_RECIPE = RECIPE.replace("lanes:\n  f1: {}\n", "lanes:\n  f1: {}\n  hang: {}\n")
EDITS = {
    "as-written": FUZZ_RECIPE,
    "rtx-port-moved": FUZZ_RECIPE.replace("ports: [{container: 8001, host: 18001}]",
                                          "ports: [{container: 8001, host: 18003}]"),
    "rtx-removed": WITHOUT_RTX.replace("lanes:\n  f1: {}\n", "lanes:\n  f1: {}\n  hang: {}\n"),
}
# Where lanectl dies or is signalled: "kill" right after the n-th call Swarm took; "INT"/"INT,INT" after step k.
# A run has at most six steps and six calls Swarm takes (two nodes of two services and a gate).
STOPS = st.tuples(st.sampled_from(["none", "INT", "INT,INT", "kill", "kill-mid-update"]), st.integers(1, 6))


def load_edits(root: Path) -> dict[str, Catalog]:
    for part in ("images", "kernels", "patches"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    catalogs = {}
    for name, text in EDITS.items():
        assert text != FUZZ_RECIPE or name == "as-written", f"the edit {name} changed nothing"
        (root / "recipes").mkdir(exist_ok=True)
        (root / "recipes" / "r.yaml").write_text(text.lstrip("\n"))
        cwd = Path.cwd()
        os.chdir(root)
        try:
            catalogs[name] = load_catalog(Project.locate())
        finally:
            os.chdir(cwd)
    return catalogs


class FuzzSwarm(FakeSwarm):
    """The in-memory Swarm, able to kill lanectl after the n-th call it takes and, for an update, to go on
    without it: the update then finishes, or is rolled back by Swarm, a few looks later (or at `settle`)."""

    def __init__(self) -> None:
        super().__init__(HOSTS)
        self.kill_at: int | None = None
        self.mid_update = False
        self.taken = 0
        self.unsettled: dict[str, tuple[int, bool, dict[str, Any], dict[str, Any] | None]] = {}

    def _maybe_die(self, call: str) -> None:
        self.taken += 1
        if self.kill_at is not None and self.taken >= self.kill_at:
            self.kill_at = None
            self.dead = True
            raise Killed(call)

    def update_service(self, current: ServiceState, spec: dict[str, Any], environ: Any) -> None:
        if not (self.mid_update and self.kill_at is not None and self.taken + 1 >= self.kill_at):
            try:
                return super().update_service(current, spec, environ)
            finally:
                self.fail_updates.discard(current.name)  # Swarm's check failed that one update
        # Killed while Swarm replaces the task: the spec is the new one, its task not started yet.
        name = current.name
        self.calls.append(f"update {name}")
        self.unsettled[name] = (3, self.rolls_back, self.specs[name], self.previous[name])
        self.previous[name], self.specs[name], self.states[name] = self.specs[name], spec, "updating"
        self._stop_task(name)
        self._maybe_die(f"update {name}")

    rolls_back = False

    def service(self, service_id: str) -> ServiceState | None:
        if service_id in self.unsettled:
            looks, back, old, previous = self.unsettled[service_id]
            if looks <= 0:
                self.settle(service_id)
            else:
                self.unsettled[service_id] = (looks - 1, back, old, previous)
        return super().service(service_id)

    def settle(self, name: str) -> None:
        _, back, old, previous = self.unsettled.pop(name)
        if name not in self.specs:
            return
        if back:  # the new task failed Swarm's health check
            self.specs[name], self.previous[name], self.states[name] = old, previous, "rollback_completed"
        else:
            self.states[name] = "completed"
        self.task_list[name].append(self._task(name))


def marks_on(swarm: FuzzSwarm, host: str) -> dict[str, str]:
    return {s.name: spec_mark(s.spec) for s in swarm.lane_services() if s.node == host}


class FleetMachine(RuleBasedStateMachine):
    catalogs: dict[str, Catalog] = {}
    folder: Path = Path()
    steps = 0  # rules run, over every example
    results: dict[str, int] = {}

    def __init__(self) -> None:
        super().__init__()
        self.swarm = FuzzSwarm()
        handle, path = tempfile.mkstemp(suffix=".jsonl", dir=self.folder)
        os.close(handle)
        os.unlink(path)
        self.journal = Journal(Path(path))
        self.catalog = self.catalogs["as-written"]
        self.gated: dict[str, dict[str, str]] = {h: {} for h in HOSTS}  # host -> marks its last passed gate saw
        self.now = 1_000_000.0  # the clock leases are judged by
        self.checked = 0

    # -- the world's truth ------------------------------------------------------------------------------

    def gate(self, swarm: Any, lane: Any, node: NodeInfo, service_id: str, reporter: Any,
             interrupted: Any = lambda: None) -> GateResult:
        """The node serves when its primary runs the gated lane and every service there runs a lane that
        generates, each on a running task."""
        placed = [s for s in self.swarm.lane_services() if s.node == node.hostname]
        primary = [s for s in placed if s.role == "primary"]
        running = all(any(t.state == "running" for t in self.swarm.tasks(s.id)) for s in placed)
        serves = bool(primary) and primary[0].lane == lane.name and running and all(
            s.lane in GOOD and s.update_state not in ("updating", "rollback_started") for s in placed)
        if serves:
            self.gated[node.hostname] = marks_on(self.swarm, node.hostname)
        return GateResult(serves, None if serves else "generation", "" if serves else "no tokens", 0.0, (), ())

    def ungated_hosts(self) -> list[str]:
        """Nodes with a service whose spec no passed gate saw."""
        return [h for h in HOSTS if any(self.gated[h].get(name) != mark for name, mark in marks_on(
            self.swarm, h).items())]

    # -- running lanectl -----------------------------------------------------------------------------------

    def snapshot(self) -> FleetSnapshot:
        services = tuple(self.swarm.lane_services())
        return FleetSnapshot(nodes=tuple(self.swarm.nodes()), services=services,
                             tasks={s.id: tuple(self.swarm.tasks(s.id)) for s in services},
                             service_names=tuple(self.swarm.service_names()), pushed=FUZZ_PUSHED,
                             secret_digests=SECRETS, unfinished=self.journal.unfinished_intent())

    def run(self, plan: Plan, why: str, stop: tuple[str, int]) -> str:
        how, when = stop
        environ = dict(SECRET_VALUES)
        if how in ("INT", "INT,INT"):
            environ[SIGNAL_AFTER_STEP_ENV] = ",".join(f"{when}:{name}" for name in how.split(","))
        elif how.startswith("kill"):
            self.swarm.kill_at = self.swarm.taken + when
            self.swarm.mid_update = how == "kill-mid-update"
        self.swarm.dead = False
        rollout = FleetRollout(self.catalog, self.swarm, self.journal, reporter=Reporter(),  # type: ignore[arg-type]
                               environ=environ, gate=self.gate, in_flight=lambda *_: None, poll_seconds=0,
                               clock=lambda: self.now)
        try:
            outcome = rollout.run(plan, why=why, unfinished=self.journal.unfinished_intent())
        except Killed:
            FleetMachine.results["killed"] = FleetMachine.results.get("killed", 0) + 1
            return "killed"
        finally:
            self.swarm.kill_at = None
            self.swarm.mid_update = False
        FleetMachine.results[outcome.result] = FleetMachine.results.get(outcome.result, 0) + 1
        return outcome.result

    def check_ended(self, result: str, hosts: list[str], what: str) -> None:
        if result in ("ok", "noop"):
            stale = [h for h in hosts if h in self.ungated_hosts()]
            assert not stale, f"{what} ended {result} while {stale} changed since a gate last saw them serve"

    @rule(lane=st.sampled_from(LANES), stop=STOPS, rolls_back=st.booleans())
    def up(self, lane: str, stop: tuple[str, int], rolls_back: bool) -> None:
        self.swarm.rolls_back = rolls_back
        try:
            plan = plan_fleet_up(self.catalog, self.snapshot(), self.catalog.lane(lane))
        except (BadInput, OperationFailed):
            FleetMachine.results["refused"] = FleetMachine.results.get("refused", 0) + 1
            return
        result = self.run(plan, f"up {lane} --fleet", stop)
        self.check_ended(result, HOSTS, f"up {lane} --fleet")

    def has_a_way_back(self) -> bool:
        """Whether `rollback --fleet` has anything to do (it refuses otherwise, changing nothing)."""
        unfinished = self.journal.unfinished_intent() or {}
        return unfinished.get("action") == "fleet-rollback" or any(
            s.update_state == "completed" and s.previous_spec for s in self.swarm.lane_services())

    @precondition(has_a_way_back)
    @rule(stop=STOPS, rolls_back=st.booleans())
    def rollback(self, stop: tuple[str, int], rolls_back: bool) -> None:
        self.swarm.rolls_back = rolls_back
        try:
            plan = plan_fleet_rollback(self.catalog, self.snapshot(), None)
        except (BadInput, OperationFailed):
            FleetMachine.results["refused"] = FleetMachine.results.get("refused", 0) + 1
            return
        hosts = sorted({s.node for s in plan.steps})
        result = self.run(plan, "rollback --fleet", stop)
        self.check_ended(result, hosts, "rollback --fleet")

    @precondition(lambda self: not self.swarm.fail_updates)
    @rule(role=st.sampled_from(["primary", "rtx"]), host=st.sampled_from(HOSTS))
    def next_update_fails_swarms_check(self, role: str, host: str) -> None:
        self.swarm.fail_updates.add(f"fleet-t-{role}-{host}")

    @precondition(lambda self: bool(self.swarm.unsettled))
    @rule()
    def swarm_settles(self) -> None:
        for name in list(self.swarm.unsettled):
            self.swarm.settle(name)

    @rule(edit=st.sampled_from(sorted(EDITS)))
    def edit_recipe(self, edit: str) -> None:
        self.catalog = self.catalogs[edit]

    @precondition(lambda self: not any(LEASE_LABEL in n.labels for n in self.swarm.nodes()))
    @rule(host=st.sampled_from(HOSTS))
    def another_manager_takes_a_lease(self, host: str) -> None:
        lease = NodeLease("ops@other-manager", 4242, "f" * 32, self.now, 600)
        self.swarm._label(f"id-{host}", LEASE_LABEL, lease.label())

    @precondition(lambda self: any(LEASE_LABEL in n.labels for n in self.swarm.nodes()))
    @rule()
    def leases_expire(self) -> None:
        self.now += 3601

    def leases_left(self) -> dict[str, str]:
        """As `fleet status` judges each node's lease, by this machine's clock."""
        closed = closed_switches(self.journal.read().records)
        host = current_user_at_host().rpartition("@")[2]
        left = {}
        for node in self.swarm.nodes():
            held = node.labels.get(LEASE_LABEL)
            why = held and why_left_behind(read_lease(held), now=self.now, host=host, pid_alive=pid_alive,
                                           switch_closed=closed.__contains__, term_seconds=LEGACY_LEASE_SECONDS)
            if why:
                left[node.hostname] = why
        return left

    @invariant()
    def status_never_calls_an_ungated_node_healthy(self) -> None:
        FleetMachine.steps += self.checked  # the check before the first rule is not a step
        self.checked = 1
        services = self.swarm.lane_services()
        seen = summarize(self.swarm.nodes(), services, {s.id: self.swarm.tasks(s.id) for s in services}, {},
                         leases_left=self.leases_left(), left_over=left_over_services(services, self.catalog))
        mine = f" pid {os.getpid()} "
        killed_here = [n.hostname for n in self.swarm.nodes() if mine in n.labels.get(LEASE_LABEL, "")]
        assert not (seen["healthy"] and killed_here), f"a killed run's lease on {killed_here} is called healthy"
        if seen["healthy"]:
            assert not self.ungated_hosts(), f"fleet status healthy while {self.ungated_hosts()} were not gated"


@pytest.fixture(scope="module")
def catalogs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Catalog]:
    return load_edits(tmp_path_factory.mktemp("fuzz-project"))


def test_fuzz_the_fleet_never_says_ok_for_a_node_it_did_not_gate(catalogs: dict[str, Catalog]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="lanectl-fleet-fuzz-", dir="/dev/shm" if Path("/dev/shm").is_dir()
                                   else None))
    FleetMachine.catalogs, FleetMachine.folder = catalogs, folder
    FleetMachine.steps, FleetMachine.results = 0, {}
    try:
        run_state_machine_as_test(FleetMachine, settings=PROFILE)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"fleet fuzz: {FleetMachine.steps} steps; run results {FleetMachine.results}")
    if PROFILE is settings.get_profile("fleet-ci"):
        assert FleetMachine.steps >= 2000, "the CI search is bounded, not cut short"
