"""The stub engine's command line, startup log and OpenAI-compatible HTTP API, over real HTTP."""

from __future__ import annotations

import math
import re
import socket
import threading
import time

import httpx
import pytest
from stubengine import decoding

from .stubproc import MODEL_NAME, free_port, metric, stream_events

PROD_FLAGS = [
    "--trust-remote-code",
    "--tensor-parallel-size", "1",
    "--cpu-offload-gb", "60",
    "--cpu-offload-params", "routed_experts.w13_weight", "routed_experts.w2_weight",
    "--engram-config", '{"cpu_offload": true}',
    "--speculative-config", '{"method":"dspark","num_speculative_tokens":5}',
    "--enable-auto-tool-choice",
    "--max-model-len", "4096",
    "--max-num-seqs", "16",
    "--gpu-memory-utilization=0.97",
]  # fmt: skip

# (process, line after the prefix): vLLM 0.31.0's texts, each from the module vLLM prints it from.
STARTUP_ORDER = [
    ("APIServer", r"^INFO \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\] Starting vLLM API server \(stub engine\) pid=\d+ "
     r"model=/model served_model_name=stub-test$"),
    ("APIServer", r"Ignoring vLLM flags the stub engine does not model: --trust-remote-code, --tensor-parallel-size 1, "
     r"--speculative-config \{.*\}, --enable-auto-tool-choice$"),
    ("APIServer", r"split-KV overlay: off \(stubengine\._stub_splitkv_C cannot be imported: "
     r"No module named 'stubengine\._stub_splitkv_C'\)"),
    ("EngineCore", r"^INFO .* \[gpu_model_runner\.py:\d+\] Starting to load model /model\.\.\.$"),
    ("EngineCore", r"^INFO .* \[default_loader\.py:\d+\] Loading weights took \d+\.\d\d seconds$"),
    ("EngineCore", r"^INFO .* \[uva\.py:\d+\] Total CPU offloaded parameters: 60\.0$"),
    ("EngineCore", r"^INFO .* \[engram\.py:\d+\] Engram table offloaded to pinned host memory: \d+ rows x \d+, "
     r"\d+\.\d\d GiB per rank$"),
    ("EngineCore", r"^INFO .* \[gpu_model_runner\.py:\d+\] Model loading took 12\.3000 GiB memory and "
     r"\d+\.\d{6} seconds$"),
    ("EngineCore", r"^INFO .* \[kv_cache_utils\.py:\d+\] GPU KV cache size: 4,400,013 tokens, Maximum concurrency for "
     r"4,096 tokens per request: 1074\.22x$"),
    # flashinfer's and uvicorn's own loggers: 0.31.0 puts the process prefix on vLLM's records only.
    (None, r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - INFO - autotuner\.py:\d+ - flashinfer\.jit: "
     r"\[Autotuner\]: Loaded 210 configs from /root/\.cache/vllm/flashinfer_autotune_cache/.*/autotune_configs\.json$"),
    (None, r"flashinfer\.jit: \[Autotuner\]: Autotuning process starts \.\.\.$"),
    (None, r"flashinfer\.jit: \[Autotuner\]: Autotuning process ends$"),
    ("EngineCore", r"^INFO .* \[core\.py:\d+\] init engine \(profile, create kv cache, warmup model\) took "
     r"\d+\.\d\d s$"),
    (None, r"^INFO:     Started server process \[\d+\]$"),
    (None, r"^INFO:     Waiting for application startup\.$"),
    (None, r"^INFO:     Application startup complete\.$"),
    (None, r"^INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ \(Press CTRL\+C to quit\)$"),
]


