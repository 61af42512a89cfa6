"""The #57711-derived split-KV overlay (patches/vllm/57711-splitkv-overlay.patch), on the CPU.

The overlay's decision and routing live in a torch-free module the patch creates; these tests load
that module from the patch itself, so they test exactly what the image gets. The ops are small fakes
of the two namespaces behind the same call shape; the GPU side is in gpu/ (see gpu/RESULTS.md).
"""

from __future__ import annotations

import importlib.util
import logging
import py_compile
import tarfile
import types
from pathlib import Path

import pytest

from lanectl.image.in_image import patching
from lanectl.project import cache_dir
from tests.conftest import REPO

OVERLAY = REPO / "patches" / "vllm" / "57711-splitkv-overlay.patch"
SPLITKV = "vllm/models/deepseek_v41/nvidia/splitkv.py"
MEGA_ATTN = "vllm/models/deepseek_v41/nvidia/flash_mla_mega_attn.py"
COMBINE = "vllm/models/deepseek_v41/nvidia/ops/splitkv_combine.py"
H2_ENV = {"VLLM_DSV41_MEGA_SPLITKV": "4", "VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS": "6"}


def created_file(path: str) -> str:
    patch = patching.parse_patch_file(OVERLAY)
    (section,) = [f for f in patch.files if f.path == path]
    assert section.creates
    return "".join(section.hunks[0].new_lines)


