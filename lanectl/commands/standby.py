"""`lanectl standby check LANE`: prove on this box, before a recipe says `standby:`, that LANE sleeps and wakes.

The protocol is `lanectl/lanes/standby_check.py`; this module runs it on the box's Docker engine, under the engine
lock: it stops what serves (and says so first: `--yes` is needed when a lane serves), starts LANE cold through the
same gated path as `up` (the cold start a wake must beat), runs the cycles, optionally starts LANE2 beside LANE
asleep, then stops LANE and brings back the lane that served before. The report is written as JSON and text (and,
on success, the `standby:` block to add to the recipe) into a folder of the state dir, or `--out`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lanectl.dockerapi.containers import ContainerEngine
from lanectl.errors import BadInput, OperationFailed
from lanectl.host.gpu_memory import memory_mib, used_mib
from lanectl.host.host_memory import available_gib
from lanectl.lanes.execute import Reporter
from lanectl.lanes.inventory import Inventory
from lanectl.lanes.standby import SleepEndpoints, StandbyError, role_base_url, role_engine
from lanectl.lanes.standby_check import (
    Beside,
    CheckReport,
    CheckSettings,
    Failure,
    Meters,
    beside_failure,
    beside_start,
    engine_failure,
    memory_figures,
    run_cycles,
)
from lanectl.lanes.switcher import LaneSwitcher
from lanectl.output import Result, aligned, warning
from lanectl.recipe.catalog import Catalog, Lane
from lanectl.recipe.model import DEV_MODE_ENV, SLEEP_MODE_FLAG, WakeCheck
from lanectl.recipe.shutdown import drain_seconds
from lanectl.state.lanes import LaneStateStore
from lanectl.state.paths import StateFiles, state_dir


def check(catalog: Catalog, lane: str, *, cycles: int, beside: str | None, yes: bool, streams: int,
          out_dir: Path | None, reporter: Reporter, lock_wait: float, no_gpu: bool = False) -> Result:
    from lanectl.commands.switch import switcher
    from lanectl.lanes.switcher import built_tag

    target = catalog.lane(lane)
    neighbour = catalog.lane(beside) if beside else None
    _require_checkable(target, neighbour, cycles, streams)
    engine = ContainerEngine()
    for needed in (target, neighbour):
        if needed is not None:
            try:
                built_tag(engine, needed)
            except OperationFailed as exc:
                raise BadInput(str(exc)) from None
    with switcher(catalog, f"lanectl standby check {lane}", lock_wait=lock_wait, reporter=reporter,
                  no_gpu=no_gpu) as lanes:
        snapshot = lanes.snapshot(target.name, *([neighbour.name] if neighbour else []))
        serving = [found.name for found in Inventory(catalog, snapshot, with_gpus=not no_gpu).live_lanes()]
        if serving and not yes:
            raise BadInput(f"a standby check stops what runs on this box: {', '.join(serving)}; it then starts "
                           f"{target.name} cold, puts it to sleep and wakes it {cycles} times"
                           + (f", starts {neighbour.name} beside it" if neighbour else "")
                           + ", and brings back the lane that served. Run it again with --yes in a window "
                             "where they may stop")
        previous = LaneStateStore(StateFiles(state_dir()).lanes).load().active
        try:
            report = _run(lanes, target, neighbour, cycles=cycles, streams=streams, serving=serving,
                          reporter=reporter, no_gpu=no_gpu)
        except (Exception, KeyboardInterrupt):
            # A lane left asleep by a check that broke off is known to nobody (no standby record), and `docker
            # start` of its running container would not wake it: stop what the check started, then re-raise.
            _stop_started(lanes, target, neighbour)
            raise
        restored = _restore(lanes, target, previous, reporter)
    folder = out_dir or StateFiles(state_dir()).standby_checks / (
        f"{target.name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}")
    data = report_data(report, target, neighbour, cycles=cycles, stopped=serving, restored=restored)
    data["files"] = write_report(folder, data)
    messages = (warning(restored),) if restored.startswith("could not") else ()
    return Result("standby.check", data, messages=messages, exit_code=0 if report.passed else 1)


def _require_checkable(target: Lane, neighbour: Lane | None, cycles: int, streams: int) -> None:
    if not 1 <= cycles <= 1000:
        raise BadInput(f"--cycles {cycles}: between 1 and 1000")
    if not 0 <= streams <= 256:
        raise BadInput(f"--streams {streams}: between 0 and 256")
    if target.spec.placement.backend != "local":
        raise BadInput(f"{target.name} runs on Swarm: a standby is a lane of this box (a Swarm update leaves no "
                       "process to wake)")
    for role, engine in target.spec.engines():
        missing = []
        if SLEEP_MODE_FLAG not in engine.args:
            missing.append(f"{SLEEP_MODE_FLAG} in its args")
        if engine.env.get(DEV_MODE_ENV) != "1":
            missing.append(f'{DEV_MODE_ENV}: "1" in its env')
        if missing:
            raise BadInput(f"{target.name}'s {role} engine runs without sleep mode: add {' and '.join(missing)} to "
                           "the recipe (the image runs exactly what the recipe says), `lanectl build "
                           f"{target.name}`, and check again")
        if not engine.ports:
            raise BadInput(f"{target.name}'s {role} publishes no port: the check reaches its sleep routes there")
    if neighbour is None:
        return
    if neighbour.name == target.name:
        raise BadInput("--beside names the lane under check: name the lane that would start beside it asleep")
    if neighbour.spec.placement.backend != "local":
        raise BadInput(f"--beside {neighbour.name} runs on Swarm, not on this box")
    ours = {(p.protocol, p.published) for _, engine in target.spec.engines() for p in engine.ports}
    for role, engine in neighbour.spec.engines():
        for port in engine.ports:
            if (port.protocol, port.published) in ours:
                raise BadInput(f"{neighbour.name}'s {role} publishes host port {port.published} as {target.name} "
                               "does; asleep, a lane keeps its port, so it could never start beside it")


class DockerLane:
    """The lane under check as containers: what `CheckedLane` asks of it."""

    def __init__(self, engine: ContainerEngine, lane: Lane) -> None:
        self.engine = engine
        self.lane = lane

    def urls(self) -> list[tuple[str, str]]:
        roles = [role for role in self.lane.roles if role_engine(self.lane, role).ports]
        return [(role, role_base_url(self.lane, role)) for role in roles]

    def ended(self) -> str | None:
        from lanectl.health.engine_exit import exit_detail

        for role in self.lane.roles:
            name = self.lane.container_name(role)
            state = self.engine.container(name)
            if state is None:
                return f"container {name} is gone"
            if not state.running:
                return f"container {name} {exit_detail(state.status, state.exit_code)}"
        return None

    def log_since(self, since: float) -> str:
        return self.engine.logs(self.lane.container_name(), since=since)


def _meters(lane: Lane, no_gpu: bool) -> Meters:
    if no_gpu:
        return Meters(host_available_gib=available_gib)
    gpus = lane.spec.gpu_ids()
    ids = sorted(gpus) if gpus else None

    def used() -> int | None:
        found = used_mib(ids)
        return sum(found.values()) if found else None

    def total() -> int | None:
        found = memory_mib()
        if not found:
            return None
        keys = ids or sorted(k for k in found if k.isdigit())
        return sum(found[k][0] for k in keys if k in found) or None

    return Meters(gpu_used_mib=used, gpu_total_mib=total, host_available_gib=available_gib)


def _run(lanes: LaneSwitcher, target: Lane, neighbour: Lane | None, *, cycles: int, streams: int,
         serving: list[str], reporter: Reporter, no_gpu: bool) -> CheckReport:
    meters = _meters(target, no_gpu)
    for name in serving:
        outcome = lanes.down(name, with_standbys=False)
        if outcome.exit_code:
            return _failed(target, Failure(kind="crash", cycle=None, detail=f"could not stop {name}: "
                                                                             f"{outcome.message}"))
    before = {"gpu_used_mib_before_start": meters.gpu_used_mib(), "gpu_total_mib": meters.gpu_total_mib(),
              "host_available_gib_before_start": meters.host_available_gib()}
    started = time.time()
    began = time.monotonic()
    outcome = lanes.up(target, rollback_on_failure=False, why="standby check: the cold start")
    cold = round(time.monotonic() - began, 2)
    if outcome.exit_code:
        return _failed(target, Failure(kind="crash", cycle=None, detail=f"the cold start failed: {outcome.message}"),
                       cold)
    reporter.step(f"{target.name} started cold in {cold:.1f} s (gate included): the time a wake must beat")
    before["host_available_gib_awake"] = meters.host_available_gib()
    checked = DockerLane(lanes.engine, target)
    fingerprint, done, failure = run_cycles(checked, _settings(target, cycles, streams), meters,
                                            cold_start_seconds=cold)
    for cycle in done:
        reporter.step(f"cycle {cycle.index}: asleep in {cycle.sleep_seconds:.2f} s, awake in "
                      f"{_seconds(cycle.wake_seconds)}, {cycle.streams_ok} stream(s) finished, output "
                      f"{'the same' if cycle.same else 'DIFFERENT' if cycle.same is False else 'not read'}",
                      ok=cycle.same is not False and not (failure and failure.cycle == cycle.index))
    next_to = None
    if failure is None and neighbour is not None:
        next_to = _beside(lanes, checked, neighbour, fingerprint, _settings(target, cycles, streams), no_gpu)
        reporter.step(f"{neighbour.name} beside it asleep: " + (f"started in {next_to.seconds:.1f} s"
                                                                 if next_to.started else next_to.detail),
                      ok=next_to.started)
        failure = beside_failure(next_to) or engine_failure_after(checked, next_to)
    startup = lanes.engine.logs(target.container_name(), since=started - 1)
    figures = memory_figures(done, before, startup, _utilization(neighbour))
    return CheckReport(lane=target.name, cold_start_seconds=cold, fingerprint=fingerprint, cycles=tuple(done),
                       memory=figures, beside=next_to, failure=failure)


def engine_failure_after(checked: DockerLane, beside: Beside) -> Failure | None:
    """After the beside start, the woken lane must still run and say the same."""
    if beside.text_after is None and beside.started:
        return engine_failure(checked, None, f"woken after {beside.lane} ran beside it, it gave no output")
    return None


def _failed(target: Lane, failure: Failure, cold: float = 0.0) -> CheckReport:
    return CheckReport(lane=target.name, cold_start_seconds=cold, fingerprint="", cycles=(), failure=failure)


def _settings(target: Lane, cycles: int, streams: int) -> CheckSettings:
    standby = target.spec.standby
    wake_check = standby.wake_check if standby else WakeCheck()
    drain = drain_seconds(target.spec, "primary")
    return CheckSettings(cycles=cycles, model=target.spec.health.served_model_name, prompt=wake_check.prompt,
                         max_tokens=wake_check.max_tokens, streams=streams,
                         drain_seconds=30.0 if drain is None else float(drain),
                         timeout=standby.wake_timeout_seconds if standby else 120.0)


def _utilization(lane: Lane | None) -> float | None:
    return None if lane is None else lane.spec.engine.gpu_memory_utilization()


def _beside(lanes: LaneSwitcher, checked: DockerLane, neighbour: Lane, fingerprint: str, settings: CheckSettings,
            no_gpu: bool) -> Beside:
    """The checked lane asleep, `neighbour` started beside it as its recipe says and held to its gate, stopped
    again; then the checked lane woken and its output compared once more."""
    endpoints = [SleepEndpoints(url, settings.timeout) for _, url in checked.urls()]
    try:
        for engine in endpoints:
            engine.sleep(1, settings.drain_seconds)
    except StandbyError as exc:
        return Beside(lane=neighbour.name, utilization=_utilization(neighbour), started=False, seconds=0.0,
                      detail=f"not started: the lane under check did not fall asleep: {exc}")
    snapshot = lanes.snapshot(neighbour.name)
    inventory = Inventory(lanes.catalog, snapshot, with_gpus=not no_gpu)
    started = time.time()
    began = time.monotonic()
    for role in neighbour.roles:
        name = neighbour.container_name(role)
        desired = inventory.desired(neighbour, role)
        if desired is None:
            raise BadInput(f"{neighbour.name} is not built: run `lanectl build {neighbour.name}` first")
        if lanes.engine.container(name) is not None:
            lanes.engine.remove(name)
        lanes.engine.create(desired.spec.owned_by(lanes.files.root), with_gpus=not no_gpu, environ=os.environ)
        lanes.engine.start(name)
    budget = neighbour.spec.health.startup_budget_minutes * 60
    result = lanes.calls.gate(neighbour, budget, started)
    seconds = round(time.monotonic() - began, 2)
    log = lanes.engine.logs(neighbour.container_name(), since=started - 1)
    used = checked_gpu_used(lanes, neighbour, no_gpu)
    for role in reversed(neighbour.roles):
        lanes.engine.stop(neighbour.container_name(role), role_engine(neighbour, role).stop_timeout_seconds)
    text = None
    try:
        for engine in endpoints:
            engine.wake_up()
        text = endpoints[0].greedy_text(settings.model, settings.prompt, settings.max_tokens)
    except StandbyError:
        pass
    return beside_start(neighbour.name, _utilization(neighbour), started=result.passed, seconds=seconds,
                        gate_detail=result.detail, log_lines=log.splitlines(), gpu_used_mib=used, text_after=text,
                        fingerprint=fingerprint)


def checked_gpu_used(lanes: LaneSwitcher, lane: Lane, no_gpu: bool) -> int | None:
    return None if no_gpu else _meters(lane, no_gpu).gpu_used_mib()


def _stop_started(lanes: LaneSwitcher, target: Lane, neighbour: Lane | None) -> None:
    for lane in (neighbour, target):
        if lane is None:
            continue
        for role in reversed(lane.roles):
            state = lanes.engine.container(lane.container_name(role))
            if state is not None and state.running:
                lanes.engine.stop(state.name, role_engine(lane, role).stop_timeout_seconds)


def _restore(lanes: LaneSwitcher, target: Lane, previous: str | None, reporter: Reporter) -> str:
    """Stop the lane under check; bring back the lane that served before, through `up`."""
    lanes.down(target.name, with_standbys=False)
    if previous is None or previous == target.name or previous not in lanes.catalog.lanes:
        return "nothing served before the check: the box serves nothing now"
    outcome = lanes.up(lanes.catalog.lane(previous), why="standby check: back to the lane that served")
    if outcome.exit_code:
        return f"could not bring back {previous}: {outcome.message}"
    return f"{previous} serves again"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def report_data(report: CheckReport, target: Lane, neighbour: Lane | None, *, cycles: int, stopped: list[str],
                restored: str) -> dict[str, Any]:
    data = report.as_dict()
    data |= {"cycles_asked": cycles, "beside_lane": neighbour.name if neighbour else None, "stopped": stopped,
             "after": restored, "checked_at": datetime.now(UTC).isoformat(timespec="seconds")}
    block = report.standby_block()
    data["standby_yaml"] = standby_yaml(block, report, target, neighbour) if block else None
    return data


def standby_yaml(block: dict[str, Any], report: CheckReport, target: Lane, neighbour: Lane | None) -> str:
    """The `standby:` block to paste under the lane, with what each number was measured from."""
    memory = report.memory
    wakes = [c.wake_seconds for c in report.cycles if c.wake_seconds is not None]
    lines = ["standby:", "  mode: sleep", "  level: 1",
             f"  weights_gib: {block['weights_gib']:g}",
             f"  resident_gib: {block['resident_gib']:g}",
             f"  gpu_memory_gib: {block['gpu_memory_gib']:g}",
             f"  wake_timeout_seconds: {block['wake_timeout_seconds']}",
             f"  # measured by `lanectl standby check {target.name}` on {datetime.now(UTC).date()}: "
             f"{len(report.cycles)} sleeps and wakes with the same output, wakes {min(wakes):.2f}-{max(wakes):.2f} s "
             f"against a cold start of {report.cold_start_seconds:.0f} s"]
    most = memory.get("max_utilization_beside")
    if most is not None:
        lines.append(f"  # a lane sharing its GPUs starts beside it asleep at --gpu-memory-utilization {most:g} "
                     "or less")
    if neighbour is not None and report.beside is not None:
        lines.append(f"  # {neighbour.name} (--gpu-memory-utilization {report.beside.utilization:g}) started "
                     f"beside it in {report.beside.seconds:.0f} s")
    return "\n".join(lines) + "\n"


def write_report(folder: Path, data: dict[str, Any]) -> list[str]:
    from lanectl.state.atomic import write_atomically

    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "report.json", folder / "report.txt"]
    texts = [json.dumps(data, indent=2, sort_keys=True) + "\n", "\n".join(report_lines(data)) + "\n"]
    if data.get("standby_yaml"):
        written.append(folder / "standby.yaml")
        texts.append(data["standby_yaml"])
    for path, text in zip(written, texts, strict=True):
        write_atomically(path, text.encode(), mode=0o644)
    return [str(path) for path in written]


def report_lines(data: Mapping[str, Any]) -> list[str]:
    """The check's report as people read it (also written as report.txt)."""
    failure = data["failure"]
    verdict = "PASSED" if data["passed"] else (
        f"FAILED: {failure['kind']}" + (f" at cycle {failure['cycle']}" if failure["cycle"] else "") + "\n  "
        + failure["detail"])
    lines = [f"standby check of {data['lane']}: {verdict}"]
    if data["stopped"]:
        lines.append(f"stopped first: {', '.join(data['stopped'])}")
    lines.append(f"cold start (gate included): {data['cold_start_seconds']:g} s")
    rows = [("CYCLE", "SLEEP S", "WAKE S", "STREAMS OK", "RESIDENT GIB", "GPU MIB ASLEEP", "SAME OUTPUT")]
    for cycle in data["cycles"]:
        rows.append((str(cycle["index"]), _or_dash(cycle["sleep_seconds"]), _or_dash(cycle["wake_seconds"]),
                     f"{cycle['streams_ok']}/{cycle['streams_ok'] + cycle['streams_failed']}",
                     _or_dash(cycle["resident_gib"]), _or_dash(cycle["gpu_used_mib_asleep"]),
                     {True: "yes", False: "NO", None: "-"}[cycle["same"]]))
    if data["cycles"]:
        lines += aligned(rows)
    memory = data["memory"] or {}
    for key in ("weights_gib", "resident_gib", "gpu_memory_gib", "max_utilization_beside"):
        if memory.get(key) is not None:
            lines.append(f"{key}: {memory[key]:g}")
    beside = data["beside"]
    if beside is not None:
        how = f"started in {beside['seconds']:g} s" if beside["started"] else f"did not start: {beside['detail']}"
        lines.append(f"beside it asleep, {beside['lane']} (--gpu-memory-utilization {beside['utilization']}): {how}")
    if data.get("standby_yaml"):
        lines += ["add to the lane in its recipe:", *data["standby_yaml"].rstrip("\n").splitlines()]
    lines.append(f"after the check: {data['after']}")
    lines += [f"wrote {path}" for path in data.get("files") or []]
    return lines


def _or_dash(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "standby check": {
        "example": """\
# in a maintenance window: stops what serves, checks demo-h1's sleep and wake 10 times, then brings it back
$ lanectl standby check demo-h1 --cycles 10 --beside demo-h2 --yes --no-gpu
""",
        "exit": {
            0: "every cycle slept and woke with the first greedy output, and the lane beside fitted; the report "
               "holds the `standby:` block to add to the recipe",
            1: "the check failed (crash, engine error, fingerprint drift, slow wake, out of memory beside); the "
               "report says which cycle and why",
            2: "refused before anything changed: a lane serves and no --yes, no sleep mode, not built, on Swarm",
        },
    },
}
