"""The executor runs a plan's steps and nothing else: on an engine in memory, with the real journal and state
files. What only Docker shows is in tests/test_lanes_docker.py and tests/test_switch_docker.py."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import pytest

from lanectl.lanes.execute import Executor, SwitchOutcome
from lanectl.lanes.interrupt import Interrupt
from lanectl.lanes.plan import Plan, plan_down, plan_reconcile, plan_restart, plan_rollback, plan_up
from lanectl.lanes.snapshot import Snapshot
from lanectl.recipe.catalog import Catalog
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneStateStore
from lanectl.state.standby import StandbyStore
from tests.switch_box import (
    Box,
    FakeEngines,
    Interrupting,
    Killed,
    QuietReporter,
    engine_from,
    keys,
    repo_catalog,
    with_engine,
    with_lane,
)

H1, H2 = "lanectl-demo-demo-h1", "lanectl-demo-demo-h2"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return repo_catalog()


class Run:
    """One box's state folder, engine and engines' answers, and the executor over them."""

    def __init__(self, catalog: Catalog, box: Box, state_dir: Path):
        self.catalog, self.box = catalog, box
        self.journal = Journal(state_dir / "journal.jsonl")
        self.states = LaneStateStore(state_dir / "state.json")
        self.standbys = StandbyStore(state_dir / "standby.json")
        self.states.save(box.state)
        self.standbys.update(lambda _: box.standby)
        self.engine = engine_from(box)
        self.engines = FakeEngines(self.engine)
        self.interrupt = Interrupt()
        self.reporter = QuietReporter()

    def executor(self) -> Executor:
        return Executor(self.catalog, self.engine, self.journal, self.states, self.standbys, self.engines,
                        self.reporter, interrupt=self.interrupt, environ={})

    def run(self, plan: Plan, switch: str | None = None) -> SwitchOutcome:
        return self.executor().run(plan, why="test", switch=switch)

    def journaled_steps(self) -> list[str]:
        return [r["step"] for r in self.journal.read().records if r["kind"] == "step"]

    def outcome(self) -> dict:
        return [r for r in self.journal.read().records if r["kind"] == "outcome"][-1]


def h1_serving(catalog: Catalog) -> Box:
    return Box(catalog).run("demo-h1").build("demo-h2").active("demo-h1", "demo-h1").fingerprinted(
        "demo-h1", "demo-h2")


def standby_h1(catalog: Catalog) -> Box:
    return Box(catalog).run("demo-h1").run("demo-h2").active("demo-h2", "demo-h1", "demo-h2").asleep("demo-h1")


def as_it_is(catalog: Catalog) -> Catalog:
    return catalog


class Kind(NamedTuple):
    """A kind of plan: the box it starts from (made from the recipes as they were), the planner, and the recipes
    as they are when it is planned (edited since the box's containers were made, or not)."""

    box: Callable[[Catalog], Box]
    plan: Callable[[Catalog, Snapshot], Plan]
    recipe: Callable[[Catalog], Catalog] = as_it_is


def h1_rtx_port_changed(catalog: Catalog) -> Catalog:
    rtx = catalog.lanes["demo-h1"].spec.companions["rtx"]
    ports = [replace(rtx.engine.ports[0], host=30077)]
    return with_lane(catalog, "demo-h1", companions={"rtx": replace(rtx, engine=replace(rtx.engine, ports=ports))})


def h1_shm_changed(catalog: Catalog) -> Catalog:
    return with_engine(catalog, "demo-h1", shm_size="2g")


def standby_h1_whose_rtx_died(catalog: Catalog) -> Box:
    """The watchdog dropped demo-h1's standby when its companion died asleep; its primary sleeps on."""
    box = standby_h1(catalog)
    rtx = f"{H1}-rtx"
    box.containers[rtx] = replace(box.containers[rtx], state="exited", host_ports=())
    box.sleeping.discard(rtx)
    box.standby = box.standby.without("demo-h1", "its rtx container exited while asleep", datetime.now(UTC))
    return box


def standby_h1_active_dead(catalog: Catalog) -> Box:
    """demo-h2, the active lane, exited; demo-h1 still waits asleep: the lane a failed switch goes back to."""
    return Box(catalog).run("demo-h1").run("demo-h2", "exited").build("demo-broken").active(
        "demo-h2", "demo-h1", "demo-h2").asleep("demo-h1").fingerprinted("demo-h2")


def up_to(lane: str) -> Callable[[Catalog, Snapshot], Plan]:
    return lambda c, s: plan_up(c, s, c.lane(lane))


def rollback(c: Catalog, s: Snapshot) -> Plan:
    return plan_rollback(c, s, None)


KINDS = {
    "up, the old lane left asleep": Kind(h1_serving, up_to("demo-h2")),
    "up, the old lane stopped": Kind(lambda c: h1_serving(c).active(None, "demo-h1"), up_to("demo-h2")),
    "rollback that wakes": Kind(standby_h1, rollback),
    "rollback to kept containers": Kind(lambda c: Box(c).run("demo-h1", "exited").run("demo-h2").active(
        "demo-h2", "demo-h1", "demo-h2"), rollback),
    "recreate": Kind(lambda c: Box(c).run("demo-h2").active("demo-h2", "demo-h2").build("demo-h2", build_id="-2"),
                     up_to("demo-h2")),
    "down with a standby": Kind(standby_h1, lambda c, s: plan_down(c, s, "demo-h2", with_standbys=True)),
    "restart": Kind(lambda c: Box(c).run("demo-h2", "exited").active("demo-h2", "demo-h2"),
                    lambda c, s: plan_restart(c, s, c.lane("demo-h2"), with_gpus=True)),
    # The watchdog never restarts a lane recorded asleep; a killed switch can leave the active lane so.
    "restart of a lane left asleep": Kind(
        lambda c: Box(c).run("demo-h1").run("demo-h2", "exited").active("demo-h1", "demo-h1").asleep("demo-h1"),
        lambda c, s: plan_restart(c, s, c.lane("demo-h1"), with_gpus=True)),
    # A gate's bracket switches with `up`: its third arm wakes the control it left asleep.
    "up that wakes a standby (a bracket's arm)": Kind(lambda c: standby_h1(c).fingerprinted("demo-h2"),
                                                      up_to("demo-h1")),
    "rollback to a standby whose companion changed": Kind(standby_h1, rollback, h1_rtx_port_changed),
    "rollback to a standby whose primary changed": Kind(standby_h1, rollback, h1_shm_changed),
    "up to a standby whose companion changed (a bracket's arm)": Kind(
        lambda c: standby_h1(c).fingerprinted("demo-h2"), up_to("demo-h1"), h1_rtx_port_changed),
    "rollback to a standby the watchdog dropped": Kind(standby_h1_whose_rtx_died, rollback),
    "up whose way back is a standby": Kind(standby_h1_active_dead, up_to("demo-broken")),
}


def planned(kind: Kind, catalog: Catalog, state_dir: Path) -> tuple[Catalog, Plan, Run]:
    """The recipes as planned, the plan, and a run of the kind's box, not started."""
    box = kind.box(catalog)
    recipes = kind.recipe(catalog)
    return recipes, kind.plan(recipes, box.snapshot(catalog=recipes)), Run(recipes, box, state_dir)


@pytest.mark.parametrize("kind", list(KINDS))
def test_what_runs_and_is_journaled_is_the_plan_step_for_step(catalog, tmp_path, kind):
    _, plan, run = planned(KINDS[kind], catalog, tmp_path)
    outcome = run.run(plan)
    assert outcome.exit_code == 0, outcome.message
    assert run.journaled_steps() == keys(plan) == list(outcome.steps)
    intent = next(r for r in run.journal.read().records if r["kind"] == "intent")
    assert intent["steps"] == keys(plan)


def awake(run: Run, catalog: Catalog) -> None:
    """What every plan holds to: no lane is held to its gate with a container asleep, and the lane that serves
    after it has none asleep (a docker start of a sleeping container leaves it asleep: a lane starts from
    stopped, or is woken)."""
    assert run.engines.gated_asleep == [], "held to its gate while asleep"
    serving = run.states.load().active
    if serving is not None:
        assert run.engine.asleep(catalog.lane(serving)) == [], f"{serving} serves half asleep"


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("failure", [None, "its gate", "its wake"])
def test_no_plan_leaves_a_container_of_the_lane_it_starts_asleep(catalog, tmp_path, kind, failure):
    recipes, plan, run = planned(KINDS[kind], catalog, tmp_path)
    if failure == "its gate":
        run.engines.failing_gates.add(plan.lane)  # the way back brings the previous lane back
    elif failure == "its wake":
        run.engines.failing_wakes.add(plan.lane)  # the cold path
    outcome = run.run(plan)
    awake(run, recipes)
    assert run.engine.asleep(recipes.lane(plan.lane)) == [], f"{plan.lane} is left half asleep"
    if failure is None or plan.kind == "down":
        assert outcome.exit_code == 0, outcome.message


def test_the_switch_leaves_the_new_lane_serving_the_old_one_asleep_and_the_watchdog_armed(catalog, tmp_path):
    box = h1_serving(catalog)
    run = Run(catalog, box, tmp_path)
    outcome = run.run(plan_up(catalog, box.snapshot(), catalog.lane("demo-h2")))
    assert outcome.message == "demo-h2 is serving (was demo-h1); demo-h1 waits asleep as a standby"
    assert run.engine.running() == {H1, f"{H1}-rtx", H2, f"{H2}-rtx"}
    state = run.states.load()
    assert (state.active, state.known_good, state.watchdog_armed, state.watchdog_lease) == (
        "demo-h2", ("demo-h1", "demo-h2"), True, None)
    assert run.standbys.load().standby("demo-h1") is not None


def test_a_failed_gate_takes_the_way_back_and_brings_the_previous_lane_back(catalog, tmp_path):
    box = h1_serving(catalog).active("demo-h1", "demo-h1")
    box.standby = dataclasses.replace(box.standby, fingerprints={})  # demo-h1 is stopped, not left asleep
    run = Run(catalog, box, tmp_path)
    run.engines.failing_gates.add("demo-h2")
    outcome = run.run(plan_up(catalog, box.snapshot(), catalog.lane("demo-h2")))
    assert (outcome.result, outcome.lane, outcome.exit_code) == ("rolled-back", "demo-h1", 1)
    assert outcome.message == ("demo-h2 failed its health gate (generation): demo-h2 is broken. Rolled back: demo-h1 "
                               "is serving again")
    assert run.engine.running() == {H1, f"{H1}-rtx"}
    assert run.states.load().active == "demo-h1" and run.states.load().watchdog_armed
    assert [r["check"] for r in run.journal.read().records if r["kind"] == "diagnostics"] == ["generation"]


def test_without_a_way_back_the_failed_lane_is_stopped_for_debugging(catalog, tmp_path):
    box = h1_serving(catalog)
    box.standby = dataclasses.replace(box.standby, fingerprints={})
    run = Run(catalog, box, tmp_path)
    run.engines.failing_gates.add("demo-h2")
    outcome = run.run(plan_up(catalog, box.snapshot(), catalog.lane("demo-h2"), rollback_on_failure=False))
    assert outcome.message.endswith("demo-h2 is stopped for debugging; nothing else was started (--no-rollback)")
    assert run.engine.running() == set()
    assert run.states.load().active is None and run.states.load().watchdog_armed


def test_a_sleep_that_fails_stops_the_lane_instead_and_the_switch_goes_on(catalog, tmp_path):
    box = h1_serving(catalog)
    run = Run(catalog, box, tmp_path)
    run.engines.failing_sleeps.add("demo-h1")
    outcome = run.run(plan_up(catalog, box.snapshot(), catalog.lane("demo-h2")))
    assert outcome.message == "demo-h2 is serving (was demo-h1)"
    assert run.engine.running() == {H2, f"{H2}-rtx"}
    assert run.standbys.load().standby("demo-h1") is None
    assert "demo-h1 is stopped instead of left asleep" in run.standbys.load().dropped["demo-h1"].reason or \
        "sleep failed" in run.standbys.load().dropped["demo-h1"].reason
    notes = [r["message"] for r in run.journal.read().records if r["kind"] == "note"]
    assert any(n.startswith("demo-h1 is stopped instead of left asleep: ") for n in notes)


def test_a_wake_that_fails_takes_the_cold_path(catalog, tmp_path):
    box = standby_h1(catalog)
    run = Run(catalog, box, tmp_path)
    run.engines.failing_wakes.add("demo-h1")
    outcome = run.run(plan_rollback(catalog, box.snapshot(), None))
    assert outcome.result == "ok" and "its wake failed" in outcome.message and "started cold" in outcome.message
    assert run.engine.running() == {H1, f"{H1}-rtx"}
    assert run.engine.held[H1].starts == 1, "stopped and started again: the cold path"


def test_a_wake_whose_output_differs_from_the_fingerprint_takes_the_cold_path(catalog, tmp_path):
    box = standby_h1(catalog)
    run = Run(catalog, box, tmp_path)
    run.engines.greedy_text = "garbage"
    outcome = run.run(plan_rollback(catalog, box.snapshot(), None))
    assert "wake check: greedy output 'garbage' differs from the fingerprint" in outcome.message


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_switch_lets_the_step_finish_then_goes_back_re_arms_and_says_what_serves(catalog, tmp_path,
                                                                                              signum):
    box = h1_serving(catalog).active("demo-h1", "demo-h1")
    box.standby = dataclasses.replace(box.standby, fingerprints={})
    run = Run(catalog, box, tmp_path)
    run.engine.on_call[f"start:{H2}"] = lambda: run.interrupt.arrived(signum)  # as the signal handler does
    outcome = run.run(plan_up(catalog, box.snapshot(), catalog.lane("demo-h2")))
    name = signal.Signals(signum).name
    assert (outcome.result, outcome.exit_code, outcome.lane) == ("interrupted", 128 + signum, "demo-h1")
    assert outcome.message == f"interrupted by {name}. Rolled back: demo-h1 is serving again"
    assert f"start:{H2}" in run.journaled_steps(), "the step in progress finished and was journaled"
    assert f"create:{H2}-rtx" not in run.journaled_steps(), "nothing after it"
    assert run.engine.running() == {H1, f"{H1}-rtx"}
    state = run.states.load()
    assert state.active == "demo-h1" and state.watchdog_armed and state.watchdog_lease is None
    assert run.outcome()["result"] == "interrupted"


def test_a_second_signal_stops_at_once_and_leaves_the_switch_for_the_next_command(catalog, tmp_path):
    box = h1_serving(catalog).active("demo-h1", "demo-h1")
    box.standby = dataclasses.replace(box.standby, fingerprints={})
    run = Run(catalog, box, tmp_path)
    run.engine.on_call[f"start:{H2}"] = lambda: run.interrupt.arrived(signal.SIGINT)
    run.engine.on_call[f"stop:{H2}"] = lambda: run.interrupt.arrived(signal.SIGINT)  # during the way back
    outcome = run.run(plan_up(catalog, box.snapshot(), catalog.lane("demo-h2")))
    assert (outcome.result, outcome.exit_code) == ("aborted", 130)
    assert "stopped at once by a second signal (SIGINT)" in outcome.message and "left unfinished" in outcome.message
    assert run.journal.unfinished_intent() is not None, "the next command finishes or undoes it"


def test_a_real_signal_after_a_held_switch_ended_is_noted_and_a_second_ends_the_command(catalog, tmp_path):
    """The window between the end of a switch's own signal handling and its printed result: Python's handler raised
    KeyboardInterrupt there, and the command exited 130 saying nothing of the switch that had finished."""
    import os

    run = Run(catalog, h1_serving(catalog).active("demo-h1", "demo-h1"), tmp_path)
    before = signal.getsignal(signal.SIGINT)
    with run.interrupt.held():
        outcome = Executor(catalog, run.engine, run.journal, run.states, run.standbys, run.engines, run.reporter,
                           interrupt=run.interrupt, environ={"LANECTL_TEST_SIGNAL_AFTER_STEP": "end:INT"}).run(
            plan_up(catalog, run.box.snapshot(), catalog.lane("demo-h2")), why="test")
        assert (outcome.result, run.interrupt.pending()) == ("ok", "SIGINT"), outcome
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before, "the command's own handler is back"


def test_a_state_file_that_cannot_be_written_after_a_passed_gate_leaves_the_new_lane_serving(catalog, tmp_path):
    box = h1_serving(catalog).active("demo-h1", "demo-h1")
    box.standby = dataclasses.replace(box.standby, fingerprints={})
    run = Run(catalog, box, tmp_path)

    def fill_the_disk(lane):
        if lane.name == "demo-h2":  # state.json cannot be replaced any more: a folder in its place
            (tmp_path / "state.json").unlink()
            (tmp_path / "state.json").mkdir()

    run.engines.on_gate = fill_the_disk
    outcome = run.run(plan_up(catalog, box.snapshot(), catalog.lane("demo-h2")))
    assert outcome.result == "failed" and outcome.exit_code == 1
    assert run.engine.running() == {H2, f"{H2}-rtx"}, "the healthy new lane is not undone"
    assert outcome.message.startswith("demo-h2 is serving (was demo-h1). BUT: mark demo-h2 active and known-good: ")
    assert "could not write" in outcome.message and "state.json" in outcome.message
    assert outcome.message.endswith("demo-h2 serves and passed its gate; fix the cause, then `lanectl up demo-h2` "
                                    "records it")


def test_an_unfinished_switch_is_finished_under_its_own_switch_id(catalog, tmp_path):
    box = Box(catalog).run("demo-h1", "exited").run("demo-h2").active("demo-h1", "demo-h1")
    run = Run(catalog, box, tmp_path)
    switch = run.journal.record_intent(action="up", from_lane="demo-h1", to_lane="demo-h2", why="up",
                                       steps=["stop:x"])["switch"]
    box.unfinished = run.journal.unfinished_intent()
    plan = plan_reconcile(catalog, box.snapshot())
    assert plan is not None
    outcome = run.run(plan, switch=switch)
    assert (outcome.result, outcome.message) == ("finished", "finished the interrupted switch: demo-h2 passed its gate")
    assert run.journal.unfinished_intent() is None
    assert run.states.load().active == "demo-h2"


def test_a_recreate_that_fails_its_gate_puts_the_old_containers_back_and_they_serve_again(catalog, tmp_path):
    box = Box(catalog).run("demo-h2").active("demo-h2", "demo-h2").build("demo-h2", build_id="-2")
    run = Run(catalog, box, tmp_path)
    old = run.engine.held[H2]
    run.engines.on_gate = lambda lane: run.engines.failing_gates.add(lane.name) if run.engine.held[H2] is not old \
        else run.engines.failing_gates.discard(lane.name)
    outcome = run.run(plan_up(catalog, box.snapshot(), catalog.lane("demo-h2")))
    assert (outcome.result, outcome.lane) == ("rolled-back", "demo-h2"), outcome.message
    assert outcome.message.endswith("Rolled back: demo-h2 is serving again")
    assert run.engine.held[H2] is old and run.engine.running() == {H2, f"{H2}-rtx"}
    assert not [name for name in run.engine.held if ".was-" in name], "nothing left set aside"


def snapshot_of(run: Run, catalog: Catalog):
    from lanectl.lanes.snapshot import take_snapshot
    from lanectl.state.paths import StateFiles

    return take_snapshot(catalog, run.engine, StateFiles(run.journal.path.parent), environ={},
                         create_secret_key=False, host_memory=lambda: 64.0)


SWITCHES = {
    "stop-first": Kind(lambda c: h1_serving(c).active("demo-h1", "demo-h1").fingerprinted(), up_to("demo-h2")),
    "sleep": Kind(h1_serving, up_to("demo-h2")),
    "wake": Kind(standby_h1, rollback),
    "recreate": Kind(lambda c: Box(c).run("demo-h2").active("demo-h2", "demo-h2").build("demo-h2", build_id="-2"),
                     up_to("demo-h2")),
    "cold start of a changed standby": KINDS["rollback to a standby whose companion changed"],
    "way back to a standby": KINDS["up whose way back is a standby"],
}


def _cases():
    for name, kind in SWITCHES.items():
        recipes = kind.recipe(repo_catalog())
        steps = len(kind.plan(recipes, kind.box(repo_catalog()).snapshot(catalog=recipes)).steps)
        for after in range(1, steps + 1):
            yield name, after


@pytest.mark.parametrize(("kind", "after"), list(_cases()))
def test_a_switch_killed_after_any_step_is_finished_or_undone_and_a_lane_serves(catalog, tmp_path, kind, after):
    catalog, killed, run = planned(SWITCHES[kind], catalog, tmp_path)

    def kill() -> None:
        raise Killed

    run.reporter = Interrupting(after, kill)
    with pytest.raises(Killed):
        run.run(killed)
    snapshot = snapshot_of(run, catalog)
    assert snapshot.unfinished is not None and len(snapshot.unfinished["done_steps"]) == after
    plan = plan_reconcile(catalog, snapshot)
    assert plan is not None
    run.reporter = QuietReporter()
    outcome = run.executor().run(plan, why="reconcile", switch=snapshot.unfinished["switch"],
                                 state=snapshot.state, standby=snapshot.standby)
    assert outcome.result in ("finished", "undone"), outcome.message
    state = run.states.load()
    assert state.active in (killed.lane, killed.previous) and state.watchdog_armed and state.watchdog_lease is None
    active = catalog.lane(state.active)
    assert {active.container_name(role) for role in active.roles} <= run.engine.running()
    others = run.engine.running() - {active.container_name(role) for role in active.roles}
    assert all(run.standbys.load().standby(name.split("-demo-")[0]) is None or True for name in others)
    assert run.journal.unfinished_intent() is None
    awake(run, catalog)


@pytest.mark.parametrize(("kind", "after"), list(_cases()))
def test_a_signal_after_any_step_goes_back_or_finishes_and_always_re_arms(catalog, tmp_path, kind, after):
    catalog, plan, run = planned(SWITCHES[kind], catalog, tmp_path)
    run.reporter = Interrupting(after, lambda: run.interrupt.arrived(signal.SIGINT))
    outcome = run.run(plan)
    state = run.states.load()
    assert state.watchdog_armed and state.watchdog_lease is None, outcome.message
    # The point of no return: the end of the last phase a failure sends back (the optional ones come after).
    committed = sum(len(phase.steps) for phase in plan.phases if not phase.optional)
    if after < committed:
        assert (outcome.result, outcome.exit_code) == ("interrupted", 130), outcome.message
        assert state.active == plan.previous, outcome.message
    else:
        assert outcome.result == "ok" and state.active == plan.lane, "past the gate only bookkeeping is left"
    serving = catalog.lane(state.active)
    assert {serving.container_name(role) for role in serving.roles} <= run.engine.running()
    awake(run, catalog)


def test_a_gate_that_passes_with_an_engine_of_the_lane_asleep_fails_it(catalog, tmp_path):
    """A companion's readiness is its /health 200, which vLLM answers asleep: a lane whose companion someone put to
    sleep passed its gate (a finished switch, a way back) and was said to serve. Each engine is asked
    /is_sleeping where it publishes once the gate passed."""
    from lanectl.lanes.plan import Phase, Step

    box = Box(catalog).run("demo-h1").active("demo-h1", "demo-h1")
    box.sleeping.add("lanectl-demo-demo-h1-rtx")
    run = Run(catalog, box, tmp_path)
    plan = Plan("up", "demo-h1", None, (Phase((Step("gate", "demo-h1", seconds=60),)),))
    outcome = run.run(plan)
    assert outcome.result == "failed", outcome
    assert outcome.message.startswith("demo-h1 failed its health gate (asleep): lanectl-demo-demo-h1-rtx answers "
                                      "/health but sleeps"), outcome.message
    box.sleeping.clear()
    assert Run(catalog, box, tmp_path / "awake").run(plan).result == "ok"
