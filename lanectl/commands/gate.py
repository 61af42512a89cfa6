from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lanectl.bench.gate import GateReport, bench_lane, run_gate, write_results
from lanectl.bench.stats import Verdict
from lanectl.bench.workload import load_workload, workload_file
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


def bench(catalog: Catalog, lane: Lane | None, workload_name: str, concurrency: list[int], out: Path | None,
          progress: Callable[[str], None]) -> dict[str, Any]:
    """Measure the serving lane (or `lane`, which must be the active one) without switching anything."""
    from lanectl.dockerapi.containers import ContainerEngine
    from lanectl.errors import BadInput
    from lanectl.state.lanes import LaneStateStore
    from lanectl.state.paths import state_dir

    active = LaneStateStore(state_dir() / "state.json").load().active
    target = lane or (catalog.lanes.get(active) if active else None)
    if target is None:
        raise BadInput("no active lane to bench; name one that is serving, or `lanectl up` one first")
    if target.name != active:
        raise BadInput(f"{target.name} is not the serving lane ({active or 'none'}); bench measures what serves. "
                       f"`lanectl up {target.name}` first, or use `lanectl gate`")
    workload = load_workload(workload_file(catalog.project.recipes_dir, workload_name))
    result = bench_lane(ContainerEngine(), target, workload, concurrency, arm="bench", kernel_log=_kernel_log(),
                        progress=progress)
    data = {"bench": result.summary(), "workload": workload.name, "concurrency": concurrency}
    if out is not None:
        data["run_dir"] = str(write_results(out, f"bench-{target.name}", data))
    return data


def gate(catalog: Catalog, candidate: Lane, control: Lane, workload_name: str, concurrency: list[int], bar: float,
         promote: bool, out: Path | None, lock_wait: float, no_gpu: bool, reporter: Any,
         progress: Callable[[str], None]) -> tuple[GateReport, Path | None]:
    from lanectl.commands.switch import switcher

    workload = load_workload(workload_file(catalog.project.recipes_dir, workload_name))
    command = f"lanectl gate {candidate.name} --control {control.name}"
    with switcher(catalog, command, lock_wait=lock_wait, reporter=reporter, no_gpu=no_gpu) as lanes:
        report = run_gate(lanes, candidate, control, workload, concurrency, bar=bar, promote=promote,
                          kernel_log=_kernel_log(), progress=progress)
    run_dir = None
    if out is not None:
        run_dir = write_results(out, f"gate-{candidate.name}", {"gate": report.as_dict(), "workload": workload.name,
                                                                 "concurrency": concurrency})
        not_drawn = plot(report.as_dict(), run_dir / "ratios.png")
        if not_drawn:
            progress(not_drawn)
    return report, run_dir


PLOT_EXTRA = "pip install 'lanectl[plot]'"


def plot(report: dict[str, Any], path: Path) -> str | None:
    """Ratio per cell with the bar and each cell's noise band: the picture a reviewer looks at first.

    matplotlib is an optional extra (a large import for one picture): without it nothing is drawn,
    and the returned line says how to get the plot; None when it was drawn (or there is nothing to draw).
    """
    try:
        import matplotlib
    except ImportError:
        return (f"no plot: matplotlib is not installed; `{PLOT_EXTRA}`, then `lanectl report {path.parent}` "
                f"draws {path.name}")

    matplotlib.use("Agg")  # no display on a server
    import matplotlib.pyplot as plt

    cells = report["cells"]
    if not cells:
        return None
    keys = list(cells)
    ratios = [cells[k]["ratio"] for k in keys]
    bands = [cells[k]["band"] for k in keys]
    colours = {"pass": "tab:green", "fail": "tab:red", "inconclusive": "tab:gray"}
    figure, axes = plt.subplots(figsize=(max(6.0, 0.6 * len(keys) + 2), 4))
    axes.bar(keys, ratios, yerr=bands, capsize=3, color=[colours[cells[k]["verdict"]] for k in keys])
    axes.axhline(report["bar"], color="tab:blue", linestyle="--", label=f"bar {report['bar']:.3f}x")
    axes.axhline(1.0, color="black", linewidth=0.8)
    low = min(min(r - b for r, b in zip(ratios, bands, strict=True)), 1.0)
    high = max(max(r + b for r, b in zip(ratios, bands, strict=True)), report["bar"])
    axes.set_ylim(low - 0.02, high + 0.02)
    axes.set_ylabel(f"{report['candidate']} / mean({report['control']} controls), output tok/s")
    axes.set_title(f"gate {report['candidate']} vs {report['control']}: {report['verdict'].upper()}")
    axes.legend()
    plt.setp(axes.get_xticklabels(), rotation=45, ha="right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None


def report_table(report: dict[str, Any]) -> list[str]:
    lines = [f"{'cell':<22} {'control-1':>10} {'candidate':>10} {'control-2':>10} {'ratio':>7} {'band':>6}  verdict"]
    for key, cell in report["cells"].items():
        lines.append(f"{key:<22} {cell['control_first']:>10.1f} {cell['candidate']:>10.1f} "
                     f"{cell['control_last']:>10.1f} {cell['ratio']:>7.3f} {cell['band']:>6.3f}  {cell['verdict']}")
    fid = report.get("fidelity") or {}
    if fid:
        lines.append(f"fidelity: {fid['verdict']}: {fid['confident_flips']} confident flips (bar "
                     f"{fid['confident_flips_bar']}), weighted divergence {fid['weighted_divergence']:.3f} "
                     f"(bar {fid['weighted_divergence_bar']:.3f}) over {fid['prompts']} prompts")
    lines.append(f"verdict: {report['verdict'].upper()} (bar {report['bar']:.3f}x)"
                 + (f"; promoted {report['promoted']}" if report.get("promoted") else ""))
    lines += [f"  - {reason}" for reason in report["reasons"]]
    return lines


def load_report(run_dir: Path) -> dict[str, Any]:
    import json

    from lanectl.errors import BadInput

    path = run_dir / "results.json"
    if not path.is_file():
        raise BadInput(f"{run_dir}: no results.json; give a folder written by `lanectl gate --out`")
    data = json.loads(path.read_text())
    if "gate" not in data:
        raise BadInput(f"{path} holds a bench run, not a gate; its figures are in the file")
    return data["gate"]


__all__ = ["Verdict", "bench", "gate", "plot", "report_table", "load_report"]
