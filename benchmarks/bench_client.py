"""The load generator's own overhead: what it measures against a stub engine whose rate is known.

The stub runs STUB_STEP_MS=10, so every stream decodes at exactly 100 tok/s and a step takes 10 ms.
For 1, 8 and 32 streams, the client's figures are printed next to their references:
  decode tok/s per stream and ms/step     vs the configured 100 tok/s and 10 ms     (target: within 2 %)
  output tok/s (all streams, window)      vs the tokens the stub itself counted in the same window
  TTFT / ITL percentiles                   vs a bare-socket asyncio client on the same stub, same run
Then the split-KV overlay's single-stream speed-up (stub split step = 0.96 of a plain one, so 1/0.96 =
1.042 expected), which tests/stub_engine/test_stub_splitkv.py checks by step counts, not in real time.
Figures, not pass/fail: the machine is shared, so the load average is printed with them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# The CLI runs in subprocesses too: they must import this checkout's lanectl, not an installed one.
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
# As installed (pip compiles the bytecode), not compiling every lanectl module again on every run.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import httpx  # noqa: E402

from lanectl.bench.loadgen import ArmResult, run_arm  # noqa: E402
from lanectl.bench.stats import percentile  # noqa: E402
from tests.stub_engine.stubproc import MODEL_NAME, STUB_DIR, StubProcess, metric  # noqa: E402

STEP_MS = 10.0
RATE = 1000 / STEP_MS
MAX_TOKENS = 100
REPEATS = 3
PROMPTS = [f"Summarise change {i} of the release in one line." for i in range(16)]


def generated_tokens(url: str) -> float:
    return metric(httpx.get(url + "/metrics").text, "vllm:generation_tokens_total")


def measure(url: str, streams: int) -> tuple[ArmResult, float, float]:
    """One arm; also the tokens the stub itself generated in the arm's window, per second, and the client's CPU.

    With no warm-up nothing runs before the window opens; the stub's counter is read again as the last
    request finishes (from the progress callback), so both counts cover the same window.
    """
    at_close: list[float] = []

    def progress(done: int, total: int) -> None:
        if done == total:
            at_close.append(generated_tokens(url))

    before, cpu0, t0 = generated_tokens(url), time.process_time(), time.perf_counter()
    arm = run_arm(url, MODEL_NAME, PROMPTS, concurrency=streams, requests=3 * streams, max_tokens=MAX_TOKENS,
                  warmup=0, on_progress=progress)
    cpu = (time.process_time() - cpu0) / (time.perf_counter() - t0)
    return arm, (at_close[0] - before) / arm.wall_time_s, cpu


async def bare_stream(port: int, prompt: str, ttfts: list[float], gaps: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True}).encode()
    sent = time.perf_counter()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: stub\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    last = None
    while line := await reader.readline():
        if not line.startswith(b"data: "):
            continue
        now = time.perf_counter()
        if line.startswith(b"data: [DONE]"):
            break
        json.loads(line[6:])
        if last is None:
            ttfts.append(now - sent)
        else:
            gaps.append(now - last)
        last = now
    writer.close()


def bare_client(port: int, streams: int) -> tuple[list[float], list[float]]:
    """The floor: one request per stream from raw sockets, nothing but a readline and a json.loads per token."""
    ttfts: list[float] = []
    gaps: list[float] = []

    async def run() -> None:
        await asyncio.gather(*(bare_stream(port, PROMPTS[i % len(PROMPTS)], ttfts, gaps) for i in range(streams)))

    asyncio.run(run())
    return ttfts, gaps


def ms(values: list[float], p: float) -> float:
    return percentile(values, p) * 1000


def single_stream_rate(url: str, tokens: int = 200) -> float:
    run_arm(url, MODEL_NAME, PROMPTS, concurrency=1, requests=1, max_tokens=4, warmup=0)  # imports, sockets
    arm = run_arm(url, MODEL_NAME, PROMPTS, concurrency=1, requests=REPEATS, max_tokens=tokens, warmup=0)
    return arm.decode_tok_per_s or 0.0


def splitkv_speedup() -> None:
    """Single-stream decode with the split-KV extension built in vs the same settings without it."""
    from tests.stub_engine.stubproc import KERNEL_SRC
    from tests.stub_engine.test_stub_splitkv import BUILD, MODULE

    if shutil.which("gcc") is None or not Path("/usr/include/python3.11/Python.h").exists():
        print("\nsplit-KV: skipped (needs gcc and the python3.11 headers)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "stub-engine"
        shutil.copytree(STUB_DIR, tree, ignore=shutil.ignore_patterns("__pycache__"))
        env = {**os.environ, "LANECTL_KERNEL_MODULE": MODULE, "LANECTL_KERNEL_OUT": str(tree / "stubengine"),
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        subprocess.run(["bash", "-c", BUILD], cwd=KERNEL_SRC, env=env, check=True, capture_output=True)
        settings = {"STUB_DECODE_TOKENS_PER_S": "200", "STUB_STATS_INTERVAL_S": "0", "VLLM_DSV41_MEGA_SPLITKV": "4",
                    "VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS": "6"}
        rates = {}
        for name, path in (("split", tree), ("plain", STUB_DIR)):
            stub = StubProcess(settings, [], path, 0)
            try:
                rates[name] = single_stream_rate(stub.wait_ready())
            finally:
                stub.kill()
    ratio = rates["split"] / rates["plain"]
    print(f"\nsplit-KV single stream at 200 tok/s: split {rates['split']:.2f} tok/s, plain {rates['plain']:.2f} "
          f"tok/s, speed-up {ratio:.4f} (expected {1 / 0.96:.4f})")


def main() -> None:
    # No drafts: one token per step, so the configured step time is also the configured token rate.
    stub = StubProcess({"STUB_STEP_MS": str(STEP_MS), "STUB_STATS_INTERVAL_S": "0", "STUB_NUM_SPECULATIVE_TOKENS": "0"},
                       [], STUB_DIR, 0)
    try:
        url = stub.wait_ready()
        run_arm(url, MODEL_NAME, PROMPTS, concurrency=1, requests=1, max_tokens=4, warmup=0)  # imports, sockets
        print(f"stub engine at STUB_STEP_MS={STEP_MS:g} ({RATE:g} tok/s per stream), {MAX_TOKENS} tokens per "
              f"request, median of {REPEATS} arms; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        for streams in (1, 8, 32):
            runs = [measure(url, streams) for _ in range(REPEATS)]
            arm = sorted(runs, key=lambda r: r[0].output_tok_per_s)[REPEATS // 2][0]
            decode = statistics.median(r[0].decode_tok_per_s or 0.0 for r in runs)
            step = statistics.median(r[0].ms_per_step or 0.0 for r in runs)
            output = statistics.median(r[0].output_tok_per_s for r in runs)
            server = statistics.median(r[1] for r in runs)
            cpu = statistics.median(r[2] for r in runs)
            ttfts, gaps = bare_client(stub.port, streams)
            print(f"\n{streams} stream{'s' if streams > 1 else ''}: failed {sum(r[0].failed for r in runs)}, "
                  f"client CPU {cpu:.2f} cores")
            print(f"  decode tok/s per stream {decode:8.2f}   configured {RATE:8.2f}   ratio {decode / RATE:.4f}")
            print(f"  ms/step                 {step:8.3f}   configured {STEP_MS:8.3f}   ratio {step / STEP_MS:.4f}")
            print(f"  output tok/s (window)   {output:8.1f}   stub counted {server:8.1f}   ratio {output / server:.4f}")
            print(f"  TTFT p50/p99 ms  {arm.ttft_p50_ms:7.2f} /{arm.ttft_p99_ms:7.2f}   "
                  f"bare-socket client {ms(ttfts, 50):7.2f} /{ms(ttfts, 99):7.2f}")
            print(f"  ITL  p50/p99 ms  {arm.itl_p50_ms:7.2f} /{arm.itl_p99_ms:7.2f}   "
                  f"bare-socket client {ms(gaps, 50):7.2f} /{ms(gaps, 99):7.2f}")
    finally:
        stub.kill()
    splitkv_speedup()


if __name__ == "__main__":
    main()
