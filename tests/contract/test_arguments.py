"""arguments: every role's serve flags, as lanectl bakes and passes them, through `vllm serve`'s own parser and
`AsyncEngineArgs.from_cli_args`; and each vLLM default lanectl relies on, read from vLLM's config classes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import vllm_oracle as oracle
from lanes import RoleArgs, baked_args, lanes, uses_vllm_entrypoint

from lanectl.bench.gate import FIDELITY_TOP_LOGPROBS
from lanectl.recipe.catalog import ROLE_PRIMARY
from lanectl.recipe.model import GPU_MEMORY_UTILIZATION_FLAG, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, flag_value

ROLES = [role for lane in lanes() if uses_vllm_entrypoint(lane) for role in baked_args(lane)]


def _engine(role: RoleArgs):  # the recipe's Engine for the role
    lane = role.lane
    return lane.spec.engine if role.role == ROLE_PRIMARY else lane.spec.companions[role.role].engine


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_every_baked_serve_flag_parses_as_vllm_parses_it(role: RoleArgs, tmp_path: Path) -> None:
    try:
        oracle.engine_args(list(role.args), tmp_path / "model")
    except (AssertionError, ValueError, TypeError) as exc:
        pytest.fail(f"{role.where()}: {role.name}'s serve args {list(role.args)} are refused by vllm serve: {exc}")


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_every_flag_is_spelt_out(role: RoleArgs) -> None:
    """vLLM's parser takes abbreviations (`--gpu-memory-util`), lanectl's flag readers do not: a shortened flag
    would serve one value while lanectl plans with another."""
    known = oracle.serve_option_strings()
    short = [arg.split("=", 1)[0] for arg in role.args if arg.startswith("--") and arg.split("=", 1)[0] not in known]
    assert not short, (f"{role.where()}: {role.name} passes {short}, which vllm serve only takes as abbreviations "
                       "of its flags; write each flag in full")


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_lanectl_reads_the_gpu_share_vllm_will_take(role: RoleArgs, tmp_path: Path) -> None:
    """The standby and neighbour arithmetic (catalog._standby_fit, plan.gpu_memory_shortfall) plans with this."""
    vllm_value = oracle.engine_args(list(role.args), tmp_path / "model").gpu_memory_utilization
    lanectl_value = _engine(role).gpu_memory_utilization()
    assert lanectl_value == vllm_value, (
        f"{role.where()}: {role.name} gets --gpu-memory-utilization {vllm_value} from {oracle.RELEASE} "
        f"({'its default' if flag_value(list(role.args), GPU_MEMORY_UTILIZATION_FLAG) is None else 'the flag'}), "
        f"but lanectl plans with {lanectl_value}")


def test_lanectls_gpu_memory_default_is_vllms() -> None:
    from vllm.config import CacheConfig

    default = CacheConfig.__dataclass_fields__["gpu_memory_utilization"].default
    default = getattr(default, "default", default)  # a pydantic FieldInfo in vLLM's config dataclasses
    assert VLLM_DEFAULT_GPU_MEMORY_UTILIZATION == default, (
        f"lanectl/recipe/model.py VLLM_DEFAULT_GPU_MEMORY_UTILIZATION is {VLLM_DEFAULT_GPU_MEMORY_UTILIZATION}, "
        f"{oracle.RELEASE}'s CacheConfig.gpu_memory_utilization defaults to {default}")


@pytest.mark.parametrize("role", [r for r in ROLES if r.role == ROLE_PRIMARY], ids=lambda role: role.name)
def test_the_gate_asks_for_no_more_logprobs_than_the_lane_allows(role: RoleArgs, tmp_path: Path) -> None:
    """lanectl/bench/gate.py FIDELITY_TOP_LOGPROBS is sent as `logprobs`/`prompt_logprobs`; vLLM refuses a request
    above the engine's --max-logprobs (ModelConfig.max_logprobs, default read from vLLM here)."""
    allowed = oracle.engine_args(list(role.args), tmp_path / "model").max_logprobs
    assert allowed == -1 or FIDELITY_TOP_LOGPROBS <= allowed, (
        f"{role.where()}: {role.name} allows {allowed} logprobs ({oracle.RELEASE}'s --max-logprobs, its default unless "
        f"the flag is given), but lanectl/bench/gate.py FIDELITY_TOP_LOGPROBS asks for {FIDELITY_TOP_LOGPROBS}: vLLM "
        "would refuse every scoring request of the gate")


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_lanectl_reads_the_served_model_name_vllm_will_serve(role: RoleArgs) -> None:
    parsed = oracle.parse_serve_args(list(role.args))
    served = (parsed.served_model_name or [parsed.model])[0]
    if role.role == ROLE_PRIMARY:
        assert served == role.lane.spec.health.served_model_name, (
            f"{role.where()}: {role.name} serves {served!r}; its health gate waits for "
            f"{role.lane.spec.health.served_model_name!r}")
    assert flag_value(list(role.args), "--served-model-name") in (None, served)
