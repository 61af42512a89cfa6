"""lanectl's own engine-facing code against a running engine, every exchange recorded.

On the GPU machine, against a real `vllm serve` (see run-on-h200.sh):
    python3 gpu/vllm_serve/run.py --engine vllm --model /tmp/models/llama-8b-shape --dummy --out $OUT/8b
Here, against the CPU stub engine, as a dry run of the same scenarios:
    python3 gpu/vllm_serve/run.py --engine stub --out /tmp/stub-record

Nothing here re-implements lanectl: the health gate, the endpoint probe, the sleep routes and the wake check,
the load generator, teacher-forced scoring, the correctness probes and the fatal-line rules are lanectl's.
What this file adds is the engine process, a clock of the exchanges (`events.jsonl`: every request and answer,
bodies trimmed, every log line with its offset in seconds from launch) and the figures (`figures.json`).
Each scenario runs even when an earlier one failed; its error is recorded, and the exit status says
whether all of them ran.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
# LANECTL_SRC: a lanectl tree other than this checkout's (e.g. a branch exported with git archive).
sys.path.insert(0, os.environ.get("LANECTL_SRC") or str(REPO))

import httpx  # noqa: E402

from lanectl.bench import loadgen  # noqa: E402
from lanectl.bench.probes import load_probe, run_probe  # noqa: E402
from lanectl.health.engine_log import fatal_engine_lines, startup_match  # noqa: E402
from lanectl.health.gate import ContainerStatus, HealthGate, MonotonicClock  # noqa: E402
from lanectl.health.probe import EndpointProbe  # noqa: E402
from lanectl.lanes.standby import SleepEndpoints, StandbyError  # noqa: E402
from lanectl.recipe.model import Health, StartupLog  # noqa: E402

MODEL_NAME = "lanectl-probe-model"
BODY_LIMIT = 1200
PROMPTS = [
    "class Stack:",
    "def parse(self, text):\n    ",
    "import os\nimport sys\n\n",
    "The quick brown fox",
    "for i in range(10):",
    "    return self._",
]


class Record:
    """Every exchange and log line of one run, in the order they happened, with offsets from launch."""

    def __init__(self, out: pathlib.Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.file = (out / "events.jsonl").open("w")
        self.figures: dict[str, Any] = {}
        self.scenario = "launch"

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def event(self, kind: str, **fields: Any) -> None:
        with self.lock:
            self.file.write(json.dumps({"t": self.now(), "scenario": self.scenario, "kind": kind, **fields}) + "\n")
            self.file.flush()

    def figure(self, key: str, value: Any) -> None:
        self.figures.setdefault(self.scenario, {})[key] = value
        print(f"  {self.scenario}.{key} = {json.dumps(value)[:300]}", flush=True)

    def close(self) -> None:
        (self.out / "figures.json").write_text(json.dumps(self.figures, indent=2) + "\n")
        self.file.close()


def trimmed(value: Any) -> Any:
    text = json.dumps(value)
    return value if len(text) <= BODY_LIMIT else {"trimmed": text[:BODY_LIMIT], "length": len(text)}


class Engine:
    """One engine process: its command, its log (read line by line, each line recorded), its exit."""

    def __init__(self, record: Record, argv: list[str], env: dict[str, str], port: int,
                 log_name: str = "engine.log") -> None:
        self.record = record
        self.base_url = f"http://127.0.0.1:{port}"
        self.lines: list[str] = []
        self.stamped: list[tuple[float, str]] = []  # (UNIX time read, line): what a log "since" reads
        self._read = 0
        record.event("launch", argv=argv, env={k: v for k, v in env.items() if k.startswith(("VLLM", "STUB"))})
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace", bufsize=1, start_new_session=True)
        self.log_file = (record.out / log_name).open("w")
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            self.stamped.append((time.time(), line))
            self.log_file.write(f"{self.record.now():9.3f} {line}\n")
            self.log_file.flush()
            self.record.event("log", line=line)

    # lanectl's health gate reads the log and the process through these two small interfaces.
    def new_lines(self) -> list[str]:
        new = self.lines[self._read:]
        self._read += len(new)
        return new

    def status(self) -> ContainerStatus:
        code = self.proc.poll()
        if code is None:
            return ContainerStatus(running=True)
        return ContainerStatus(running=False, exit_code=code, detail=f"exited with code {code}")

    def http(self, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int | str, Any]:
        """One request, recorded with its answer: (status, parsed body) or ("refused"/"timeout"/…, detail)."""
        started = time.monotonic()
        try:
            response = httpx.request(method, self.base_url + path, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            kind = "refused" if isinstance(exc, httpx.ConnectError) else type(exc).__name__
            self.record.event("http", method=method, path=path, request=trimmed(body), status=kind,
                              seconds=round(time.monotonic() - started, 3))
            return kind, str(exc)
        try:
            answer: Any = response.json()
        except ValueError:
            answer = response.text
        recorded = answer
        if path == "/metrics" and isinstance(answer, str):
            # The exposition is long; what a reader needs is which vllm: series exist, with their labels.
            recorded = sorted({line.split(" ")[0] for line in answer.splitlines() if line.startswith("vllm:")})
        self.record.event("http", method=method, path=path, request=trimmed(body), status=response.status_code,
                          response=trimmed(recorded), seconds=round(time.monotonic() - started, 3))
        return response.status_code, answer

    def engine_core_pids(self) -> list[int]:
        """vLLM's engine core runs in a child process titled VLLM::EngineCore (setproctitle)."""
        pids = []
        for proc in pathlib.Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            sid = int(stat.rsplit(")", 1)[1].split()[3])
            if "EngineCore" in cmdline and sid == self.proc.pid:
                pids.append(int(proc.name))
        return pids

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def gpu_memory_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


