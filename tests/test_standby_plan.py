"""The pure standby rules of a switch plan: who sleeps, who is stopped and why, what a wake needs, and what is
done when a sleep or a wake fails."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from lanectl.lanes.plan import (
    gpu_memory_shortfall,
    plan_drop_lost_standbys,
    plan_reconcile,
    plan_rollback,
    plan_up,
    standby_refusal,
)
from lanectl.recipe.catalog import Catalog
from tests.switch_box import Box, keys, repo_catalog, way_back, with_engine, with_lane

H1, H2, BROKEN = "lanectl-demo-demo-h1", "lanectl-demo-demo-h2", "lanectl-demo-demo-broken"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return repo_catalog()


def h1_serving(catalog: Catalog) -> Box:
    return Box(catalog).run("demo-h1").build("demo-h2").active("demo-h1", "demo-h1").fingerprinted(
        "demo-h1", "demo-h2", "demo-broken")


def test_the_active_lane_sleeps_companion_first_and_memory_is_checked_before_the_new_lane_starts(catalog):
    plan = plan_up(catalog, h1_serving(catalog).snapshot(), catalog.lane("demo-h2"))
    assert keys(plan) == ["disarm:demo-h2", f"sleep:{H1}-rtx", f"sleep:{H1}", "check-memory:demo-h2",
                          f"create:{H2}", f"start:{H2}", f"create:{H2}-rtx", f"start:{H2}-rtx",
                          "gate:demo-h2", "activate:demo-h2", "arm:demo-h2"]
    sleep, memory = plan.phases[1], plan.phases[2]
    assert [s.key for s in sleep.fallback] == [f"stop:{H1}-rtx", f"stop:{H1}", "forget-standby:demo-h1"], \
        "a sleep that fails stops the lane instead"
    assert [s.key for s in memory.fallback][-1] == "forget-standby:demo-h1"
    assert [s.key for phase in plan.way_back for s in phase.steps][:4] == [
        f"stop:{H2}-rtx", f"stop:{H2}", "wake:demo-h1", "gate:demo-h1"], "the way back wakes the lane it left"


def test_a_lane_that_is_not_active_is_stopped_not_put_to_sleep(catalog):
    box = h1_serving(catalog).active(None, "demo-h1")
    plan = plan_up(catalog, box.snapshot(), catalog.lane("demo-h2"))
    assert keys(plan)[1:3] == [f"stop:{H1}-rtx", f"stop:{H1}"] and "sleep" not in {s.action for s in plan.steps}
    assert plan.steps[1].why == ""


@pytest.mark.parametrize(("change", "why"), [
    ("rollback", "not left asleep: a rollback stops the lane it leaves"),
    ("no fingerprint",
     "not left asleep: no wake-check fingerprint is recorded for it, so a wake could not be checked"),
    ("little memory",
     "not left asleep: host memory: 1.5 GiB available, its weights need 2 GiB (level-1 sleep copies them to host "
     "memory)"),
    ("memory unknown",
     "not left asleep: host memory is unknown (/proc/meminfo unreadable), and level-1 sleep copies the weights there"),
])
def test_an_active_lane_that_cannot_sleep_safely_is_stopped_with_the_reason(catalog, change, why):
    box = h1_serving(catalog)
    if change == "no fingerprint":
        box.standby = dataclasses.replace(box.standby, fingerprints={})
    box.host_memory_gib = {"little memory": 1.5, "memory unknown": None}.get(change, box.host_memory_gib)
    target = catalog.lane("demo-h2")
    plan = plan_rollback(catalog, box.snapshot(), target) if change == "rollback" else \
        plan_up(catalog, box.snapshot(), target)
    assert keys(plan)[1:3] == [f"stop:{H1}-rtx", f"stop:{H1}"]
    assert {s.why for s in plan.steps[1:3]} == {why}
    assert plan.steps[2].describe().endswith(f"allowing 30 s to exit ({why})")
    assert "check-memory:demo-h2" not in keys(plan)


def test_a_lane_without_standby_in_its_recipe_is_stopped_silently(catalog):
    box = Box(catalog).run("h1-REF").build("h2-REF").active("h1-REF", "h1-REF")
    plan = plan_up(catalog, box.snapshot(), catalog.lane("h2-REF"))
    assert [s.action for s in plan.steps[1:3]] == ["stop", "stop"] and plan.steps[1].why == ""


def test_a_standby_target_is_woken_and_held_to_gate_and_wake_check_and_falls_back_to_the_cold_path(catalog):
    box = Box(catalog).run("demo-h1").run("demo-h2").active("demo-h2", "demo-h1", "demo-h2").asleep("demo-h1")
    plan = plan_rollback(catalog, box.snapshot(), None)
    assert keys(plan) == ["disarm:demo-h1", f"stop:{H2}-rtx", f"stop:{H2}", "wake:demo-h1", "gate:demo-h1",
                          "wake-check:demo-h1", "activate:demo-h1", "arm:demo-h1"]
    assert plan.steps[1].why == "not left asleep: the lane it rolls back to needs all of its GPU memory back"
    wake = next(phase for phase in plan.phases if phase.steps[0].action == "wake")
    assert wake.steps[1].seconds == 30, "a woken lane's gate has the wake's budget"
    assert [s.key for s in wake.fallback] == [f"stop:{H1}-rtx", f"stop:{H1}", f"start:{H1}", f"start:{H1}-rtx",
                                              "gate:demo-h1"]
    assert wake.fallback[-1].seconds == 120, "the cold path's gate has the startup budget"


def test_an_up_that_wakes_a_standby_still_stops_the_lane_it_leaves(catalog):
    box = Box(catalog).run("demo-h1").run("demo-h2").active("demo-h2", "demo-h1", "demo-h2").asleep("demo-h1")
    box.fingerprinted("demo-h2")
    plan = plan_up(catalog, box.snapshot(), catalog.lane("demo-h1"))
    assert [s.action for s in plan.steps[1:3]] == ["stop", "stop"], "never two sleepers on one GPU set"


def test_one_standby_per_gpu_set_the_older_one_is_stopped(catalog):
    box = Box(catalog).run("demo-h1").run("demo-h2").build("demo-broken").active("demo-h2", "demo-h1", "demo-h2")
    box.asleep("demo-h1").fingerprinted("demo-h2")
    plan = plan_up(catalog, box.snapshot(), catalog.lane("demo-broken"))
    assert keys(plan)[1:7] == [f"stop:{H1}-rtx", f"stop:{H1}", "forget-standby:demo-h1", f"sleep:{H2}-rtx",
                               f"sleep:{H2}", "check-memory:demo-broken"]
    assert plan.steps[1].why == "ends its standby: demo-broken takes its GPUs"


def test_a_standby_whose_container_no_longer_matches_the_recipe_is_dropped_and_started_cold(catalog):
    box = Box(catalog).run("demo-h1").run("demo-h2").active("demo-h2", "demo-h1", "demo-h2").asleep("demo-h1")
    edited = with_engine(catalog, "demo-h1", shm_size="2g")
    plan = plan_rollback(edited, box.snapshot(catalog=edited), None)
    assert plan.notes == ("the standby of demo-h1 is lost: its primary container no longer matches the recipe "
                          "(shm_size none → 2g); a rollback to it is a cold start",
                          "demo-h1 has no standby to wake; starting it cold")
    assert "wake:demo-h1" not in keys(plan) and f"create:{H1}" in keys(plan)
    assert keys(plan)[1] == "forget-standby:demo-h1"


def test_a_standby_lost_to_its_companions_change_is_stopped_before_its_cold_start(catalog):
    """Its primary is unchanged but asleep: `docker start` of it would do nothing, and the gate would hold a
    sleeping engine to a generation probe it never answers."""
    box = Box(catalog).run("demo-h1").run("demo-h2").active("demo-h2", "demo-h1", "demo-h2").asleep("demo-h1")
    rtx = catalog.lane("demo-h1").spec.companions["rtx"]
    edited = with_lane(catalog, "demo-h1", companions={"rtx": replace(rtx, engine=replace(
        rtx.engine, ports=[replace(rtx.engine.ports[0], host=30077)]))})
    plan = plan_rollback(edited, box.snapshot(catalog=edited), None)
    assert keys(plan)[:11] == ["disarm:demo-h1", "forget-standby:demo-h1", f"stop:{H2}-rtx", f"stop:{H2}",
                               f"stop:{H1}-rtx", f"stop:{H1}", f"start:{H1}", f"set-aside:{H1}-rtx",
                               f"create:{H1}-rtx", f"start:{H1}-rtx", "gate:demo-h1"]
    assert {s.why for s in plan.steps[4:6]} == {
        "its standby is dropped and it may still sleep: a cold start begins stopped"}


def test_a_standby_the_watchdog_dropped_has_its_sleeping_primary_stopped_before_it_starts(catalog):
    box = Box(catalog).run("demo-h1", roles=("primary",)).run("demo-h1", "exited", roles=("rtx",)).run("demo-h2")
    box.active("demo-h2", "demo-h1", "demo-h2").asleep("demo-h1")
    box.standby = box.standby.without("demo-h1", "its rtx container exited while asleep", datetime.now(UTC))
    plan = plan_rollback(catalog, box.snapshot(), None)
    assert keys(plan)[3:7] == [f"stop:{H1}", f"start:{H1}", f"start:{H1}-rtx", "gate:demo-h1"]
    assert way_back(plan)[-5:-2] == [f"start:{H2}", f"start:{H2}-rtx", "gate:demo-h2"]


def test_an_unfinished_wake_is_finished_by_waking_not_by_gating_a_sleeping_lane(catalog):
    box = Box(catalog).run("demo-h1").run("demo-h2", "exited").active("demo-h2", "demo-h1", "demo-h2")
    box.asleep("demo-h1").unfinished = {"switch": "s1", "action": "up", "from": "demo-h2", "to": "demo-h1",
                                        "done_steps": ["disarm:demo-h1", f"stop:{H2}-rtx", f"stop:{H2}"]}
    plan = plan_reconcile(catalog, box.snapshot())
    assert plan is not None and plan.kind == "finish"
    assert keys(plan)[:3] == ["wake:demo-h1", "gate:demo-h1", "wake-check:demo-h1"]


def test_a_standby_that_died_asleep_is_lost(catalog):
    box = Box(catalog).run("demo-h1", "exited").run("demo-h2").active("demo-h2", "demo-h1", "demo-h2")
    box.asleep("demo-h1")
    plan = plan_rollback(catalog, box.snapshot(), None)
    assert "its primary container exited while asleep (exit code 0: vLLM exits 0 when its engine core dies)" in \
        plan.notes[0]
    assert keys(plan)[4:6] == [f"start:{H1}", f"start:{H1}-rtx"]


def test_a_shared_host_port_stops_the_lane_it_would_block(catalog):
    """Validation refuses this within a recipe; across recipes the plan still must not leave a port taken."""
    h1 = catalog.lane("demo-h1")
    h2 = catalog.lane("demo-h2")
    same_port = replace(h2, spec=replace(h2.spec, engine=replace(h2.spec.engine, ports=h1.spec.engine.ports)))
    snapshot = h1_serving(catalog).snapshot()
    assert standby_refusal(h1, same_port, snapshot, rollback=False) == (
        "demo-h2 publishes its host port 18000/tcp, which a sleeping lane keeps")
    assert standby_refusal(h1, h2, snapshot, rollback=False) is None


MIB = 1024


@pytest.mark.parametrize(("memory", "expected"), [
    ({"0": (80 * MIB, 75 * MIB), "1": (80 * MIB, 79 * MIB)}, None),
    ({"0": (80 * MIB, 70 * MIB), "1": (80 * MIB, 79 * MIB)},
     "GPU 0: 70.0 GiB free, and demo-h2's primary needs 73.6 GiB (--gpu-memory-utilization 0.92 of 80.0 GiB)"),
    ({"0": (80 * MIB, 79 * MIB)}, "GPU 1 of demo-h2's rtx is not among those nvidia-smi lists"),
])
def test_gpu_memory_is_judged_by_vllms_own_rule(catalog, memory, expected):
    assert gpu_memory_shortfall(catalog.lane("demo-h2"), memory) == expected


def test_the_gpu_memory_utilization_flag_is_read_from_the_lane(catalog):
    """h2-REF asks for 0.97 of GPU 0 (77.6 GiB of 80): 78 GiB free fits, 77 does not."""
    assert gpu_memory_shortfall(catalog.lane("h2-REF"), {"0": (80 * MIB, 78 * MIB), "1": (80 * MIB, 80 * MIB)}) \
        is None
    assert gpu_memory_shortfall(catalog.lane("h2-REF"), {"0": (80 * MIB, 77 * MIB), "1": (80 * MIB, 80 * MIB)}) == (
        "GPU 0: 77.0 GiB free, and h2-REF's primary needs 77.6 GiB (--gpu-memory-utilization 0.97 of 80.0 GiB)")


def test_a_paused_standby_is_lost_and_the_watchdogs_drop_stops_it_with_its_own_drain(catalog):
    """`docker pause` of a lane waiting asleep: it answers nothing, not even a wake, so it is lost; what drops it
    stops it (a paused container still holds its GPUs and ports), companions first, each with its own timeout."""
    box = Box(catalog).run("demo-h2").run("demo-h1", "paused").active("demo-h2", "demo-h1", "demo-h2")
    box.asleep("demo-h1")
    plan = plan_drop_lost_standbys(catalog, box.snapshot())
    assert plan is not None and keys(plan) == [f"stop:{H1}-rtx", f"stop:{H1}", "forget-standby:demo-h1"]
    assert plan.steps[2].why == ("its primary container was paused while asleep (docker pause): it answers nothing, "
                                 "not even a wake")
    assert [s.seconds for s in plan.steps[:2]] == [30, 30]  # what the demo's containers were created with


def test_the_watchdogs_drop_leaves_a_standby_that_can_still_be_woken_alone(catalog):
    box = Box(catalog).run("demo-h2").run("demo-h1").active("demo-h2", "demo-h1", "demo-h2").asleep("demo-h1")
    assert plan_drop_lost_standbys(catalog, box.snapshot()) is None
    edited = with_engine(catalog, "demo-h1", shm_size="2g")  # drift is a switch's to judge, not the watchdog's
    assert plan_drop_lost_standbys(edited, box.snapshot(catalog=edited)) is None


def test_a_lost_standby_beside_the_switch_is_stopped_as_it_is_dropped(catalog):
    """demo-h1 paused while asleep, and a switch to a lane it does not conflict with: it was forgotten and left
    paused on its GPUs, where the next restart of the active lane was refused."""
    box = Box(catalog).run("demo-h2").run("demo-h1", "paused").active("demo-h2", "demo-h1", "demo-h2")
    box.asleep("demo-h1")
    plan = plan_up(catalog, box.build("demo-h2-8").snapshot(), catalog.lane("demo-h2-8"))
    assert keys(plan)[:4] == ["disarm:demo-h2-8", f"stop:{H1}-rtx", f"stop:{H1}", "forget-standby:demo-h1"]
    assert keys(plan).count(f"stop:{H1}") == 1


def test_up_of_the_serving_lane_drops_a_lost_standby_beside_it_and_touches_nothing_else(catalog):
    box = Box(catalog).run("demo-h2").run("demo-h1", "paused").active("demo-h2", "demo-h1", "demo-h2")
    box.asleep("demo-h1")
    plan = plan_up(catalog, box.snapshot(), catalog.lane("demo-h2"))
    assert keys(plan) == [f"stop:{H1}-rtx", f"stop:{H1}", "forget-standby:demo-h1"]
    assert all(phase.optional for phase in plan.phases) and plan.notes[0].startswith("the standby of demo-h1 is lost")
