"""`lanectl diff A B`: what differs between two lanes' rendered inputs, exact lines and envelope."""

from __future__ import annotations

import json

from lanectl.image.render import plan_image
from lanectl.lanes.diff import patch_header, serve_flags
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from tests.test_cli import lanectl

RECIPE = """
schema: lanectl/v1
id: t
defaults:
  image:
    template: stub-engine
    base: lanectl/base-python:bookworm
    local_base: true
    python_site: /opt/stub
  engine:
    args: [/model, --served-model-name, m, --max-num-seqs, "16", --gpu-memory-utilization, "0.9",
           --speculative-config, '{"num_speculative_tokens":5}', --enforce-eager, --port, "8000"]
    env: {STUB_KV_CACHE_TOKENS: "4400013", STUB_LOAD_SECONDS: "2"}
    ports:
      - {container: 8000, host: 18000, host_ip: 127.0.0.1}
    volumes:
      - {source: /srv/models/rev1, target: /model, read_only: true}
  companions:
    rtx:
      engine:
        args: [/model, --port, "8001"]
  health:
    startup_budget_minutes: 1
    served_model_name: m
lanes:
  old: {}
  new:
    kernels: [stub-splitkv]
    patches:
      - path: stub-engine/0001-rejection-sampler-guard.patch
        sha256: "4a2957d1860eb2127239ff4603d492c37cd91cfcbb7689466411f77a555a9335"
    engine:
      args: [/model, --served-model-name, m, --max-num-seqs, "32", --gpu-memory-utilization, "0.9",
             --speculative-config, '{"num_speculative_tokens":5}', --port, "8000", --max-model-len=8192]
      env: {STUB_KV_CACHE_TOKENS: "4400013", STUB_LOAD_SECONDS: "3", VLLM_DSV41_MEGA_SPLITKV: "4"}
      ports:
        - {container: 8000, host: 18010, host_ip: 127.0.0.1}
    health:
      startup_budget_minutes: 2
"""


def tags(project):
    catalog = load_catalog(Project.locate())
    return {name: plan_image(catalog.lane(name)).tag for name in ("old", "new")}


def test_serve_flags_read_each_flag_once_whatever_its_form():
    assert serve_flags(["/model", "--a", "1", "--b=2", "--switch", "--many", "x", "y"]) == {
        "<arg 1>": "/model", "--a": "1", "--b": "2", "--switch": None, "--many": "x y"}


def test_a_patch_header_gives_its_subject_and_upstream_link():
    assert patch_header("Subject: Fix it\nUpstream: https://x/pull/1 (merged)\n---\n") == (
        "Fix it", "https://x/pull/1 (merged)")
    assert patch_header("--- a/f\n+++ b/f\n") == ("", "")


def test_diff_names_each_difference_and_what_is_the_same(project, write_recipe):
    write_recipe(RECIPE)
    tag = tags(project)
    result = lanectl("diff", "old", "new", cwd=project)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [
        "old -> new",
        f"  image  {tag['old']} -> {tag['new']}",
        "  kernel  + stub-splitkv: path kernels/src/stub-splitkv, installed as stubengine._stub_splitkv_C beside "
        "stubengine.attention",
        "  patch  + stub-engine/0001-rejection-sampler-guard.patch (sha256 4a2957d1860e): Guard the last draft "
        "position by the real row length, not the configured k; upstream "
        "https://github.com/vllm-project/vllm/pull/60945 (mirrored on the stub engine)",
        "  engine arg  ~ --max-num-seqs: 16 -> 32",
        "  engine arg  - --enforce-eager",
        "  engine arg  + --max-model-len 8192",
        "  env  ~ STUB_LOAD_SECONDS: 2 -> 3",
        "  env  + VLLM_DSV41_MEGA_SPLITKV=4",
        "  port  - 127.0.0.1:18000->8000/tcp",
        "  port  + 127.0.0.1:18010->8000/tcp",
        "  health  ~ startup_budget_minutes: 1.0 -> 2.0",
        "  same base image (lanectl/base-python:bookworm, built on this host: no registry digest)",
        "  same checkpoint (/srv/models/rev1:/model:ro)",
        '  same speculative schedule (--speculative-config {"num_speculative_tokens":5})',
        "  same served model name (--served-model-name m)",
        "  same KV size (4,400,013 tokens)",
        "  same companions (rtx)",
        "  same rollback (cold start)",
    ]


def test_diff_json_is_the_envelope_with_every_change(project, write_recipe):
    write_recipe(RECIPE)
    result = lanectl("diff", "old", "new", "--json", cwd=project)
    assert result.returncode == 0
    envelope = json.loads(result.stdout)
    assert (envelope["lanectl"], envelope["command"]) == (1, "diff")
    data = envelope["data"]
    assert data["b"]["kernels"]["stub-splitkv"] == {
        "source": "path kernels/src/stub-splitkv", "upstream": "", "module": "stubengine._stub_splitkv_C",
        "beside": "stubengine.attention"}
    assert {"what": "engine arg", "change": "changed", "key": "--max-num-seqs", "a": "16", "b": "32"} in data["changes"]
    assert data["b"]["patches"]["stub-engine/0001-rejection-sampler-guard.patch"]["upstream"].startswith(
        "https://github.com/vllm-project/vllm/pull/60945")


def test_a_lane_against_itself_has_no_differences(project, write_recipe):
    write_recipe(RECIPE)
    lines = lanectl("diff", "new", "new", cwd=project).stdout.splitlines()
    assert lines[2] == "  no differences in the rendered inputs"
    assert "  same serve flags" in lines and "  same health gate" in lines


def test_an_unknown_lane_exits_2_naming_the_known_ones(project, write_recipe):
    write_recipe(RECIPE)
    result = lanectl("diff", "old", "newer", cwd=project)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "lanectl: no lane 'newer'; known lanes: new, old\n"