# ---- scenarios ------------------------------------------------------------------------------------------

def health_for(engine_kind: str, budget_minutes: float) -> Health:
    """The demo recipe's kind of rules, adapted to what this engine prints (0.26.0: two KV lines)."""
    expect = [r"KV cache size: [0-9,]+ tokens", r"Maximum concurrency for [0-9,]+ tokens per request",
              r"init engine \(profile, create kv cache, warmup model\) took"]
    return Health(startup_budget_minutes=budget_minutes, poll_interval_seconds=1, request_timeout_seconds=5,
                  served_model_name=MODEL_NAME, startup_log=StartupLog(expect=expect))


def scenario_startup(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    health = health_for(args.engine, args.budget_minutes)
    gate = HealthGate(health, EndpointProbe(engine.base_url, health), engine, engine, MonotonicClock())
    result = gate.wait()
    rec.figure("gate_passed", result.passed)
    rec.figure("gate_detail", result.detail)
    rec.figure("ready_seconds", round(result.seconds, 1))
    rec.figure("gpu_memory_mib_ready", gpu_memory_mib())
    # Which of lanectl's shipped startup rules this engine's real log satisfies (the recipes' own regexes).
    rec.figure("shipped_rules", shipped_rule_matches(engine.lines))
    if not result.passed:
        raise RuntimeError(f"the gate failed: {result.detail}")


def shipped_rule_matches(lines: list[str]) -> dict[str, Any]:
    import yaml

    found: dict[str, Any] = {}
    for path in sorted((REPO / "recipes").rglob("*.yaml")):
        text = path.read_text()
        if "startup_log" not in text:
            continue
        for rule_kind in ("expect", "forbid"):
            for pattern in _rules(yaml.safe_load(text), rule_kind):
                regex = re.compile(pattern)
                hits = [line for line in lines if startup_match(regex, line)]
                found[f"{path.relative_to(REPO)} {rule_kind} {pattern}"] = hits[:2] or "no line"
    return found


def _rules(doc: Any, kind: str) -> list[str]:
    rules: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "startup_log" and isinstance(value, dict):
                rules += [r for r in value.get(kind) or [] if isinstance(r, str)]
            else:
                rules += _rules(value, kind)
    elif isinstance(doc, list):
        for value in doc:
            rules += _rules(value, kind)
    return sorted(set(rules))


def scenario_probe(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    probe = EndpointProbe(engine.base_url, health_for(args.engine, 1))
    for name, result in (("health", probe.health_ok()), ("models", probe.models_lists_served_model()),
                         ("generate", probe.generate())):
        rec.figure(name, {"ok": result.ok, "detail": result.detail})
    engine.http("GET", "/v1/models")
    engine.http("POST", "/v1/completions", {"model": MODEL_NAME, "prompt": "Say OK.", "max_tokens": 3,
                                            "temperature": 0})
    status, metrics = engine.http("GET", "/metrics")
    if isinstance(metrics, str):
        names = sorted({m.group(1) for m in re.finditer(r"^(vllm:[a-z_:]+)", metrics, re.M)})
        rec.figure("metric_names", names)
        rec.figure("engine_sleep_state_lines", [line for line in metrics.splitlines() if "sleep_state" in line][:6])


def scenario_sleep_wake(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    endpoints = SleepEndpoints(engine.base_url, timeout=120)
    prompt, max_tokens = "The wake check:", 16
    fingerprint = endpoints.greedy_text(MODEL_NAME, prompt, max_tokens)
    rec.figure("fingerprint", fingerprint)
    engine.http("GET", "/sleep")  # 405 in 0.31.0
    engine.http("GET", "/is_sleeping")
    cycles = []
    for cycle in range(args.cycles):
        before = gpu_memory_mib()
        engine.http("POST", "/reset_prefix_cache")
        started = time.monotonic()
        try:
            endpoints.sleep(1)
        except StandbyError as exc:
            cycles.append({"cycle": cycle, "sleep_error": str(exc)})
            break
        slept = time.monotonic() - started
        asleep_mem = gpu_memory_mib()
        engine.http("GET", "/is_sleeping")
        health = engine.http("GET", "/health", timeout=5)[0]
        models = engine.http("GET", "/v1/models", timeout=5)[0]
        _, metrics = engine.http("GET", "/metrics")
        sleep_state = [line for line in metrics.splitlines() if "sleep_state" in line and not line.startswith("#")] \
            if isinstance(metrics, str) else []
        started = time.monotonic()
        endpoints.wake_up()
        woke = time.monotonic() - started
        text = endpoints.greedy_text(MODEL_NAME, prompt, max_tokens)
        cycles.append({"cycle": cycle, "sleep_s": round(slept, 3), "wake_s": round(woke, 3),
                       "gpu_mib_before": before, "gpu_mib_asleep": asleep_mem, "gpu_mib_awake": gpu_memory_mib(),
                       "health_asleep": health, "models_asleep": models, "sleep_state_asleep": sleep_state,
                       "fingerprint_same": text == fingerprint})
    rec.figure("cycles", cycles)
    rec.figure("log", [line for line in engine.lines if re.search(r"(?i)sleep|wake|CuMemAllocator", line)][-12:])


def scenario_request_while_asleep(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    endpoints = SleepEndpoints(engine.base_url, timeout=120)
    endpoints.sleep(1)
    asleep_at = time.monotonic()
    answer: dict[str, Any] = {}

    def send() -> None:
        answer["status"], answer["body"] = engine.http(
            "POST", "/v1/completions", {"model": MODEL_NAME, "prompt": "While asleep:", "max_tokens": 4,
                                        "temperature": 0}, timeout=60)
        answer["at"] = time.monotonic()

    sender = threading.Thread(target=send)
    sender.start()
    sender.join(args.asleep_wait)
    rec.figure("answered_while_asleep", not sender.is_alive())
    rec.figure("health_while_asleep", engine.http("GET", "/health", timeout=5)[0])
    wake_at = time.monotonic()
    endpoints.wake_up()
    sender.join(60)
    rec.figure("status", answer.get("status"))
    if "at" in answer:
        rec.figure("answered_seconds_after_wake_call", round(answer["at"] - wake_at, 3))
        rec.figure("waited_seconds", round(answer["at"] - asleep_at, 3))


def scenario_loadgen(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    for concurrency, requests in ((1, 4), (8, 16)):
        arm = loadgen.run_arm(engine.base_url, MODEL_NAME, PROMPTS, concurrency=concurrency, requests=requests,
                              max_tokens=64, warmup=1, timeout=120)
        rec.figure(f"c{concurrency}", {k: getattr(arm, k) for k in (
            "requests", "output_tokens", "output_tok_per_s", "decode_tok_per_s", "ms_per_step", "ttft_p50_ms",
            "itl_p50_ms", "failed", "cut")})


def scenario_teacher_forcing(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    """lanectl's teacher forcing by token ids on the engine's own greedy continuations, beside what scoring
    by text would have met: the joined text sent back through the engine's tokenizer."""
    from lanectl.bench import forcing

    rows = []
    with httpx.Client() as client:
        for prompt in PROMPTS:
            greedy = forcing.greedy_continuation(client, engine.base_url, MODEL_NAME, prompt, max_tokens=16,
                                                 top_logprobs=1)
            if isinstance(greedy, str):
                rows.append({"prompt": prompt, "error": greedy})
                continue
            ids, tokens = list(greedy.token_ids), [c.token for c in greedy.choices]
            row: dict[str, Any] = {"prompt": prompt, "tokens": tokens,
                                   "prompt_token_ids": list(greedy.prompt_token_ids), "token_ids": ids}
            joined = prompt + "".join(tokens)
            _, by_text = engine.http("POST", "/tokenize", {"model": MODEL_NAME, "prompt": joined,
                                                          "add_special_tokens": False})
            _, prompt_alone = engine.http("POST", "/tokenize", {"model": MODEL_NAME, "prompt": prompt,
                                                               "add_special_tokens": False})
            if isinstance(by_text, dict) and isinstance(prompt_alone, dict):
                expected = prompt_alone.get("tokens", []) + ids
                row["text_retokenizes_aligned"] = by_text.get("tokens") == expected
                row["retokenized_ids"] = by_text.get("tokens")
            scored = forcing.score_continuation(client, engine.base_url, MODEL_NAME, greedy.prompt_token_ids, ids,
                                                top=5)
            if isinstance(scored, str):
                row["scored_by_ids"] = scored
            else:
                row["scored_by_ids"] = {"positions": len(scored), "flips": [
                    {"position": i, "token": p.token, "logprob": round(p.logprob, 4), "top": p.top_token,
                     "top_logprob": round(p.top_logprob, 4), "margin": round(p.top_logprob - p.logprob, 4)}
                    for i, p in enumerate(scored) if p.token_id != p.top_token_id]}
            rows.append(row)
    rec.figure("prompts", rows)
    rec.figure("unscored_by_ids", sum(1 for r in rows if not isinstance(r.get("scored_by_ids"), dict)))
    rec.figure("misaligned_by_text", sum(1 for r in rows if r.get("text_retokenizes_aligned") is False))


def scenario_probes(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    for name in ("gauntlet", "needle-4k"):  # thinking asks 4096 tokens x 16: minutes of device time
        probe = load_probe(REPO / "recipes" / "workloads" / "probes" / f"{name}.yaml").probe
        rec.figure(name, run_probe(engine.base_url, MODEL_NAME, probe).summary())


def scenario_engine_kill(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    log_from = len(engine.lines)
    pids = engine.engine_core_pids()
    rec.figure("engine_core_pids", pids)
    killed_at = time.monotonic()
    if args.engine == "vllm":
        if not pids:
            raise RuntimeError("no VLLM::EngineCore process found")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    else:
        engine.http("POST", "/admin/fault", {"fault": "crash"})
    rec.event("note", text=f"engine core killed (pids {pids})")
    sequence = []
    refused = 0
    while time.monotonic() - killed_at < 20 and refused < 3:
        at = round(time.monotonic() - killed_at, 2)
        health = engine.http("GET", "/health", timeout=2)[0]
        generation, body = engine.http("POST", "/v1/completions", {"model": MODEL_NAME, "prompt": "Still there?",
                                                                   "max_tokens": 2, "temperature": 0}, timeout=2)
        sequence.append({"t": at, "health": health, "completion": generation,
                         "error": body.get("error", {}).get("message") if isinstance(body, dict) and
                         isinstance(body.get("error"), dict) else None})
        refused = refused + 1 if health == "refused" else 0
        time.sleep(0.1)
    rec.figure("sequence", sequence)
    try:
        code = engine.proc.wait(60)
    except subprocess.TimeoutExpired:
        code = None
    rec.figure("exit_code", code)
    time.sleep(0.5)
    tail = engine.lines[log_from:]
    rec.figure("fatal_lines_matched", fatal_engine_lines(tail)[:10])
    rec.figure("log_after_kill", [line for line in tail if line.strip()][:60])


def scenario_stop(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    """SIGTERM to the server's own process only, as Docker's stop reaches it through its init: the exit code
    of a stop that was asked for (under --exit-guard, the guard's, which must stay 0)."""
    log_from = len(engine.lines)
    asked_at = time.monotonic()
    os.kill(engine.proc.pid, signal.SIGTERM)
    try:
        code = engine.proc.wait(60)
    except subprocess.TimeoutExpired:
        code = None
    rec.figure("exit_code", code)
    rec.figure("seconds_to_exit", round(time.monotonic() - asked_at, 2))
    time.sleep(0.5)
    rec.figure("log_after_stop", [line for line in engine.lines[log_from:] if line.strip()][-30:])


# ---- A/A arms (issue 32) and drains (issue 31) -------------------------------------------------------

AA_CLASSES = ("prose", "code")


def _measure_arm(base_url: str, index: int, streams_list: list[int], t0: float, tag: str) -> list[dict[str, Any]]:
    """One arm of one engine, exactly as the gate's bench_lane sends it: for each class of AA_CLASSES and each
    concurrency, the coding workload's prompts of the class with a prefix of the arm's own (so no arm is served
    from another's prefix cache), max(prompts, 3 x streams) requests, warm-up min(streams, 2), 128 tokens at
    temperature 0; every request's start, finish, tokens and rate, in completion order."""
    from lanectl.bench.workload import load_workload, prefixed

    workload = load_workload(REPO / "recipes" / "workloads" / "coding.yaml")
    cells = []
    for klass in AA_CLASSES:
        prompts = [prefixed(p, f"{tag}{index:02d}-{klass[:4]}") for p in workload.prompts(klass)]
        for streams in streams_list:
            started = time.monotonic() - t0
            arm = loadgen.run_arm(base_url, MODEL_NAME, prompts, concurrency=streams,
                                  requests=max(len(prompts), 3 * streams), max_tokens=workload.max_tokens,
                                  warmup=min(streams, 2), temperature=workload.temperature, prompt_class=klass)
            done = sorted(arm.results, key=lambda r: r.finished_s)
            cells.append({"arm": index, "class": klass, "streams": streams, "started_s": round(started, 3),
                          "wall_time_s": round(arm.wall_time_s, 4), "failed": arm.failed, "cut": arm.cut,
                          "output_tok_per_s": round(arm.output_tok_per_s, 3),
                          "requests": [{"prompt": r.prompt_index, "ok": r.ok, "started_s": round(r.started_s, 4),
                                        "finished_s": round(r.finished_s, 4), "tokens": r.output_tokens,
                                        "chunks": len(r.chunk_times_s),
                                        "ttft_s": None if r.ttft_s is None else round(r.ttft_s, 4),
                                        "tok_per_s": round(r.tok_per_s, 4)} for r in done]})
    return cells


def _arm_figures(rec: Record, arms: list[dict[str, Any]], streams_list: list[int], lane: str | None = None) -> None:
    for klass in AA_CLASSES:
        for streams in streams_list:
            means = [sum(r["tok_per_s"] for r in a["requests"]) / len(a["requests"]) for a in arms
                     if a["class"] == klass and a["streams"] == streams and a.get("lane") == lane]
            if not means:
                continue
            mean = sum(means) / len(means)
            spread = (sum((m - mean) ** 2 for m in means) / (len(means) - 1)) ** 0.5 if len(means) > 1 else 0.0
            rec.figure(f"{lane + ' ' if lane else ''}{klass}@{streams}",
                       {"arms": len(means), "mean_tok_per_s": round(mean, 3),
                        "arm_sd_percent": round(100 * spread / mean, 3)})


def scenario_aa_arms(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    """Identical arms of the unchanged engine, interleaved (arm k at every concurrency of --aa-streams for each
    class, then arm k + 1), each sent as `_measure_arm` says, into aa_arms.json (rewritten after every arm, so a
    run stopped at its limit keeps the arms it finished): the A/A data that the gate's intervals are judged on.
    No arm starts once --aa-seconds would be passed by an arm as long as the longest so far."""
    streams_list = [int(s) for s in args.aa_streams.split(",")]
    arms: list[dict[str, Any]] = []
    t0 = time.monotonic()
    longest = 0.0
    for index in range(args.aa_arms):
        if time.monotonic() - t0 + longest > args.aa_seconds:
            print(f"  aa: stopped before arm {index}: the --aa-seconds budget", flush=True)
            break
        began = time.monotonic()
        arms += _measure_arm(engine.base_url, index, streams_list, t0, "aa")
        longest = max(longest, time.monotonic() - began)
        print(f"  aa arm {index} done at {time.monotonic() - t0:.1f} s", flush=True)
        (rec.out / "aa_arms.json").write_text(json.dumps({
            "engine": args.engine, "model": args.model, "workload": "recipes/workloads/coding.yaml",
            "vllm_args": args.vllm_arg, "streams": streams_list,
            "order": "arm-major: for arm, for class, for streams", "arms": arms}, indent=1) + "\n")
    _arm_figures(rec, arms, streams_list)


def scenario_ab_arms(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    """A real A/B set: lane A is the engine already up, lane B a second `vllm serve` on the same GPU with A's
    arguments plus --b-arg (e.g. a lower --max-num-seqs), started once A is ready (each with its own share of
    the GPU memory, --gpu-memory-utilization in --vllm-arg). Arms alternate A, B, A, B, ..., A (the order
    --until-decided extends a gate's A/B/A in), each sent as `_measure_arm` says, into ab_arms.json (rewritten
    after every arm); the set always ends on an A arm. Only one engine is sent requests at a time."""
    streams_list = [int(s) for s in args.aa_streams.split(",")]
    b_args = argparse.Namespace(**{**vars(args), "vllm_arg": [*args.vllm_arg, *args.b_arg], "port": args.port + 1})
    argv, env = engine_command(b_args)
    b_engine = Engine(rec, argv, env, b_args.port, log_name="engine-b.log")
    try:
        health = health_for(args.engine, args.budget_minutes)
        gate = HealthGate(health, EndpointProbe(b_engine.base_url, health), b_engine, b_engine, MonotonicClock())
        result = gate.wait()
        rec.figure("b_ready_seconds", round(result.seconds, 1))
        rec.figure("b_gate_detail", result.detail)
        if not result.passed:
            raise RuntimeError(f"lane B's gate failed: {result.detail}")
        rec.figure("gpu_memory_mib_both_ready", gpu_memory_mib())
        arms: list[dict[str, Any]] = []
        t0 = time.monotonic()
        longest = 0.0
        index = 0
        while True:
            for lane, target in (("A", engine), ("B", b_engine)):
                began = time.monotonic()
                for cell in _measure_arm(target.base_url, index, streams_list, t0, f"ab{lane}"):
                    arms.append({"lane": lane, **cell})
                longest = max(longest, time.monotonic() - began)
                print(f"  ab arm {lane}{index} done at {time.monotonic() - t0:.1f} s", flush=True)
                (rec.out / "ab_arms.json").write_text(json.dumps({
                    "engine": args.engine, "model": args.model, "workload": "recipes/workloads/coding.yaml",
                    "a_args": args.vllm_arg, "b_args": b_args.vllm_arg, "streams": streams_list,
                    "order": "A0, B0, A1, B1, ..., A(n): for arm, for class, for streams", "arms": arms},
                    indent=1) + "\n")
                # B only when the A after it fits too: the set ends on A.
                if lane == "A" and (index + 1 >= args.aa_arms or time.monotonic() - t0 + 2 * longest > args.aa_seconds):
                    _arm_figures(rec, arms, streams_list, "A")
                    _arm_figures(rec, arms, streams_list, "B")
                    return
            index += 1
    finally:
        b_engine.stop()


class StreamWatch:
    """One streaming completion in its own thread, as a client sees it: every chunk's time, how it ended
    (finish_reason, [DONE], an error, or silence past `silence` seconds: a stalled stream)."""

    def __init__(self, base_url: str, prompt: str, max_tokens: int, t0: float, silence: float = 15.0) -> None:
        self.base_url, self.prompt, self.max_tokens, self.t0, self.silence = base_url, prompt, max_tokens, t0, silence
        self.status: int | str | None = None
        self.chunks: list[float] = []
        self.tokens = 0
        self.finish_reason: str | None = None
        self.done = False
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StreamWatch:
        self.thread.start()
        return self

    def _run(self) -> None:
        body = {"model": MODEL_NAME, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
        timeout = httpx.Timeout(10.0, read=self.silence)
        try:
            with httpx.stream("POST", self.base_url + "/v1/completions", json=body, timeout=timeout) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line[len("data: "):]
                    if payload == "[DONE]":
                        self.done = True
                        continue
                    event = json.loads(payload)
                    for choice in event.get("choices") or []:
                        self.chunks.append(time.monotonic() - self.t0)
                        if choice.get("finish_reason"):
                            self.finish_reason = choice["finish_reason"]
                    if event.get("usage"):
                        self.tokens = event["usage"].get("completion_tokens", self.tokens)
        except httpx.HTTPError as exc:
            self.error = type(exc).__name__ + (f": {exc}" if str(exc) else "")

    def summary(self, signal_at: float) -> dict[str, Any]:
        return {"status": self.status, "finish_reason": self.finish_reason, "done": self.done, "error": self.error,
                "completion_tokens": self.tokens, "chunks": len(self.chunks),
                "last_chunk_after_signal_s": round(self.chunks[-1] - signal_at, 3) if self.chunks else None}


def _requests_running(engine: Engine) -> dict[str, float]:
    """vllm:num_requests_running / waiting from /metrics, summed over engines (what lanectl journals)."""
    status, text = engine.http("GET", "/metrics", timeout=5)
    found: dict[str, float] = {}
    if isinstance(text, str):
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
            if values:
                found[name] = sum(float(v) for v in values)
    return found


def _streams_in_flight(engine: Engine, count: int, max_tokens: int, t0: float) -> list[StreamWatch]:
    watches = [StreamWatch(engine.base_url, f"Stream {i}: write a long story about the sea.", max_tokens, t0).start()
               for i in range(count)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(w.chunks for w in watches):
        time.sleep(0.05)
    return watches


def scenario_drain_stop(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    """8 streaming completions in flight, then SIGTERM to the server (under --exit-guard: to the guard, which
    forwards it, as Docker's stop reaches a lane's engine). What each stream saw, what new requests got while
    the engine drained, how long it took to exit and with which code, and what the engine logged."""
    log_from = len(engine.lines)
    t0 = time.monotonic()
    watches = _streams_in_flight(engine, 8, args.drain_tokens, t0)
    time.sleep(1.0)
    rec.figure("in_flight_before_signal", _requests_running(engine))
    signal_at = time.monotonic() - t0
    os.kill(engine.proc.pid, signal.SIGTERM)
    rec.event("note", text="SIGTERM sent with 8 streams in flight")
    probes = []
    refused = 0
    while engine.proc.poll() is None and refused < 3 and time.monotonic() - t0 - signal_at < args.exit_wait:
        at = round(time.monotonic() - t0 - signal_at, 3)
        status, body = engine.http("POST", "/v1/completions", {"model": MODEL_NAME, "prompt": "A new request:",
                                                               "max_tokens": 2, "temperature": 0}, timeout=3)
        message = body.get("error", {}).get("message") if isinstance(body, dict) and isinstance(
            body.get("error"), dict) else (body if isinstance(body, str) else None)
        probes.append({"t": at, "status": status, "message": (message or "")[:200]})
        refused = refused + 1 if status == "refused" else 0
        time.sleep(0.25)
    try:
        code = engine.proc.wait(max(1.0, args.exit_wait - (time.monotonic() - t0 - signal_at)))
        exited_after = round(time.monotonic() - t0 - signal_at, 3)
    except subprocess.TimeoutExpired:
        code, exited_after = None, None
    for watch in watches:
        watch.thread.join(20)
    rec.figure("new_requests_after_signal", probes)
    rec.figure("streams", [w.summary(signal_at) for w in watches])
    rec.figure("exit_code", code)
    rec.figure("seconds_to_exit", exited_after)
    time.sleep(0.5)
    rec.figure("log_after_signal", [line for line in engine.lines[log_from:]
                                    if re.search(r"(?i)shutdown|drain|abort|signal|exit|shutting|terminat", line)][:40])


def scenario_sleep_modes(rec: Record, engine: Engine, args: argparse.Namespace) -> None:
    """8 streams in flight, then POST /sleep?level=1&mode=wait, woken; then the same with mode=abort: what the
    streams saw and how long each sleep took to answer (a sleep that waits lets in-flight requests finish)."""
    endpoints = SleepEndpoints(engine.base_url, timeout=120)
    for mode in ("wait", "abort"):
        t0 = time.monotonic()
        watches = _streams_in_flight(engine, 8, args.sleep_tokens, t0)
        time.sleep(1.0)
        running = _requests_running(engine)
        asked_at = time.monotonic() - t0
        status, body = engine.http("POST", f"/sleep?level=1&mode={mode}", timeout=120)
        answered = round(time.monotonic() - t0 - asked_at, 3)
        for watch in watches:
            watch.thread.join(30)
        sleeping = engine.http("GET", "/is_sleeping", timeout=10)
        woke = None
        try:
            started = time.monotonic()
            endpoints.wake_up()
            woke = round(time.monotonic() - started, 3)
        except StandbyError as exc:
            woke = f"wake failed: {exc}"
        rec.figure(mode, {"in_flight_before_sleep": running, "sleep_status": status, "sleep_body": body,
                          "sleep_answered_after_s": answered, "is_sleeping_after": sleeping,
                          "streams": [w.summary(asked_at) for w in watches], "wake": woke})
    rec.figure("greedy_after", endpoints.greedy_text(MODEL_NAME, "The wake check:", 8))


SCENARIOS: dict[str, Callable[[Record, Engine, argparse.Namespace], None]] = {
    "startup": scenario_startup,
    "probe": scenario_probe,
    "teacher_forcing": scenario_teacher_forcing,
    "loadgen": scenario_loadgen,
    "probes": scenario_probes,
    "sleep_wake": scenario_sleep_wake,
    "request_while_asleep": scenario_request_while_asleep,
    "engine_kill": scenario_engine_kill,
    "stop": scenario_stop,
    "aa_arms": scenario_aa_arms,
    "ab_arms": scenario_ab_arms,
    "drain_stop": scenario_drain_stop,
    "sleep_modes": scenario_sleep_modes,
}


def engine_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if args.engine == "stub":
        stub = pathlib.Path(os.environ.get("LANECTL_SRC") or REPO) / "images" / "stub-engine"
        env |= {"PYTHONPATH": str(stub), "VLLM_SERVER_DEV_MODE": "1", "STUB_ADMIN": "1",
                "STUB_LOAD_SECONDS": "1", "STUB_SLEEP_SECONDS": "0.2", "STUB_WAKE_SECONDS": "0.2"}
        if args.stub_version:
            env["STUB_VLLM_VERSION"] = args.stub_version
        # vLLM's flags too (--shutdown-timeout N): the stub reads the ones it models.
        argv = [sys.executable, "-m", "stubengine", "serve", "/model", "--enable-sleep-mode", *args.vllm_arg]
    else:
        env |= {"VLLM_SERVER_DEV_MODE": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        # The `vllm` script's shebang names the machine the wheel was built on; the module is the same CLI.
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", args.model, "--enable-sleep-mode",
                "--max-model-len", "8192", "--max-num-seqs", "32"]
        if args.dummy:
            argv += ["--load-format", "dummy"]
        argv += args.vllm_arg
    argv += ["--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(args.port)]
    if args.exit_guard:
        # As a lane image runs its engine (lanectl/image/templates/_lane/engine.j2).
        guard = pathlib.Path(os.environ.get("LANECTL_SRC") or REPO) / "lanectl" / "image" / "in_image" / "exit_guard.py"
        argv = [sys.executable, str(guard), *argv]
    return argv, env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("vllm", "stub"), required=True)
    parser.add_argument("--model", default="/tmp/models/llama-8b-shape")
    parser.add_argument("--dummy", action="store_true", help="--load-format dummy (config-only model)")
    parser.add_argument("--vllm-arg", action="append", default=[], help="one more argument for vllm serve")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--budget-minutes", type=float, default=6)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--asleep-wait", type=float, default=6)
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios, in this order")
    parser.add_argument("--exit-guard", action="store_true", help="run the engine under lanectl's exit guard")
    parser.add_argument("--aa-arms", type=int, default=16, help="aa_arms: identical arms per cell; ab_arms: A arms")
    parser.add_argument("--aa-streams", default="1,8,32", help="aa_arms, ab_arms: the concurrencies of each arm")
    parser.add_argument("--aa-seconds", type=float, default=1e9,
                        help="aa_arms, ab_arms: start no arm that would end past this many seconds")
    parser.add_argument("--b-arg", action="append", default=[], help="ab_arms: one more vllm serve argument for B")
    parser.add_argument("--drain-tokens", type=int, default=2048, help="drain_stop: tokens each stream asks for")
    parser.add_argument("--sleep-tokens", type=int, default=768, help="sleep_modes: tokens each stream asks for")
    parser.add_argument("--exit-wait", type=float, default=45, help="drain_stop: seconds to wait for the exit")
    parser.add_argument("--stub-version", help="STUB_VLLM_VERSION for --engine stub (e.g. 0.26.0, the record's)")
    args = parser.parse_args()

    rec = Record(args.out)
    argv, env = engine_command(args)
    engine = Engine(rec, argv, env, args.port)
    failed = []
    try:
        for name in args.only.split(","):
            rec.scenario = name
            print(f"== {name} at {rec.now()} s", flush=True)
            started = time.monotonic()
            try:
                SCENARIOS[name](rec, engine, args)
            except Exception as exc:  # one scenario's failure is a finding; the next still runs
                failed.append(name)
                rec.figure("error", f"{type(exc).__name__}: {exc}")
                rec.event("error", traceback=traceback.format_exc()[-3000:])
                if name == "startup":
                    break
            rec.figure("seconds", round(time.monotonic() - started, 1))
            if engine.proc.poll() is not None and name not in ("engine_kill", "stop", "drain_stop"):
                rec.figure("engine_exited", engine.proc.returncode)
                break
    finally:
        engine.stop()
        time.sleep(0.5)
        rec.close()
    print(json.dumps({"failed": failed, "out": str(args.out)}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
