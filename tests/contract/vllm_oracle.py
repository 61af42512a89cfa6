"""The installed vLLM release's and its flashinfer's own code, as the contract checks consult it (the pin, 0.31.0 with
flashinfer 0.7.0.post1, unless `make contract VLLM=X.Y.Z` installed another).

Nothing here restates what vLLM prints: log texts are read from the installed source (every logger call's format
string, found with `ast`), rendered with vLLM's own helpers and formatter, or produced by running vLLM's and
flashinfer's logging code itself. A lookup names a file and a fragment of the call it wants; when the release's code
has no such call the lookup fails and says so, which is the point.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from functools import cache
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import vllm

from lanectl.pin.log_calls import LogCall

SITE = Path(vllm.__file__).resolve().parent.parent
# How messages name the release under check: "vLLM 0.32.0".
RELEASE = f"vLLM {version('vllm')}"

# What the production box's autotune cache holds (BRIEF §2: the recipe's "Loaded 210 configs"). Any count prints
# the same line; this one makes the rendered line the one the box prints.
PRODUCTION_AUTOTUNE_CONFIGS = 210
# The release note's KV cache capacity for h1-REF/h2-REF (BRIEF §2).
PRODUCTION_KV_TOKENS = 4_400_013


@cache
def log_calls(package: str) -> tuple[LogCall, ...]:
    """Every logger call with a literal format string in an installed package (vllm, flashinfer), read by the code
    `lanectl pin check` reads a release's source with (lanectl/pin/log_calls.py)."""
    from lanectl.pin import log_calls as reader

    cache_file = Path(sys.prefix) / f".contract-log-calls-{package}.json"
    root = SITE / package
    code = hashlib.sha256(Path(reader.__file__).read_bytes()).hexdigest()[:16]
    stamp = f"{package}:{os.path.getmtime(root / '__init__.py')}:{code}"
    if cache_file.is_file():
        saved = json.loads(cache_file.read_text())
        if saved.get("stamp") == stamp:
            return tuple(LogCall(**c) for c in saved["calls"])
    calls = [call for path in sorted(root.rglob("*.py"))
             for call in reader.log_calls(path.read_text(encoding="utf-8", errors="replace"),
                                          str(path.relative_to(SITE)))]
    tmp = cache_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"stamp": stamp, "calls": [c.__dict__ for c in calls]}))
    tmp.replace(cache_file)
    return tuple(calls)


def find_call(file: str, fragment: str) -> LogCall:
    """The logger call in `file` (relative to site-packages) whose format string contains `fragment` (the first,
    when the file logs that same text from several places). A release that moved the call to another module (0.32.0
    moved the Engram table's from `models/deepseek_v41/nvidia/engram.py` to `common/engram.py`) is looked up in the
    whole package; the call found names its own file."""
    package = file.split("/", 1)[0]
    found = [c for c in log_calls(package) if c.file == file and fragment in c.template]
    if not found:
        found = [c for c in log_calls(package) if fragment in c.template]
    if len({c.template for c in found}) != 1:
        near = [c.template for c in log_calls(package) if c.file == file][:12]
        raise AssertionError(f"{file}: expected one logger call containing {fragment!r} in the installed "
                             f"{package} {version(package.replace('flashinfer', 'flashinfer-python'))}, found "
                             f"{len(found)}; its calls: {near}")
    return found[0]


# -- vLLM's own record formatting -----------------------------------------------------------------------------

@cache
def vllm_formatter() -> logging.Formatter:
    """The formatter vLLM's default logging config gives its handler (vllm/logger.py DEFAULT_LOGGING_CONFIG)."""

    from vllm import logger as vllm_logger

    # What the API server does at start (configure_logging_from_args): vLLM's record factory, which adds the
    # process name the format prints, and its handler.
    vllm_logger._configure_vllm_root_logger()
    spec = dict(vllm_logger.DEFAULT_LOGGING_CONFIG["formatters"]["vllm"])
    factory = spec.pop("()")
    module, _, name = factory.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    return cls(spec.pop("format"), spec.pop("datefmt"), **spec)


