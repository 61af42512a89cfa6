"""Command line and environment of the stub engine.

The command line is vLLM's (`serve MODEL --served-model-name NAME ...`). Recipes pass the full production
flag set, so every flag the stub has no use for is accepted and reported once at startup instead of
failing the launch the way an unknown flag would fail argparse.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

USAGE = (
    "usage: python3 -m stubengine serve MODEL_PATH [--served-model-name NAME ...] [--host HOST] "
    "[--port PORT] [--max-model-len N] [--max-num-seqs N] [any other vLLM flag ...]"
)

FAULTS = ("crash", "crash_on_start", "hang", "unhealthy", "fatal_log", "slow_start",
          "wake_fail", "wake_altered", "die_asleep", "die_on_wake", "sleep_fail", "prefix_cache_held",
          "broken_tool_json", "leak_reasoning", "loop", "miss_needle")


# How many draft tokens the stub's target model agrees with at each decode step of a request, in turn: a
# fixed cycle rather than a draw, so every prompt decodes at the same rate (a benchmark's A/B/A arms vary
# their prompts, and a per-prompt acceptance would add noise no gate could see through). Mean 1.9 accepted
# drafts at k=5, i.e. a mean acceptance length of 2.9 tokens per step; 0 and 5 are in it, as real steps have.
ACCEPTED_DRAFTS_CYCLE = (2, 0, 3, 2, 1, 5, 2, 1, 2, 1)


def mean_tokens_per_step(draft_steps: int) -> float:
    """Tokens one request's decode step yields on average with this many draft steps: 1 + accepted drafts."""
    return 1 + sum(min(n, draft_steps) for n in ACCEPTED_DRAFTS_CYCLE) / len(ACCEPTED_DRAFTS_CYCLE)


class ConfigError(ValueError):
    """A flag or environment value the stub cannot run with."""


@dataclass
class Config:
    model: str
    served_model_names: list[str]
    host: str = "0.0.0.0"
    port: int = 8000
    max_model_len: int = 32768
    max_num_seqs: int = 256
    cpu_offload_gb: float | None = None
    cpu_offload_params: list[str] = field(default_factory=list)
    # --engram-config '{"cpu_offload": true}': the Engram table lives in pinned host memory.
    engram_cpu_offload: bool = False
    ignored_flags: list[tuple[str, list[str]]] = field(default_factory=list)
    # vLLM's sleep mode: the allocator that can release memory is chosen at start (--enable-sleep-mode),
    # and the routes that drive it are mounted only in development mode (VLLM_SERVER_DEV_MODE=1).
    enable_sleep_mode: bool = False
    dev_mode: bool = False

    load_seconds: float = 2.0
    slow_start_seconds: float = 30.0
    step_seconds: float = 0.01
    num_speculative_tokens: int = 5
    kv_cache_tokens: int = 4_400_013
    autotune_configs: int = 210
    autotune_stall: bool = False
    # The vLLM whose log lines the stub prints: 0.31.0 (the recipes' pin) or 0.26.0 (the GPU record's).
    vllm_version: str = "0.31.0"
    token_seed: int = 0
    flip_every: int = 0
    prefill_flip_from: int = 0
    fault: str | None = None
    fault_after_s: float = 0.0
    core_death_seconds: float = 1.0  # the record's (faults.CORE_DEATH_SECONDS)
    admin: bool = False
    oob_log_every: int = 100
    stats_interval_s: float = 10.0
    sleep_seconds: float = 0.5
    wake_seconds: float = 1.0
    sleep_refuses: bool = False
    # The GPU the stub shares (gpu.py): --gpu-memory-utilization (vLLM 0.31.0's default 0.92), the folder of the
    # engines on it, its size, what a level-1 sleep keeps on it and copies to host memory.
    gpu_memory_utilization: float = 0.92
    gpu_ledger: str | None = None
    gpu_total_gib: float = 80.0
    resident_gib: float = 1.0
    weights_gib: float = 13.15
    # The first wake a sleep fault (wake_fail, wake_altered, die_on_wake) acts on; 1: every wake.
    fault_wake: int = 1
    # vLLM's --shutdown-timeout (engine/arg_utils.py: "0 = abort, >0 = wait"): what a stop signal does to the
    # requests in flight. abort_lost: with 0, the engine core is killed before its abort outputs leave.
    shutdown_timeout: int = 0
    abort_lost: bool = False
    # Split-KV overlay, read under the real vLLM names (#57711).
    mega_splitkv: int = 0
    mega_splitkv_max_tokens: int = 8

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]


