"""`lanectl standby check`'s protocol against a real `vllm serve` on the GPU machine, every figure recorded.

The protocol is lanectl's own (`lanectl/lanes/standby_check.py`: the fingerprint, N sleeps with streams in flight
and wakes, the failure it names, the memory figures, the standby block); this file only runs the engine as a
local process (run.py's `Engine`), as `lanectl standby check` runs it in a container:

    python3 gpu/vllm_serve/standby_check.py --model /tmp/models/llama-1b-random --out $OUT/uva \\
        --env VLLM_USE_V2_MODEL_RUNNER=0 --vllm-arg=--offload-backend --vllm-arg=uva \\
        --vllm-arg=--cpu-offload-gb --vllm-arg=1 --vllm-arg=--cpu-offload-params \\
        --vllm-arg=gate_up_proj --vllm-arg=down_proj --cycles 12 --beside 0.92,0.99

Here, against the CPU stub, as a dry run: `--engine stub`. Writes report.json (the check's report, the startup
proof lines, logprobs before the first sleep and after the last wake) and the engine logs under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import httpx  # noqa: E402
import run  # noqa: E402  (run.py beside this file puts lanectl on the path)

from lanectl.health.gate import HealthGate, MonotonicClock  # noqa: E402
from lanectl.health.probe import EndpointProbe  # noqa: E402
from lanectl.host.host_memory import available_gib  # noqa: E402
from lanectl.lanes.standby import SleepEndpoints, StandbyError  # noqa: E402
from lanectl.lanes.standby_check import (  # noqa: E402
    Beside,
    CheckReport,
    CheckSettings,
    Meters,
    beside_failure,
    beside_start,
    engine_failure,
    memory_figures,
    run_cycles,
)

PROMPT = "def parse(self, text):\n    "
# The startup lines that say what the engine really did: which runner, what it offloaded, what it loaded.
PROOF = re.compile(r"Total CPU offloaded parameters|Model loading took|Free memory on device|model runner|"
                   r"ModelRunner|V2|Available KV cache memory|KV cache size|CuMemAllocator|Sleep mode freed|"
                   r"It took .* seconds to (fall asleep|wake up)|offload", re.IGNORECASE)


class ProcessLane:
    """The lane under check as a local process: what `CheckedLane` asks of it."""

    def __init__(self, engine: run.Engine) -> None:
        self.engine = engine

    def urls(self) -> list[tuple[str, str]]:
        return [("primary", self.engine.base_url)]

    def ended(self) -> str | None:
        code = self.engine.proc.poll()
        return None if code is None else f"the engine process exited with code {code}"

    def log_since(self, since: float) -> str:
        return "\n".join(line for stamp, line in list(self.engine.stamped) if stamp >= since)


def gpu_total_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def gate(engine: run.Engine, budget_minutes: float) -> tuple[bool, float, str]:
    health = run.health_for("vllm", budget_minutes)
    result = HealthGate(health, EndpointProbe(engine.base_url, health), engine, engine, MonotonicClock()).wait()
    return result.passed, result.seconds, result.detail


def logprobs(base_url: str, max_tokens: int) -> Any:
    """The fingerprint's tokens with their top-2 logprobs: equal text could hide moved numbers."""
    body = {"model": run.MODEL_NAME, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "logprobs": 2}
    try:
        answer = httpx.post(base_url + "/v1/completions", json=body, timeout=60).json()
        lp = answer["choices"][0]["logprobs"]
        return {"tokens": lp["tokens"], "token_logprobs": lp["token_logprobs"], "top_logprobs": lp["top_logprobs"]}
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def margins(lp: Any) -> float | None:
    """The smallest gap between the chosen token and the runner-up: how close greedy came to a tie."""
    gaps = []
    for top in lp.get("top_logprobs") or []:
        values = sorted(top.values(), reverse=True)
        if len(values) > 1:
            gaps.append(values[0] - values[1])
    return round(min(gaps), 4) if gaps else None