def test_startup_log_lines_in_order_with_production_flags(spawn) -> None:
    p = spawn(args=PROD_FLAGS)
    lines = list(p.lines)
    pos = 0
    for process, pattern in STARTUP_ORDER:
        head = rf"^\({process} pid=\d+\) " if process else "^"
        regex = re.compile(head + pattern.removeprefix("^") if pattern.startswith("^") else head + ".*" + pattern)
        while pos < len(lines) and not regex.search(lines[pos]):
            pos += 1
        assert pos < len(lines), f"{regex.pattern!r} missing or out of order in:\n" + "\n".join(lines)
        pos += 1
    models = httpx.get(p.url + "/v1/models").json()
    assert models["data"][0]["max_model_len"] == 4096


def test_port_is_bound_only_after_load(spawn) -> None:
    port = free_port()
    p = spawn(env={"STUB_LOAD_SECONDS": "1.0"}, port=port, ready=False)
    p.wait_line("Starting to load model")
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    p.wait_ready()
    assert p.port == port
    assert time.monotonic() - p.started >= 1.0
    assert httpx.get(p.url + "/health").status_code == 200


def test_health_models_and_unknown_route(stub) -> None:
    health = httpx.get(stub.url + "/health")
    assert health.status_code == 200 and health.content == b""
    models = httpx.get(stub.url + "/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in models["data"]] == [(MODEL_NAME, "model", 32768)]
    assert httpx.get(stub.url + "/nope").status_code == 404
    assert httpx.post(stub.url + "/admin/fault", json={"fault": "crash"}).status_code == 404  # admin is off
    assert stub.proc.poll() is None


def test_streaming_completion_shape(stub) -> None:
    events = stream_events(
        stub.url,
        "/v1/completions",
        {
            "model": MODEL_NAME,
            "prompt": "Write a haiku about GPUs",
            "max_tokens": 7,
            "logprobs": 0,
            "stream_options": {"include_usage": True},
        },
    )
    data = [e for _, e in events]
    assert data[-1] == "[DONE]"
    usage_chunk = data[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 7
    chunks = data[:-2]
    # One chunk per engine step, each with the tokens the step accepted: the prefill's one, then 1 to k + 1.
    counts = [len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks]
    assert sum(counts) == 7 and counts[0] == 1 and all(1 <= n <= 6 for n in counts), counts
    assert all(c["object"] == "text_completion" and c["model"] == MODEL_NAME for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert all(c["choices"][0]["text"] == "".join(c["choices"][0]["logprobs"]["tokens"]) for c in chunks)
    assert all(c["choices"][0]["text"].strip() for c in chunks)
    assert len({c["id"] for c in chunks}) == 1


def test_streaming_chat_shape(stub) -> None:
    events = stream_events(
        stub.url,
        "/v1/chat/completions",
        {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "logprobs": True,
            "stream_options": {"include_usage": True},
        },
    )
    data = [e for _, e in events]
    assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = data[1:-2]
    assert sum(len(c["choices"][0]["logprobs"]["content"]) for c in content) == 5
    assert all(c["object"] == "chat.completion.chunk" and c["choices"][0]["delta"]["content"] for c in content)
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert data[-2]["usage"]["completion_tokens"] == 5
    assert data[-1] == "[DONE]"


def test_stream_without_usage_has_no_usage_chunk(stub) -> None:
    data = [e for _, e in stream_events(stub.url, "/v1/completions", {"prompt": "x", "max_tokens": 3})]
    assert len(data) >= 2 and data[-1] == "[DONE]"
    assert all("usage" not in d for d in data[:-1])


def _chunk_tokens(url: str, body: dict) -> list[int]:
    events = stream_events(url, "/v1/completions", {**body, "logprobs": 0})
    return [len(e["choices"][0]["logprobs"]["tokens"]) for _, e in events if e != "[DONE]" and e["choices"]]


def test_a_speculative_chunk_carries_every_token_its_step_accepted(spawn) -> None:
    """vLLM streams a step's accepted tokens in one chunk: the stub's chunks and its own acceptance metrics
    must tell the same story (mean acceptance length = 1 + accepted / drafts)."""
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "2000"})
    counts = _chunk_tokens(p.url, {"prompt": "a long answer", "max_tokens": 300})
    m = httpx.get(p.url + "/metrics").text
    drafts = metric(m, "vllm:spec_decode_num_drafts_total")
    accepted = metric(m, "vllm:spec_decode_num_accepted_tokens_total")
    assert sum(counts) == 300 and counts[0] == 1, "the prefill step has no drafts yet"
    assert all(1 <= n <= 6 for n in counts) and max(counts) == 6 and counts.count(1) > 1, counts
    assert drafts == len(counts) - 1 == metric(m, "stub:engine_steps_total") - 1
    assert metric(m, "vllm:spec_decode_num_draft_tokens_total") == 5 * drafts
    # Every decode chunk is 1 + its step's accepted drafts, except the last, cut at max_tokens.
    assert 0 <= drafts + accepted - sum(counts[1:]) <= 5
    assert 1 + accepted / drafts == pytest.approx(2.9, abs=0.05)
    assert sum(counts[1:]) / (len(counts) - 1) == pytest.approx(2.9, abs=0.05)
    # The same rate for any prompt: how many drafts a step accepts does not depend on the text.
    assert _chunk_tokens(p.url, {"prompt": "another prompt entirely", "max_tokens": 300}) == counts
    q = spawn(env={"STUB_NUM_SPECULATIVE_TOKENS": "0"})
    assert _chunk_tokens(q.url, {"prompt": "plain decoding", "max_tokens": 20}) == [1] * 20


def test_non_streaming_matches_streaming(stub) -> None:
    body = {"model": MODEL_NAME, "prompt": "same prompt", "max_tokens": 9}
    full = httpx.post(stub.url + "/v1/completions", json=body).json()
    streamed = [e for _, e in stream_events(stub.url, "/v1/completions", body)][:-1]
    assert full["choices"][0]["text"] == "".join(c["choices"][0]["text"] for c in streamed)
    assert full["choices"][0]["finish_reason"] == "length"
    assert full["usage"]["completion_tokens"] == 9
    chat = httpx.post(
        stub.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
        },
    ).json()
    assert chat["object"] == "chat.completion"
    assert len(chat["choices"][0]["message"]["content"].split()) == 4
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 4


