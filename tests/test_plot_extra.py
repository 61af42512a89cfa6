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
    "order": "ABA", "reasons": ["every cell passes the bar at the low end of its interval"], "fidelity": {},
    "cells": {
        "coding@1": {"class": "coding", "concurrency": 1, "context": 0, "ratio": 1.095, "low": 1.08, "high": 1.11,
                     "arms": {"control-1": 100.0, "candidate": 110.0, "control-2": 101.0}, "verdict": "pass",
                     "decode_ratio": 1.1, "prompt_ratio": 1.01, "ttft_ratio": 0.99},
        "coding@8/64K": {"class": "coding", "concurrency": 8, "context": 65536, "ratio": 1.084, "low": 1.06,
                         "high": 1.1, "arms": {"control-1": 700.0, "candidate": 760.0, "control-2": 702.0},
                         "verdict": "pass", "decode_ratio": 1.09, "prompt_ratio": None, "ttft_ratio": 1.0},
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


def report(run_dir: Path, env: dict[str, str] | None = None, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lanectl", "report", str(run_dir), *extra], capture_output=True,
                          text=True, env=env, timeout=120)


def test_report_without_matplotlib_shows_the_table_and_how_to_get_the_plot(run_dir, tmp_path):
    env = without_matplotlib(tmp_path)
    result = report(run_dir, env)
    assert result.returncode == 0, result.stderr
    assert "verdict: PASS (bar 1.025x, order ABA)" in result.stdout
    # The release note's table: per class at each concurrency and context, then each cell's figures.
    assert result.stdout.splitlines()[:5] == [
        "candidate / control, per-request tok/s:",
        "users  context      coding",
        "    1        0       1.095",
        "    8    65536       1.084",
        "cell                     control-1   candidate   control-2  ratio  95% interval decode prompt   TTFT  verdict",
    ]
    assert result.stdout.splitlines()[5:7] == [
        "coding@1                     100.0       110.0       101.0  1.095  1.080-1.110   1.100  1.010  0.990  pass",
        "coding@8/64K                 700.0       760.0       702.0  1.084  1.060-1.100   1.090      -  1.000  pass",
    ]
    as_json = report(run_dir, env, "--json")
    assert json.loads(as_json.stdout)["data"]["cells"] == REPORT["cells"]
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