@pytest.fixture(scope="module")
def splitkv(tmp_path_factory: pytest.TempPathFactory) -> types.ModuleType:
    path = tmp_path_factory.mktemp("overlay") / "splitkv.py"
    path.write_text(created_file(SPLITKV))
    spec = importlib.util.spec_from_file_location("vllm.models.deepseek_v41.nvidia.splitkv", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeOp:
    """One op of a namespace: records its calls; `schema` is what torch would print for it."""

    def __init__(self, schema: str) -> None:
        self.calls: list[tuple] = []
        self.default = types.SimpleNamespace(_schema=schema)

    def __call__(self, *args: object) -> None:
        self.calls.append(args)


STOCK_SCHEMA = "_flashmla_C::fused_norm_rope_attn_rope_cast_decode(Tensor q, ...) -> Tensor[]"
SIDE_SCHEMA = ("_flashmla_splitkv_C::fused_norm_rope_attn_rope_cast_decode(Tensor q, ..., int mega_num_splits=1, "
               "Tensor(f!)? mega_o_accum=None, Tensor(g!)? mega_lse_accum=None) -> Tensor[]")


def fake_torch_ops(side_schema: str | None = SIDE_SCHEMA) -> types.SimpleNamespace:
    """torch.ops with the stock namespace, and the side one once its module is imported."""
    ops = types.SimpleNamespace(_flashmla_C=types.SimpleNamespace(
        fused_norm_rope_attn_rope_cast_decode=FakeOp(STOCK_SCHEMA)))
    if side_schema is not None:
        ops._flashmla_splitkv_C = types.SimpleNamespace(fused_norm_rope_attn_rope_cast_decode=FakeOp(side_schema))
    return ops


def imported(name: str) -> object:
    assert name == "vllm._flashmla_splitkv_C"
    return types.ModuleType(name)


def missing(name: str) -> object:
    raise ImportError(f"No module named '{name}'")


@pytest.mark.parametrize(("decodes", "tokens", "splits"), [
    (1, 6, True),   # the one shape the release note splits
    (1, 5, False),  # fewer query tokens (a shorter draft)
    (1, 7, False),
    (2, 6, False),  # two requests of 3 tokens
    (2, 12, False),
    (0, 0, False),
])
def test_only_one_request_of_exactly_max_tokens_splits(splitkv, decodes, tokens, splits):
    route = splitkv.resolve_route(H2_ENV, fake_torch_ops(), imported)
    assert route.splits(decodes, tokens) is splits


@pytest.mark.parametrize(("env", "why"), [
    ({}, "VLLM_DSV41_MEGA_SPLITKV=0"),
    ({"VLLM_DSV41_MEGA_SPLITKV": "1"}, "VLLM_DSV41_MEGA_SPLITKV=1"),
    ({"VLLM_DSV41_MEGA_SPLITKV": "3"}, "VLLM_DSV41_MEGA_SPLITKV=3 is not a power of two between 2 and 8"),
    ({"VLLM_DSV41_MEGA_SPLITKV": "16"}, "VLLM_DSV41_MEGA_SPLITKV=16 is not a power of two between 2 and 8"),
    ({"VLLM_DSV41_MEGA_SPLITKV": "4", "VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS": "0"},
     "VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS=0 is below 1"),
    ({"VLLM_DSV41_MEGA_SPLITKV": "four"},
     "VLLM_DSV41_MEGA_SPLITKV='four' / VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS='8' are not integers"),
])
def test_settings_that_do_not_split_say_why(splitkv, env, why):
    route = splitkv.resolve_route(env, fake_torch_ops(), imported)
    assert route.plan is None and not route.splits(1, 6)
    assert route.startup_line == f"split-KV overlay: off ({why}); every call unsplit on torch.ops._flashmla_C"


def test_the_start_up_line_names_the_settings_and_both_namespaces(splitkv, caplog):
    route = splitkv.resolve_route(H2_ENV, fake_torch_ops(), imported)
    with caplog.at_level(logging.INFO):
        splitkv.log_startup(route)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [(
        "INFO",
        "split-KV overlay: on, 4 splits at 1 request x 6 query tokens via torch.ops._flashmla_splitkv_C; "
        "every other call unsplit on torch.ops._flashmla_C")]
    # The regex h2-REF's health gate requires matches it.
    assert "split-KV overlay: on, 4 splits at 1 request x 6 query tokens" in route.startup_line


def test_a_missing_side_module_is_one_warning_and_no_split(splitkv, caplog):
    route = splitkv.resolve_route(H2_ENV, fake_torch_ops(side_schema=None), missing)
    with caplog.at_level(logging.INFO):
        splitkv.log_startup(route)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [(
        "WARNING",
        "split-KV overlay: off (vllm._flashmla_splitkv_C cannot be imported (No module named "
        "'vllm._flashmla_splitkv_C')); every call unsplit on torch.ops._flashmla_C")]
    assert not route.splits(1, 6)


def test_support_is_read_from_the_side_ops_schema_not_the_stock_one(splitkv):
    # A side build without the argument (the wrong source) is refused, even though it imports.
    old = splitkv.resolve_route(H2_ENV, fake_torch_ops(side_schema=STOCK_SCHEMA.replace("_flashmla_C",
                                                                                        "_flashmla_splitkv_C")),
                                imported)
    assert old.plan is None and old.degraded
    assert "has no mega_num_splits argument (not the split-KV build)" in old.startup_line
    # A stock op that gained the argument does not make the overlay use the stock op.
    ops = fake_torch_ops()
    ops._flashmla_C.fused_norm_rope_attn_rope_cast_decode.default._schema = SIDE_SCHEMA
    route = splitkv.resolve_route(H2_ENV, ops, imported)
    assert route.side_op is ops._flashmla_splitkv_C.fused_norm_rope_attn_rope_cast_decode


def test_split_calls_go_to_the_side_namespace_and_everything_else_to_the_stock_one(splitkv):
    ops = fake_torch_ops()
    stock = ops._flashmla_C.fused_norm_rope_attn_rope_cast_decode
    side = ops._flashmla_splitkv_C.fused_norm_rope_attn_rope_cast_decode
    route = splitkv.resolve_route(H2_ENV, ops, imported)
    partials = ("o_accum", "lse_accum")
    combined: list[tuple] = []

    def decode(decodes: int, tokens: int, with_partials: tuple | None = partials) -> bool:
        return splitkv.run_decode(route, stock, ("q", "kv", "out.data", "out.scale"), num_decodes=decodes,
                                  num_decode_tokens=tokens, partials=with_partials,
                                  combine=lambda o, lse: combined.append((o, lse)))

    assert decode(1, 6) is True
    assert side.calls == [("q", "kv", "out.data", "out.scale", 4, "o_accum", "lse_accum")]
    assert combined == [("o_accum", "lse_accum")]
    assert stock.calls == []
    for decodes, tokens in [(1, 5), (2, 6), (4, 24)]:
        assert decode(decodes, tokens) is False
    # Without partials (warm-up never ran, so none were allocated outside graph capture): unsplit.
    assert decode(1, 6, with_partials=None) is False
    assert len(stock.calls) == 4 and all(call == ("q", "kv", "out.data", "out.scale") for call in stock.calls)
    assert len(side.calls) == 1 and len(combined) == 1


def test_an_overlay_that_is_off_never_touches_the_side_namespace(splitkv):
    ops = fake_torch_ops()
    route = splitkv.resolve_route({}, ops, imported)
    stock = ops._flashmla_C.fused_norm_rope_attn_rope_cast_decode
    assert splitkv.run_decode(route, stock, ("q",), num_decodes=1, num_decode_tokens=6,
                              partials=("o", "l"), combine=lambda o, lse: pytest.fail("combined")) is False
    assert stock.calls == [("q",)]
    assert ops._flashmla_splitkv_C.fused_norm_rope_attn_rope_cast_decode.calls == []


def test_the_overlay_and_lanectl_agree_on_the_split_limit(splitkv):
    from lanectl.recipe.model import SPLITKV_MAX_SPLITS

    assert splitkv.MAX_SPLITS == SPLITKV_MAX_SPLITS
    assert f"MAX_SPLITS = {SPLITKV_MAX_SPLITS}\n" in created_file(COMBINE)


@pytest.mark.network
def test_the_overlay_applies_to_0_31_0_and_leaves_prefill_on_the_stock_op(tmp_path):
    from lanectl.image.upstream import fetch_sdist

    sdist = fetch_sdist("vllm", "0.31.0", cache_dir())
    prefix = "vllm-0.31.0/"
    wanted = {prefix + p for p in (MEGA_ATTN, "vllm/envs.py")}
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers() if m.name in wanted], filter="data")
    root = tmp_path / "vllm-0.31.0"
    report = patching.apply(patching.parse_patch_file(OVERLAY), root)
    assert report.status == patching.PatchStatus.APPLIES
    for path in (MEGA_ATTN, SPLITKV, COMBINE, "vllm/envs.py"):
        py_compile.compile(str(root / path), doraise=True)
    patched = (root / MEGA_ATTN).read_text()
    assert patched.count("torch.ops._flashmla_C.fused_norm_rope_attn_rope_cast_fwd(") == 1  # prefill: stock
    assert patched.count("torch.ops._flashmla_C.fused_norm_rope_attn_rope_cast_decode,") == 1  # unsplit decode
    assert "_flashmla_splitkv_C" not in patched  # the side namespace is reached only through the route
    envs = (root / "vllm/envs.py").read_text()
    assert '"VLLM_DSV41_MEGA_SPLITKV": lambda:' in envs and '"VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS": lambda' in envs


def test_h2_ref_requires_the_overlay_and_its_start_up_line():
    from lanectl.project import Project
    from lanectl.recipe.catalog import load_catalog

    h2 = load_catalog(Project.locate(REPO / "recipes")).lane("h2-REF")
    assert "vllm/57711-splitkv-overlay.patch" in [p.path for p in h2.spec.patches]
    assert "split-KV overlay: on, 4 splits at 1 request x 6 query tokens" in h2.spec.health.startup_log.expect


def created_paths() -> list[str]:
    return [f.path for f in patching.parse_patch_file(OVERLAY).files if f.creates]


def test_the_overlay_creates_exactly_its_two_modules():
    assert created_paths() == [SPLITKV, COMBINE]
    assert Path(REPO / "gpu" / "splitkv_combine.py").read_text() == created_file(COMBINE), \
        "gpu/splitkv_combine.py is what was proven on the GPU; the overlay must ship the same bytes"
