"""`bench` (measure the serving lane), `gate` (the A/B/A bracket) and `report` (a gate run again)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lanectl.bench.gate import bench_lane, run_calibration, run_gate, write_results
from lanectl.bench.probes import load_probes, max_model_len
from lanectl.bench.stats import MAX_CALIBRATION_ARMS, Verdict
from lanectl.bench.workload import Workload, load_workload, workload_file
from lanectl.errors import EXIT_FAILED, EXIT_OK
from lanectl.lanes.switcher import Reporter
from lanectl.output import Message, Result, info, warning
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
    from lanectl.state.out_paths import check_output_folder
    from lanectl.state.paths import StateFiles, state_dir

    if out is not None:
        check_output_folder(out, "--out")
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
        try:
            data["run_dir"] = str(write_results(out, f"bench-{target.name}", data))
            messages = (info(f"results in {data['run_dir']}"),)
        except OSError as exc:
            messages = (_not_written(out, exc),)
    return Result("bench", data, messages)


def _not_written(out: Path, exc: OSError) -> Message:
    # --out was checked before the run; what failed since (a full disk, a folder removed) must not lose the run.
    return warning(f"--out {out}: could not write the results ({exc.strerror or exc}); they are only in this "
                   "output (--json prints them whole)")


def _max_model_len(lanes: list[Lane]) -> tuple[int, str] | None:
    """The smallest --max-model-len the lanes' recipes set (and which lane sets it); None when none sets one."""
    found = [(limit, lane.name) for lane in lanes if (limit := max_model_len(lane.spec.engine.args)) is not None]
    return min(found) if found else None


# Enough to outlast any drift a bracket could average away; more is a mistake in the command line.
MAX_EXTRA_ROUNDS = 50
DEFAULT_CALIBRATION_ARMS = 8


def check_gate_options(bar: float, max_false_promotion: float, until_decided: int, arms: int | None,
                       calibrate: bool, order: str) -> None:
    """Every number of the command line, before anything is read or switched: a bar of nan, inf or 0 would
    run the whole bracket and then judge nothing (or pass everything)."""
    from lanectl.bench.gate import ORDERS
    from lanectl.errors import BadInput

    if not math.isfinite(bar) or bar <= 0:
        raise BadInput(f"--bar {bar}: expected a finite ratio > 0, e.g. 1.025 (the candidate 2.5% faster)")
    if not math.isfinite(max_false_promotion) or not 0 <= max_false_promotion <= 1:
        raise BadInput(f"--max-false-promotion {max_false_promotion}: expected a rate in [0, 1], e.g. 0.05")
    if order not in ORDERS:
        raise BadInput(f"--order {order!r}: expected one of {', '.join(ORDERS)}")
    if not 0 <= until_decided <= MAX_EXTRA_ROUNDS:
        raise BadInput(f"--until-decided {until_decided}: expected 0 to {MAX_EXTRA_ROUNDS} more rounds of arms")
    if arms is not None and not calibrate:
        raise BadInput("--arms sets how many arms --calibrate runs; a gate's arms follow --order and --until-decided")
    if arms is not None and not 3 <= arms <= MAX_CALIBRATION_ARMS:
        raise BadInput(f"--arms {arms}: expected 3 to {MAX_CALIBRATION_ARMS} arms")
    if calibrate and (until_decided or order != "ABA"):
        raise BadInput("--calibrate runs --arms arms of one lane back to back; --order and --until-decided are "
                       "for a gate")


