"""matplotlib is the optional `plot` extra: without it `report` (and `gate --out`) still write and
show the figures, say how to get the plot, and exit as they would with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lanectl.bench.plot import PLOT_EXTRA, plot

REPORT = {
    "candidate": "h2-REF", "control": "h1-REF", "bar": 1.025, "verdict": "pass", "promoted": None,
    "reasons": ["every cell passes the bar and the controls' noise"], "fidelity": {},
    "cells": {
        "coding/c1": {"control_first": 100.0, "candidate": 110.0, "control_last": 101.0, "ratio": 1.095,
                      "band": 0.01, "verdict": "pass"},
        "coding/c8": {"control_first": 700.0, "candidate": 760.0, "control_last": 702.0, "ratio": 1.084,
                      "band": 0.003, "verdict": "pass"},
    },
}


def without_matplotlib(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import matplotlib` fails, as where the extra is not installed."""
    blocker = tmp_path / "no-matplotlib" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is not installed (blocked by the test)')\n")
    path = os.pathsep.join([str(blocker.parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "COLUMNS": "200"}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "gate-run"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"gate": REPORT}))
    return folder


def report(run_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lanectl", "report", str(run_dir)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_report_without_matplotlib_shows_the_table_and_how_to_get_the_plot(run_dir, tmp_path):
    result = report(run_dir, without_matplotlib(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "verdict: PASS (bar 1.025x)" in result.stdout
    assert result.stderr == (f"no plot: matplotlib is not installed; `{PLOT_EXTRA}`, then `lanectl report "
                             f"{run_dir}` draws ratios.png\n")
    assert not (run_dir / "ratios.png").exists()


def test_report_with_matplotlib_draws_the_plot(run_dir):
    result = report(run_dir)
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"plot: {run_dir / 'ratios.png'}\n"
    assert (run_dir / "ratios.png").read_bytes().startswith(b"\x89PNG")


def test_the_plot_says_what_it_needs_when_matplotlib_cannot_be_imported(run_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert plot(REPORT, run_dir / "ratios.png") == (
        f"no plot: matplotlib is not installed; `pip install 'lanectl[plot]'`, then `lanectl report {run_dir}` "
        "draws ratios.png")
    assert not (run_dir / "ratios.png").exists()
