"""The rejection-sampler bug (vLLM #60945 mirrored) and its patch."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from stubengine import decoding, engine, rejection_sampler

from .stubproc import PATCH, STUB_DIR, metric, unprefixed


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def patched(patched_tree: Path) -> ModuleType:
    return _load(patched_tree / "stubengine" / "rejection_sampler.py", "patched_rejection_sampler")


def _batch(num_running: int, k: int = 5) -> tuple[list[int], list[int], list[int]]:
    """One step's flattened buffers, laid out as the engine lays them out."""
    steps = engine.draft_steps(num_running, k)
    target: list[int] = []
    drafts: list[int] = []
    cu = [0]
    for r in range(num_running):
        stream = decoding.TokenStream(f"request {r}")
        row = [stream.token(j) for j in range(steps + 1)]
        target += row
        # Alternate all-accepted rows and rows rejected at the second draft.
        drafts += [0] + [tok if (r % 2 == 0 or j == 0) else (tok + 1) % decoding.V for j, tok in enumerate(row[:-1])]
        cu.append(len(target))
    return target, drafts, cu


def test_schedule_drops_to_three_draft_steps_at_9_to_32() -> None:
    assert [engine.draft_steps(n, 5) for n in (1, 8, 9, 16, 32, 33)] == [5, 5, 3, 3, 3, 5]
    assert engine.draft_steps(12, 2) == 2


@pytest.mark.parametrize("num_running", [1, 8, 9, 16, 32, 33])
def test_unpatched_reads_past_the_buffer_only_when_fewer_steps_ran(num_running: int) -> None:
    target, drafts, cu = _batch(num_running)
    out = rejection_sampler.rejection_sample(target, drafts, cu, 5)
    if 9 <= num_running <= 32:
        assert out.oob_reads == [len(target) - 1]  # the last row's bonus position, one slot past the end
    else:
        assert out.oob_reads == []
        # Rows that accepted every draft stop at the bonus position; the others at the first mismatch.
        assert out.num_accepted == [5 if r % 2 == 0 else 1 for r in range(num_running)]


@pytest.mark.parametrize("num_running", [1, 8, 9, 16, 32, 33])
def test_patched_never_reads_past_and_matches_where_the_bug_cannot_fire(patched, num_running: int) -> None:
    target, drafts, cu = _batch(num_running)
    fixed = patched.rejection_sample(target, drafts, cu, 5)
    steps = engine.draft_steps(num_running, 5)
    assert fixed.oob_reads == []
    assert fixed.num_accepted == [steps if r % 2 == 0 else 1 for r in range(num_running)]
    if steps == 5:  # bit-identical to the unpatched code whenever all k draft steps ran
        buggy = rejection_sampler.rejection_sample(target, drafts, cu, 5)
        assert (fixed.num_accepted, fixed.oob_reads) == (buggy.num_accepted, buggy.oob_reads)


def test_patch_applies_cleanly_and_is_small(tmp_path: Path) -> None:
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed")
    text = PATCH.read_text()
    header, diff = text.split("\n---\n", 1)
    assert header.startswith("Subject: Guard the last draft position")
    assert "Upstream: https://github.com/vllm-project/vllm/pull/60945" in header
    assert "Target: stubengine/rejection_sampler.py" in header and "Base: path:images/stub-engine" in header
    assert diff.startswith("--- a/stubengine/rejection_sampler.py\n+++ b/stubengine/rejection_sampler.py\n")
    changed = [ln for ln in diff.splitlines()[2:] if ln[:1] in "+-"]
    assert 2 <= len(changed) <= 6
    root = tmp_path / "stub-engine"
    shutil.copytree(STUB_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    run = {"cwd": root, "capture_output": True, "text": True}
    assert subprocess.run(["patch", "-p1", "--dry-run", "-i", str(PATCH)], **run).returncode == 0
    assert subprocess.run(["patch", "-p1", "-i", str(PATCH)], **run).returncode == 0
    # Once applied it reverses cleanly and no longer applies forward: "already applied" is detectable.
    assert subprocess.run(["patch", "-p1", "-R", "--dry-run", "-i", str(PATCH)], **run).returncode == 0
    assert subprocess.run(["patch", "-p1", "--forward", "--dry-run", "-i", str(PATCH)], **run).returncode != 0


def _run_ten_streams_in_one_batch(url: str) -> None:
    """Ten requests admitted in one step, however the client threads raced: the engine is held (the `hang`
    fault parks its loop before admitting anything) until all ten wait, then released."""
    assert httpx.post(url + "/admin/fault", json={"fault": "hang"}).status_code == 200
    failures: list[BaseException] = []

    def one(i: int) -> None:
        try:
            r = httpx.post(url + "/v1/completions", json={"prompt": f"user {i}", "max_tokens": 30}, timeout=120)
            r.raise_for_status()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while metric(httpx.get(url + "/metrics").text, "vllm:num_requests_waiting") < 10:
        assert time.monotonic() < deadline, "ten requests never reached the engine's queue"
        time.sleep(0.05)
    assert httpx.post(url + "/admin/fault", json={"fault": "clear"}).status_code == 200
    for t in threads:
        t.join(120)
    assert not failures, failures


def test_engine_counts_stray_reads_unpatched_and_none_patched(spawn, patched_tree: Path) -> None:
    env = {"STUB_DECODE_TOKENS_PER_S": "200", "STUB_OOB_LOG_EVERY": "1000", "STUB_ADMIN": "1"}
    buggy = spawn(env=env)
    fixed = spawn(env=env, pythonpath=patched_tree)
    for p in (buggy, fixed):
        _run_ten_streams_in_one_batch(p.url)
    m_buggy = httpx.get(buggy.url + "/metrics").text
    m_fixed = httpx.get(fixed.url + "/metrics").text
    assert metric(m_fixed, "stub:oob_draft_reads_total") == 0
    # Every step ran all ten rows (one draft row each) at 3 of 5 draft steps, so one stray read a step; a step
    # carries 1-4 tokens (speculative decoding), so 30 tokens take 8 to 30 steps.
    drafts = metric(m_buggy, "vllm:spec_decode_num_drafts_total")
    assert metric(m_fixed, "vllm:spec_decode_num_drafts_total") == drafts  # the same steps, patched or not
    assert drafts % 10 == 0 and 8 <= drafts // 10 <= 30
    assert metric(m_buggy, "stub:oob_draft_reads_total") == drafts // 10
    warnings = [ln for ln in buggy.lines if "rejection sampler read past draft buffer" in ln]
    assert len(warnings) == 1 and unprefixed(warnings[0]).startswith("WARNING ")  # rate-limited to one per 1000
    assert "3 of 5 configured draft steps, 10 running requests" in warnings[0]
    assert not any("read past draft buffer" in ln for ln in fixed.lines)


def test_no_stray_reads_at_low_concurrency(stub) -> None:
    httpx.post(stub.url + "/v1/completions", json={"prompt": "solo", "max_tokens": 20})
    m = httpx.get(stub.url + "/metrics").text
    assert metric(m, "stub:oob_draft_reads_total") == 0
    # Every step after the prefill drafts 5 tokens for the one request.
    steps = metric(m, "stub:engine_steps_total")
    assert metric(m, "vllm:spec_decode_num_draft_tokens_total") == 5 * (steps - 1) > 0