def vllm_line(call: LogCall, *values: Any, process: str = "EngineCore") -> str:
    """The line vLLM prints for `call` with `values`, in `process` (`EngineCore`, `APIServer`), as its own
    record factory and formatter make it: `(EngineCore pid=N) INFO MM-DD hh:mm:ss [file.py:NNN] message`."""
    from vllm import logger as vllm_logger

    formatter = vllm_formatter()
    vllm_logger.set_vllm_process_name(process)
    logger = logging.getLogger(call.file.removesuffix(".py").replace("/", "."))
    record = logger.makeRecord(logger.name, getattr(logging, call.level), str(SITE / call.file), call.line,
                               call.template, values, None)
    return formatter.format(record)


def format_gib(num_bytes: int) -> str:
    from vllm.utils.mem_utils import format_gib as real

    return real(num_bytes)


# -- sequences produced by running vLLM's and flashinfer's own logging code --------------------------------------

class Captured(logging.Handler):
    """The records a logger emits, each also formatted by that logger's own (first) handler's formatter."""

    def __init__(self, logger: logging.Logger, formatter: logging.Formatter | None) -> None:
        super().__init__(logging.DEBUG)
        self.logger, self.own_formatter, self.records, self.lines = logger, formatter, [], []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append((self.own_formatter or vllm_formatter()).format(record))

    def __enter__(self) -> Captured:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)


# Where vLLM's images put the engine's home (/root, the user is root): vLLM's and flashinfer's caches live under it
# unless the lane's environment moves them. The suite's stand-in for the container's filesystem is CONTAINER_ROOT
# (conftest.py), which HOME points into before flashinfer reads it at import.
CONTAINER_HOME = "/root"
# Variables that place vLLM's and flashinfer's caches, read by the autotune code at call time; a lane's value is a
# container path, rebased under CONTAINER_ROOT for the run.
CACHE_PLACEMENT_ENV = ("VLLM_CACHE_ROOT", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "FLASHINFER_AUTOTUNE_CACHE_DIR",
                       "XDG_CACHE_HOME")
# The model's own work inside flashinfer_autotune(): forward passes over the model on a GPU. They are replaced: what
# is run for real is everything around them (where the cache is looked for, loaded, published and saved, and what is
# logged about it), which is vLLM's and flashinfer's code as released. Names differ between releases.
MODEL_RUNS = ("_run_flashinfer_autotune_dummy_runs", "_run_flashinfer_bf16_autotune_dummy_run",
              "replayssm_autotune_warmup", "_autotune_kimi_k3_kda_qkvg", "autotune_hisparse_flashinfer_attention")


@dataclass(frozen=True)
class AutotuneStart:
    lines: list[str]  # what a start on a warm cache prints, in order, as vLLM's and flashinfer's handlers format it
    cache_files: list[str]  # container paths of the files the tuning start before it left behind


def container_root() -> Path:
    return Path(os.environ["HOME"]).parent


@cache
def single_rank_world() -> None:
    """vLLM's process groups for one rank on one node (gloo on the CPU), as a TP=1, PP=1 lane's worker has them."""
    import socket

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                distributed_init_method=f"tcp://127.0.0.1:{port}")
    with set_current_vllm_config(VllmConfig()):
        parallel_state.initialize_model_parallel(1, 1)


