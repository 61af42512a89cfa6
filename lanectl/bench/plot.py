"""The gate's picture: ratio per cell with the bar and each cell's 95% interval.

matplotlib is an optional extra (`lanectl[plot]`), imported only when a plot is drawn: it takes most of
a second to load, for one picture.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from lanectl.errors import OperationFailed
from lanectl.output import shown
from lanectl.state.atomic import replacing

PLOT_EXTRA = "pip install 'lanectl[plot]'"


def plot(report: dict[str, Any], path: Path) -> str | None:
    """Ratio per cell with the bar and each cell's 95% interval: the picture a reviewer looks at first.

    Without matplotlib nothing is drawn, and the returned line says how to get the plot; None when it was
    drawn (or there is nothing to draw).
    """
    try:
        import matplotlib
    except ImportError:
        return (f"no plot: matplotlib is not installed; `{PLOT_EXTRA}`, then `lanectl report {path.parent}` "
                f"draws {path.name}")

    matplotlib.use("Agg")  # no display on a server
    cells = plotted_cells(report)
    if not cells:
        return None
    # matplotlib warns on stderr about what it cannot draw, quoting it: a glyph missing for a name's ESC or BEL
    # wrote them raw to the terminal. The names are drawn escaped; what it still warns about is no one's to fix.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _draw(report, cells, path)
    return None


def _text(value: object) -> str:
    """A name from results.json as the plot shows it: control characters escaped, and `$` kept from starting
    matplotlib's mathtext (an unbalanced one would raise)."""
    return shown(str(value)).replace("$", r"\$")


def _draw(report: dict[str, Any], cells: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    keys = [_text(key) for key in cells]
    cells = dict(zip(keys, cells.values(), strict=True))
    ratios = [cells[k]["ratio"] for k in keys]
    errors = [[cells[k]["ratio"] - cells[k]["low"] for k in keys], [cells[k]["high"] - cells[k]["ratio"] for k in keys]]
    colours = {"pass": "tab:green", "fail": "tab:red", "inconclusive": "tab:gray"}
    figure, axes = plt.subplots(figsize=(max(6.0, 0.6 * len(keys) + 2), 4))
    axes.bar(keys, ratios, yerr=errors, capsize=3, color=[colours[cells[k]["verdict"]] for k in keys])
    axes.axhline(report["bar"], color="tab:blue", linestyle="--", label=f"bar {report['bar']:.3f}x")
    axes.axhline(1.0, color="black", linewidth=0.8)
    low = min(min(cells[k]["low"] for k in keys), 1.0)
    high = max(max(cells[k]["high"] for k in keys), report["bar"])
    axes.set_ylim(low - 0.02, high + 0.02)
    candidates = ", ".join(_text(c["candidate"]) for c in report.get("candidates", [report]))
    # A bracket's candidates are named on the x axis; the label would not fit them all.
    who = "candidate" if "candidates" in report else candidates
    control = _text(report["control"])
    axes.set_ylabel(f"{who} / {control} controls, per-request tok/s")
    axes.set_title(f"gate {candidates} vs {control}: {_text(report['verdict']).upper()}")
    axes.legend()
    plt.setp(axes.get_xticklabels(), rotation=45, ha="right")
    figure.tight_layout()
    try:
        # Whole or not at all, and never through a link planted as ratios.png: the rename replaces the link.
        with replacing(path, mode=0o644) as handle:
            figure.savefig(handle, format="png", dpi=100)
    except OSError as exc:
        raise OperationFailed(f"could not write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)


def plotted_cells(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A gate's cells; a bracket of several candidates' cells side by side, each named `lane: cell`."""
    if "candidates" not in report:
        return dict(report["cells"])
    return {f"{c['candidate']}: {key}": cell for c in report["candidates"] for key, cell in c["cells"].items()}
