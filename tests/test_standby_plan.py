"""The pure standby rules of a switch plan: who sleeps, who is stopped and why, and what a wake needs."""

from __future__ import annotations

import pytest

from lanectl.lanes.plan import StandbyFacts, gpu_memory_shortfall, plan_switch, standby_refusal
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from tests.conftest import REPO
from tests.test_switch_plan import container, keys

H1, H2, BROKEN = "lanectl-demo-demo-h1", "lanectl-demo-demo-h2", "lanectl-demo-demo-broken"
ROOMY = 64.0  # GiB of host memory: the demo lanes' weights (2 GiB) fit


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(Project.locate(REPO / "recipes"))


def running(catalog, *lanes: str, image: str = "img"):
    return [container(catalog, lane, role, "running", f"{image}:{lane}") for lane in lanes
            for role in ("primary", "rtx")]


def facts(**kwargs) -> StandbyFacts:
    base = {"fingerprinted": frozenset({"demo-h1", "demo-h2", "demo-broken"}), "host_available_gib": ROOMY}
    return StandbyFacts(**{**base, **kwargs})


def test_the_active_lane_sleeps_companion_first_and_memory_is_checked_before_the_new_lane_starts(catalog):
    steps = plan_switch(catalog.lane("demo-h2"), "img:demo-h2", catalog, running(catalog, "demo-h1"),
                        active="demo-h1", standby=facts())
    assert keys(steps) == [f"sleep:{H1}-rtx", f"sleep:{H1}", "check-memory:demo-h2",
                           f"create:{H2}", f"start:{H2}", f"create:{H2}-rtx", f"start:{H2}-rtx",
                           "gate:demo-h2", "activate:demo-h2"]


def test_a_lane_that_is_not_active_is_stopped_not_put_to_sleep(catalog):
    steps = plan_switch(catalog.lane("demo-h2"), "img:demo-h2", catalog, running(catalog, "demo-h1"),
                        active=None, standby=facts())
    assert keys(steps)[:2] == [f"stop:{H1}-rtx", f"stop:{H1}"] and "sleep" not in {s.action for s in steps}
    assert steps[0].why == ""


@pytest.mark.parametrize(("change", "why"), [
    ({"rollback": True}, "not left asleep: a rollback stops the lane it leaves"),
    ({"fingerprinted": frozenset()},
     "not left asleep: no wake-check fingerprint is recorded for it, so a wake could not be checked"),
    ({"host_available_gib": 1.5},
     "not left asleep: host memory: 1.5 GiB available, its weights need 2 GiB (level-1 sleep copies them to host "
     "memory)"),
    ({"host_available_gib": None},
     "not left asleep: host memory is unknown (/proc/meminfo unreadable), and level-1 sleep copies the weights there"),
])
def test_an_active_lane_that_cannot_sleep_safely_is_stopped_with_the_reason(catalog, change, why):
    steps = plan_switch(catalog.lane("demo-h2"), "img:demo-h2", catalog, running(catalog, "demo-h1"),
                        active="demo-h1", standby=facts(**change))
    assert keys(steps)[:2] == [f"stop:{H1}-rtx", f"stop:{H1}"]
    assert {s.why for s in steps[:2]} == {why}
    assert steps[1].describe().endswith(f"allowing 10 s to exit ({why})")
    assert "check-memory:demo-h2" not in keys(steps)


def test_a_lane_without_standby_in_its_recipe_is_stopped_silently(catalog):
    steps = plan_switch(catalog.lane("h2-REF"), "img:h2", catalog, running(catalog, "h1-REF"),
                        active="h1-REF", standby=facts())
    assert [s.action for s in steps[:2]] == ["stop", "stop"] and steps[0].why == ""


def test_a_standby_target_is_woken_and_held_to_gate_and_wake_check(catalog):
    observed = running(catalog, "demo-h1", "demo-h2")
    steps = plan_switch(catalog.lane("demo-h1"), "img:demo-h1", catalog, observed, active="demo-h2",
                        standby=facts(asleep=frozenset({"demo-h1"}), rollback=True))
    assert keys(steps) == [f"stop:{H2}-rtx", f"stop:{H2}", f"wake:{H1}", f"wake:{H1}-rtx", "gate:demo-h1",
                           "wake-check:demo-h1", "activate:demo-h1"]
    assert steps[0].why == "not left asleep: the lane it rolls back to needs all of its GPU memory back"


def test_an_up_that_wakes_a_standby_still_stops_the_lane_it_leaves(catalog):
    observed = running(catalog, "demo-h1", "demo-h2")
    steps = plan_switch(catalog.lane("demo-h1"), "img:demo-h1", catalog, observed, active="demo-h2",
                        standby=facts(asleep=frozenset({"demo-h1"})))
    assert [s.action for s in steps[:2]] == ["stop", "stop"], "never two sleepers on one GPU set"


def test_one_standby_per_gpu_set_the_older_one_is_stopped(catalog):
    observed = running(catalog, "demo-h1", "demo-h2")
    steps = plan_switch(catalog.lane("demo-broken"), "img:demo-broken", catalog, observed, active="demo-h2",
                        standby=facts(asleep=frozenset({"demo-h1"})))
    assert keys(steps)[:5] == [f"stop:{H1}-rtx", f"stop:{H1}", f"sleep:{H2}-rtx", f"sleep:{H2}",
                               "check-memory:demo-broken"]
    assert steps[0].why == "ends its standby: demo-broken takes its GPUs"


def test_a_shared_host_port_stops_the_lane_it_would_block(catalog):
    """Validation refuses this within a recipe; across recipes the plan still must not leave a port taken."""
    from dataclasses import replace

    h1 = catalog.lane("demo-h1")
    h2 = catalog.lane("demo-h2")
    same_port = replace(h2, spec=h2.spec.model_copy(update={"engine": h2.spec.engine.model_copy(
        update={"ports": h1.spec.engine.ports})}))
    assert standby_refusal(h1, same_port, facts()) == (
        "demo-h2 publishes its host port 18000/tcp, which a sleeping lane keeps")
    assert standby_refusal(h1, h2, facts()) is None


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