def test_completion_logprobs(stub) -> None:
    resp = httpx.post(
        stub.url + "/v1/completions", json={"prompt": "logprobs please", "max_tokens": 32, "logprobs": 3}
    ).json()
    lp = resp["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 32
    assert "".join(lp["tokens"]) == resp["choices"][0]["text"]
    for tok, tok_lp, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert len(top) == 3
        assert top[tok] == tok_lp == max(top.values())
    confident = sum(math.exp(x) >= 0.9 for x in lp["token_logprobs"])
    assert confident >= 24  # about 15 positions in 16 are confident


def test_chat_logprobs(stub) -> None:
    resp = httpx.post(
        stub.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 6,
            "logprobs": True,
            "top_logprobs": 2,
        },
    ).json()
    content = resp["choices"][0]["logprobs"]["content"]
    assert len(content) == 6
    for entry in content:
        assert [t["token"] for t in entry["top_logprobs"]][0] == entry["token"]
        assert len(entry["top_logprobs"]) == 2 and entry["logprob"] < 0
        assert entry["bytes"] == list(entry["token"].encode())


def test_wrong_model_is_404_and_too_long_is_400(stub) -> None:
    resp = httpx.post(stub.url + "/v1/completions", json={"model": "other", "prompt": "x"})
    assert resp.status_code == 404
    assert resp.json()["error"]["type"] == "NotFoundError"
    resp = httpx.post(stub.url + "/v1/completions", json={"prompt": "x", "max_tokens": 40000})
    assert resp.status_code == 400
    assert "maximum context length is 32768" in resp.json()["error"]["message"]


