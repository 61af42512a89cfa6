"""What lanectl depends on in a recorded run of gpu/vllm_serve/run.py, as plain facts.

The same function reads the real vLLM's record (gpu/record/, made on the H200) and a run of the same
scenarios against the stub engine; the replay test compares the two. A fact is what one of lanectl's
readers acts on: a status, a field, the order of events, a line its rules read. Timings and model
outputs are not facts here: random weights and a CPU stub share neither.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lanectl.health.engine_log import fatal_engine_lines

RECORD = Path(__file__).resolve().parents[1] / "gpu" / "record"
# A record from vLLM's own logger: "(EngineCore pid=752) INFO 12-01 16:31:40 [kv_cache_utils.py:2177] ...".
VLLM_RECORD = re.compile(r"^(?:\((?P<process>\w+) pid=\d+\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                         r"\d\d-\d\d \d\d:\d\d:\d\d \[(?P<file>[\w.]+):\d+\] (?P<message>.*)$")
UVICORN = re.compile(r"^(?:\((?P<process>\w+) pid=\d+\) )?INFO: +(?P<message>.*)$")


def load(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    return events, json.loads((run / "figures.json").read_text())


def _lines(events: list[dict[str, Any]], scenario: str | None = None) -> list[str]:
    return [e["line"] for e in events if e["kind"] == "log" and (scenario is None or e["scenario"] == scenario)]


def _record(lines: list[str], pattern: str) -> dict[str, str] | None:
    """The first vLLM log record whose message matches `pattern`: its process, level, file and message."""
    for line in lines:
        match = VLLM_RECORD.match(line) or UVICORN.match(line)
        if match and re.search(pattern, match.group("message")):
            found = match.groupdict()
            return {"process": found["process"] or "", "level": found.get("level") or "INFO",
                    "file": found.get("file") or "uvicorn", "message": found["message"]}
    return None


def _http(events: list[dict[str, Any]], scenario: str, method: str, path: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "http" and e["scenario"] == scenario and e["method"] == method
            and e["path"].split("?")[0] == path]


def facts(events: list[dict[str, Any]], figures: dict[str, Any]) -> dict[str, Any]:
    start = _lines(events, "launch") + _lines(events, "startup")
    found: dict[str, Any] = {}

    def milestone(pattern: str) -> int | None:
        return next((i for i, line in enumerate(start) if re.search(pattern, line)), None)

    order = [milestone(p) for p in (r"Model loading took", r"KV cache size", r"init engine \(",
                                    r"Application startup complete")]
    found["startup: gate passed with the KV and init-engine rules"] = figures["startup"].get("gate_passed")
    found["startup: load, KV size, init engine, API up, in that order"] = (
        None not in order and order == sorted(order))
    found["startup: lines that carry the KV cache size and the maximum concurrency"] = sum(
        1 for line in start if re.search(r"KV cache size|Maximum concurrency for", line))
    kv = _record(start, r"KV cache size: [0-9,]+ tokens")
    found["startup: the KV line is a record of"] = kv and (kv["process"], kv["level"], kv["file"])
    up = _record(start, r"^Application startup complete\.$")
    found["startup: uvicorn's startup line is printed by"] = up and up["process"]

    probe = figures.get("probe", {})
    for key in ("health", "models", "generate"):
        found[f"probe: {key} ok"] = (probe.get(key) or {}).get("ok")

    sleep = figures.get("sleep_wake", {})
    cycles = sleep.get("cycles", [])
    found["sleep: GET /sleep"] = [e["status"] for e in _http(events, "sleep_wake", "GET", "/sleep")]
    resets = _http(events, "sleep_wake", "POST", "/reset_prefix_cache")
    found["sleep: POST /reset_prefix_cache answers"] = sorted({(e["status"], json.dumps(e.get("response")))
                                                               for e in resets})
    answers = [(e.get("response") or {}).get("is_sleeping") for e in _http(events, "sleep_wake", "GET", "/is_sleeping")]
    found["sleep: /is_sleeping before the first sleep, then after each"] = answers[:1] + sorted(set(answers[1:]))
    found["sleep: /health while asleep"] = sorted({c.get("health_asleep") for c in cycles})
    found["sleep: /v1/models while asleep"] = sorted({c.get("models_asleep") for c in cycles})
    found["sleep: greedy output the same after every wake"] = all(c.get("fingerprint_same") for c in cycles)
    for pattern in (r"^Sleep mode freed [0-9.]+ GiB memory, [0-9.]+ GiB memory is still in use\.$",
                    r"^It took [0-9.]+ seconds to fall asleep\.$",
                    r"^It took [0-9.]+ seconds to wake up tags"):
        hit = _record(_lines(events, "sleep_wake"), pattern)
        found[f"sleep: a record matching {pattern}"] = hit and (hit["process"], hit["level"])

    asleep = figures.get("request_while_asleep", {})
    found["asleep: a completion sent while asleep is answered before the wake"] = asleep.get("answered_while_asleep")
    found["asleep: /health while asleep"] = asleep.get("health_while_asleep")
    found["asleep: that completion's status once woken"] = asleep.get("status")

    forced = figures.get("teacher_forcing", {})
    found["teacher forcing: prompts unscored by ids"] = forced.get("unscored_by_ids")
    rows = forced.get("prompts", [])
    found["teacher forcing: every greedy answer carried prompt_token_ids and token_ids"] = bool(rows) and all(
        isinstance(r.get("prompt_token_ids"), list) and isinstance(r.get("token_ids"), list) for r in rows)

    for arm in ("c1", "c8"):
        found[f"loadgen {arm}: failed requests"] = (figures.get("loadgen", {}).get(arm) or {}).get("failed")

    kill = figures.get("engine_kill", {})
    sequence = kill.get("sequence", [])
    # Polls that got an HTTP answer: one at the moment the port closed can be reset or time out instead.
    answered = [s for s in sequence if isinstance(s["health"], int)]
    # Outcomes, not the window: whether a poll caught the moment the API server outlived its engine core depends on
    # how busy the machine was (the record's own polls say how long it lasted; kill_window() reads it).
    found["kill: /health answered nothing but 200 until the port refused"] = all(s["health"] == 200 for s in answered)
    # A poll can straddle the close (health answered, the completion refused or reset) or time out: races, so only
    # the completions that got an HTTP answer count.
    completions = [s for s in answered if isinstance(s["completion"], int)]
    found["kill: every completion answered after the kill failed with 500"] = all(
        s["completion"] == 500 for s in completions)
    found["kill: every error said the engine core had an issue"] = all(
        (s["error"] or "").startswith("EngineCore encountered an issue.") for s in completions)
    found["kill: then the port refuses"] = bool(sequence) and sequence[-1]["health"] == "refused"
    found["kill: exit code"] = kill.get("exit_code")
    after = _lines(events, "engine_kill")
    hit = _record(after, r"engine core exited unexpectedly")
    found["kill: 'engine core exited unexpectedly' is a record of"] = hit and (hit["process"], hit["level"],
                                                                               hit["file"])
    dead = _record(after, r"EngineDeadError")
    found["kill: an EngineDeadError record"] = dead and (dead["process"], dead["level"])
    # lanectl's rules of today over the recorded lines, not what the run's lanectl made of them.
    found["kill: lines lanectl's fatal rules believe"] = len(fatal_engine_lines(after)) > 0
    return found


def kill_window(figures: dict[str, Any]) -> tuple[float | None, float | None]:
    """From a run's own polls after the engine core was killed: the last moment /health still answered (None: no poll
    caught one) and the first moment the port refused, in seconds after the kill."""
    sequence = figures.get("engine_kill", {}).get("sequence", [])
    answered = [s["t"] for s in sequence if isinstance(s["health"], int)]
    refused = [s["t"] for s in sequence if s["health"] == "refused"]
    return (max(answered) if answered else None, min(refused) if refused else None)


# -- stops and sleeps with requests in flight (run.py's drain_stop and sleep_modes) ---------------------------------

def stream_ending(stream: dict[str, Any]) -> str:
    """How one streaming completion in flight ended, as its client saw it."""
    finish, done, error = stream.get("finish_reason"), stream.get("done"), stream.get("error") or ""
    if finish and done:
        return "finished" if finish in ("length", "stop") else f"ended with finish_reason {finish}"
    if not finish and not done and error.startswith("ReadTimeout"):
        return "stalled: no byte more, the connection held open"
    if not finish and not done and error:
        return f"cut: {error.split(':', 1)[0]}"
    return f"finish_reason {finish}, [DONE] {done}, error {error.split(':', 1)[0] or None}"


def _endings(streams: list[dict[str, Any]]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for stream in streams:
        counts[stream_ending(stream)] = counts.get(stream_ending(stream), 0) + 1
    return sorted(counts.items())


def _error_message(response: Any) -> str | None:
    error = response.get("error") if isinstance(response, dict) else None
    return error.get("message") if isinstance(error, dict) else None


def drain_facts(events: list[dict[str, Any]], figures: dict[str, Any], timeout: int) -> dict[str, Any]:
    """A stop (SIGTERM) with 8 streams in flight at --shutdown-timeout `timeout`, and, where the run has them, the
    sleeps with streams in flight: what lanectl's switch and its reports rely on."""
    stop = figures.get("drain_stop", {})
    lines = _lines(events, "drain_stop")
    head = f"drain {timeout}:"
    found: dict[str, Any] = {}
    found[f"{head} requests running before the signal"] = (stop.get("in_flight_before_signal") or {}).get(
        "vllm:num_requests_running")
    mode = next((m.group(1) for line in lines if (m := re.search(r"stopping engine client (mode=\w+ timeout=\d+s)",
                                                                  line))), None)
    found[f"{head} the API server stops its engine client with"] = mode
    counted = next((m.groups() for line in lines if (m := re.search(r"EngineCore: (aborting|draining) in-flight "
                                                                     r"requests count=(\d+)", line))), None)
    found[f"{head} the engine core says it is"] = counted and (counted[0], int(counted[1]))
    found[f"{head} the engine core is killed"] = any("force killing remaining process" in line for line in lines)
    found[f"{head} the streams in flight ended"] = _endings(stop.get("streams", []))
    # New requests sent while it stopped (a text prompt each, as a client sends).
    asked = [e for e in _http(events, "drain_stop", "POST", "/v1/completions")
             if (e.get("request") or {}).get("prompt") == "A new request:"]
    found[f"{head} a new request was served a token while it stopped"] = any(
        e["status"] == 200 and ((e.get("response") or {}).get("usage") or {}).get("completion_tokens") for e in asked)
    # Failed, refused, reset: each came back at once; none was left waiting (a probe gives up after 3 s).
    found[f"{head} no new request was left waiting for an answer"] = not any(
        str(e["status"]).endswith("Timeout") for e in asked)
    # Which of those it was depends on when each request came (0.26.0's uvicorn stopped listening within 0.1 s).
    found[f"{head} what a new request got, when answered"] = sorted({
        (e["status"], _error_message(e.get("response"))) for e in asked if isinstance(e["status"], int)}, key=str)
    found[f"{head} exit code"] = stop.get("exit_code")
    sleeps = figures.get("sleep_modes", {})
    for sleep_mode in ("wait", "abort"):
        cycle = sleeps.get(sleep_mode)
        if cycle is None:
            continue
        found[f"sleep mode={sleep_mode}: the streams in flight ended"] = _endings(cycle.get("streams", []))
        found[f"sleep mode={sleep_mode}: the sleep answered"] = cycle.get("sleep_status")
        asleep = cycle.get("is_sleeping_after") or [None, None]
        found[f"sleep mode={sleep_mode}: /is_sleeping after"] = (asleep[1] or {}).get("is_sleeping") if isinstance(
            asleep[1], dict) else asleep[1]
        found[f"sleep mode={sleep_mode}: woke"] = isinstance(cycle.get("wake"), (int, float))
    return found