# Flags whose values the stub uses; everything else is collected as ignored.
_SINGLE = ("--model", "--host", "--port", "--max-model-len", "--max-num-seqs", "--cpu-offload-gb",
           "--engram-config", "--shutdown-timeout", "--gpu-memory-utilization")
VLLM_VERSIONS = ("0.31.0", "0.26.0")
_MULTI = ("--served-model-name", "--cpu-offload-params")
_BOOLEAN = ("--enable-sleep-mode",)


@dataclass
class ParsedArgs:
    model: str | None = None
    single: dict[str, str] = field(default_factory=dict)
    multi: dict[str, list[str]] = field(default_factory=dict)
    switches: set[str] = field(default_factory=set)
    ignored: list[tuple[str, list[str]]] = field(default_factory=list)


def parse_args(argv: Sequence[str]) -> ParsedArgs:
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        raise ConfigError(USAGE)
    if args[0] != "serve":
        raise ConfigError(f"unknown command {args[0]!r}\n{USAGE}")
    out = ParsedArgs()
    i = 1
    while i < len(args):
        token = args[i]
        i += 1
        if token in ("-h", "--help"):
            raise ConfigError(USAGE)
        if not token.startswith("--"):
            # The positional MODEL_PATH must come first (as in `vllm serve MODEL ...`): after an unknown
            # flag the stub cannot tell a value from a positional, because it does not know vLLM's flags.
            if out.model is not None or "--model" in out.single:
                raise ConfigError(f"unexpected argument {token!r}\n{USAGE}")
            out.model = token
            continue
        name, sep, inline = token.partition("=")
        values = [inline] if sep else []
        if not sep:
            # Take every following non-flag token: vLLM has nargs='+' flags (--cpu-offload-params a b),
            # and "-1" is a value, not a flag.
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        if name in _SINGLE:
            if len(values) != 1:
                raise ConfigError(f"{name} takes exactly one value, got {values!r}")
            out.single[name] = values[0]
        elif name in _BOOLEAN:
            if values:
                raise ConfigError(f"{name} takes no value, got {values!r}")
            out.switches.add(name)
        elif name in _MULTI:
            if not values:
                raise ConfigError(f"{name} needs at least one value")
            out.multi[name] = values
        else:
            out.ignored.append((name, values))
    return out


def _num(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name, "")
    if raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be >= {minimum}")
    return value


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name, "")
    if raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be >= {minimum}")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _shutdown_timeout(raw: str) -> int:
    """As vLLM reads it: argparse's `type=int`, then VllmConfig's `Field(ge=0)`."""
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"argument --shutdown-timeout: invalid int value: {raw!r}") from None
    if value < 0:
        raise ConfigError(f"--shutdown-timeout {value}: must be >= 0 (0 aborts in-flight requests, N waits N s)")
    return value