def gate(catalog: Catalog, candidate: str | list[str], control: str | None, workload_name: str,
         concurrency: list[int], bar: float, promote: bool, out: Path | None, lock_wait: float, no_gpu: bool,
         reporter: Reporter, progress: Callable[[str], None], order: str = "ABA", calibrate: bool = False,
         max_false_promotion: float = 0.05, until_decided: int = 0, arms: int | None = None) -> Result:
    """The bracket in `order` (control, each candidate, control by default); exit 0 when a candidate
    PASSed, 1 when none did. With `until_decided`, up to that many more rounds of arms while a candidate
    is undecided. With `calibrate`, `arms` arms of the one CANDIDATE back to back; the exit is 0 when its
    false-promotion rate is at most `max_false_promotion`, and its arm noise is kept for later gates of the
    workload on this host. With `out`, the results and their plot are written to a new folder under it.
    Every option, the workload, its probes and the host's calibration are checked before anything switches."""
    from lanectl.bench.calibration_file import CalibrationStore, priors_for
    from lanectl.commands.switch import switcher
    from lanectl.errors import BadInput
    from lanectl.host.gpu_inventory import gpu_names
    from lanectl.lanes.switcher import built_tag
    from lanectl.state.out_paths import check_output_folder
    from lanectl.state.paths import StateFiles, state_dir

    check_gate_options(bar, max_false_promotion, until_decided, arms, calibrate, order)
    if out is not None:
        check_output_folder(out, "--out")
    names = [candidate] if isinstance(candidate, str) else list(candidate)
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
    store = CalibrationStore(StateFiles(state_dir()).calibration)
    # Read once: the calibration records these GPUs, and a gate uses a calibration only on the ones it recorded.
    gpus = gpu_names()
    priors, noise_prior, prior_line = priors_for(store.load(), workload, control, gpus=gpus)
    command = f"lanectl gate {' '.join(names)} " + ("--calibrate" if calibrate else f"--control {control}")
    with switcher(catalog, command, lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu) as lanes:
        # Every image before the first switch: a refusal mid-bracket would leave a candidate serving.
        for lane in (control_lane, *candidate_lanes):
            built_tag(lanes.engine, lane)
        if calibrate:
            single = run_calibration(lanes, control_lane, workload, concurrency,
                                     arms=arms or DEFAULT_CALIBRATION_ARMS, bar=bar,
                                     max_false_promotion=max_false_promotion, kernel_log=_kernel_log(),
                                     gpus=gpus, progress=progress)
            data, verdict = single.as_dict(), single.verdict
            messages: tuple[Message, ...] = (info(_keep_noise(store, control_lane.name, workload, data)),)
        else:
            bracket = run_gate(lanes, candidate_lanes, control_lane, workload, concurrency, bar=bar,
                               promote=promote, kernel_log=_kernel_log(), order=order, until_decided=until_decided,
                               priors=priors, noise_prior=noise_prior, progress=progress, probes=probes)
            data, verdict = bracket.as_dict(), bracket.verdict
            # The control's config is known only once it ran: a calibration of another config was refused then.
            refused = next((c.noise_prior["refused"] for c in bracket.candidates
                            if c.noise_prior and c.noise_prior.get("refused")), None)
            messages = (info(f"calibration not used: {refused}" if refused else prior_line),)
    run_dir = None
    if out is not None:
        name = f"calibrate-{names[0]}" if calibrate else f"gate-{'+'.join(names)}"
        try:
            run_dir, drawn = _write_run(out, name, data, workload.name, concurrency)
            messages += drawn
        except OSError as exc:
            messages += (_not_written(out, exc),)
    return Result("gate", {**data, "run_dir": str(run_dir) if run_dir else None}, messages,
                  exit_code=EXIT_OK if verdict == Verdict.PASS else EXIT_FAILED)


def _write_run(out: Path, name: str, data: dict[str, Any], workload: str,
               concurrency: list[int]) -> tuple[Path, tuple[Message, ...]]:
    from lanectl.bench.plot import plot
    from lanectl.bench.results_file import RESULTS_VERSION

    run_dir = write_results(out, name, {"version": RESULTS_VERSION, "gate": data, "workload": workload,
                                        "concurrency": concurrency})
    not_drawn = plot(data, run_dir / "ratios.png")
    messages = (info(not_drawn),) if not_drawn else ()
    drawn = (run_dir / "ratios.png").is_file()  # a calibration has no ratios to draw
    return run_dir, messages + (info(f"results{' and plot' if drawn else ''} in {run_dir}"),)