def flashinfer_autotune_start(env: dict[str, str], lane_key: str,
                              configs: int = PRODUCTION_AUTOTUNE_CONFIGS) -> AutotuneStart:
    """A lane's start on a warm autotune cache, by running the installed vLLM's `flashinfer_autotune()`
    (model_executor/warmup/kernel_warmup.py) twice in a single-rank world with the lane's environment: first as the
    start that tuned `configs` ops (its dummy runs record them, as tuning does, so vLLM's and flashinfer's own code
    decide where they are saved or published), then as the next start, whose lines are returned. The first start's
    lines are printed, not captured: silencing flashinfer's logger through `logging` would leave it silent for good
    (it is not registered with `logging`'s manager, so a level change never clears its cached answer)."""
    from flashinfer.autotuner import AutoTuner
    from flashinfer.jit.core import logger as fi_logger
    from vllm.model_executor.warmup import kernel_warmup

    single_rank_world()
    root = container_root()
    _fresh_process(env, root)
    runner = _runner(lane_key)

    def tune(_runner: Any, **_: Any) -> None:
        _record_tuned(AutoTuner.get(), configs)

    saved = {name: getattr(kernel_warmup, name) for name in MODEL_RUNS if hasattr(kernel_warmup, name)}
    try:
        for name in saved:
            setattr(kernel_warmup, name, lambda *args, **kwargs: None)
        kernel_warmup._run_flashinfer_autotune_dummy_runs = tune  # type: ignore[attr-defined]
        kernel_warmup.flashinfer_autotune(runner)
        files = sorted("/" + str(p.relative_to(root)) for p in root.rglob("*.json") if "autotune" in str(p))
        kernel_warmup._run_flashinfer_autotune_dummy_runs = lambda *args, **kwargs: None  # type: ignore[attr-defined]
        _fresh_process(env, root, keep_files=True)
        vllm_formatter()
        with Captured(logging.getLogger("vllm"), None) as captured, Captured(
                fi_logger, fi_logger.handlers[0].formatter if fi_logger.handlers else None) as fi_captured:
            fi_captured.lines = captured.lines  # one list: the two loggers' lines in the order they were printed
            kernel_warmup.flashinfer_autotune(runner)
    finally:
        for name, function in saved.items():
            setattr(kernel_warmup, name, function)
    return AutotuneStart(captured.lines, files)


def _runner(lane_key: str) -> Any:
    """What flashinfer_autotune() reads of the GPU model runner. The config hash, which needs the model's real
    config, is the lane's name; the rest is a TP=1, PP=1, DP=1 lane at -O2 without HiSparse. Its model is an empty
    module: the dummy runs that would run it are replaced (MODEL_RUNS)."""
    import torch

    config = SimpleNamespace(
        compute_hash=lambda include_version=True: lane_key,
        attention_config=SimpleNamespace(hisparse_config=None),
        kernel_config=SimpleNamespace(enable_flashinfer_autotune=True, linear_backend="auto"),
        parallel_config=SimpleNamespace(data_parallel_rank=0, pipeline_parallel_size=1, enable_elastic_ep=False),
        cache_config=SimpleNamespace(mamba_block_size=None, kv_cache_layout=None),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=8192))
    return SimpleNamespace(vllm_config=config, get_model=torch.nn.Module, speculator=None, max_num_reqs=16,
                           max_num_tokens=8192, scheduler_config=config.scheduler_config)


def _record_tuned(tuner: Any, configs: int) -> None:
    """`configs` ops tuned, recorded where flashinfer records a tuning result: the managed store attached for this
    process when there is one (autotune_v2), else the tuner's in-memory configs, which vLLM then saves."""
    store = getattr(tuner, "_managed_cache", None)
    if store is not None:
        for i in range(configs):
            key_fields = (f"op{i}", "TrtllmGenRunner", ((i,),), ())
            store.publish(str(key_fields), "TrtllmGenRunner", i % 7, key_fields=key_fields)
        return
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tuned.json"
        path.write_text(json.dumps({f"op{i}::(shape-{i},)": ["TrtllmGenRunner", i % 7] for i in range(configs)}))
        tuner.load_configs(str(path))
    tuner._dirty = True


def _fresh_process(env: dict[str, str], root: Path, keep_files: bool = False) -> None:
    """The state a new engine process starts with: the lane's cache placement, flashinfer's tuner and vLLM's
    log-once memory empty (and, unless `keep_files`, no autotune cache on the container's filesystem)."""
    import shutil

    import vllm.envs as envs
    from flashinfer.autotuner import AutoTuner
    from vllm import logger as vllm_logger

    if not keep_files:
        # Only the autotune caches: flashinfer keeps its log file open under the same home.
        for found in sorted(root.rglob("*autotune*"), key=lambda p: len(p.parts)):
            shutil.rmtree(found, ignore_errors=True) if found.is_dir() else found.unlink(missing_ok=True)
        Path(os.environ["HOME"]).mkdir(parents=True, exist_ok=True)
    for name in CACHE_PLACEMENT_ENV:
        if name in env:
            os.environ[name] = str(root / env[name].lstrip("/"))
        else:
            os.environ.pop(name, None)
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    AutoTuner._instance = None
    for name in ("_print_debug_once", "_print_info_once", "_print_warning_once", "_print_error_once"):
        once = getattr(vllm_logger, name, None)
        if once is not None and hasattr(once, "cache_clear"):
            once.cache_clear()


