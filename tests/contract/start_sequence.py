"""A healthy start of a lane's primary, as the vLLM release under check prints it: each line from a real format string
at its real place, formatted by vLLM's own formatter, or printed by running vLLM's and flashinfer's code itself.

Values are the lane's own (its flags parsed by vLLM's parser) or the production box's (the release note's KV
capacity, the autotune cache's 210 configs); what the lines *say* is never written here.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import vllm_oracle as oracle
from lanes import REPO, baked_args

from lanectl.image.in_image import patching
from lanectl.recipe.catalog import Lane

OVERLAY_PATCH = REPO / "patches" / "vllm" / "57711-splitkv-overlay.patch"
OVERLAY_MODULE = "vllm.models.deepseek_v41.nvidia.splitkv"
# FlashMLA #25's decode op schema at fork commit 00e9393f (BRIEF §7): what the overlay inspects the side op for.
SPLITKV_SCHEMA = ("_flashmla_splitkv_C::fused_norm_rope_attn_rope_cast_decode(..., int mega_num_splits=1, "
                  "Tensor(f!)? mega_o_accum=None, Tensor(g!)? mega_lse_accum=None) -> Tensor[]")
GiB = 1 << 30


@dataclass(frozen=True)
class StartLine:
    text: str  # the whole physical line
    source: str  # where it comes from: file:line in the installed package, or "ran <function>"


def _logged(call: oracle.LogCall, *values: Any) -> StartLine:
    return StartLine(oracle.vllm_line(call, *values), call.where)


def healthy_start(lane: Lane, workdir: Path) -> list[StartLine]:
    primary = baked_args(lane)[0]
    args = oracle.parse_serve_args(list(primary.args))
    lines = [
        _logged(oracle.find_call("vllm/v1/worker/gpu_model_runner.py", "Starting to load model"), args.model),
        _logged(oracle.find_call("vllm/model_executor/model_loader/default_loader.py", "Loading weights took"),
                96.31),
    ]
    if args.offload_backend == "uva" and args.cpu_offload_gb:
        # UVAOffloader.wrap_modules: the parameters it moved, in format_gib (a number, no unit).
        lines.append(_logged(oracle.find_call("vllm/model_executor/offloader/uva.py", "Total CPU offloaded"),
                             oracle.format_gib(int(args.cpu_offload_gb * GiB))))
    engram = getattr(args, "engram_config", None)
    if engram is not None and getattr(engram, "cpu_offload", False):
        rows, dim, block = 16_777_216, 1024, 128
        lines.append(_logged(oracle.find_call("vllm/models/deepseek_v41/nvidia/engram.py", "Engram table offloaded"),
                             rows, dim, rows * (dim + dim // block) / GiB, "per rank"))
    lines.append(_logged(oracle.find_call("vllm/v1/worker/gpu_model_runner.py", "Model loading took"),
                         oracle.format_gib(int(12.3 * GiB)), 121.5))
    lines.append(StartLine(oracle.kv_cache_line(oracle.PRODUCTION_KV_TOKENS, args.max_model_len or 1 << 20),
                           "ran vllm.v1.core.kv_cache_utils.update_kv_cache_capacity"))
    # flashinfer_autotune() (model_executor/warmup/kernel_warmup.py) on a warm cache, at -O2 on an SM >= 9.0 GPU.
    lines += [StartLine(text, "ran vllm's flashinfer_autotune() on the cache the start before it tuned")
              for text in autotune_start(lane).lines]
    overlay = splitkv_startup_line(lane, primary.env, workdir / "overlay")
    if overlay is not None:
        lines.append(overlay)
    lines.append(_logged(oracle.find_call("vllm/v1/engine/core.py", "warmup model) took %.2f s (compilation: %.2f s)"),
                         402.7, 19.75))
    return lines


_AUTOTUNE_STARTS: dict[str, oracle.AutotuneStart] = {}


def autotune_start(lane: Lane) -> oracle.AutotuneStart:
    """vLLM's own autotune start for the lane's primary, in its environment (vllm_oracle.flashinfer_autotune_start);
    run once per lane and session."""
    if lane.name not in _AUTOTUNE_STARTS:
        _AUTOTUNE_STARTS[lane.name] = oracle.flashinfer_autotune_start(baked_args(lane)[0].env, lane.name)
    return _AUTOTUNE_STARTS[lane.name]


def splitkv_startup_line(lane: Lane, env: dict[str, str], workdir: Path) -> StartLine | None:
    """The split-KV overlay's start-up line, printed by the overlay's own code (the patch h2-REF applies to vLLM
    the release under check) for the lane's environment; None for a lane that asks for no split."""
    if "VLLM_DSV41_MEGA_SPLITKV" not in env:
        return None
    patch = patching.parse_patch_file(OVERLAY_PATCH)
    if workdir.exists():
        shutil.rmtree(workdir)
    for target in patch.files:
        source = oracle.SITE / target.path
        if source.is_file():
            (workdir / target.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, workdir / target.path)
    report = patching.apply(patch, workdir)
    assert report.written, "\n".join(patching.format_report(report))
    source = workdir / "vllm/models/deepseek_v41/nvidia/splitkv.py"
    spec = importlib.util.spec_from_file_location(OVERLAY_MODULE, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[OVERLAY_MODULE] = module
    spec.loader.exec_module(module)
    # The side module is built and import-tested by the image's kernel stage; here its op is the schema it has.
    op = SimpleNamespace(default=SimpleNamespace(_schema=SPLITKV_SCHEMA))
    ops = SimpleNamespace(**{module.SIDE_NAMESPACE: SimpleNamespace(**{module.DECODE_OP: op})})
    route = module.resolve_route(env, ops, import_module=lambda name: None)
    logger = logging.getLogger(OVERLAY_MODULE)
    with oracle.Captured(logger, None) as captured:
        oracle.vllm_formatter()
        from vllm import logger as vllm_logger

        vllm_logger.set_vllm_process_name("EngineCore")
        module.log_startup(route)
    return StartLine(captured.lines[-1], f"ran the overlay's splitkv.log_startup ({OVERLAY_PATCH.name})")
