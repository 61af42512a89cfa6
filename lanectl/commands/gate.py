"""`bench` (measure the serving lane), `gate` (the A/B/A bracket) and `report` (a gate run again)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lanectl.bench.gate import bench_lane, run_gate, write_results
from lanectl.bench.probes import load_probes, max_model_len
from lanectl.bench.stats import Verdict
from lanectl.bench.workload import load_workload, workload_file
from lanectl.errors import EXIT_FAILED, EXIT_OK
from lanectl.lanes.switcher import Reporter
from lanectl.output import Message, Result, info
from lanectl.recipe.catalog import Catalog, Lane


def _kernel_log() -> Any | None:
    from lanectl.errors import LanectlError
    from lanectl.host.kernel_log import open_kernel_log

    try:
        source = open_kernel_log(os.environ.get("LANECTL_KERNEL_LOG") or "kmsg")
        source.read_new(None)
        return source
    except LanectlError:
        return None


def bench(catalog: Catalog, lane: str | None, workload_name: str, concurrency: list[int], out: Path | None,
          progress: Callable[[str], None]) -> Result:
    """Measure the serving lane (or `lane`, which must be the active one) without switching anything."""
    from lanectl.dockerapi.containers import ContainerEngine
    from lanectl.errors import BadInput
    from lanectl.state.lanes import LaneStateStore
    from lanectl.state.paths import StateFiles, state_dir

    named = catalog.lane(lane) if lane else None
    active = LaneStateStore(StateFiles(state_dir()).lanes).load().active
    target = named or (catalog.lanes.get(active) if active else None)
    if target is None:
        raise BadInput("no active lane to bench; name one that is serving, or `lanectl up` one first")
    if target.name != active:
        raise BadInput(f"{target.name} is not the serving lane ({active or 'none'}); bench measures what serves. "
                       f"`lanectl up {target.name}` first, or use `lanectl gate`")
    limit = _max_model_len([target])
    workload = load_workload(workload_file(catalog.project.recipes_dir, workload_name),
                             max_model_len=limit[0] if limit else None, lane=target.name)
    result = bench_lane(ContainerEngine(), target, workload, concurrency, arm="bench", kernel_log=_kernel_log(),
                        progress=progress)
    data = {"bench": result.summary(), "workload": workload.name, "concurrency": concurrency}
    messages: tuple[Message, ...] = ()
    if out is not None:
        data["run_dir"] = str(write_results(out, f"bench-{target.name}", data))
        messages = (info(f"results in {data['run_dir']}"),)
    return Result("bench", data, messages)


def _max_model_len(lanes: list[Lane]) -> tuple[int, str] | None:
    """The smallest --max-model-len the lanes' recipes set (and which lane sets it); None when none sets one."""
    found = [(limit, lane.name) for lane in lanes if (limit := max_model_len(lane.spec.engine.args)) is not None]
    return min(found) if found else None


def gate(catalog: Catalog, candidate: str | list[str], control: str | None, workload_name: str,
         concurrency: list[int], bar: float, promote: bool, out: Path | None, lock_wait: float, no_gpu: bool,
         reporter: Reporter, progress: Callable[[str], None], order: str = "ABA", calibrate: bool = False,
         max_false_promotion: float = 0.05) -> Result:
    """The bracket in `order` (control, each candidate, control by default); exit 0 when a candidate
    PASSed, 1 when none did. With `calibrate`, the one CANDIDATE runs against itself in the same order
    and the exit is 0 when its false-promotion rate is at most `max_false_promotion`. With `out`, the
    results and their plot are written to a new folder under it. The workload is checked (against the
    lanes' --max-model-len too) before anything switches."""
    from lanectl.bench.gate import ORDERS
    from lanectl.bench.plot import plot
    from lanectl.commands.switch import switcher
    from lanectl.errors import BadInput
    from lanectl.lanes.switcher import built_tag

    names = [candidate] if isinstance(candidate, str) else list(candidate)
    if order not in ORDERS:
        raise BadInput(f"--order {order!r}: expected one of {', '.join(ORDERS)}")
    if not 0 <= max_false_promotion <= 1:
        raise BadInput(f"--max-false-promotion {max_false_promotion}: expected a rate in [0, 1]")
    if not names:
        raise BadInput("name at least one candidate lane")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise BadInput(f"candidate {twice[0]} is named twice; name each candidate once")
    if calibrate:
        if len(names) > 1:
            raise BadInput("--calibrate runs one lane against itself: give one CANDIDATE")
        if control not in (None, names[0]):
            raise BadInput("--calibrate runs one lane against itself: give it as CANDIDATE, without --control "
                           "(or with --control naming the same lane)")
        control = names[0]
    elif control is None:
        raise BadInput("--control is required (or --calibrate, to run CANDIDATE against itself)")
    elif control in names:
        raise BadInput(f"{control} is both the control and a candidate; to run one lane against itself, use "
                       "--calibrate")
    candidate_lanes, control_lane = [catalog.lane(name) for name in names], catalog.lane(control)
    limit = _max_model_len([control_lane, *candidate_lanes])
    workload_path = workload_file(catalog.project.recipes_dir, workload_name)
    workload = load_workload(workload_path, max_model_len=limit[0] if limit else None, lane=limit[1] if limit else "")
    # Every probe file read, and every needle held against each lane's context length, before any switch.
    probes = load_probes(workload_path, workload.probes or [],
                         [(lane.name, max_model_len(lane.spec.engine.args)) for lane in (control_lane,
                                                                                         *candidate_lanes)])
    command = f"lanectl gate {' '.join(names)} " + ("--calibrate" if calibrate else f"--control {control}")
    with switcher(catalog, command, lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu) as lanes:
        # Every image before the first switch: a refusal mid-bracket would leave a candidate serving.
        for lane in (control_lane, *candidate_lanes):
            built_tag(lanes.engine, lane)
        report = run_gate(lanes, candidate_lanes, control_lane, workload, concurrency, bar=bar,
                          promote=promote and not calibrate, kernel_log=_kernel_log(), order=order,
                          max_false_promotion=max_false_promotion if calibrate else None, progress=progress,
                          probes=probes)
    run_dir = None
    messages: tuple[Message, ...] = ()
    data = report.as_dict()
    if out is not None:
        name = f"calibrate-{names[0]}" if calibrate else f"gate-{'+'.join(names)}"
        run_dir = write_results(out, name, {"gate": data, "workload": workload.name, "concurrency": concurrency})
        not_drawn = plot(data, run_dir / "ratios.png")
        messages = (info(not_drawn),) if not_drawn else ()
        messages += (info(f"results{'' if not_drawn else ' and plot'} in {run_dir}"),)
    passed = report.verdict == Verdict.PASS
    return Result("gate", {**data, "run_dir": str(run_dir) if run_dir else None}, messages,
                  exit_code=EXIT_OK if passed else EXIT_FAILED)


def report(run_dir: Path) -> Result:
    """The figures of a gate run written by `gate --out`, and its plot drawn again (ratios.png)."""
    from lanectl.bench.plot import plot
    from lanectl.bench.results_file import load_gate_results

    gate = load_gate_results(run_dir)
    not_drawn = plot(gate, run_dir / "ratios.png")
    return Result("report", gate, (info(not_drawn or f"plot: {run_dir / 'ratios.png'}"),))