def kv_cache_line(kv_tokens: int, max_model_len: int, device_type: str = "cuda") -> str:
    """The KV capacity line, from vLLM's own `update_kv_cache_capacity` (v1/core/kv_cache_utils.py); only the
    capacity computation, which needs a real model's KV layout, is given the lane's numbers."""
    from vllm.v1.core import kv_cache_utils

    # attention_config: read by 0.32.0 and later (HiSparse adds host memory to the pool it names).
    config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len),
                             cache_config=SimpleNamespace(), device_config=SimpleNamespace(device_type=device_type),
                             attention_config=SimpleNamespace(hisparse_config=None))
    vllm_formatter()
    from vllm import logger as vllm_logger

    vllm_logger.set_vllm_process_name("EngineCore")
    saved = kv_cache_utils.get_kv_cache_capacity
    kv_cache_utils.get_kv_cache_capacity = lambda *_: (kv_tokens, kv_tokens / max_model_len)  # type: ignore
    try:
        with Captured(kv_cache_utils.logger, None) as captured:
            # info_once: a message seen before in this process is dropped; a fresh args tuple is a fresh message.
            kv_cache_utils.update_kv_cache_capacity(config, None)  # type: ignore[arg-type]
    finally:
        kv_cache_utils.get_kv_cache_capacity = saved
    return "\n".join(vllm_formatter().format(r) for r in captured.records) or _already_logged(
        "v1/core/kv_cache_utils.py", kv_tokens, max_model_len)


def _already_logged(file: str, kv_tokens: int, max_model_len: int) -> str:
    call = find_call(f"vllm/{file}", "KV cache size")
    return vllm_line(call, "GPU", f"{kv_tokens:,}", f"{max_model_len:,}", kv_tokens / max_model_len)


def engine_dead_traceback() -> list[str]:
    """The lines Python prints for vLLM's `EngineDeadError` raised in the API server (its own message)."""
    import traceback

    from vllm.v1.engine.exceptions import EngineDeadError

    try:
        raise EngineDeadError()
    except EngineDeadError as exc:
        return "".join(traceback.format_exception(exc)).splitlines()


# -- the arguments a role's engine receives ---------------------------------------------------------------------

@cache
def serve_parser() -> Any:
    """`vllm serve`'s own parser (entrypoints/cli/serve.py ServeSubcommand, make_arg_parser)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    return parser


def parse_serve_args(args: list[str]) -> Any:
    """`vllm serve ARGS` parsed as vLLM parses it; SystemExit (argparse's error) becomes an AssertionError."""
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed = serve_parser().parse_args(["serve", *args])
    except SystemExit:
        said = err.getvalue().strip().splitlines()
        raise AssertionError(said[-1] if said else "vllm serve refused") from None
    if getattr(parsed, "model_tag", None) is not None:
        parsed.model = parsed.model_tag
    return parsed


@cache
def serve_option_strings() -> frozenset[str]:
    """Every flag `vllm serve` knows, spelt out (its parser also takes abbreviations of them)."""
    serve = next(a for a in serve_parser()._actions if hasattr(a, "choices") and a.choices and "serve" in a.choices)
    return frozenset(s for action in serve.choices["serve"]._actions for s in action.option_strings)


def engine_args(args: list[str], model_dir: Path) -> Any:
    """`AsyncEngineArgs.from_cli_args` of `vllm serve ARGS`. A local model path (`/model`, the mount point in the
    container) is read from `model_dir` here: vLLM takes a path that does not exist for a Hugging Face repo id."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    parsed = parse_serve_args(args)
    if isinstance(parsed.model, str) and parsed.model.startswith("/"):
        model_dir.mkdir(parents=True, exist_ok=True)
        parsed.model = str(model_dir)
        if getattr(parsed, "model_tag", None):
            parsed.model_tag = str(model_dir)
    return AsyncEngineArgs.from_cli_args(parsed)
