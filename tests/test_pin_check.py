"""`lanectl pin check VERSION` against the real released sources of vLLM 0.31.0, 0.32.0, 0.33.0 and the flashinfer
releases they pin, downloaded from PyPI once into the shared test cache (the facts read from them are cached beside
them, so a second run takes seconds).

Three versions of the production recipe: as shipped (ready for the move: the report names each item and one thing
breaks, the #60945 backport to drop); the same with its pin moved to 0.32.0 and #60945 dropped (green); and the
recipe as it was before it was made ready, with a flag vLLM never had (each item breaks, where the issue said).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lanectl.commands.pin import check_pin_command
from lanectl.errors import BadInput
from lanectl.project import Project
from tests.conftest import REPO
from tests.test_cli import lanectl

RECIPE = "recipes/dgx-station-gb300/deepseek-v4.1-flash-vllm-uva-dspark-sidecar.yaml"
BACKPORT = "vllm/60945-rejection-sampler-guard.patch"
OVERLAY = "vllm/57711-splitkv-overlay.patch"


def test_cache() -> str:
    return os.environ.get("LANECTL_TEST_CACHE", str(Path.home() / ".cache" / "lanectl-test"))


test_cache.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def copy_project(root: Path, edit: Any = None) -> Path:
    for part in ("recipes", "images", "kernels", "patches"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    if edit is not None:
        path = root / RECIPE
        recipe = yaml.safe_load(path.read_text())
        edit(recipe)
        path.write_text(yaml.safe_dump(recipe, sort_keys=False, width=200))
    return root


def moved_to_032(recipe: dict[str, Any]) -> None:
    recipe["defaults"]["image"]["vllm"] = "0.32.0"
    h2 = recipe["lanes"]["h2-REF"]
    h2["patches"] = [p for p in h2["patches"] if p["path"] != BACKPORT]


def as_before_it_was_ready(recipe: dict[str, Any]) -> None:
    """The production recipe before this change (main's), with only its pin named, and a flag no vLLM has."""
    image = recipe["defaults"]["image"]
    del image["download_kernels"]
    del recipe["defaults"]["engine"]["env"]["FLASHINFER_AUTOTUNE_CACHE_DIR"]
    log = recipe["defaults"]["health"]["startup_log"]
    for stall in log["stall"]:
        del stall["warm"], stall["cold_minutes"]
    log["expect"].append("Loaded 210 configs")
    h2 = recipe["lanes"]["h2-REF"]["health"]["startup_log"]["expect"]
    h2.insert(len(h2) - 1, "Loaded 210 configs")
    recipe["defaults"]["companions"]["rtx"]["engine"]["args"] += ["--no-such-vllm-flag", "1"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], tuple[int, dict[str, Any]]]]:
    """(project, version) -> (exit code, the report), from the command itself, against the cached real sources."""
    projects = {"shipped": copy_project(tmp_path_factory.mktemp("shipped")),
                "moved": copy_project(tmp_path_factory.mktemp("moved"), moved_to_032),
                "unready": copy_project(tmp_path_factory.mktemp("unready"), as_before_it_was_ready)}
    runs = [("shipped", "0.32.0"), ("shipped", "0.33.0"), ("moved", "0.32.0"), ("unready", "0.32.0"),
            ("unready", "0.33.0")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LANECTL_CACHE_DIR", test_cache())
        out = {}
        for name, version in runs:
            result = check_pin_command(Project.locate(projects[name] / "recipes"), version)
            out[(name, version)] = result.exit_code, json.loads(json.dumps(result.data))
    yield out


def lane(report: dict[str, Any], name: str) -> list[dict[str, str]]:
    return next(entry["findings"] for entry in report["lanes"] if entry["lane"] == name)


def texts(findings: list[dict[str, str]], verdict: str, topic: str) -> list[str]:
    return [f["text"] for f in findings if f["verdict"] == verdict and f["topic"] == topic]


def one(findings: list[dict[str, str]], verdict: str, topic: str, pattern: str) -> str:
    found = [text for text in texts(findings, verdict, topic) if re.search(pattern, text)]
    assert len(found) == 1, (verdict, topic, pattern, findings)
    return found[0]


@pytest.mark.network
def test_moving_the_shipped_recipe_to_032_names_every_item_and_breaks_only_on_the_backport(reports) -> None:
    code, report = reports[("shipped", "0.32.0")]
    assert (code, report["breaks"], report["flashinfer"]) == (1, 1, "0.7.0.post1")
    h1, h2 = lane(report, "h1-REF"), lane(report, "h2-REF")
    one(h2, "breaks", "patch", rf"^{BACKPORT} is already upstream in vLLM 0\.32\.0: drop it")
    one(h2, "ok", "patch", rf"^{OVERLAY} applies to vLLM 0\.32\.0$")
    for findings in (h1, h2):
        rename = one(findings, "note", "first start", "retunes from scratch")
        assert ("reads autotune_configs_dp{dp}_rank{rank}.json (vllm/model_executor/warmup/kernel_warmup.py:456) "
                "where vLLM 0.31.0 wrote autotune_configs.json, and never the old name") in rename
        assert "the stall autotune allows that cold run 90 min" in rename
        one(findings, "ok", "build", r"runs `vllm download-kernels` \(vllm/entrypoints/cli/download_kernels\.py:\d+\)")
        one(findings, "ok", "cache", r"^the flashinfer autotune cache stays in a volume: /root/\.cache/vllm/")
    release = report["release"]
    for route in ("/weight_checker", "/shutdown_weight_transfer_engine"):
        one(release, "note", "dev routes", rf"^development mode adds {route} \(not in vLLM 0\.31\.0\)")
    assert "POST /sleep answers 200 {'status': 'sleeping', 'level': level} (vLLM 0.31.0: 200, empty)" in \
        texts(release, "note", "answers")[0]
    one(release, "note", "answers", r"^POST /wake_up answers 200 \{'status': 'awake' if fully_awake else 'sleeping'")
    compile_note = next(f for f in release if f["topic"] == "compile cache")
    assert compile_note["where"].startswith("vllm/config/vllm.py:") and "vllm/compilation/" in compile_note["where"]


@pytest.mark.network
def test_moving_the_shipped_recipe_to_033_names_the_managed_cache_and_its_line(reports) -> None:
    code, report = reports[("shipped", "0.33.0")]
    assert (code, report["breaks"], report["flashinfer"]) == (1, 1, "0.7.2.post1")
    h2 = lane(report, "h2-REF")
    one(h2, "breaks", "patch", rf"^{BACKPORT} conflicts with vLLM 0\.33\.0 \(vllm/v1/worker/gpu/spec_decode/"
                               r"rejection_sampler_utils\.py: hunk 1 of 1 .*upstream since vLLM 0\.32\.0: drop it$")
    one(h2, "ok", "patch", rf"^{OVERLAY} applies to vLLM 0\.33\.0$")
    for findings in (lane(report, "h1-REF"), h2):
        one(findings, "ok", "cache", r"^flashinfer's managed autotune store stays in a volume: "
                                     r"/root/\.cache/vllm/flashinfer-autotune \(FLASHINFER_AUTOTUNE_CACHE_DIR;")
        one(findings, "note", "first start", r"keeps a single-rank lane's results in flashinfer's managed store "
                                             r"\(vllm/model_executor/warmup/kernel_warmup\.py:\d+\), which starts "
                                             "empty")
        warm = one(findings, "note", "startup rule", r"^stall warm ")
        assert "never the JSON cache file whose loader prints '[Autotuner]: Loaded {…} configs from {…}'" in warm
        assert "it logs 'Using FlashInfer managed autotune cache (root=%s)." in warm
    pins = texts(report["release"], "note", "pins")
    assert any("torch 2.14.0 (vLLM 0.31.0: 2.13.0)" in text for text in pins)


@pytest.mark.network
def test_the_production_recipe_with_its_pin_moved_to_032_and_the_backport_dropped_checks_green(reports) -> None:
    code, report = reports[("moved", "0.32.0")]
    assert (code, report["breaks"]) == (0, 0), report
    assert [entry["pinned"] for entry in report["lanes"]] == ["0.32.0", "0.32.0"]
    one(lane(report, "h2-REF"), "ok", "patch", rf"^{OVERLAY} applies to vLLM 0\.32\.0$")
    # Nothing about the autotune cache to carry: the pin and the target read the same file.
    one(lane(report, "h1-REF"), "ok", "first start", "reads the autotune results vLLM 0.32.0 saved")


@pytest.mark.network
def test_the_recipe_as_it_was_breaks_on_032_where_the_issue_said(reports) -> None:
    code, report = reports[("unready", "0.32.0")]
    assert code == 1
    for name in ("h1-REF", "h2-REF"):
        findings = lane(report, name)
        stall = one(findings, "breaks", "first start", r"the stall autotune \(10 min\) fails it and the lane rolls "
                                                       r"back, on every try")
        assert "autotune_configs_dp{dp}_rank{rank}.json" in stall
        one(findings, "breaks", "first start", r"^expect 'Loaded 210 configs' matches only the line a warm autotune "
                                               r"cache prints")
        one(findings, "breaks", "build", r"need `vllm download-kernels` at build")
        one(findings, "breaks", "serve flag", r"^--no-such-vllm-flag: vLLM 0\.32\.0's `vllm serve` has no such "
                                              "option")


@pytest.mark.network
def test_the_recipe_as_it_was_breaks_on_033_where_the_issue_said(reports) -> None:
    code, report = reports[("unready", "0.33.0")]
    assert code == 1
    for name in ("h1-REF", "h2-REF"):
        findings = lane(report, name)
        never = one(findings, "breaks", "startup rule", r"^expect 'Loaded 210 configs': no log call of vLLM 0\.33\.0")
        assert "uses flashinfer's managed autotune store" in never
        one(findings, "breaks", "cache", r"^flashinfer's managed autotune store leaves the recipe's volumes: "
                                         r"/root/\.cache/flashinfer/autotune \(flashinfer 0\.7\.2\.post1's default")


@pytest.mark.network
def test_the_cli_prints_the_report_and_exits_1_when_something_breaks(reports, tmp_path: Path) -> None:
    project = copy_project(tmp_path / "p")
    result = lanectl("pin", "check", "0.32.0", cwd=project, env={"LANECTL_CACHE_DIR": test_cache()})
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "vLLM 0.32.0 (flashinfer 0.7.0.post1), from its released source"
    assert f"  breaks patch: {BACKPORT} is already upstream in vLLM 0.32.0: drop it (applying it changes nothing)" \
        f"  [{RECIPE}:{_line_of(project / RECIPE, BACKPORT)}]" in lines
    assert lines[-1] == "1 thing breaks moving to vLLM 0.32.0"
    assert "not checked: demo-h1: no image.vllm (not a vLLM image, or its release is not named)" in result.stderr


def _line_of(path: Path, text: str) -> int:
    return next(i for i, row in enumerate(path.read_text().splitlines(), 1) if text in row)


def test_a_version_that_is_not_one_is_refused_before_anything_is_fetched(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "p")
    result = lanectl("pin", "check", "0.32", cwd=project, env={"LANECTL_CACHE_DIR": str(tmp_path / "cache")})
    assert (result.returncode, result.stderr) == (2, "lanectl: '0.32' is not a vLLM release version (e.g. 0.32.0)\n")
    assert not (tmp_path / "cache").exists()


def test_a_project_without_a_named_vllm_release_is_bad_input(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "p")
    (project / RECIPE).unlink()
    with pytest.raises(BadInput, match=r"no lane names its vLLM release: set image\.vllm"):
        check_pin_command(Project.locate(project / "recipes"), "0.32.0")
