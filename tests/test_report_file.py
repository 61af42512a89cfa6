"""`lanectl report DIR` on a folder someone else may have edited: every wrong shape of results.json is a
clear error (exit 2) with nothing written, and the plot never goes through a link. Through the real CLI."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_plot_extra import REPORT


def report(run_dir: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "lanectl", "report", str(run_dir)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert "Traceback" not in result.stderr, result.stderr
    return result


def gate_with(change) -> bytes:
    gate = copy.deepcopy(REPORT)
    change(gate)
    return json.dumps({"gate": gate}).encode()


SHAPES: dict[str, bytes] = {
    "empty": b"",
    "not-json": b"{\"gate\": ",
    "not-utf8": b"\xff\xfe{}",
    "a-list": b"[]",
    "a-number": b"42",
    "gate-is-a-list": b'{"gate": []}',
    "gate-is-null": b'{"gate": null}',
    "gate-without-fields": b'{"gate": {}}',
    "cells-is-a-list": gate_with(lambda g: g.update(cells=[])),
    "cell-is-a-string": gate_with(lambda g: g["cells"].update({"x": "fast"})),
    "cell-without-ratio": gate_with(lambda g: g["cells"]["coding@1"].pop("ratio")),
    "arm-rate-is-text": gate_with(lambda g: g["cells"]["coding@1"]["arms"].update({"candidate": "fast"})),
    "unknown-verdict": gate_with(lambda g: g.update(verdict="maybe")),
    "bar-is-nan": json.dumps({"gate": {**REPORT, "bar": float("nan")}}).encode(),
    "ratio-is-infinite": gate_with(lambda g: g["cells"]["coding@1"].update(ratio=1e999)),
    "reasons-is-a-string": gate_with(lambda g: g.update(reasons="all good")),
    "fidelity-is-a-list": gate_with(lambda g: g.update(fidelity=[1])),
    "probes-wrong-shape": gate_with(lambda g: g.update(probes={"p": {"candidate": 3}})),
    "nested-past-the-recursion-limit": b"[" * 100_000,
}


@pytest.mark.parametrize("content", SHAPES.values(), ids=SHAPES.keys())
def test_a_malformed_results_json_is_a_clear_error_and_nothing_is_drawn(tmp_path: Path, content: bytes):
    (tmp_path / "results.json").write_bytes(content)

    result = report(tmp_path)

    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"lanectl: {tmp_path / 'results.json'} "), result.stderr
    assert not (tmp_path / "ratios.png").exists()


def test_a_fifo_as_results_json_is_refused_without_waiting(tmp_path: Path):
    os.mkfifo(tmp_path / "results.json")

    result = report(tmp_path)

    assert result.returncode == 2
    assert "is not a regular file" in result.stderr


def test_the_plot_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"gate": REPORT}))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (run / "ratios.png").symlink_to(victim)

    result = report(run)

    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "keep me\n"
    assert not (run / "ratios.png").is_symlink()
    assert (run / "ratios.png").read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def test_a_plot_that_cannot_be_written_is_an_error_not_a_traceback(tmp_path: Path):
    pytest.importorskip("matplotlib")
    (tmp_path / "results.json").write_text(json.dumps({"gate": REPORT}))
    (tmp_path / "ratios.png").mkdir()

    result = report(tmp_path)

    assert result.returncode != 0
    assert f"could not write {tmp_path / 'ratios.png'}" in result.stderr