def _text(url: str, prompt: str, n: int = 24, logprobs: int | None = None) -> dict:
    body = {"prompt": prompt, "max_tokens": n}
    if logprobs is not None:
        body["logprobs"] = logprobs
    return httpx.post(url + "/v1/completions", json=body).json()["choices"][0]


def test_tokens_are_deterministic_across_servers_and_change_with_seed(spawn) -> None:
    a, b = spawn(), spawn()
    c = spawn(env={"STUB_TOKEN_SEED": "7"})
    for prompt in ("alpha", "a longer prompt about split attention"):
        ca, cb, cc = (_text(p.url, prompt, logprobs=2) for p in (a, b, c))
        assert ca == cb
        assert ca["text"] != cc["text"]
    assert _text(a.url, "alpha")["text"] != _text(a.url, "beta")["text"]


def _scored(url: str, text: str, k: int = 2) -> list[dict]:
    """vLLM's prompt logprobs of `text`, per piece: (forced piece, its logprob, the model's top piece)."""
    body = {"prompt": text, "max_tokens": 1, "temperature": 0, "prompt_logprobs": k}
    entries = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(decoding.tokenize(text))
    out = []
    for entry in entries[1:]:
        forced = next(iter(entry.values()))  # vLLM lists the prompt's own token first
        (top,) = [v for v in entry.values() if v["rank"] == 1]
        out.append({"forced": forced["decoded_token"], "logprob": forced["logprob"], "top": top["decoded_token"]})
    return out


def test_prompt_logprobs_score_a_continuation_as_generation_produced_it(spawn) -> None:
    stub = spawn()
    prompt = "Say what a write-ahead log is for."
    generated = _text(stub.url, prompt, 24, logprobs=1)["logprobs"]
    scored = _scored(stub.url, prompt + "".join(generated["tokens"]))[-24:]
    assert [s["forced"] for s in scored] == [s["top"] for s in scored] == generated["tokens"]
    assert [s["logprob"] for s in scored] == pytest.approx(generated["token_logprobs"])
    chat = httpx.post(stub.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "prompt_logprobs"


def test_flip_every_flips_confident_positions_only(spawn) -> None:
    control = spawn()
    candidate = spawn(env={"STUB_FLIP_EVERY": "4"})
    n = 64
    prompt = "flip me"  # two pieces: generated position i is position i + 2 of the text
    ref = _text(control.url, prompt, n, logprobs=2)["logprobs"]
    stream = decoding.TokenStream(prompt)
    expected = {i for i in range(n) if (i + 2 + 1) % 4 == 0 and stream.is_confident(i)}
    assert len(expected) >= 10
    # Scored on the control's own continuation (teacher forcing), the candidate prefers its runner-up
    # at exactly those positions, and nowhere else.
    scored = _scored(candidate.url, prompt + "".join(ref["tokens"]))[-n:]
    assert {i for i, s in enumerate(scored) if s["top"] != s["forced"]} == expected
    for i in expected:  # the control was sure of the token the candidate dropped
        assert math.exp(ref["token_logprobs"][i]) >= 0.93
    # Generating, the candidate continues its own text after its first flip: the two agree only before it.
    got = _text(candidate.url, prompt, n, logprobs=2)["logprobs"]
    first = min(expected)
    assert got["tokens"][:first] == ref["tokens"][:first] and got["tokens"][first] != ref["tokens"][first]
    assert ref["tokens"][first] in got["top_logprobs"][first]


def test_a_late_prefill_fault_shows_only_under_teacher_forcing(spawn) -> None:
    control = spawn()
    candidate = spawn(env={"STUB_PREFILL_FLIP_FROM": "20"})
    prompt = "Say what a write-ahead log is for."  # 7 pieces, so decoding starts at position 7
    assert len(decoding.tokenize(prompt)) == 7
    ref = _text(control.url, prompt, 32, logprobs=1)["logprobs"]
    assert _text(candidate.url, prompt, 32, logprobs=1)["logprobs"] == ref
    scored = _scored(candidate.url, prompt + "".join(ref["tokens"]))[-32:]
    stream = decoding.TokenStream(prompt)
    flipped = {i for i, s in enumerate(scored) if s["top"] != s["forced"]}
    assert flipped == {i for i in range(32) if i + 7 >= 20 and stream.is_confident(i)}
    assert len(flipped) >= 10


def test_metrics_names_labels_and_counts(stub) -> None:
    before = httpx.get(stub.url + "/metrics").text
    label = {"model_name": MODEL_NAME}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "stub:oob_draft_reads_total",
        "stub:splitkv_steps_total",
    ):
        metric(before, name, **label)
    # vLLM 0.31.0 removed the old name; its sleep-state gauge is there without development mode too.
    assert "vllm:gpu_cache_usage_perc" not in before
    assert metric(before, "vllm:engine_sleep_state", sleep_state="awake", **label) == 1
    assert metric(before, "vllm:engine_sleep_state", sleep_state="weights_offloaded", **label) == 0
    assert metric(before, "vllm:engine_sleep_state", sleep_state="discard_all", **label) == 0
    httpx.post(stub.url + "/v1/completions", json={"prompt": "count me", "max_tokens": 11})
    after = httpx.get(stub.url + "/metrics").text
    assert metric(after, "vllm:generation_tokens_total") - metric(before, "vllm:generation_tokens_total") == 11
    assert metric(after, "vllm:prompt_tokens_total") - metric(before, "vllm:prompt_tokens_total") == 2
    assert metric(after, "vllm:time_to_first_token_seconds_count") == 1
    assert metric(after, "vllm:request_success_total", finished_reason="length") == 1
    assert metric(after, "vllm:num_requests_running") == 0