def beside(rec: run.Record, args: argparse.Namespace, lane: ProcessLane, utilization: float,
           fingerprint: str) -> Beside:
    """The lane asleep, a second engine started beside it at `utilization`, stopped again, the lane woken and
    checked once more."""
    endpoints = SleepEndpoints(lane.engine.base_url, 120)
    endpoints.sleep(1, 30)
    b_args = argparse.Namespace(**{**vars(args), "port": args.port + 1,
                                   "vllm_arg": ["--enforce-eager", "--gpu-memory-utilization", str(utilization)]})
    argv, env = run.engine_command(b_args)
    env = {**env, **dict(pair.split("=", 1) for pair in args.beside_env)}
    b_engine = run.Engine(rec, argv, env, b_args.port, log_name=f"engine-beside-{utilization}.log")
    try:
        started, seconds, detail = gate(b_engine, 5)
        used = run.gpu_memory_mib()
        lines = list(b_engine.lines)
    finally:
        b_engine.stop()
    endpoints.wake_up()
    text = endpoints.greedy_text(run.MODEL_NAME, PROMPT, args.max_tokens)
    return beside_start(f"beside at {utilization}", utilization, started=started, seconds=round(seconds, 1),
                        gate_detail=detail, log_lines=lines, gpu_used_mib=used, text_after=text,
                        fingerprint=fingerprint)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("vllm", "stub"), default="vllm")
    parser.add_argument("--model", default="/tmp/models/llama-1b-random")
    parser.add_argument("--dummy", action="store_true")
    parser.add_argument("--vllm-arg", action="append", default=[])
    parser.add_argument("--env", action="append", default=[], help="K=V for the checked engine")
    parser.add_argument("--beside-env", action="append", default=[], help="K=V for the engine beside")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-tokens", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--beside", default="", help="comma-separated --gpu-memory-utilization values to start "
                                                      "beside the sleeping engine, in order")
    parser.add_argument("--stub-version", default="0.26.0")
    args = parser.parse_args()
    args.exit_guard = False

    rec = run.Record(args.out)
    before = {"gpu_used_mib_before_start": run.gpu_memory_mib(), "gpu_total_mib": gpu_total_mib(),
              "host_available_gib_before_start": available_gib()}
    argv, env = run.engine_command(args)
    env.update(dict(pair.split("=", 1) for pair in args.env))
    launched = time.monotonic()
    engine = run.Engine(rec, argv, env, args.port)
    lane = ProcessLane(engine)
    report: dict[str, Any] = {"argv": argv, "env": {k: v for k, v in env.items() if k.startswith(("VLLM", "STUB"))}}
    try:
        passed, seconds, detail = gate(engine, 8)
        cold = round(time.monotonic() - launched, 2)
        report |= {"cold_start_seconds": cold, "gate": detail, "gpu_used_mib_awake": run.gpu_memory_mib()}
        print(f"cold start {cold} s: {detail}", flush=True)
        if not passed:
            raise RuntimeError(f"the engine failed its gate: {detail}")
        report["logprobs_before"] = logprobs(engine.base_url, args.max_tokens)
        before["host_available_gib_awake"] = available_gib()
        settings = CheckSettings(cycles=args.cycles, model=run.MODEL_NAME, prompt=PROMPT, max_tokens=args.max_tokens,
                                 streams=args.streams, stream_tokens=args.stream_tokens)
        meters = Meters(gpu_used_mib=run.gpu_memory_mib, host_available_gib=available_gib)
        fingerprint, cycles, failure = run_cycles(lane, settings, meters, cold_start_seconds=cold)
        for cycle in cycles:
            print(f"  cycle {cycle.index}: sleep {cycle.sleep_seconds} s, wake {cycle.wake_seconds} s, "
                  f"streams {cycle.streams_ok} ok / {cycle.streams_failed} failed, asleep "
                  f"{cycle.gpu_used_mib_asleep} MiB, same {cycle.same}", flush=True)
        report["logprobs_after"] = logprobs(engine.base_url, args.max_tokens)
        besides = []
        for value in [float(v) for v in args.beside.split(",") if v] if failure is None else []:
            try:
                besides.append(beside(rec, args, lane, value, fingerprint))
            except StandbyError as exc:
                failure = engine_failure(lane, None, f"beside {value}: {exc}")
                break
            print(f"  beside {value}: {besides[-1]}", flush=True)
        startup = lane.log_since(0)
        first_beside = besides[0] if besides else None
        figures = memory_figures(cycles, before, startup, first_beside.utilization if first_beside else None)
        failure = failure or next((f for f in map(beside_failure, besides[:1]) if f), None)
        check = CheckReport(lane=args.model, cold_start_seconds=cold, fingerprint=fingerprint, cycles=tuple(cycles),
                            memory=figures, beside=first_beside, failure=failure)
        report["check"] = check.as_dict()
        report["besides"] = [b.__dict__ for b in besides]
        lp_before, lp_after = report["logprobs_before"], report["logprobs_after"]
        report["logprobs_equal"] = lp_before == lp_after
        report["logprob_min_margin"] = margins(lp_before)
    except Exception as exc:  # the record keeps what ran, and says what broke
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        report["proof_lines"] = [line for line in engine.lines if PROOF.search(line)][:80]
        engine.stop()
        time.sleep(0.5)
        rec.close()
        (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(json.dumps({k: report.get(k) for k in ("cold_start_seconds", "error", "logprobs_equal",
                                                 "logprob_min_margin")}))
    print(json.dumps(report.get("check", {}).get("failure")), json.dumps(report.get("check", {}).get("standby")))
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
