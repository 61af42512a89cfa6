"""The box's switch under any interleaving: a stateful fuzzer (Hypothesis's RuleBasedStateMachine).

The rules are the operator's and the world's moves: `up`, `rollback`, `down` and a watchdog pass, each killed
(SIGKILL) or interrupted (one or two SIGINTs) after any step; recipe edits (the stop timeout, a companion's
port, env); an engine that fails its gate; an operator who stops, kills, starts or puts to sleep a container,
also in the middle of a switch. The invariants are the promises of `lanectl/lanes/invariants.py`, checked after
every rule against the engine in memory (tests/switch_box.py), with the real planner, executor, journal and
state files.

CI runs the bounded profile (derandomized, at least 2,000 steps); `make fuzz` runs `HYPOTHESIS_PROFILE=long`.
A failure prints the shortest sequence of moves that breaks a promise; each one found becomes an example test
below the machine.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import tests.switch_box
from lanectl.errors import LanectlError
from lanectl.lanes.execute import SwitchOutcome
from lanectl.lanes.interrupt import Interrupt
from lanectl.lanes.invariants import gpus_overlap
from lanectl.lanes.plan import Plan, plan_down, plan_reconcile, plan_rollback, plan_up
from lanectl.lanes.snapshot import Snapshot, take_snapshot
from lanectl.lanes.switcher import LaneSwitcher
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.state.journal import Journal
from lanectl.state.lanes import SWITCH_LEASE_PREFIX, LaneStateStore
from lanectl.state.standby import StandbyStore
from tests.switch_box import (
    Box,
    FakeEngines,
    Interrupting,
    Killed,
    MemoryEngine,
    QuietReporter,
    repo_catalog,
    with_engine,
    with_lane,
)

LANES = ("demo-h1", "demo-h2", "demo-h2-8")
STEPS_PER_EXAMPLE = 30
# Shrinking is kept (a failure is worth its shortest form), the explain phase is not: it reruns every failing
# step with variations, for minutes, to annotate lines the shrunk sequence already shows.
settings.register_profile("ci", max_examples=100, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None,
                          derandomize=True, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                          suppress_health_check=list(HealthCheck), print_blob=True)
# While writing a fix: no shrinking, every distinct failure reported at once.
settings.register_profile("dev", max_examples=60, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate],
                          suppress_health_check=list(HealthCheck), report_multiple_bugs=True)
settings.register_profile("long", max_examples=5_000, stateful_step_count=60, deadline=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

# What happens to a switch after its step k (a kill, one or two SIGINTs, an operator's `docker start` of the
# stopped container `pick` counts to), or None: it runs to its end.
INTERRUPTIONS = st.one_of(st.none(), st.tuples(st.sampled_from(["kill", "int", "int2", "operator-start"]),
                                               st.integers(1, 12), st.integers(0, 7)))
How = tuple[str, int, int] | None
# A container holds its GPU memory running or paused (frozen, not freed); awake is holding it and not asleep.
HOLDING = ("running", "paused")


# Where the machine's state folders go: memory, where a file is written and fsynced in microseconds (the search
# writes thousands of journal lines and state files); the temporary folder where there is no /dev/shm.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


class ImagePlansOnce:
    """`plan_images_apart` as the snapshot calls it, each lane's plan made once: the recipe's files do not
    change while the machine runs, and reading and hashing the build context for each of thousands of
    snapshots was a third of the search's time. The lanes are kept, so their ids stay theirs."""

    def __init__(self, plan: Callable[..., Any]):
        self.plan = plan
        self.made: dict[int, tuple[Lane, Any, str | None]] = {}

    def __call__(self, lanes: Any) -> tuple[dict[str, Any], dict[str, str]]:
        plans: dict[str, Any] = {}
        unrendered: dict[str, str] = {}
        for lane in lanes:
            if id(lane) not in self.made:
                made, failed = self.plan([lane])
                self.made[id(lane)] = (lane, made.get(lane.name), failed.get(lane.name))
            _, plan, why = self.made[id(lane)]
            if plan is not None:
                plans[lane.name] = plan
            if why is not None:
                unrendered[lane.name] = why
        return plans, unrendered


class CountingEngine(MemoryEngine):
    """The memory engine that remembers, for each stop, the stop timeout the container was created with, the
    order in which containers were started, and which ones an operator started by hand."""

    def __init__(self, images: dict[str, str]):
        super().__init__(images)
        self.own_drains: list[tuple[str, int, int]] = []  # (name, allowed, its own)
        self.started_at: dict[str, int] = {}  # name -> when it was last started, as a count of starts
        self.by_hand: set[str] = set()  # started by an operator, and not stopped or started by lanectl since
        self.clock = itertools.count(1)
        self.removed_running: list[str] = []  # containers removed while they ran (docker rm -f)

    def stop(self, name: str, timeout: int) -> None:
        held = self.held.get(name)
        if held is not None and held.state == "running":
            self.own_drains.append((name, timeout, held.spec.stop_timeout_seconds))
        self.by_hand.discard(name)
        super().stop(name, timeout)

    def remove(self, name: str) -> None:
        held = self.held.get(name)
        if held is not None and held.state == "running":
            self.removed_running.append(name)
        super().remove(name)

    def start(self, name: str) -> bool:
        started = super().start(name)
        if started:
            self.started_at[name] = next(self.clock)
            self.by_hand.discard(name)
        return started

    def start_by_hand(self, name: str) -> None:
        self.held[name].state = "running"
        self.started_at[name] = next(self.clock)
        self.by_hand.add(name)

    def rename_by_hand(self, name: str) -> None:
        """`docker rename` by someone else: a lane container to NAME.renamed, or one renamed so back."""
        new_name = name.removesuffix(".renamed") if name.endswith(".renamed") else name + ".renamed"
        if new_name in self.held:
            return
        self.rename(name, new_name)
        self.by_hand.add(new_name)  # whatever it does now under another name is the operator's doing

    def rename(self, name: str, new_name: str) -> None:
        super().rename(name, new_name)
        for marks in (self.started_at,):
            if name in marks:
                marks[new_name] = marks.pop(name)
        if name in self.by_hand:
            self.by_hand.discard(name)
            self.by_hand.add(new_name)


class FuzzSwitcher(LaneSwitcher):
    """The real switcher, its snapshot's /health answered by the engines in memory (200 while asleep, as vLLM)."""

    def snapshot(self, *lanes: str, create_secret_key: bool = True, probe: bool = True) -> Snapshot:
        engines = self.calls
        assert isinstance(engines, FakeEngines)
        return take_snapshot(self.catalog, self.engine, self.files, also=lanes,  # type: ignore[arg-type]
                             environ=self.environ,
                             create_secret_key=create_secret_key, host_memory=lambda: 64.0,
                             health=(lambda lane: lane.name not in engines.failing_gates) if probe else None,
                             asleep=engines.is_sleeping)


