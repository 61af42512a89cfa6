"""The watchdog's decisions on fixed observations: no engine, no clock but the one given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lanectl.host.xid import parse_xid
from lanectl.recipe.model import WatchdogPolicy, validated
from lanectl.watchdog.policy import Observation, WatchdogMemory, backoff_seconds, decide

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
POLICY = validated(WatchdogPolicy, {"failures_before_action": 3, "restart": {
    "max_restarts": 3, "window_minutes": 30, "backoff_initial_seconds": 10, "backoff_max_seconds": 60}})
BUDGET = 600.0


def observed(**changes) -> Observation:
    base = dict(lane="h2-REF", containers_running=True, container_detail="", health_ok=True, health_detail="ok",
                generation_ok=True, generation_detail="ok", started_at=NOW - timedelta(hours=1))
    return Observation(**{**base, **changes})


def ready(**changes) -> WatchdogMemory:
    return WatchdogMemory(**{"lane": "h2-REF", "ready_since_start": True, **changes})


def test_a_pass_without_a_probe_answer_keeps_the_failure_count():
    decision = decide(observed(health_ok=None, health_detail="", generation_ok=None, generation_detail=""),
                      ready(consecutive_failures=2), POLICY, now=NOW, armed=True, startup_budget_seconds=BUDGET)
    assert (decision.action, decision.failing, decision.memory.consecutive_failures) == ("none", False, 2)
    assert decision.reason == "running; no probe answer in this pass"


def test_healthy_resets_the_failure_count():
    decision = decide(observed(), ready(consecutive_failures=2), POLICY, now=NOW, armed=True,
                      startup_budget_seconds=BUDGET)
    assert (decision.action, decision.failing, decision.memory.consecutive_failures) == ("none", False, 0)


def test_act_only_after_n_consecutive_failed_probes():
    memory = ready()
    actions = []
    for _ in range(3):
        decision = decide(observed(health_ok=False, health_detail="/health answered 503"), memory, POLICY, now=NOW,
                          armed=True, startup_budget_seconds=BUDGET)
        memory = decision.memory
        actions.append(decision.action)
    assert actions == ["none", "none", "restart"]


def test_a_crash_is_restarted_at_once_and_the_cap_turns_into_a_rollback():
    crash = observed(containers_running=False, container_detail="primary exited (exit code 1)", health_ok=None)
    restarts = tuple((NOW - timedelta(minutes=m)).isoformat() for m in (20, 10, 5))
    assert decide(crash, ready(), POLICY, now=NOW, armed=True, startup_budget_seconds=BUDGET).action == "restart"
    decision = decide(crash, ready(restarts=restarts), POLICY, now=NOW, armed=True, startup_budget_seconds=BUDGET)
    assert decision.action == "rollback" and "crash loop" in decision.reason


def test_restarts_older_than_the_window_do_not_count():
    crash = observed(containers_running=False, container_detail="primary exited (exit code 1)")
    old = tuple((NOW - timedelta(minutes=m)).isoformat() for m in (90, 80, 70))
    decision = decide(crash, ready(restarts=old), POLICY, now=NOW, armed=True, startup_budget_seconds=BUDGET)
    assert decision.action == "restart" and decision.memory.restarts == ()


def test_exponential_backoff_between_restarts():
    assert [backoff_seconds(POLICY, n) for n in range(5)] == [0, 10, 20, 40, 60]
    crash = observed(containers_running=False, container_detail="primary exited (exit code 1)")
    just_now = ((NOW - timedelta(seconds=5)).isoformat(),)
    decision = decide(crash, ready(restarts=just_now), POLICY, now=NOW, armed=True, startup_budget_seconds=BUDGET)
    assert decision.action == "wait" and decision.backoff_until == NOW + timedelta(seconds=5)


def test_inside_the_startup_budget_a_loading_lane_is_not_failing():
    loading = observed(health_ok=False, health_detail="/health: connection refused", generation_ok=None,
                       started_at=NOW - timedelta(minutes=8))
    for _ in range(10):
        decision = decide(loading, WatchdogMemory(lane="h2-REF"), POLICY, now=NOW, armed=True,
                          startup_budget_seconds=BUDGET)
        assert (decision.action, decision.failing) == ("none", False)
    late = decide(observed(health_ok=False, health_detail="x", started_at=NOW - timedelta(minutes=11)),
                  WatchdogMemory(lane="h2-REF", consecutive_failures=2), POLICY, now=NOW, armed=True,
                  startup_budget_seconds=BUDGET)
    assert late.action == "restart", "past the budget, failures count"


def test_a_hang_is_not_shielded_by_the_startup_budget():
    hung = observed(health_ok=True, generation_ok=False, generation_detail="timed out",
                    started_at=NOW - timedelta(minutes=1))
    decision = decide(hung, WatchdogMemory(lane="h2-REF"), POLICY, now=NOW, armed=True, startup_budget_seconds=BUDGET)
    assert decision.failing and decision.memory.consecutive_failures == 1


@pytest.mark.parametrize(("code", "action"), [(31, "restart"), (94, "restart"), (79, "stop"), (109, "stop"),
                                              (63, "none")])
def test_xid_classes(code, action):
    xid = parse_xid(f"NVRM: Xid (PCI:0000:01:00): {code}, pid=1, name=python3, x")
    assert xid is not None
    decision = decide(observed(xids=(xid,)), ready(), POLICY, now=NOW, armed=True, startup_budget_seconds=BUDGET)
    assert decision.action == action


# NVIDIA's catalog: 63 is a row remapped after an ECC error, immediate action IGNORE.
UNLISTED = parse_xid("NVRM: Xid (PCI:0000:01:00): 63, pid=1, name=python3, Row Remapper: New row marked for remapping")
CRASH = dict(containers_running=False, container_detail="primary exited (exit code 1)", health_ok=None)
RESTARTED_AT = (NOW - timedelta(seconds=5)).isoformat()


@pytest.mark.parametrize(("changes", "memory", "action"), [
    (CRASH, ready(), "restart"),
    (dict(CRASH, xids=(parse_xid("NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=python3, x"),)), ready(), "stop"),
    (CRASH, ready(restarts=(RESTARTED_AT,)), "wait"),
    (CRASH, ready(restarts=(RESTARTED_AT,) * 3), "rollback"),
    (dict(health_ok=False, health_detail="503"), ready(), "none"),
    ({}, ready(), "none"),
], ids=["restart", "stop", "back-off", "rollback", "probe-failed", "healthy"])
def test_an_unlisted_xid_is_carried_by_every_kind_of_pass(changes, memory, action):
    obs = observed(**{**changes, "xids": (*changes.get("xids", ()), UNLISTED)})
    decision = decide(obs, memory, POLICY, now=NOW, armed=True, startup_budget_seconds=BUDGET)
    assert decision.action == action
    assert decision.xid_unlisted == (UNLISTED,), "counted and journaled by the runner"
    assert decision.reason.endswith("; unlisted Xid 63 recorded (not acted on)")
    assert UNLISTED not in decision.xid_application + decision.xid_hardware, "never acted on"


def test_disarmed_observes_only():
    crash = observed(containers_running=False, container_detail="primary exited (exit code 1)")
    decision = decide(crash, ready(), POLICY, now=NOW, armed=False, startup_budget_seconds=BUDGET)
    assert decision.observe_only and decision.reason.endswith("(disarmed: observed only, would restart)")


def test_memory_of_another_lane_is_not_carried_over():
    decision = decide(observed(), WatchdogMemory(lane="h1-REF", consecutive_failures=2, restarts=("x",)), POLICY,
                      now=NOW, armed=True, startup_budget_seconds=BUDGET)
    assert decision.memory.lane == "h2-REF" and decision.memory.restarts == ()
