"""Every change to the box's lanes, as snapshot → plan → execute → record.

`LaneSwitcher` is what the commands, the gate's brackets and the watchdog call: each verb takes one snapshot
(`lanes/snapshot.py`), plans from it (`lanes/plan.py`, pure) and runs the plan (`lanes/execute.py`), which
journals every step. A switch an earlier run left unfinished is finished or undone first, from its own plan.
The caller holds the engine lock. The engine's containers are the truth of what exists; `state.json` only
remembers which lane is active and known-good.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from lanectl.dockerapi.containers import ContainerEngine
from lanectl.host.gpu_memory import memory_mib
from lanectl.host.host_memory import available_gib
from lanectl.image.render import plan_image
from lanectl.lanes.engine_calls import EngineCalls, LaneEngines
from lanectl.lanes.execute import Executor, Reporter, SwitchOutcome
from lanectl.lanes.interrupt import Interrupt
from lanectl.lanes.plan import (
    Plan,
    plan_down,
    plan_drop_lost_standbys,
    plan_reconcile,
    plan_restart,
    plan_rollback,
    plan_up,
)
from lanectl.lanes.snapshot import Snapshot, take_snapshot
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.lanes import LaneStateStore
from lanectl.state.paths import StateFiles
from lanectl.state.standby import StandbyStore

__all__ = ["LaneSwitcher", "Reporter", "SwitchOutcome", "built_tag"]


def built_tag(engine: ContainerEngine, lane: Lane) -> str:
    """The lane's current image tag; refuses, before any change, when it has not been built."""
    from lanectl.errors import OperationFailed

    tag = plan_image(lane).tag
    if engine.image_labels(tag) is None:
        raise OperationFailed(f"{lane.name}: image {tag} is not built; run `lanectl build {lane.name}` first")
    return tag


