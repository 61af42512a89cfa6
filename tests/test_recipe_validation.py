"""Exact validation messages: each bad recipe gets one located, actionable line per problem."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from lanectl.errors import RecipeInvalid
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog

GOOD = """
schema: lanectl/v1
id: t
defaults:
  image:
    template: stub-engine
    base: lanectl/base-python:bookworm
    local_base: true
    python_site: /opt/stub
  engine:
    args: [/model, --served-model-name, m, --port, "8000"]
    ports:
      - {container: 8000, host: 18000}
  health:
    startup_budget_minutes: 1
    served_model_name: m
lanes:
  a: {}
  b:
    engine:
      env: {X: "1"}
"""


def problems(project: Path) -> list[str]:
    with pytest.raises(RecipeInvalid) as caught:
        load_catalog(Project.locate())
    return [str(p) for p in caught.value.problems]


def test_the_good_recipe_loads(project, write_recipe):
    write_recipe(GOOD)
    catalog = load_catalog(Project.locate())
    assert sorted(catalog.lanes) == ["a", "b"]


@pytest.mark.parametrize(("change", "expected"), [
    pytest.param(
        ("  a: {}\n", "  a: {\n"),
        ["recipes/r.yaml:19:11: malformed YAML: expected ',' or '}', but got ':'; "
         "fix the syntax at this spot"],
        id="malformed-yaml"),
    pytest.param(
        ("  b:\n", "  a:\n"),
        ["recipes/r.yaml:18:3: lanes.a: duplicate key; each key may appear once in a mapping"],
        id="duplicate-lane-in-file"),
    pytest.param(
        ("schema: lanectl/v1\n", "schema: lanectl/v2\n"),
        ["recipes/r.yaml:1:9: schema: Input should be 'lanectl/v1', got 'lanectl/v2'"],
        id="wrong-schema-version"),
    pytest.param(
        ("    python_site: /opt/stub\n", "    python_site: /opt/stub\n    bsae: x\n"),
        ["recipes/r.yaml:9:5: defaults.image.bsae: unknown key; expected one of: template, base, local_base, "
         "python_site, registry, vllm, download_kernels"],
        id="unknown-key"),
    pytest.param(
        ("      - {container: 8000, host: 18000}\n", "      - {container: 8000, host: 70000}\n"),
        ["recipes/r.yaml:12:33: defaults.engine.ports[0].host: Input should be less than or equal to 65535, "
         "got 70000"],
        id="bad-port"),
    pytest.param(
        ("    startup_budget_minutes: 1\n", "    startup_budget_minutes: soon\n"),
        ["recipes/r.yaml:14:29: defaults.health.startup_budget_minutes: Input should be a valid number, "
         "got 'soon'"],
        id="wrong-type"),
    pytest.param(
        ("    template: stub-engine\n", "    template: nope\n"),
        ["recipes/r.yaml:5:15: defaults.image.template: no template images/nope/Dockerfile.j2; known "
         "templates: stub-engine, vllm"] * 1,
        id="missing-template"),
    pytest.param(
        ("    local_base: true\n", ""),
        ["recipes/r.yaml:5:5: defaults.image: base 'lanectl/base-python:bookworm' must be pinned by digest "
         "(name:tag@sha256:<64 hex>), or set local_base: true for an image built on this host"],
        id="base-not-pinned"),
    pytest.param(
        ("  health:\n    startup_budget_minutes: 1\n    served_model_name: m\n", ""),
        ["recipes/r.yaml:14:6: lanes.a.health: required key is missing",
         "recipes/r.yaml:16:5: lanes.b.health: required key is missing"],
        id="missing-required"),
    pytest.param(
        ("      env: {X: \"1\"}\n", "      env: {HF_TOKEN: abc}\n"),
        ["recipes/r.yaml:20:13: lanes.b.engine.env.HF_TOKEN: 'HF_TOKEN' looks like a secret; list it under "
         "'secret_env' so it comes from the environment at start and never lands in the image"],
        id="secret-in-env"),
    pytest.param(
        ("    served_model_name: m\n", "    served_model_name: other\n"),
        ["recipes/r.yaml:15:24: defaults.health.served_model_name: is 'other' but the engine serves 'm' "
         "(--served-model-name); the readiness check would never pass"],
        id="served-model-mismatch"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    kernels: [warp-drive]\n"),
        ["recipes/r.yaml:19:15: lanes.b.kernels[0]: no kernel 'warp-drive': expected kernels/warp-drive.yaml; "
         "known kernels: flashmla-splitkv, stub-splitkv"],
        id="missing-kernel"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    patches:\n      - {path: nope.patch, sha256: \"" + "0" * 64 + "\"}\n"),
        ["recipes/r.yaml:20:16: lanes.b.patches[0].path: no patch file patches/nope.patch; paths are relative "
         "to patches/"],
        id="missing-patch"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    engine:\n      gpus: {count: 0}\n"),
        ["recipes/r.yaml:20:21: lanes.b.engine.gpus.count: must be at least 1 or 'all', got 0"],
        id="bad-gpu-count"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    engine:\n      gpus: {device_ids: [\"0\", \"zero\"]}\n"),
        ["recipes/r.yaml:20:26: lanes.b.engine.gpus.device_ids: 'zero' is not a GPU index ('0') or UUID "
         "('GPU-…')"],
        id="bad-gpu-id"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    companions:\n      rtx:\n        engine:\n          ports: [{container: 9000, host: 18000}]\n"),
        ["recipes/r.yaml:22:19: lanes.b.companions.rtx.engine.ports[0]: host port 18000/tcp is already "
         "published by the primary container; give each a distinct host port"],
        id="port-clash-with-companion"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    companions:\n      primary:\n        engine: {}\n"),
        ["recipes/r.yaml:20:7: lanes.b.companions: 'primary' is the lane's own container; name the companion "
         "otherwise"],
        id="companion-named-primary"),
    pytest.param(
        ("    served_model_name: m\n",
         "    served_model_name: m\n    startup_log: {expect: [\"KV cache (\"]}\n"),
        ["recipes/r.yaml:16:28: defaults.health.startup_log.expect[0]: 'KV cache (' is not a valid regular "
         "expression: missing ), unterminated subpattern at position 9"],
        id="bad-regex"),
    pytest.param(
        ("    served_model_name: m\n",
         "    served_model_name: m\n    startup_log:\n      stall:\n"
         "        - {after: \"Autotuning process starts\", until: \"ends (\", minutes: 10}\n"),
        ["recipes/r.yaml:18:55: defaults.health.startup_log.stall[0].until: 'ends (' is not a valid regular "
         "expression: missing ), unterminated subpattern at position 5"],
        id="bad-stall-regex"),
    pytest.param(
        ("    served_model_name: m\n",
         "    served_model_name: m\n    startup_log:\n      stall:\n"
         "        - {after: \"Autotuning process starts\", minutes: 10}\n"),
        ["recipes/r.yaml:20:6: lanes.a.health.startup_log.stall[0].until: required key is missing",
         "recipes/r.yaml:22:5: lanes.b.health.startup_log.stall[0].until: required key is missing"],
        id="stall-without-until"),
    pytest.param(
        ("    served_model_name: m\n",
         "    served_model_name: m\n    generation_probe: {max_tokens: 50}\n"),
        ["recipes/r.yaml:16:36: defaults.health.generation_probe.max_tokens: Input should be less than or "
         "equal to 3, got 50"],
        id="probe-too-long"),
    pytest.param(
        ("      - {container: 8000, host: 18000}\n",
         "      - {container: 8000, host: 18000}\n    volumes: [{target: /model}]\n"),
        ["recipes/r.yaml:13:15: defaults.engine.volumes[0]: give exactly one of 'source' (a host path) or "
         "'volume' (a named volume)"],
        id="volume-without-source"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    placement: {nodes: [station-1]}\n"),
        ["recipes/r.yaml:19:16: lanes.b.placement: nodes, node_labels and canary place a lane on Swarm; add "
         "'backend: swarm'"],
        id="placement-nodes-without-swarm"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    placement: {backend: swarm, nodes: [station-1], canary: station-2}\n"),
        ["recipes/r.yaml:19:16: lanes.b.placement: canary 'station-2' is not one of the lane's nodes "
         "['station-1']"],
        id="canary-not-a-node"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    placement: {backend: swarm}\n    engine: {ipc: host}\n"),
        ["recipes/r.yaml:19:5: lanes.b: primary: Swarm services cannot set an IPC mode (Docker API 1.41); remove "
         "'ipc' for a Swarm lane (shm_size still applies, as a tmpfs at /dev/shm)"],
        id="ipc-on-swarm"),
    pytest.param(
        ("  b:\n    engine:\n      env: {X: \"1\"}\n",
         "  b:\n    placement: {backend: swarm}\n    engine: {gpus: {count: all}}\n"),
        ["recipes/r.yaml:19:5: lanes.b: primary: Swarm reserves GPUs by number; give gpus.count or "
         "gpus.device_ids, not 'all'"],
        id="all-gpus-on-swarm"),
])
def test_bad_recipe_is_reported_exactly(project, write_recipe, change, expected):
    old, new = change
    assert old in GOOD
    write_recipe(GOOD.replace(old, new, 1))
    assert problems(project) == expected


def test_patch_sha_mismatch_names_the_actual_hash(project, write_recipe):
    patch = project / "patches" / "local.patch"
    patch.write_text("Subject: x\n")
    actual = hashlib.sha256(patch.read_bytes()).hexdigest()
    write_recipe(GOOD.replace("  b:\n    engine:\n      env: {X: \"1\"}\n",
                              "  b:\n    patches:\n      - path: local.patch\n        sha256: \"" + "a" * 64 + "\"\n"))
    assert problems(project) == [
        f"recipes/r.yaml:21:17: lanes.b.patches[0].sha256: sha256 does not match patches/local.patch (it hashes "
        f"to {actual}); review the patch, then update sha256"]


def test_lane_names_are_unique_across_recipes(project, write_recipe):
    write_recipe(GOOD, "one.yaml")
    write_recipe(GOOD.replace("id: t", "id: u").replace("{container: 8000, host: 18000}",
                                                       "{container: 8000, host: 18001}"), "two.yaml")
    assert problems(project) == [
        "recipes/two.yaml:17:3: lanes.a: lane name already used in recipes/one.yaml; lane names are unique "
        "across recipes",
        "recipes/two.yaml:18:3: lanes.b: lane name already used in recipes/one.yaml; lane names are unique "
        "across recipes",
    ]


def test_every_problem_of_every_file_is_listed_at_once(project, write_recipe):
    write_recipe(GOOD.replace("template: stub-engine", "template: nope"), "one.yaml")
    write_recipe("schema: lanectl/v1\nid: [\n", "two.yaml")
    listed = problems(project)
    assert len(listed) == 2
    assert listed[0].startswith("recipes/one.yaml:5:15: defaults.image.template: no template")
    assert listed[1].startswith("recipes/two.yaml:3:1: malformed YAML")


def test_bad_kernel_file_is_reported_in_that_file(project, write_recipe):
    (project / "kernels" / "broken.yaml").write_text(
        "schema: lanectl-kernel/v1\nname: broken\nsource: {git: https://x/y.git}\nbuild: [make]\n"
        "install: {package: p, module: m, beside: m}\nsmoke: {op_schema: {op: p.m.f, argument: a}}\n")
    write_recipe(GOOD.replace("  b:\n    engine:\n      env: {X: \"1\"}\n", "  b:\n    kernels: [broken]\n"))
    assert problems(project) == [
        "kernels/broken.yaml:3:9: source: a git source must pin 'commit' (40 hex) so the build is reproducible",
        "kernels/broken.yaml:5:10: install: module must differ from 'beside': the shipped module is never "
        "replaced",
    ]


def test_the_shipped_recipes_are_valid():
    from tests.conftest import REPO

    catalog = load_catalog(Project.locate(REPO / "recipes"))
    assert {"h1-REF", "h2-REF", "demo-h1", "demo-h2"} <= set(catalog.lanes)
    h2 = catalog.lane("h2-REF")
    assert h2.container_name() == "dsv41-vllm-1017-h2-REF"
    assert h2.container_name("rtx") == "dsv41-vllm-1017-h2-REF-rtx"
    assert [k.name for k in h2.kernels] == ["flashmla-splitkv"]


def test_unknown_lane_suggests_the_closest(project, write_recipe):
    from lanectl.errors import BadInput

    write_recipe(GOOD.replace("  a: {}", "  h2-REF: {}"))
    catalog = load_catalog(Project.locate())
    with pytest.raises(BadInput, match=r"^no lane 'h3-REF'; did you mean h2-REF\?$"):
        catalog.lane("h3-REF")


@pytest.mark.parametrize(("env", "expected"), [
    ('{VLLM_DSV41_MEGA_SPLITKV: "3"}',
     "VLLM_DSV41_MEGA_SPLITKV='3': give 0 (off) or a power of two from 2 to 8, the most the overlay's combine "
     "kernel merges"),
    ('{VLLM_DSV41_MEGA_SPLITKV: "16"}',
     "VLLM_DSV41_MEGA_SPLITKV='16': give 0 (off) or a power of two from 2 to 8, the most the overlay's combine "
     "kernel merges"),
    ('{VLLM_DSV41_MEGA_SPLITKV: "four"}',
     "VLLM_DSV41_MEGA_SPLITKV='four': give 0 (off) or a power of two from 2 to 8, the most the overlay's combine "
     "kernel merges"),
    ('{VLLM_DSV41_MEGA_SPLITKV: "4", VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS: "0"}',
     "VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS='0': give the decode query-token count of the one request that splits "
     "(1 + draft tokens), at least 1"),
])
def test_split_kv_settings_are_checked_where_they_are_written(project, write_recipe, env, expected):
    write_recipe(GOOD.replace('env: {X: "1"}', f"env: {env}"))
    assert problems(project) == [f"recipes/r.yaml:20:12: lanes.b.engine.env: {expected}"]


@pytest.mark.parametrize("env", ['{VLLM_DSV41_MEGA_SPLITKV: "0"}', '{VLLM_DSV41_MEGA_SPLITKV: "2"}',
                                 '{VLLM_DSV41_MEGA_SPLITKV: "8", VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS: "6"}'])
def test_split_kv_settings_the_overlay_supports_pass(project, write_recipe, env):
    write_recipe(GOOD.replace('env: {X: "1"}', f"env: {env}"))
    assert load_catalog(Project.locate()).lane("b").spec.engine.env


def test_a_top_level_problem_does_not_hide_the_lanes_problems(project, write_recipe):
    """An unknown top-level key and a bad id are listed together with each lane's own problem, in file order."""
    bad = (GOOD.replace("id: t", "id: T!\nowner: ops", 1)
               .replace("      env: {X: \"1\"}\n", "      env: {X: \"1\"}\n    gpus: {count: 0}\n", 1))
    write_recipe(bad)
    listed = problems(project)
    assert [line.split(": ", 2)[1] for line in listed] == ["id", "owner", "lanes.b.gpus"], listed