class BoxMachine(RuleBasedStateMachine):
    """One box: its engine in memory, its state folder on disk, its recipes as edited so far."""

    moves = 0  # rules run, over every sequence of the search (test_interleavings_of_the_box_switch reads it)
    sequences = 0

    @initialize(first=st.sampled_from(LANES))
    def start(self, first: str) -> None:
        BoxMachine.sequences += 1
        BoxMachine.moves -= 1  # the invariants' run after this set-up is no move
        # Container IDs from 1 in every sequence: names set aside carry them, so the search would otherwise depend
        # on how many containers the tests before it made.
        tests.switch_box._ids = itertools.count(1)
        self.folder = Path(tempfile.mkdtemp(prefix="lanectl-fuzz-", dir=SCRATCH))
        self.catalog: Catalog = repo_catalog()
        self.engine = CountingEngine({})
        self.engines = FakeEngines(self.engine)
        self.environ: dict[str, str] = {}  # lanectl's environment: where secret values come from
        self._build()
        self.last: SwitchOutcome | None = None
        self.full: int | None = None  # the state folder's disk is full for the next command: journal appends that fit
        self.unrecorded = False  # a command ran on a full state folder, and none has written state.json since
        # Every lane made once, the first one serving: stopped containers of other lanes are there from the start.
        for lane in (*(other for other in LANES if other != first), first):
            self.switch(lambda s, lane=lane: s.up(self._lane(lane), why="up"), None)

    def teardown(self) -> None:
        shutil.rmtree(getattr(self, "folder", "/nonexistent"), ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------------------------

    def _lane(self, name: str) -> Lane:
        return self.catalog.lanes[name]

    def _build(self) -> None:
        # One image per tag: a recipe edit that changes what is built (the primary's env and flags are baked into
        # its image) is a new image ID, and so drift on the containers made from the old one.
        for tag in Box(self.catalog).build(*LANES).images:
            self.engine.images.setdefault(tag, "sha256:" + hashlib.sha256(tag.encode()).hexdigest()[:16])

    def switcher(self, reporter: QuietReporter, interrupt: Interrupt) -> FuzzSwitcher:
        journal = Journal(self.folder / "journal.jsonl")
        states = LaneStateStore(self.folder / "state.json")
        if self.full is not None:  # the disk is full: state.json cannot be written, the journal for a few lines
            journal, states = FullJournal(journal.path, self.full), FullStateFolder(states.path)
        return FuzzSwitcher(self.catalog, self.engine, journal, states, reporter=reporter,  # type: ignore[arg-type]
                            no_gpu=True, environ=self.environ, calls=self.engines, interrupt=interrupt,
                            host_memory=lambda: 64.0, gpu_memory=lambda: None)

    def switch(self, verb: Callable[[LaneSwitcher], SwitchOutcome | None], how: How,
               dry: Callable[[Snapshot], Plan] | None = None, *also: str) -> bool:
        """One lanectl command, as a process: killed, interrupted or disturbed after step k, or run to its end;
        True when it was killed. With `dry`, the command's `--dry-run` is planned first (from the same look at
        the engine and the state files, making no secret key) and held to what the run then does."""
        # A full disk is no input of a plan: the run then stops at its first write, which no dry run foresees.
        planned = self._dry_run(dry, also) if dry is not None and self.full is None else None
        journal_lines = self._journal_lines()
        killed = refused = False
        interrupt = Interrupt()
        reporter = QuietReporter()
        if how is not None:
            kind, after, pick = how
            act: Callable[[], None]
            if kind == "kill":
                def act() -> None:
                    raise Killed
            elif kind == "int":
                def act() -> None:
                    interrupt.arrived(signal.SIGINT)
            elif kind == "int2":
                def act() -> None:
                    interrupt.arrived(signal.SIGINT)
                    interrupt.arrived(signal.SIGINT)
            else:
                def act() -> None:
                    self._operator_starts_a_stopped_container(pick)
            reporter = Interrupting(after, act)
        self.last = None
        try:
            self.last = verb(self.switcher(reporter, interrupt))
        except Killed:
            killed = True
        except LanectlError:
            refused = True  # refused before any change (no known-good lane, a foreign container): exit 2
        finally:
            # What state.json says serves may now be wrong until a command writes it again: a full state folder
            # leaves the engine the only truth (the promises that read state.json wait for that write).
            self.unrecorded = self.full is not None or (self.unrecorded and (
                self.last is None or self.last.result not in ("ok", "rolled-back", "finished", "undone")))
            self.full = None  # the disk is freed (or the next command's problem again only if a rule says so)
        if planned is not None:
            self._held_to_its_dry_run(planned, refused, journal_lines)
        return killed

    def _dry_run(self, planner: Callable[[Snapshot], Plan], also: tuple[str, ...]) -> Plan | LanectlError | None:
        """What `--dry-run` shows (commands/switch.py: the same snapshot, no secret key made), or None when an
        unfinished switch comes first (the run finishes it and plans again, as the dry run says)."""
        snapshot = self.switcher(QuietReporter(), Interrupt()).snapshot(*also, create_secret_key=False)
        if plan_reconcile(self.catalog, snapshot, with_gpus=False) is not None:
            return None
        try:
            return planner(snapshot)
        except LanectlError as refused:
            return refused

    def _journal_lines(self) -> int:
        path = self.folder / "journal.jsonl"
        return len(path.read_bytes().splitlines()) if path.exists() else 0

    def _held_to_its_dry_run(self, planned: Plan | LanectlError, refused: bool, before: int) -> None:
        path = self.folder / "journal.jsonl"
        records = [json.loads(line) for line in (path.read_bytes().splitlines()[before:] if path.exists() else [])]
        intents = [record for record in records if record.get("kind") == "intent"]
        if isinstance(planned, LanectlError):
            assert refused and not intents, f"--dry-run refused ({planned}); the run did not"
            return
        assert not refused, f"the run was refused; its --dry-run planned {planned.keys}"
        if planned.kind == "noop":
            assert self.last is not None and self.last.result == "noop", \
                f"--dry-run said {planned.message!r}; the run: {self.last}"
        else:
            assert intents, f"--dry-run planned {planned.keys}; the run journaled no intent: {self.last}"
            assert intents[0]["steps"] == planned.keys, \
                f"--dry-run planned {planned.keys}; the run journaled {intents[0]['steps']}"

    def _operator_starts_a_stopped_container(self, pick: int) -> None:
        """Someone runs `docker start` on a stopped lane container while a switch runs: one of another lane than
        the switch's target when there is one (what the executor's look before a start must catch)."""
        target = getattr(self, "target", None)
        stopped = sorted(name for name, held in self.engine.held.items() if held.state == "exited")
        others = [name for name in stopped if self.engine.held[name].spec.labels.get("io.lanectl.lane") != target]
        chosen = others if pick % 2 == 0 and others else stopped
        if chosen:
            self.engine.start_by_hand(chosen[pick % len(chosen)])

    def state(self) -> Any:
        return LaneStateStore(self.folder / "state.json").load()

    def unfinished(self) -> dict[str, Any] | None:
        """The journal's unfinished switch, read again only when the journal changed (the promises ask after
        every move)."""
        path = self.folder / "journal.jsonl"
        seen = (path.stat().st_size, path.stat().st_mtime_ns) if path.exists() else None
        if getattr(self, "_unfinished", (None, None))[0] != seen or seen is None:
            self._unfinished = (seen, Journal(path).unfinished_intent())
        return self._unfinished[1]

    def awake_lanes(self, *, by_lanectl: bool = False) -> dict[str, set[str]]:
        """Lane -> its containers that run and are awake, by their labels; `by_lanectl`: not those an operator
        started by hand."""
        awake: dict[str, set[str]] = {}
        for name, held in self.engine.held.items():
            if held.state in HOLDING and not held.asleep and not (by_lanectl and name in self.engine.by_hand):
                awake.setdefault(held.spec.labels.get("io.lanectl.lane", "?"), set()).add(name)
        return awake

    def awake_containers(self) -> list[tuple[str, str]]:
        """(lane, container) for every awake container, in the order they were started."""
        awake = [(held.spec.labels.get("io.lanectl.lane", "?"), name) for name, held in self.engine.held.items()
                 if held.state in HOLDING and not held.asleep]
        return sorted(awake, key=lambda pair: self.engine.started_at.get(pair[1], 0))

    # -- the operator's commands -----------------------------------------------------------------------------

    @rule(lane=st.sampled_from(LANES), how=INTERRUPTIONS, fails=st.booleans(), bad_build=st.booleans())
    def up(self, lane: str, how: How, fails: bool, bad_build: bool = False) -> None:
        """`lanectl up LANE`; with `fails`, the lane's engine fails its gate this once (its way back runs); with
        `bad_build`, the containers this command creates fail their gate and the ones it had, put back, pass
        theirs (a broken build): when it takes its way back, the lane that served before serves after, unless a
        signal or a failing engine of its own says otherwise."""
        failing = lane in self.engines.failing_gates
        if fails:
            self.engines.failing_gates.add(lane)
        # What serves before, unless an unfinished switch comes first (the command finishes or undoes it first).
        serving = self._serving() if self.unfinished() is None else None
        if bad_build:
            before = {id(held) for held in self.engine.held.values()}
            engines = self.engines

            def judge(gated: Lane) -> None:
                made = any(id(self.engine.held.get(gated.container_name(role))) not in before for role in gated.roles
                           if gated.container_name(role) in self.engine.held)
                (engines.failing_gates.add if made or gated.name in failing_now else
                 engines.failing_gates.discard)(gated.name)

            failing_now = set(engines.failing_gates)
            engines.on_gate = judge
        self.target = lane
        try:
            self.switch(lambda s: s.up(self._lane(lane), why="up"), how,
                        lambda snapshot: plan_up(self.catalog, snapshot, self._lane(lane), with_gpus=False), lane)
        finally:
            if bad_build:
                self.engines.on_gate = None
                self.engines.failing_gates = failing_now
        if fails and not failing:
            self.engines.failing_gates.discard(lane)
        took_its_way_back = self.last is not None and self.last.result not in ("ok", "noop")
        if bad_build and serving is not None and how is None and not fails and took_its_way_back:
            awake = self.awake_lanes().get(serving, set())
            whole = {self._lane(serving).container_name(role) for role in self._lane(serving).roles}
            assert whole <= awake, (f"{serving} served before a broken build of {lane}; after it only {sorted(awake)} "
                                    f"of it is awake: {self.last}")

    def _serving(self) -> str | None:
        """The active lane when every container of it runs awake (not paused: frozen, it answers nothing) and its
        engine passes its gate, else None."""
        active = self.state().active
        if active not in self.catalog.lanes or active in self.engines.failing_gates:
            return None
        lane = self._lane(active)
        awake = self.awake_lanes(by_lanectl=True).get(active, set())
        names = {lane.container_name(role) for role in lane.roles}
        paused = {name for name in names if name in self.engine.held and self.engine.held[name].state == "paused"}
        return active if names <= awake and not paused else None

    @rule(port=st.sampled_from([18101, 18102]))
    def a_broken_change_to_the_serving_lane(self, port: int) -> None:
        """The serving lane's companion moved to another host port and rolled out with `up`, and the new build
        fails its gate: the way back puts the old containers back and holds them to their gate where they
        publish (`up` asserts that the lane serves again)."""
        active = self.state().active
        if active in self.catalog.lanes:
            self.edit_companion_port(lane=active, port=port)
            self.up(lane=active, how=None, fails=False, bad_build=True)

    @rule(how=INTERRUPTIONS)
    def rollback(self, how: How) -> None:
        self.switch(lambda s: s.rollback(None), how,
                    lambda snapshot: plan_rollback(self.catalog, snapshot, None, with_gpus=False))

    @rule(how=INTERRUPTIONS)
    def down(self, how: How) -> None:
        active = self.state().active
        name = active if active in self.catalog.lanes else None
        self.switch(lambda s: s.down(name, with_standbys=True), how,
                    lambda snapshot: plan_down(self.catalog, snapshot, name, with_standbys=True), *filter(None, [name]))

    @rule(lane=st.sampled_from(LANES))
    def up_from_a_second_state_folder(self, lane: str) -> None:
        """`LANECTL_STATE_DIR=… lanectl up LANE` from another folder on the same engine: refused while this
        folder's lane containers exist, and then nothing changes."""
        before = {name: (held.state, held.asleep) for name, held in self.engine.held.items()}
        other = self.folder / "second-state"
        switcher = FuzzSwitcher(self.catalog, self.engine, Journal(other / "journal.jsonl"),  # type: ignore[arg-type]
                                LaneStateStore(other / "state.json"), reporter=QuietReporter(), no_gpu=True,
                                environ={}, calls=self.engines, interrupt=Interrupt(), host_memory=lambda: 64.0,
                                gpu_memory=lambda: None)
        self.last = None
        try:
            switcher.up(self._lane(lane), why="up")
        except LanectlError as refused:
            assert "one engine has one state" in str(refused) or "cannot start" in str(refused), refused
            assert {n: (h.state, h.asleep) for n, h in self.engine.held.items()} == before
            return
        assert not before, "a second state folder switched an engine that already had lanes"
        shutil.rmtree(other, ignore_errors=True)
        for name in list(self.engine.held):
            self.engine.held.pop(name)  # what it made is not this folder's: gone, as if it ran `down` and pruned

    @rule(how=INTERRUPTIONS)
    def watchdog_check(self, how: How) -> None:
        """A cron pass: finish or undo a switch that died with its lease, or past its last step (its lease cleared,
        its outcome never written); restart a dead active lane."""
        state = self.state()
        lease = state.watchdog_lease
        if (lease is not None and lease.reason.startswith(SWITCH_LEASE_PREFIX)) \
                or Journal(self.folder / "journal.jsonl").last_switch_open():
            self.switch(lambda s: s.reconcile(), how)
            return
        active = state.active
        if not state.watchdog_armed:
            return
        if self.switcher(QuietReporter(), Interrupt()).drop_lost_standbys(act=False) is not None:
            # A standby that died, was removed or paused is dropped and what is left of it stopped
            # (watchdog/runner.py `_check_standbys`), before the active lane is judged.
            if self.switch(lambda s: (dropped := s.drop_lost_standbys()) and dropped[1], how):
                return
            how = None
        if active not in self.catalog.lanes:
            return
        if StandbyStore(self.folder / "standby.json").load().standby(active) is not None:
            return  # a lane recorded asleep is never restarted
        lane = self._lane(active)
        if all(self.engine.held.get(lane.container_name(r)) and self.engine.held[lane.container_name(r)].state
               == "running" for r in lane.roles):
            return
        self.switch(lambda s: s.reconcile() or s.restart(lane), how)

    # -- the world -----------------------------------------------------------------------------------------

    @rule(lane=st.sampled_from(LANES), failing=st.booleans())
    def engine_health(self, lane: str, failing: bool) -> None:
        """The lane's engine fails its gate from now on (a bad build, a broken model), or is fixed."""
        self.last = None  # what the last command said is about the box before this
        (self.engines.failing_gates.add if failing else self.engines.failing_gates.discard)(lane)

    @rule(data=st.data(), action=st.sampled_from(["stop", "kill", "sleep", "pause", "unpause", "rename"]))
    def operator_on_the_engine(self, data: st.DataObject, action: str) -> None:
        """`docker stop`/`kill`/`pause`/`unpause`/`rename` of a container, or `POST /sleep` to an engine, by
        someone else. A container renamed is renamed back by the next rename of it."""
        self.last = None  # what the last command said is about the box before this
        if action == "rename":
            names = sorted(name for name in self.engine.held if ".was-" not in name)
            if names:
                self.engine.rename_by_hand(data.draw(st.sampled_from(names)))
            return
        state = "paused" if action == "unpause" else "running"
        chosen = sorted(name for name, held in self.engine.held.items() if held.state == state)
        if not chosen:
            return
        name = data.draw(st.sampled_from(chosen))
        held = self.engine.held[name]
        if action == "sleep":
            held.asleep = True
        elif action in ("pause", "unpause"):
            held.state = "paused" if action == "pause" else "running"
        else:
            held.state = "exited"
            held.asleep = False

    @rule(role=st.sampled_from(["primary", "rtx"]))
    def someone_puts_the_active_lane_to_sleep(self, role: str) -> None:
        """`POST /sleep` to an engine of the serving lane (a dev-mode route anyone on its port can use): its
        /health still answers 200, so only asking `/is_sleeping` tells it from a healthy lane."""
        self.last = None
        active = self.state().active
        if active in self.catalog.lanes and role in self._lane(active).roles:
            held = self.engine.held.get(self._lane(active).container_name(role))
            if held is not None and held.state == "running":
                held.asleep = True

    @rule(lane=st.sampled_from(LANES), seconds=st.sampled_from([20, 30, 60]))
    def edit_stop_timeout(self, lane: str, seconds: int) -> None:
        self.last = None
        engine = self._lane(lane).spec.engine
        self.catalog = with_engine(self.catalog, lane, stop_timeout_seconds=seconds)
        rtx = self._lane(lane).spec.companions.get("rtx")
        if rtx is not None:
            self.catalog = with_lane(self.catalog, lane, companions={
                "rtx": replace(rtx, engine=replace(rtx.engine, stop_timeout_seconds=seconds))})
        assert self._lane(lane).spec.engine is not engine
        self._build()

    @rule(lane=st.sampled_from(LANES), port=st.sampled_from([18101, 18102]))
    def edit_companion_port(self, lane: str, port: int) -> None:
        self.last = None
        rtx = self._lane(lane).spec.companions.get("rtx")
        if rtx is None:
            return
        ports = [replace(rtx.engine.ports[0], host=port + LANES.index(lane) * 10)]
        self.catalog = with_lane(self.catalog, lane, companions={
            "rtx": replace(rtx, engine=replace(rtx.engine, ports=ports))})
        self._build()

    @rule(lane=st.sampled_from(LANES), present=st.booleans())
    def edit_companion_presence(self, lane: str, present: bool) -> None:
        """The lane's `-rtx` companion removed from its recipe, or put back."""
        self.last = None
        original = repo_catalog().lanes[lane].spec.companions["rtx"]
        current = self._lane(lane).spec.companions.get("rtx", original)
        self.catalog = with_lane(self.catalog, lane, companions={"rtx": current} if present else {})
        self._build()

    @rule(lane=st.sampled_from(LANES), value=st.sampled_from(["1", "2"]))
    def edit_env(self, lane: str, value: str) -> None:
        self.last = None
        engine = self._lane(lane).spec.engine
        self.catalog = with_engine(self.catalog, lane, env={**engine.env, "STUB_LOAD_SECONDS": value})
        self._build()

    @rule(lane=st.sampled_from(LANES), secret=st.booleans())
    def edit_secret(self, lane: str, secret: bool) -> None:
        """The lane's primary is given HF_TOKEN from lanectl's environment, or no longer."""
        self.last = None
        self.catalog = with_engine(self.catalog, lane, secret_env=["HF_TOKEN"] if secret else [])
        self._build()

    @rule(value=st.sampled_from([None, "hf_one", "hf_two"]))
    def operator_sets_the_secret(self, value: str | None) -> None:
        """HF_TOKEN in lanectl's environment rotated, or unset (a switch that needs it is then refused)."""
        self.last = None
        if value is None:
            self.environ.pop("HF_TOKEN", None)
        else:
            self.environ["HF_TOKEN"] = value

    @rule()
    def secret_key_lost(self) -> None:
        """secret-digest.key deleted (a restore from backup without it, a tidy operator)."""
        self.last = None
        (self.folder / "secret-digest.key").unlink(missing_ok=True)

    @rule(fits=st.integers(0, 6))
    def state_folder_fills(self, fits: int) -> None:
        """The state folder's disk fills up for the next command: state.json cannot be written, and of the
        journal only `fits` more lines."""
        self.full = fits

    # -- the promises ----------------------------------------------------------------------------------------

    @invariant()
    def count_the_move(self) -> None:
        """Not a promise: the invariants run after every rule, so this counts the moves searched."""
        BoxMachine.moves += 1

    @invariant()
    def one_lane_awake_per_gpu(self) -> None:
        """No container lanectl started is awake beside one of another lane on its GPUs, whoever started that
        one first (an operator's `docker start` of two lanes at once is the operator's doing)."""
        awake = [(lane, name) for lane, name in self.awake_containers() if lane in self.catalog.lanes]
        for i, (lane, name) in enumerate(awake):
            if name in self.engine.by_hand:
                continue
            earlier = [(other, o) for other, o in awake[:i] if other != lane
                       and gpus_overlap(self._lane(other), self._lane(lane))]
            assert not earlier, f"lanectl started {name} awake beside {earlier} on one GPU"

    @invariant()
    def what_is_awake_is_the_active_lane_or_the_unfinished_switchs(self) -> None:
        if self.unrecorded:
            return  # state.json could not be written: the engine alone says what serves
        allowed = {self.state().active}
        intent = self.unfinished()
        if intent is not None:
            allowed |= {intent.get("to"), intent.get("from")}
        stray = {lane: names for lane, names in self.awake_lanes(by_lanectl=True).items() if lane not in allowed}
        assert not stray, f"awake but neither active nor being switched: {stray} (active {allowed})"

    @invariant()
    def every_stop_gives_the_containers_own_drain(self) -> None:
        cut = [(name, allowed, own) for name, allowed, own in self.engine.own_drains if allowed != own]
        assert not cut, f"stopped with a stop timeout other than its own (name, allowed, own): {cut}"

    @invariant()
    def every_container_with_lanectls_labels_is_accounted_for(self) -> None:
        """`status` and `down` see every container lanectl made: a lane's, one set aside, an orphan (a role the
        recipe no longer has) or a foreign one (renamed)."""
        from lanectl.lanes.inventory import Inventory
        from lanectl.state.lanes import LaneState
        from lanectl.state.standby import StandbyState

        # Sorting containers needs only the listing: no state files, no builds.
        listing = Snapshot(containers=tuple(self.engine.list_containers()), state=LaneState(),
                           standby=StandbyState(), unfinished=None, images={}, image_plans={})
        inventory = Inventory(self.catalog, listing)
        seen = {*inventory.own, *inventory.aside, *inventory.orphans, *(f.listed.name for f in inventory.foreign)}
        made = {name for name, held in self.engine.held.items() if "io.lanectl.lane" in held.spec.labels}
        assert made <= seen, f"made by lanectl and seen by no command: {sorted(made - seen)}"

    @invariant()
    def a_lane_lanectl_no_longer_counts_on_holds_no_gpu(self) -> None:
        """What lanectl counts on is the active lane, the standbys it records and the switch left unfinished;
        what drops a standby (it died, was removed or paused while asleep) stops what is left of it, so nothing
        else lanectl made is left frozen or asleep on its GPUs, where it would block the active lane's restart."""
        if self.unrecorded:
            return  # state.json could not be written: the engine alone says what serves
        counted = {self.state().active, *(r.lane for r in StandbyStore(self.folder / "standby.json").load().standbys)}
        intent = self.unfinished()
        if intent is not None:
            counted |= {intent.get("to"), intent.get("from")}
        left = sorted(name for name, held in self.engine.held.items()
                      if (held.state == "paused" or (held.state == "running" and held.asleep))
                      and held.spec.labels.get("io.lanectl.lane") not in counted and name not in self.engine.by_hand)
        assert not left, f"frozen or asleep on its GPUs, of a lane lanectl no longer counts on: {left}"

    @invariant()
    def nothing_running_is_removed(self) -> None:
        assert not self.engine.removed_running, f"removed while running: {self.engine.removed_running}"

    @invariant()
    def the_last_message_names_what_serves(self) -> None:
        outcome = self.last
        if outcome is None or outcome.lane is None or outcome.result not in ("ok", "finished", "undone",
                                                                             "rolled-back", "noop"):
            return
        lane = self._lane(outcome.lane)
        names = {lane.container_name(role) for role in lane.roles}
        awake = self.awake_lanes().get(outcome.lane, set())
        assert names <= awake, f"{outcome.result}: {outcome.message!r}, but only {sorted(awake)} of it is awake"


MIN_MOVES = 2_000  # CI's profile must search at least this many moves, over all its sequences


def test_interleavings_of_the_box_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's search, counting what it searched: the moves (rules run) over how many sequences."""
    import lanectl.lanes.snapshot

    monkeypatch.setattr(lanectl.lanes.snapshot, "plan_images_apart",
                        ImagePlansOnce(lanectl.lanes.snapshot.plan_images_apart))
    BoxMachine.moves = BoxMachine.sequences = 0
    run_state_machine_as_test(BoxMachine, settings=settings.get_profile(PROFILE))
    print(f"the box's switch: {BoxMachine.moves} moves over {BoxMachine.sequences} sequences ({PROFILE} profile)")
    if PROFILE == "ci":
        assert BoxMachine.moves >= MIN_MOVES, f"only {BoxMachine.moves} moves searched"


# -- what the fuzzer and the hostile passes found, pinned as sequences of the machine's moves ------------------

def machine(first: str) -> BoxMachine:
    box = BoxMachine()
    box.start(first=first)
    return box


def promises_hold(box: BoxMachine) -> None:
    box.every_container_with_lanectls_labels_is_accounted_for()
    box.a_lane_lanectl_no_longer_counts_on_holds_no_gpu()
    box.nothing_running_is_removed()
    box.one_lane_awake_per_gpu()
    box.what_is_awake_is_the_active_lane_or_the_unfinished_switchs()
    box.every_stop_gives_the_containers_own_drain()
    box.the_last_message_names_what_serves()
    box.teardown()


def test_a_killed_rollback_and_one_watchdog_pass_never_leave_two_lanes_awake():
    """demo-h2 active, demo-h1 asleep as its standby; `rollback` killed right after `stop demo-h2-rtx`; the
    watchdog's pass finishes the switch: it stops demo-h2's primary before it wakes demo-h1."""
    box = machine("demo-h1")
    box.up(lane="demo-h2", how=None, fails=False)
    assert box.last is not None and "demo-h1 waits asleep" in box.last.message
    box.rollback(how=("kill", 2, 0))
    assert box.unfinished() is not None
    box.watchdog_check(how=None)
    assert box.last is not None and box.last.result == "finished", box.last
    assert set(box.awake_lanes()) == {"demo-h1"}
    promises_hold(box)


def test_a_switch_killed_past_its_last_step_is_finished_by_one_watchdog_pass():
    """`up` killed after its last step, before its outcome: the lease is cleared already, so the watchdog used to
    leave the switch unfinished in the journal for ever. Every kill point of the switch, one pass each."""
    past_the_end = 0
    for after in range(1, 40):
        box = machine("demo-h1")
        box.up(lane="demo-h2", how=("kill", after, 0), fails=False)
        if box.unfinished() is None:
            break  # the switch ended before step `after`
        past_the_end += box.state().watchdog_lease is None  # its lease cleared: past its last step
        box.watchdog_check(how=None)
        assert box.unfinished() is None, f"killed after step {after}: still unfinished after a watchdog pass"
        promises_hold(box)
    assert past_the_end >= 1 and after > 3, (past_the_end, after)


def test_a_recipe_that_shortens_the_stop_timeout_still_stops_the_running_container_with_its_own():
    box = machine("demo-h1")  # created with 30 s
    box.edit_stop_timeout(lane="demo-h1", seconds=20)
    box.up(lane="demo-h1", how=None, fails=False)  # recreates it: the old one is stopped first
    assert ("lanectl-demo-demo-h1", 30, 30) in box.engine.own_drains
    promises_hold(box)


def test_a_way_back_stops_a_recreated_container_with_its_own_new_timeout():
    box = machine("demo-h1")
    box.edit_stop_timeout(lane="demo-h1", seconds=60)
    box.up(lane="demo-h1", how=None, fails=True)  # the recreated lane fails its gate: the way back stops it
    assert ("lanectl-demo-demo-h1", 60, 60) in box.engine.own_drains
    promises_hold(box)


def test_a_first_signal_during_a_way_back_lets_it_finish():
    box = machine("demo-h1")
    box.down(how=None)
    box.edit_stop_timeout(lane="demo-h1", seconds=20)
    box.engine_health(lane="demo-h1", failing=True)
    box.rollback(how=("int", 9, 0))  # SIGINT while the way back stops demo-h1
    assert box.awake_lanes() == {}, box.last
    promises_hold(box)


def test_a_container_set_aside_that_was_started_by_hand_is_stopped_before_its_replacement_starts():
    box = machine("demo-h2")
    box.down(how=None)
    box.edit_companion_port(lane="demo-h2", port=18101)
    box.rollback(how=("operator-start", 1, 1))  # `docker start` of demo-h2-rtx before it is set aside
    assert not [name for name, held in box.engine.held.items() if ".was-" in name and held.state == "running"]
    box.up(lane="demo-h1", how=None, fails=False)
    promises_hold(box)


def test_an_active_lane_put_to_sleep_by_someone_is_not_healthy_and_up_wakes_it_by_a_restart():
    box = machine("demo-h1")
    box.operator_on_the_engine(data=_Drawn("lanectl-demo-demo-h1"), action="sleep")
    box.up(lane="demo-h1", how=None, fails=False)
    assert box.last is not None and box.last.result == "ok", box.last
    assert "already active and healthy" not in box.last.message
    assert box.awake_lanes() == {"demo-h1": {"lanectl-demo-demo-h1", "lanectl-demo-demo-h1-rtx"}}
    promises_hold(box)


class _Drawn:
    """A data() stand-in that draws the given values in order."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any) -> Any:
        return self.values.pop(0)


def test_a_companion_removed_from_the_recipe_is_seen_and_the_next_switch_stops_and_removes_it():
    box = machine("demo-h1")
    box.edit_companion_presence(lane="demo-h1", present=False)
    box.every_container_with_lanectls_labels_is_accounted_for()  # it was invisible to status, down and rollback
    box.up(lane="demo-h2", how=None, fails=False)
    assert "lanectl-demo-demo-h1-rtx" not in box.engine.held, box.last
    promises_hold(box)


def test_a_ctrl_c_before_the_serving_lane_was_put_to_sleep_leaves_it_serving_untouched():
    """demo-h2 serves, demo-h1 sleeps as the older standby; `up demo-h2-8` is interrupted while it stops
    demo-h1: demo-h2 was never put to sleep, so the way back must not wake-check it and restart it cold."""
    box = machine("demo-h1")
    box.up(lane="demo-h2", how=None, fails=False)
    starts = {name: held.starts for name, held in box.engine.held.items()}
    box.up(lane="demo-h2-8", how=("int", 2, 0), fails=False)  # after disarm and the first stop of demo-h1
    assert box.last is not None and box.last.lane == "demo-h2", box.last
    assert "wake of demo-h2 failed" not in box.last.message, box.last.message
    h2 = {name: held.starts for name, held in box.engine.held.items() if name.startswith("lanectl-demo-demo-h2")
          and not name.startswith("lanectl-demo-demo-h2-8")}
    assert h2 == {name: starts[name] for name in h2}, "demo-h2 was restarted"
    promises_hold(box)


def test_a_lost_secret_key_with_the_secret_unchanged_recreates_nothing_and_the_dry_run_says_the_same():
    from lanectl.lanes.plan import plan_up

    box = machine("demo-h1")
    box.environ["HF_TOKEN"] = "hf_unchanged"
    box.catalog = with_engine(box.catalog, "demo-h1", secret_env=["HF_TOKEN"])
    box._build()
    box.up(lane="demo-h1", how=None, fails=False)  # recreated once: the secret is new to the container
    (box.folder / "secret-digest.key").unlink()
    switcher = box.switcher(QuietReporter(), Interrupt())
    dry = plan_up(box.catalog, switcher.snapshot("demo-h1", create_secret_key=False), box._lane("demo-h1"),
                  with_gpus=False)
    box.up(lane="demo-h1", how=None, fails=False)
    assert box.last is not None and (dry.kind, box.last.result) == ("noop", "noop"), "\n".join(dry.lines())
    promises_hold(box)


def test_a_recreate_of_the_serving_lane_that_fails_its_gate_leaves_it_serving_and_the_standby_asleep():
    """demo-h2 serves, demo-h1 sleeps as its standby; a companion env change makes the recreated demo-h2 fail
    its gate: the way back puts the old containers back and demo-h2 serves as it was, demo-h1 still asleep
    (it dropped demo-h1's standby first and ended on demo-h1: "demo-h1 is serving again")."""
    box = machine("demo-h1")
    box.up(lane="demo-h2", how=None, fails=False)
    box.edit_stop_timeout(lane="demo-h2", seconds=60)
    old = box.engine.held["lanectl-demo-demo-h2"]
    engines = box.engines  # the recreated containers fail their gate; the old ones, put back, pass it
    engines.on_gate = lambda lane: (engines.failing_gates.discard if box.engine.held.get(lane.container_name())
                                    is old else engines.failing_gates.add)(lane.name)
    box.up(lane="demo-h2", how=None, fails=False)
    assert box.last is not None and box.last.lane == "demo-h2", box.last
    assert box.engine.held["lanectl-demo-demo-h2"] is old
    assert box.state().active == "demo-h2"
    assert box.engine.asleep(box._lane("demo-h1")) == ["lanectl-demo-demo-h1", "lanectl-demo-demo-h1-rtx"]
    promises_hold(box)


def test_a_companion_recreate_that_fails_its_gate_leaves_the_serving_primary_running_untouched():
    """Only demo-h2's companion changes (a new host port) and its recreate fails the gate: the way back replaces
    the companion and gates the lane again, and the primary, which the change never touched, is neither stopped
    nor started (it was: on a real engine that is a cold start, minutes without service, for nothing)."""
    box = machine("demo-h1")
    box.up(lane="demo-h2", how=None, fails=False)
    old_rtx = box.engine.held["lanectl-demo-demo-h2-rtx"]
    primary = box.engine.held["lanectl-demo-demo-h2"]
    box.edit_companion_port(lane="demo-h2", port=18101)
    engines = box.engines  # the recreated companion fails its gate; the old one, put back, passes it
    engines.on_gate = lambda lane: (engines.failing_gates.discard if box.engine.held.get(lane.container_name("rtx"))
                                    is old_rtx else engines.failing_gates.add)(lane.name)
    calls_before = len(box.engine.calls)
    box.up(lane="demo-h2", how=None, fails=False)
    assert box.last is not None and box.last.lane == "demo-h2", box.last
    calls = box.engine.calls[calls_before:]
    assert "create:lanectl-demo-demo-h2-rtx" in calls, "the companion was recreated, then put back"
    assert not {"stop:lanectl-demo-demo-h2", "start:lanectl-demo-demo-h2"} & set(calls), calls
    assert box.engine.held["lanectl-demo-demo-h2"] is primary and box.engine.held["lanectl-demo-demo-h2-rtx"] is old_rtx
    assert box.state().active == "demo-h2"
    promises_hold(box)


class FullStateFolder(LaneStateStore):
    """state.json on a disk that has filled up: every write fails as the kernel fails it."""

    def save(self, state: Any) -> Any:
        raise OSError(28, "No space left on device", str(self.path))


def test_a_full_state_folder_fails_the_rollback_first_step_and_leaves_the_standby_asleep():
    box = machine("demo-h1")
    box.up(lane="demo-h2", how=None, fails=False)  # demo-h1 waits asleep
    full = FuzzSwitcher(box.catalog, box.engine, Journal(box.folder / "journal.jsonl"),  # type: ignore[arg-type]
                        FullStateFolder(box.folder / "state.json"), reporter=QuietReporter(), no_gpu=True,
                        environ={}, calls=box.engines, interrupt=Interrupt(), host_memory=lambda: 64.0,
                        gpu_memory=lambda: None)
    outcome = full.rollback(None)
    assert outcome.result != "ok" and "No space left on device" in outcome.message, outcome.message
    assert box.engine.asleep(box._lane("demo-h1")) == ["lanectl-demo-demo-h1", "lanectl-demo-demo-h1-rtx"], \
        "the standby the rollback was about to wake is still there"
    assert set(box.awake_lanes()) == {"demo-h2"}
    promises_hold(box)


class FullJournal(Journal):
    """journal.jsonl on that full disk: the first `fits` appends land in the file's last, partly used block; every
    later one fails as the kernel fails it."""

    def __init__(self, path: Path, fits: int):
        super().__init__(path)
        self.fits = fits

    def _append_line(self, line: bytes) -> None:
        if self.fits <= 0:
            raise OSError(28, "No space left on device", str(self.path))
        self.fits -= 1
        super()._append_line(line)


def on_a_full_disk(box: BoxMachine, fits: int, *, state_fits: bool = False) -> FuzzSwitcher:
    states = LaneStateStore(box.folder / "state.json") if state_fits else FullStateFolder(box.folder / "state.json")
    return FuzzSwitcher(box.catalog, box.engine, FullJournal(box.folder / "journal.jsonl", fits),  # type: ignore[arg-type]
                        states, reporter=QuietReporter(), no_gpu=True, environ={}, calls=box.engines,
                        interrupt=Interrupt(), host_memory=lambda: 64.0, gpu_memory=lambda: None)


def test_a_journal_that_fills_up_during_the_way_back_does_not_cut_it_short():
    """Found on the real engine (a state folder on a full tmpfs): the intent and the first step records fit in the
    journal's last block, the next did not, and the way back ended there: 'could not write the journal' alone,
    demo-h2 neither gated nor said to serve. The way back goes on without its journal and says what serves."""
    box = machine("demo-h1")
    box.up(lane="demo-h2", how=None, fails=False)  # demo-h1 waits asleep
    outcome = on_a_full_disk(box, fits=2).rollback(None)  # the intent and the failed disarm
    assert outcome.result == "rolled-back" and outcome.lane == "demo-h2", outcome
    # Its first step (a state write) failed, so no container changed, and the way back changes none either.
    assert "No container was changed: demo-h2 serves as it did" in outcome.message, outcome.message
    assert "could not write the journal" in outcome.message, outcome.message
    # No engine failed: the disk did. demo-h1's log (it slept through it) is not shown as the failed lane's.
    assert outcome.diagnostics["log_tail"] == [] and outcome.diagnostics["check"] is None, outcome.diagnostics
    assert box.engine.asleep(box._lane("demo-h1")) == ["lanectl-demo-demo-h1", "lanectl-demo-demo-h1-rtx"]
    assert set(box.awake_lanes()) == {"demo-h2"}
    promises_hold(box)


def test_a_step_the_journal_cannot_record_sends_the_switch_back():
    """A switch goes no further than its journal: a kill past the last step it recorded would leave the next command
    a trail that stops short of what runs. It takes its way back, which goes on without the journal."""
    box = machine("demo-h1")
    outcome = on_a_full_disk(box, fits=2, state_fits=True).up(box._lane("demo-h2"), why="up")  # intent, disarm
    assert outcome.result == "rolled-back" and outcome.lane == "demo-h1", outcome
    assert outcome.message.startswith("could not write the journal"), outcome.message
    assert "No container was changed: demo-h1 serves as it did" in outcome.message, outcome.message
    assert set(box.awake_lanes()) == {"demo-h1"}
    promises_hold(box)


def test_a_recreate_for_a_new_port_that_fails_its_gate_puts_the_old_container_back_and_gates_it_on_its_port():
    """A new host port for demo-h2's companion plus a gate the new containers fail: the old containers are put
    back and serve on their old port; the way back's gate probes that port, so demo-h2 is serving again and stays
    active (it probed the new port, said no lane is serving, exited 1 and cleared `active`)."""
    box = machine("demo-h2")
    box.edit_companion_port(lane="demo-h2", port=18102)
    old = box.engine.held["lanectl-demo-demo-h2-rtx"]
    engines = box.engines
    engines.on_gate = lambda lane: (engines.failing_gates.discard if box.engine.held.get(
        lane.container_name("rtx")) is old else engines.failing_gates.add)(lane.name)
    box.up(lane="demo-h2", how=None, fails=False)
    assert box.last is not None and (box.last.result, box.last.lane) == ("rolled-back", "demo-h2"), box.last
    assert box.state().active == "demo-h2" and box.engine.held["lanectl-demo-demo-h2-rtx"] is old
    promises_hold(box)


def test_a_secret_missing_from_lanectls_environment_is_refused_before_the_serving_lane_sleeps():
    box = machine("demo-h1")  # demo-h1 serves; demo-h2 would be created with HF_TOKEN, which is not set
    box.catalog = with_engine(box.catalog, "demo-h2", secret_env=["HF_TOKEN"])
    box._build()
    box.up(lane="demo-h2", how=None, fails=False)
    assert box.last is None, "refused before any change (exit 2)"
    assert set(box.awake_lanes()) == {"demo-h1"} and box.engine.asleep(box._lane("demo-h1")) == []
    promises_hold(box)


def test_a_container_of_another_lane_started_by_hand_before_a_start_refuses_the_start():
    """`docker start` of demo-h2's stopped primary while `up demo-h2-8` is about to start: the executor's fresh
    look refuses the start, and no lane lanectl starts is awake beside it."""
    box = machine("demo-h1")  # every lane made once; demo-h1 serves, demo-h2 and demo-h2-8 stopped
    box.target = "demo-h2-8"
    box.up(lane="demo-h2-8", how=("operator-start", 3, 2), fails=False)  # after demo-h1's stops, before the wake
    assert box.engine.by_hand, "the operator started a container"
    assert box.last is not None and "refused to start" in box.last.message, box.last
    promises_hold(box)


def test_a_container_set_aside_and_started_again_by_hand_is_not_removed_by_the_prune():
    box = machine("demo-h1")
    box.edit_env(lane="demo-h1", value="1")  # `up demo-h1` recreates both containers, setting the old ones aside

    def start_the_old_ones() -> None:  # after `mark demo-h1 active`, before the prune removes what was set aside
        for name in [name for name in box.engine.held if ".was-" in name]:
            box.engine.start_by_hand(name)

    box.last = box.switcher(Interrupting(11, start_the_old_ones), Interrupt()).up(box._lane("demo-h1"), why="up")
    assert [name for name in box.engine.by_hand if ".was-" in name], box.last
    promises_hold(box)


def test_an_undo_whose_lane_does_not_come_back_says_so_stops_it_and_re_arms_the_watchdog():
    """Found by the machine: a killed rollback is undone by the next command, and the lane it brings back fails
    its gate. The undo said '… is serving again', left that lane running unhealthy and the watchdog disarmed."""
    box = machine("demo-h1")
    box.rollback(how=None)
    box.operator_on_the_engine(action="kill", data=_Drawn("lanectl-demo-demo-h2-8"))
    box.rollback(how=("kill", 6, 0))
    box.operator_on_the_engine(action="stop", data=_Drawn("lanectl-demo-demo-h1"))
    box.engine_health(lane="demo-h2-8", failing=True)
    box.down(how=None)
    state = box.state()
    assert state.watchdog_armed and state.watchdog_lease is None, state
    assert box.awake_lanes() == {}
    promises_hold(box)


def test_up_of_the_active_lane_whose_companion_was_removed_stops_and_removes_the_orphan():
    """Found on the real engine: `up demo-h1` after demo-h1's companion left its recipe said "already active and
    healthy; nothing to do", and the orphan ran on."""
    box = machine("demo-h1")
    box.edit_companion_presence(lane="demo-h1", present=False)
    box.up(lane="demo-h1", how=None, fails=False)
    assert box.last is not None and box.last.result == "ok", box.last
    assert "lanectl-demo-demo-h1-rtx" not in box.engine.held, box.last
    assert box.awake_lanes() == {"demo-h1": {"lanectl-demo-demo-h1"}}
    promises_hold(box)


def test_a_broken_recreate_of_the_serving_lane_beside_a_lost_standby_goes_back_to_the_serving_lane():
    """Found by the machine: demo-h1 serves, demo-h2-8 waited asleep until its primary was stopped (a lost
    standby, its companion still asleep on the GPU); a new companion port recreates demo-h1's companion, and the
    new build fails its gate. The way back went to demo-h2-8, started cold, rather than putting demo-h1 back as
    it was."""
    box = machine("demo-h1")
    assert box.engine.asleep(box._lane("demo-h2-8")), "demo-h2-8 waits asleep"
    box.operator_on_the_engine(action="stop", data=_Drawn("lanectl-demo-demo-h2-8"))
    box.edit_companion_port(lane="demo-h1", port=18101)
    box.up(lane="demo-h1", how=None, fails=False, bad_build=True)  # asserts that demo-h1 serves again
    assert box.last is not None and (box.last.result, box.last.lane) == ("rolled-back", "demo-h1"), box.last
    promises_hold(box)


def test_a_lost_standby_whose_companion_left_the_recipe_has_that_companion_stopped_too():
    """Found by the machine: the watchdog's pass dropped demo-h2-8 (its primary stopped while asleep) and stopped
    what its recipe still names, leaving the companion the recipe no longer has asleep on its GPUs."""
    box = machine("demo-h1")
    box.edit_companion_presence(lane="demo-h2-8", present=False)
    box.operator_on_the_engine(action="stop", data=_Drawn("lanectl-demo-demo-h2-8"))
    box.watchdog_check(how=None)
    assert box.engine.held["lanectl-demo-demo-h2-8-rtx"].state == "exited"
    promises_hold(box)


def test_a_continuation_stopped_by_a_second_signal_ends_the_command_there():
    """Found by the machine: `up demo-h2` killed after putting demo-h1's companion to sleep; `up demo-h1` first
    undoes that switch, and a double Ctrl-C stops the undo at once. The command went on to a switch of its own with
    the old one still open, was interrupted in turn, and left demo-h1's primary awake with no lane active and no
    switch open: a lane nothing watched. It now ends with the undo, which the next command finishes."""
    box = machine("demo-h1")
    box.up(lane="demo-h1", how=None, fails=True)  # stopped for debugging: no lane serves, none waits asleep
    box.up(lane="demo-h1", how=None, fails=False)
    box.up(lane="demo-h2", how=("kill", 2, 0), fails=False)
    assert box.unfinished() is not None and box.unfinished()["done_steps"][-1] == "sleep:lanectl-demo-demo-h1-rtx"
    box.up(lane="demo-h1", how=("int2", 1, 0), fails=False)
    assert box.last is not None and box.last.result == "aborted", box.last
    assert box.unfinished() is not None and box.unfinished()["to"] == "demo-h2", "left for the next command"
    promises_hold(box)


def test_a_switch_that_a_renamed_container_on_its_gpus_would_stop_half_way_is_refused_before_any_change():
    """Found by the machine: demo-h2-8 serves beside demo-h2 asleep, and someone renames demo-h2's primary. A
    recreate of demo-h2-8 stopped it, then could not start it again beside a container lanectl cannot ask whether
    it sleeps (counted awake), and its way back could not either: nothing served. It is refused up front now."""
    box = machine("demo-h2-8")
    assert box.engine.asleep(box._lane("demo-h2")), "demo-h2 waits asleep beside it"
    box.operator_on_the_engine(action="rename", data=_Drawn("lanectl-demo-demo-h2"))
    starts = {name: held.starts for name, held in box.engine.held.items()}
    box.a_broken_change_to_the_serving_lane(port=18102)
    assert box.last is None, "refused before any change (exit 2)"
    assert {name: held.starts for name, held in box.engine.held.items()} == starts
    assert box.awake_lanes()["demo-h2-8"] == {"lanectl-demo-demo-h2-8", "lanectl-demo-demo-h2-8-rtx"}
    promises_hold(box)


def test_a_killed_down_of_the_box_is_finished_whole_by_the_next_watchdog_pass():
    """Found by the machine: `lanectl down` (the box: its lane, the standbys, the orphans) killed after its first
    stop; the watchdog's pass finished only the lane, and left the standby asleep and the orphan companion
    running. The finish now plans the down again from what the engine shows."""
    box = machine("demo-h1")  # demo-h1 serves, demo-h2-8 waits asleep
    box.edit_companion_presence(lane="demo-h1", present=False)  # demo-h1's companion becomes an orphan
    box.down(how=("kill", 1, 0))
    box.watchdog_check(how=None)
    assert box.last is not None and box.last.result == "finished", box.last
    assert box.awake_lanes() == {} and not box.engine.asleep(box._lane("demo-h2-8")), box.engine.held
    assert "lanectl-demo-demo-h1-rtx" not in box.engine.held
    promises_hold(box)


def test_a_change_that_fails_at_its_first_state_write_leaves_the_serving_lane_untouched():
    """Found by the machine: demo-h2-8 serves, demo-h2 waits asleep; demo-h2's companion leaves its recipe (its
    container an orphan, asleep); the state folder is full. A companion-port change to demo-h2-8 failed at its first
    step (the disarm's state.json write), so nothing on the engine had changed; its way back still stopped
    demo-h2-8's companion and started it again, and the start was refused: the orphan could not be asked whether it
    sleeps (its role has no port in the recipe), so it counted as awake. Nothing served. Now a way back taken before
    any container changed changes none, and an orphan is asked on the port it publishes."""
    box = machine("demo-h2-8")
    box.state_folder_fills(fits=1)
    box.edit_companion_presence(lane="demo-h2", present=False)
    box.a_broken_change_to_the_serving_lane(port=18101)  # asserts that demo-h2-8 serves after its way back
    promises_hold(box)


def test_a_switch_that_fails_before_changing_a_container_changes_none_on_its_way_back():
    """A companion-port change to the serving lane whose first step (the disarm's state.json write) fails on a full
    disk: the way back stopped demo-h2-8's companion and started it again, for a change that never reached the
    engine. It now holds demo-h2-8 to its gate and changes no container."""
    box = machine("demo-h2-8")
    box.state_folder_fills(fits=1)
    box.engine.calls.clear()
    box.a_broken_change_to_the_serving_lane(port=18101)
    assert box.last is not None and box.last.result == "rolled-back", box.last
    assert "No container was changed: demo-h2-8 serves as it did" in box.last.message, box.last.message
    changed = [call for call in box.engine.calls if call.split(":")[0] in ("stop", "start", "create", "rename")]
    assert changed == [], changed
    promises_hold(box)


def test_an_orphan_asleep_on_the_gpus_is_asked_on_the_port_it_publishes():
    """demo-h2 waits asleep beside demo-h2-8, then its companion leaves its recipe: the companion's container is an
    orphan, still asleep. A broken companion change to demo-h2-8 takes its way back, which starts the old companion
    again: that start was refused (the orphan's role has no port in the recipe to ask, so it counted as awake), and
    nothing served. It is asked on the host port it publishes, says it sleeps, and the start goes ahead."""
    box = machine("demo-h2-8")
    box.edit_companion_presence(lane="demo-h2", present=False)
    assert box.engine.asleep(box._lane("demo-h2")) == ["lanectl-demo-demo-h2"]
    assert box.engine.held["lanectl-demo-demo-h2-rtx"].asleep, "the orphan sleeps"
    box.a_broken_change_to_the_serving_lane(port=18101)  # asserts that demo-h2-8 serves after its way back
    assert box.last is not None and box.last.result == "rolled-back", box.last
    assert "refused" not in box.last.message, box.last.message
    promises_hold(box)


def test_a_replacement_started_by_hand_during_the_way_back_is_stopped_before_it_is_removed():
    """Found by the machine: a recreate of demo-h1 (an env change) fails its gate; its way back stopped the new
    containers, and someone's `docker start` of the new companion came before the put-back, which removed it
    running. The put-back stops it first, with its own drain."""
    box = machine("demo-h1")
    box.edit_env(lane="demo-h1", value="1")
    box.down(how=None)
    box.engine.calls.clear()
    box.up(lane="demo-h1", how=("operator-start", 10, 1), fails=True)  # after both stops, before the put-backs
    assert box.engine.calls.count("stop:lanectl-demo-demo-h1-rtx") == 2, "stopped by the way back, then again"
    promises_hold(box)


def test_a_switch_that_fails_before_changing_a_container_does_not_call_half_a_lane_serving():
    """demo-h2 runs without its companion (an interrupted rollback, and someone's `docker start` of its primary
    alone); `up demo-h1` on a full disk fails at its first state write. A lane whose companion does not run fails
    its gate, so the way back is the whole one, not the bookkeeping alone."""
    box = machine("demo-h1")
    box.rollback(how=("operator-start", 1, 0))
    box.state_folder_fills(fits=2)
    box.up(lane="demo-h1", how=None, fails=False)
    promises_hold(box)


def test_a_lane_with_no_lane_before_it_that_fails_its_gate_is_stopped_for_debugging():
    """`up` of the active lane whose engine fails its gate, no container changed: with no lane to go back to, the
    way back stops it for debugging (a lane left running but marked inactive would be awake and unwatched)."""
    box = machine("demo-h1")
    box.up(lane="demo-h1", how=None, fails=True)
    assert box.last is not None and "stopped for debugging" in box.last.message, box.last
    promises_hold(box)


def test_up_of_the_active_lane_whose_primary_someone_paused_starts_it_from_stopped():
    """Found by the machine: `docker pause` of demo-h1's primary, then `lanectl up demo-h1`. The plan started the
    paused container, Docker refused ("cannot start a paused container"), and the way back stopped the lane for
    debugging: nothing served. A paused container is stopped first (with its own drain), then started."""
    box = machine("demo-h1")
    box.operator_on_the_engine(data=_Drawn("lanectl-demo-demo-h1"), action="pause")
    box.up(lane="demo-h1", how=None, fails=False)
    assert box.last is not None and box.last.result == "ok", box.last
    assert box.awake_lanes() == {"demo-h1": {"lanectl-demo-demo-h1", "lanectl-demo-demo-h1-rtx"}}
    assert box.engine.held["lanectl-demo-demo-h1"].state == "running"
    promises_hold(box)


def test_an_undo_of_a_killed_switch_stops_a_companion_its_recipe_dropped_since():
    """Found by the machine: `up demo-h1` killed after starting both its containers; demo-h1's companion then
    leaves its recipe, and someone stops demo-h1's primary. The watchdog's pass undid the switch by stopping the
    recipe's roles alone: the companion, an orphan now, stayed awake on the GPUs with no lane active. A
    continuation stops and removes orphans first, as every switch does."""
    box = machine("demo-h1")
    box.down(how=None)
    box.up(lane="demo-h1", how=("kill", 3, 0), fails=False)
    box.edit_companion_presence(lane="demo-h1", present=False)
    box.operator_on_the_engine(data=_Drawn("lanectl-demo-demo-h1"), action="stop")
    box.watchdog_check(how=None)
    assert "lanectl-demo-demo-h1-rtx" not in box.engine.held, "the orphan is removed"
    promises_hold(box)


def test_a_way_back_with_no_lane_to_go_back_to_that_fails_says_what_it_was_doing():
    """The failed way back of a switch with no lane before it said "Rolling back to None FAILED too"."""
    box = machine("demo-h2")
    box.someone_puts_the_active_lane_to_sleep(role="primary")  # no lane serves before: nothing to go back to
    box.state_folder_fills(fits=1)
    box.up(lane="demo-h2", how=None, fails=False)
    assert box.last is not None and "Stopping demo-h2 FAILED too" in box.last.message, box.last
    assert "None" not in box.last.message, box.last.message