def test_bad_configuration_exits_2(spawn) -> None:
    for env in ({"STUB_FAULT": "explode"}, {"VLLM_DSV41_MEGA_SPLITKV": "four"}, {"STUB_STEP_MS": "x"}):
        p = spawn(env=env, ready=False)
        assert p.wait_exit(10) == 2
        assert "error:" in p.output


def test_client_disconnect_aborts_the_request(spawn) -> None:
    p = spawn(env={"STUB_DECODE_TOKENS_PER_S": "100"})
    with httpx.stream(
        "POST", p.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1000, "stream": True}, timeout=10
    ) as resp:
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        m = httpx.get(p.url + "/metrics").text
        if metric(m, "vllm:request_success_total", finished_reason="abort") == 1:
            break
        time.sleep(0.05)
    assert metric(m, "vllm:num_requests_running") == 0
    assert metric(m, "vllm:request_success_total", finished_reason="abort") == 1
    assert metric(m, "vllm:generation_tokens_total") < 100


def test_max_num_seqs_queues_the_rest(spawn) -> None:
    p = spawn(args=["--max-num-seqs", "2"], env={"STUB_DECODE_TOKENS_PER_S": "100"})
    done: list[int] = []

    def one(i: int) -> None:
        r = httpx.post(p.url + "/v1/completions", json={"prompt": f"q{i}", "max_tokens": 200}, timeout=30)
        done.append(r.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    # All three arrive when the OS lets the threads run, and the engine admits waiting requests at its next
    # step: look until the steady state (2 running, 1 queued), and at every look, never more than 2 running.
    deadline = time.monotonic() + 10
    seen = []
    while time.monotonic() < deadline:
        m = httpx.get(p.url + "/metrics").text
        seen.append((metric(m, "vllm:num_requests_running"), metric(m, "vllm:num_requests_waiting")))
        if seen[-1] == (2, 1):
            break
        time.sleep(0.02)
    assert seen[-1] == (2, 1), seen[-10:]
    assert max(running for running, _ in seen) <= 2
    for t in threads:
        t.join(30)
    assert done == [200, 200, 200]