def _keep_noise(store: Any, lane: str, workload: Workload, data: dict[str, Any]) -> str:
    """A calibration's arm noise, kept for later gates when every cell was measured cleanly."""
    from lanectl.bench.calibration_file import measured_noise
    from lanectl.bench.verdict import fault_reasons

    calibration = data.get("calibration") or {}
    faults = fault_reasons(data["arms"])
    cells = calibration.get("cells") or {}
    if faults or not cells or len(cells) != len(data["arms"][0]["cells"]):
        why = faults[0] if faults else "not every cell was measured"
        return f"arm noise not kept for later gates: {why}"
    store.save(workload.name, measured_noise(lane, workload, calibration))
    return (f"arm noise of workload {workload.name} kept in {store.path}: later gates of it on this host pool "
            "their own arms with it")


def report(run_dir: Path) -> Result:
    """A gate run written by `gate --out`, judged again from the per-request rates it keeps (format 2): its
    figures and verdicts as the evidence says, where the recorded ones differ, and its plot drawn again."""
    from lanectl.bench.calibration_file import kept_calibration
    from lanectl.bench.plot import plot
    from lanectl.bench.results_file import load_results
    from lanectl.bench.verdict import recheck

    results = load_results(run_dir)
    rechecked = recheck(results, kept_calibration(results.get("workload")))
    not_drawn = plot(rechecked.gate, run_dir / "ratios.png")
    messages: tuple[Message, ...] = (info(not_drawn or f"plot: {run_dir / 'ratios.png'}"),)
    if rechecked.not_reproduced:
        messages += (warning(f"{run_dir / 'results.json'}: the verdict is not reproduced: the evidence does not hold "
                             f"together in {len(rechecked.not_reproduced)} place(s), so no candidate passes on it "
                             f"({rechecked.not_reproduced[0]})"),)
    if rechecked.differences:
        messages += (warning(f"{run_dir / 'results.json'}: the recorded figures differ from its per-request rates "
                             f"in {len(rechecked.differences)} place(s); shown as the rates say"),)
    data = {**rechecked.gate, "results_version": results.get("version", 1), "recomputed": rechecked.recomputed,
            "differences": rechecked.differences, "not_reproduced": rechecked.not_reproduced,
            "priors_checked": rechecked.priors_checked}
    return Result("report", data, messages)


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "bench": {
        "example": """\
$ lanectl bench --workload smoke --concurrency 1,8 --out /tmp/bench-h2
""",
        "exit": {
            0: "measured",
            1: "the lane did not serve or a request failed",
            2: "an unknown lane or workload, or a bad option value",
        },
    },
    "gate": {
        "example": """\
$ lanectl gate h2-REF --control h1-REF --bar 1.025 --out runs/h2-vs-h1
$ lanectl gate stub-b --control stub-a --workload smoke --no-gpu     # the starter project, on the CPU stub
$ lanectl gate h2-REF --calibrate --arms 8 --workload coding         # A/A: how noisy this host is
""",
        "exit": {
            0: "PASS (with --calibrate: the false-promotion rate is within --max-false-promotion)",
            1: "FAIL or INCONCLUSIVE, or a lane did not serve; with --promote nothing was promoted",
            2: "an unknown lane or workload, a bad option value or an invalid recipe; nothing was switched",
        },
    },
    "report": {
        "example": """\
$ lanectl report runs/h2-vs-h1                          # the tables again, and ratios.png redrawn
$ lanectl report runs/h2-vs-h1 --release-note --out RELEASE-NOTE.md
""",
        "exit": {
            0: "written",
            2: "not a folder `gate --out` wrote, or its results.json is damaged",
        },
    },
}