def load(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    parsed = parse_args(argv)
    model = parsed.model or parsed.single.get("--model")
    if not model:
        raise ConfigError(f"MODEL_PATH is required\n{USAGE}")
    single = parsed.single
    try:
        offload_gb = single.get("--cpu-offload-gb")
        cfg = Config(
            model=model,
            served_model_names=parsed.multi.get("--served-model-name", [model]),
            host=single.get("--host", "0.0.0.0"),
            port=int(single.get("--port", "8000")),
            max_model_len=int(single.get("--max-model-len", "32768")),
            max_num_seqs=int(single.get("--max-num-seqs", "256")),
            cpu_offload_gb=float(offload_gb) if offload_gb is not None else None,
            cpu_offload_params=parsed.multi.get("--cpu-offload-params", []),
            ignored_flags=parsed.ignored,
            enable_sleep_mode="--enable-sleep-mode" in parsed.switches,
            gpu_memory_utilization=float(single.get("--gpu-memory-utilization", "0.92")),
        )
    except ValueError as exc:
        raise ConfigError(f"bad flag value: {exc}") from None
    engram = single.get("--engram-config")
    if engram is not None:
        try:
            engram_config = json.loads(engram)
        except ValueError as exc:
            raise ConfigError(f"--engram-config {engram!r} is not JSON: {exc}") from None
        if not isinstance(engram_config, dict):
            raise ConfigError(f"--engram-config {engram!r} must be a JSON object")
        cfg.engram_cpu_offload = engram_config.get("cpu_offload") is True
    if not 0 <= cfg.port <= 65535:
        raise ConfigError(f"--port {cfg.port} out of range")
    if cfg.max_model_len < 1 or cfg.max_num_seqs < 1:
        raise ConfigError("--max-model-len and --max-num-seqs must be >= 1")
    cfg.shutdown_timeout = _shutdown_timeout(single.get("--shutdown-timeout", "0"))

    cfg.load_seconds = _num(env, "STUB_LOAD_SECONDS", 2.0)
    cfg.slow_start_seconds = _num(env, "STUB_SLOW_START_SECONDS", 30.0)
    rate = _num(env, "STUB_DECODE_TOKENS_PER_S", 100.0, minimum=1e-6)
    step_ms = env.get("STUB_STEP_MS", "").strip()
    cfg.num_speculative_tokens = _int(env, "STUB_NUM_SPECULATIVE_TOKENS", 5)
    # The rate is a single stream's tokens per second; a speculative step carries several tokens, so a step
    # lasts as long as its mean number of tokens takes at that rate.
    per_step = mean_tokens_per_step(cfg.num_speculative_tokens)
    cfg.step_seconds = _num(env, "STUB_STEP_MS", 0.0, minimum=1e-6) / 1000.0 if step_ms else per_step / rate
    cfg.kv_cache_tokens = _int(env, "STUB_KV_CACHE_TOKENS", 4_400_013, minimum=1)
    cfg.autotune_configs = _int(env, "STUB_AUTOTUNE_CONFIGS", 210)
    cfg.autotune_stall = _flag(env, "STUB_AUTOTUNE_STALL")
    version = env.get("STUB_VLLM_VERSION", "").strip() or "0.31.0"
    if version not in VLLM_VERSIONS:
        raise ConfigError(f"STUB_VLLM_VERSION={version!r}: expected one of {', '.join(VLLM_VERSIONS)}")
    cfg.vllm_version = version
    cfg.token_seed = _int(env, "STUB_TOKEN_SEED", 0, minimum=-(2**63))
    cfg.flip_every = _int(env, "STUB_FLIP_EVERY", 0)
    cfg.prefill_flip_from = _int(env, "STUB_PREFILL_FLIP_FROM", 0)
    cfg.fault_after_s = _num(env, "STUB_FAULT_AFTER_S", 0.0)
    cfg.core_death_seconds = _num(env, "STUB_CORE_DEATH_SECONDS", 1.0)
    cfg.admin = _flag(env, "STUB_ADMIN")
    cfg.oob_log_every = _int(env, "STUB_OOB_LOG_EVERY", 100, minimum=1)
    cfg.stats_interval_s = _num(env, "STUB_STATS_INTERVAL_S", 10.0)
    cfg.sleep_seconds = _num(env, "STUB_SLEEP_SECONDS", 0.5)
    cfg.wake_seconds = _num(env, "STUB_WAKE_SECONDS", 1.0)
    cfg.sleep_refuses = _flag(env, "STUB_SLEEP_REFUSES")
    if not 0 < cfg.gpu_memory_utilization <= 1:
        raise ConfigError(f"--gpu-memory-utilization {cfg.gpu_memory_utilization}: must be in (0, 1]")
    cfg.gpu_ledger = env.get("STUB_GPU_LEDGER", "").strip() or None
    cfg.gpu_total_gib = _num(env, "STUB_GPU_TOTAL_GIB", 80.0, minimum=1e-3)
    cfg.resident_gib = _num(env, "STUB_RESIDENT_GIB", 1.0)
    cfg.weights_gib = _num(env, "STUB_WEIGHTS_GIB", 13.15)
    cfg.fault_wake = _int(env, "STUB_FAULT_WAKE", 1, minimum=1)
    cfg.abort_lost = _flag(env, "STUB_ABORT_LOST")
    cfg.dev_mode = _flag(env, "VLLM_SERVER_DEV_MODE")
    fault = env.get("STUB_FAULT", "").strip().lower()
    if fault and fault != "none":
        if fault not in FAULTS:
            raise ConfigError(f"STUB_FAULT={fault!r}: expected one of {', '.join(FAULTS)}")
        cfg.fault = fault
    # Parsed like vLLM's envs.py parses them: an integer or the default, anything else is an error.
    cfg.mega_splitkv = _int(env, "VLLM_DSV41_MEGA_SPLITKV", 0)
    cfg.mega_splitkv_max_tokens = _int(env, "VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS", 8)
    return cfg
