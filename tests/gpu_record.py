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
    answered = [s for s in sequence if s["health"] != "refused"]
    found["kill: /health answers 200 for a moment after the engine core died"] = bool(answered) and all(
        s["health"] == 200 for s in answered)
    # A poll can straddle the close (health answered, the completion refused) or time out: both are races.
    answers = {s["completion"] for s in answered} - {"ReadTimeout", "refused"}
    found["kill: completions answered in that moment"] = sorted(answers, key=str)
    found["kill: their error"] = sorted({s["error"] for s in answered if s["error"]})
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