# -- the standby check against a real vLLM (issue 55): gpu/record/standby-1b/ ---------------------------------------

STANDBY_RECORD = RECORD / "standby-1b"
# run.py's engine logs put each line after its offset in seconds from launch: "   52.921 (EngineCore pid=911) INFO …".
LOG_OFFSET = re.compile(r"^ *[0-9]+\.[0-9]{3} ")
FELL_ASLEEP = re.compile(r"It took ([0-9.]+) seconds to fall asleep\.")
WOKE = re.compile(r"It took ([0-9.]+) seconds to wake up")


def standby_report(run: str) -> dict[str, Any]:
    """report.json of the record's `uva` run (UVA offload, two starts beside it) or its `control` (no offload)."""
    report: dict[str, Any] = json.loads((STANDBY_RECORD / run / "report.json").read_text())
    return report


def engine_lines(run: str, log: str = "engine.log") -> list[str]:
    """One of a run's engine logs, each line as the engine printed it."""
    return [LOG_OFFSET.sub("", line, count=1) for line in (STANDBY_RECORD / run / log).read_text().splitlines()]


def standby_stub_env(run: str) -> dict[str, str]:
    """The stub told to sleep and wake as the record's engine did: the GPU's size as vLLM saw it, the GPU memory it
    kept asleep, the host memory a sleep took, and vLLM's own seconds to fall asleep and to wake (the median of its
    lines; the seconds a sleep with streams in flight takes on top are the streams' own)."""
    from statistics import median

    memory = standby_report(run)["check"]["memory"]
    log = "\n".join(engine_lines(run))
    # The stub takes no host memory: it logs as backed up what the check took a sleep to take, the larger of vLLM's
    # "backed up in CPU" and MemAvailable's fall (1.09 GiB against 0.97 logged with UVA).
    weights = max(memory["backed_up_gib_logged"], memory["host_taken_gib"])
    return {"STUB_GPU_TOTAL_GIB": f"{memory['gpu_memory_gib']:g}",
            "STUB_RESIDENT_GIB": f"{memory['resident_gib_logged']:g}",
            "STUB_WEIGHTS_GIB": f"{weights:g}",
            "STUB_SLEEP_SECONDS": f"{median(float(s) for s in FELL_ASLEEP.findall(log)):.3f}",
            "STUB_WAKE_SECONDS": f"{median(float(s) for s in WOKE.findall(log)):.3f}"}