class LaneSwitcher:
    def __init__(self, catalog: Catalog, engine: ContainerEngine, journal: Journal, states: LaneStateStore, *,
                 reporter: Reporter, no_gpu: bool = False, environ: Mapping[str, str] | None = None,
                 calls: EngineCalls | None = None, interrupt: Interrupt | None = None,
                 host_memory: Callable[[], float | None] = available_gib,
                 gpu_memory: Callable[[], dict[str, tuple[int, int]] | None] = memory_mib):
        self.catalog = catalog
        self.engine = engine
        self.journal = journal
        self.states = states
        self.files = StateFiles(states.path.parent)
        self.standbys = StandbyStore(self.files.standby)
        self.reporter = reporter
        self.no_gpu = no_gpu
        self.environ = os.environ if environ is None else environ
        self.interrupt = interrupt or Interrupt()
        self.calls = calls or LaneEngines(engine, on_gate=reporter.gate, interrupted=self.interrupt.pending,
                                          sleep=self.interrupt.sleep)
        self.host_memory = host_memory
        self.gpu_memory = gpu_memory

    # -- the verbs -------------------------------------------------------------------------------------------

    def snapshot(self, *lanes: str, create_secret_key: bool = True, probe: bool = True) -> Snapshot:
        """What the engine and the state files show now; with `probe`, whether the active lane answers /health
        and every engine of it is awake (a plan that may find it healthy and do nothing needs that)."""
        def healthy(lane: Lane) -> bool:
            from lanectl.health.probe import EndpointProbe, probe_base_url

            return EndpointProbe(probe_base_url(lane), lane.spec.health).health_ok().ok

        return take_snapshot(self.catalog, self.engine, self.files, also=lanes, environ=self.environ,
                             create_secret_key=create_secret_key, host_memory=self.host_memory,
                             health=healthy if probe else None, asleep=self.calls.is_sleeping)

    def up(self, lane: Lane, *, rollback_on_failure: bool = True, why: str = "up",
           rollback: bool = False) -> SwitchOutcome:
        """Make `lane` the serving lane, health-gated, or go back."""
        return self._switch(lambda snapshot: plan_up(self.catalog, snapshot, lane, rollback=rollback,
                                                     rollback_on_failure=rollback_on_failure,
                                                     with_gpus=not self.no_gpu), lambda _: why, lane.name)

    def rollback(self, to: Lane | None) -> SwitchOutcome:
        return self._switch(lambda snapshot: plan_rollback(self.catalog, snapshot, to, with_gpus=not self.no_gpu),
                            lambda snapshot: f"rollback from {snapshot.state.active or 'no active lane'}",
                            *([to.name] if to else []))

    def restart(self, lane: Lane, *, before_start: Callable[[], str] = lambda: "") -> SwitchOutcome:
        """The watchdog's restart: stop the lane, let `before_start` wait (GPU memory), start it, gate it."""
        return self._switch(lambda snapshot: plan_restart(self.catalog, snapshot, lane, with_gpus=not self.no_gpu),
                            lambda _: "watchdog restart", lane.name, before_start=before_start)

    def down(self, lane_name: str | None, *, with_standbys: bool = False) -> SwitchOutcome:
        """Stop the lane named `lane_name` (no recipe that loads may have it), and with `with_standbys` every lane
        waiting asleep too (`lanectl down` of the box)."""
        return self._switch(lambda snapshot: plan_down(self.catalog, snapshot, lane_name, with_standbys=with_standbys),
                            lambda _: "down", *([lane_name] if lane_name else []))

    def drop_lost_standbys(self, *, act: bool = True) -> tuple[Plan, SwitchOutcome | None] | None:
        """The watchdog's look at the lanes waiting asleep: each one that died, was removed or was paused is dropped
        and what is left of it live stopped (`plan_drop_lost_standbys`); without `act`, only the plan. None when
        every standby can still be woken."""
        plan = plan_drop_lost_standbys(self.catalog, self.snapshot(create_secret_key=False, probe=False))
        if plan is None or not act:
            return None if plan is None else (plan, None)
        dropped: list[Plan] = []

        def planner(snapshot: Snapshot) -> Plan:
            found = plan_drop_lost_standbys(self.catalog, snapshot)
            dropped.append(found or Plan("noop", None, message="every standby can be woken again"))
            return dropped[0]

        outcome = self._switch(planner, lambda _: "watchdog: a standby is lost")
        return (dropped[0], outcome) if dropped else (plan, outcome)

    def reconcile(self) -> SwitchOutcome | None:
        """Finish or undo the switch a killed run left unfinished, against what the engine shows."""
        outcome, _ = self._reconcile(self.snapshot())
        return outcome

    def execute(self, plan: Plan, snapshot: Snapshot, *, why: str, switch: str | None = None,
                before_start: Callable[[], str] = lambda: "") -> SwitchOutcome:
        """Run `plan`, made from `snapshot` (whose state files it goes on from)."""
        executor = Executor(self.catalog, self.engine, self.journal, self.states, self.standbys, self.calls,
                            self.reporter, interrupt=self.interrupt, environ=self.environ,
                            gpu_memory=self.gpu_memory, before_start=before_start)
        return executor.run(plan, why=why, switch=switch, state=snapshot.state, standby=snapshot.standby)

    # -- internals -------------------------------------------------------------------------------------------

    def _switch(self, planner: Callable[[Snapshot], Plan], why: Callable[[Snapshot], str], *lanes: str,
                before_start: Callable[[], str] = lambda: "") -> SwitchOutcome:
        """A verb: finish or undo the switch an earlier run left unfinished, then plan from what the engine shows
        and run the plan. A signal that stopped the continuation ends the command there: the operator asked it to
        stop, and a new switch begun while the old one is still open would be one the journal cannot explain."""
        outcome, snapshot = self._reconcile(self.snapshot(*lanes), *lanes)
        if outcome is not None and outcome.signum is not None:
            return outcome
        return self.execute(planner(snapshot), snapshot, why=why(snapshot), before_start=before_start)

    def _reconcile(self, snapshot: Snapshot, *lanes: str) -> tuple[SwitchOutcome | None, Snapshot]:
        plan = plan_reconcile(self.catalog, snapshot, with_gpus=not self.no_gpu)
        if plan is None:
            return None, snapshot
        intent = snapshot.unfinished
        assert intent is not None
        self.reporter.note(f"found an unfinished {intent['action']} ({intent.get('from') or '-'} -> "
                           f"{intent.get('to') or '-'}) started {intent['ts']} by {intent['who']}, after "
                           f"{len(intent['done_steps'])} of {len(intent['steps'])} steps; reconciling")
        outcome = self.execute(plan, snapshot, why="reconcile", switch=intent["switch"])
        self.reporter.note(outcome.message)
        return outcome, self.snapshot(*lanes)
