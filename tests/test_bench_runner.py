"""benchmarks/run_all.py, without running a benchmark: how RESULTS.md is rewritten section by section."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_all", REPO / "benchmarks" / "run_all.py")
    assert spec and spec.loader
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def section(runner: ModuleType, name: str, output: str) -> str:
    return runner.render_section(runner.Run(
        name=name, command=f".venv/bin/python benchmarks/{name}.py", started="2026-12-04T16:00:00Z", seconds=12.0,
        status=0, output=output, commit="0123456789ab", machine="2 cores, a CPU; load average 1.00 1.00 1.00"))


def test_every_benchmark_in_the_list_has_its_section_in_order(runner: ModuleType) -> None:
    text = runner.rewrite({}, "")
    names = [runner.section_name(script) for script in runner.BENCHMARKS]
    positions = [text.index(f"<!-- bench:{name} -->") for name in names]
    assert positions == sorted(positions)
    assert text.count("Not measured yet") == len(names)


def test_a_section_run_again_replaces_only_itself(runner: ModuleType) -> None:
    first, second = runner.section_name(runner.BENCHMARKS[0]), runner.section_name(runner.BENCHMARKS[1])
    before = runner.rewrite({first: section(runner, first, "old figure 1"),
                             second: section(runner, second, "kept figure 2")}, "")
    after = runner.rewrite({first: section(runner, first, "new figure 1")}, before)
    assert "new figure 1" in after and "old figure 1" not in after
    assert "kept figure 2" in after
    assert after.count(f"<!-- bench:{first} -->") == 1


def test_a_section_carries_its_own_run_facts(runner: ModuleType) -> None:
    text = section(runner, "lanes", "switch: +317 ms")
    for fact in ("`.venv/bin/python benchmarks/lanes.py`", "make bench ONLY=lanes", "2026-12-04T16:00:00Z",
                 "0123456789ab", "2 cores", "exit status 0", "switch: +317 ms"):
        assert fact in text


def test_an_unknown_name_is_refused(runner: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["--only", "no-such-benchmark"]) == 2
    assert "no benchmark named no-such-benchmark" in capsys.readouterr().err
