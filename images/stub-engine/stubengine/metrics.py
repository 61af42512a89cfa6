"""Prometheus text exposition under vLLM's metric names, plus the stub's own `stub:` counters.

Written by hand because the image has no prometheus_client; the output follows the text format 0.0.4
that vLLM's /metrics serves, with the same `engine` and `model_name` labels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# vLLM's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1


@dataclass
class Gauges:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.request_success: dict[str, int] = {}
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted_tokens = 0
        self.oob_draft_reads = 0
        self.splitkv_steps = 0
        self.engine_steps = 0
        self.gauges: Callable[[], Gauges] = Gauges
        self.sleep_state = {"awake": 1, "weights_offloaded": 0, "discard_all": 0}

    def set_sleep_state(self, *, asleep: bool, level: int) -> None:
        """vLLM's record_sleep_state: awake 0 while asleep at any level, and the level's own flag."""
        with self._lock:
            self.sleep_state = {"awake": int(not asleep), "weights_offloaded": int(asleep and level == 1),
                                "discard_all": int(asleep and level == 2)}

    def add(self, **counters: int) -> None:
        with self._lock:
            for name, value in counters.items():
                setattr(self, name, getattr(self, name) + value)

    def observe_ttft(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def finished(self, reason: str) -> None:
        with self._lock:
            self.request_success[reason] = self.request_success.get(reason, 0) + 1

    def render(self) -> str:
        labels = f'engine="0",model_name="{_escape(self.model_name)}"'
        gauges = self.gauges()
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float, extra: str = "") -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.append(f"{name}{{{labels}{extra}}} {float(value)!r}")

        with self._lock:
            metric(
                "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", gauges.running
            )
            metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", gauges.waiting)
            metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", gauges.kv_usage)
            # vLLM 0.31.0 no longer has vllm:gpu_cache_usage_perc (kv_cache_usage_perc took its place).
            name = "vllm:engine_sleep_state"
            out.append(f"# HELP {name} Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means "
                       "engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
                       "level 2.")
            out.append(f"# TYPE {name} gauge")
            for state, value in self.sleep_state.items():
                out.append(f'{name}{{{labels},sleep_state="{state}"}} {float(value)!r}')
            metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens)
            metric(
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                self.generation_tokens,
            )
            out.append("# HELP vllm:request_success_total Count of successfully processed requests.")
            out.append("# TYPE vllm:request_success_total counter")
            for reason in sorted(set(self.request_success) | {"length", "stop", "abort"}):
                value = float(self.request_success.get(reason, 0))
                out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {value!r}')
            name = "vllm:time_to_first_token_seconds"
            out.append(f"# HELP {name} Histogram of time to first token in seconds.")
            out.append(f"# TYPE {name} histogram")
            for bound, count in zip(self.ttft.buckets, self.ttft.counts, strict=True):
                out.append(f'{name}_bucket{{{labels},le="{bound!r}"}} {float(count)!r}')
            out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.ttft.n)!r}')
            out.append(f"{name}_count{{{labels}}} {float(self.ttft.n)!r}")
            out.append(f"{name}_sum{{{labels}}} {self.ttft.total!r}")
            metric("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", self.spec_drafts)
            metric(
                "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", self.spec_draft_tokens
            )
            metric(
                "vllm:spec_decode_num_accepted_tokens_total",
                "counter",
                "Number of accepted tokens.",
                self.spec_accepted_tokens,
            )
            metric(
                "stub:oob_draft_reads_total",
                "counter",
                "Rejection-sampler reads past the end of the draft buffer (vLLM #60945).",
                self.oob_draft_reads,
            )
            metric(
                "stub:splitkv_steps_total",
                "counter",
                "Engine steps that ran split-KV decode attention.",
                self.splitkv_steps,
            )
            metric("stub:engine_steps_total", "counter", "Engine steps run.", self.engine_steps)
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
