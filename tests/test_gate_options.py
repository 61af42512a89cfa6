"""`lanectl gate` refuses bad numbers and bad lane lists before anything runs: exit 2, the option named, no
state written, nothing switched. Through the real CLI on the repo's demo recipes; no Docker is reached, so a
test that let a bad option through to the bracket would fail on the missing lanes instead of passing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_cli import lanectl

DEMO = ["--recipes", str(REPO / "recipes"), "gate"]
BRACKET = ["demo-h2", "--control", "demo-h1", "--workload", "demo", "--no-gpu"]
CALIBRATION = ["demo-h1", "--calibrate", "--workload", "demo", "--no-gpu"]

REFUSED = {
    "bar-nan": (BRACKET + ["--bar", "nan"], "--bar nan: expected a finite ratio > 0"),
    "bar-inf": (BRACKET + ["--bar", "inf"], "--bar inf: expected a finite ratio > 0"),
    "bar-zero": (BRACKET + ["--bar", "0"], "--bar 0.0: expected a finite ratio > 0"),
    "bar-negative": (BRACKET + ["--bar", "-1.025"], "--bar -1.025: expected a finite ratio > 0"),
    "false-promotion-nan": (CALIBRATION + ["--max-false-promotion", "nan"], "--max-false-promotion nan: expected"),
    "false-promotion-above-1": (CALIBRATION + ["--max-false-promotion", "2"], "--max-false-promotion 2.0: expected"),
    "until-decided-negative": (BRACKET + ["--until-decided", "-1"], "--until-decided -1: expected 0 to 50"),
    "until-decided-huge": (BRACKET + ["--until-decided", "1000"], "--until-decided 1000: expected 0 to 50"),
    "arms-without-calibrate": (BRACKET + ["--arms", "5"], "--arms sets how many arms --calibrate runs"),
    "arms-too-few": (CALIBRATION + ["--arms", "2"], "--arms 2: expected 3 to 100 arms"),
    "calibrate-until-decided": (CALIBRATION + ["--until-decided", "2"], "--calibrate runs --arms arms of one lane"),
    "order-unknown": (BRACKET + ["--order", "ABC"], "--order 'ABC': expected one of ABA, ABBA"),
    "concurrency-zero": (BRACKET + ["--concurrency", "0,8"], "--concurrency '0,8': expected whole numbers from 1"),
    "concurrency-twice": (BRACKET + ["--concurrency", "1,8,1"], "--concurrency '1,8,1': 1 is named twice"),
    "concurrency-huge": (BRACKET + ["--concurrency", "100000"], "--concurrency '100000': expected whole numbers"),
    "candidate-twice": (["demo-h2", "demo-h2", "--control", "demo-h1", "--workload", "demo"],
                        "candidate demo-h2 is named twice"),
    "candidate-is-control": (["demo-h1", "--control", "demo-h1", "--workload", "demo"],
                             "demo-h1 is both the control and a candidate"),
}


@pytest.mark.parametrize("args, said", REFUSED.values(), ids=REFUSED.keys())
def test_a_bad_option_exits_2_before_anything_runs(tmp_path: Path, args: list[str], said: str):
    state = tmp_path / "state"
    result = lanectl(*DEMO, *args, cwd=tmp_path, env={"LANECTL_STATE_DIR": str(state),
                                                       "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not state.exists()  # no lock, no journal: nothing switched, no arm ran
