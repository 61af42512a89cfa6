"""Rendering: whole Dockerfiles compared against reviewed golden files, quoting, stage order, hashing.

Regenerate the golden files after an intended change with `UPDATE_GOLDEN=1 pytest tests/test_render.py`,
then read the diff before committing it.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile

import pytest

from lanectl.image.render import env_value, plan_image, plan_images
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from lanectl.recipe.model import merge
from tests.conftest import REPO
from tests.test_recipe_validation import GOOD, problems

GOLDEN = REPO / "tests" / "golden"


@pytest.fixture(scope="module")
def shipped():
    return load_catalog(Project.locate(REPO / "recipes"))


@pytest.mark.parametrize("lane", ["h1-REF", "h2-REF", "demo-h1", "demo-h2"])
def test_dockerfile_matches_golden(shipped, lane):
    rendered = plan_image(shipped.lane(lane)).dockerfile
    golden = GOLDEN / f"{lane}.Dockerfile"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text()


def test_merge_rule_maps_merge_lists_and_scalars_replace():
    defaults = {"engine": {"args": ["a", "b"], "env": {"X": "1", "Y": "2"}, "init": True}, "kernels": ["k"]}
    lane = {"engine": {"args": ["c"], "env": {"Y": "3", "Z": "4"}}, "kernels": []}
    assert merge(defaults, lane) == {
        "engine": {"args": ["c"], "env": {"X": "1", "Y": "3", "Z": "4"}, "init": True},
        "kernels": [],
    }
    assert defaults["engine"]["env"] == {"X": "1", "Y": "2"}, "merging must not change the defaults"


def test_lane_inherits_and_overrides(shipped):
    h1, h2 = shipped.lane("h1-REF"), shipped.lane("h2-REF")
    assert h1.spec.engine.args == h2.spec.engine.args
    cache = {"FLASHINFER_AUTOTUNE_CACHE_DIR": "/root/.cache/vllm/flashinfer-autotune"}
    assert h2.spec.engine.env == {"VLLM_LOGGING_LEVEL": "INFO", **cache, "VLLM_DSV41_MEGA_SPLITKV": "4",
                                  "VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS": "6"}
    assert h1.spec.engine.env == {"VLLM_LOGGING_LEVEL": "INFO", **cache}


def test_recipe_values_cannot_inject_instructions(project, write_recipe):
    hostile = 'x"]\\nRUN rm -rf / #'
    write_recipe(GOOD.replace('args: [/model, --served-model-name, m, --port, "8000"]',
                              f"args: [/model, --served-model-name, m, --port, \"8000\", '{hostile}']")
                     .replace('env: {X: "1"}', "env: {X: '$HOME\" \\ RUN evil'}"))
    dockerfile = plan_image(load_catalog(Project.locate()).lane("b")).dockerfile
    runs = [line for line in dockerfile.splitlines() if line.startswith("RUN")]
    assert len(runs) == 1 and runs[0].startswith('RUN ["python3", "-m", "compileall", "-q", ')  # the template's own
    cmd = next(line for line in dockerfile.splitlines() if line.startswith("CMD "))
    import json

    assert json.loads(cmd[4:])[-3:] == [hostile, "--shutdown-timeout", "15"]
    assert 'ENV X="\\$HOME\\" \\\\ RUN evil"' in dockerfile


def test_env_value_escapes_expansion_and_quotes():
    assert env_value('a"b$HOME\\c') == '"a\\"b\\$HOME\\\\c"'


def test_kernel_stage_comes_first_and_does_not_see_serve_flags(shipped):
    dockerfile = plan_image(shipped.lane("h2-REF")).dockerfile
    kernel_stage, final_stage = dockerfile.split("\n\nFROM ", 1)
    assert "AS kernel-flashmla-splitkv" in kernel_stage
    assert "--served-model-name" not in kernel_stage and "VLLM_DSV41" not in kernel_stage
    assert "patching.py" not in kernel_stage
    assert final_stage.index("COPY --from=kernel-flashmla-splitkv") < final_stage.index("patching.py")


def test_the_labels_go_into_the_built_dockerfile_as_one_line_that_docker_reads_back_verbatim(project, write_recipe):
    write_recipe(GOOD)
    plan = plan_image(load_catalog(Project.locate()).lane("a"))
    labels = {"io.lanectl.patches": '{"a.patch": "x"}', "io.lanectl.lane": "a", "odd": 'a $HOME \\ "q"'}
    with tarfile.open(fileobj=io.BytesIO(plan.context_tar(labels))) as tar:
        sent = tar.extractfile("Dockerfile").read().decode()  # type: ignore[union-attr]
    assert sent == plan.dockerfile.rstrip("\n") + "\n" + (
        'LABEL "io.lanectl.lane"="a" "io.lanectl.patches"="{\\"a.patch\\": \\"x\\"}" '
        '"odd"="a \\$HOME \\\\ \\"q\\""\n')
    assert plan.context_tar() != plan.context_tar(labels) and "LABEL" not in plan.dockerfile


def test_input_hash_changes_with_inputs_and_only_then(project, write_recipe):
    write_recipe(GOOD)
    first = plan_image(load_catalog(Project.locate()).lane("a"))
    again = plan_image(load_catalog(Project.locate()).lane("a"))
    assert first.input_hash == again.input_hash and first.context_tar() == again.context_tar()
    write_recipe(GOOD.replace('"8000"]', '"8000", --max-num-seqs, "8"]'))
    changed = plan_image(load_catalog(Project.locate()).lane("a"))
    assert changed.input_hash != first.input_hash
    assert re.fullmatch(r"lanectl/t:a-[0-9a-f]{12}", changed.tag)
    assert changed.moving_tag == "lanectl/t:a"


def test_planning_lanes_together_plans_each_as_alone(shipped):
    # They share template and kernel folders, read once for all: each plan must still be its own lane's.
    lanes = list(shipped.lanes.values())
    together = plan_images(lanes)
    assert list(together) == [lane.name for lane in lanes]
    assert len({plan.input_hash for plan in together.values()}) == len(lanes)
    for lane in lanes:
        assert together[lane.name] == plan_image(lane), lane.name


def test_labels_carry_provenance(shipped):
    plan = plan_image(shipped.lane("h2-REF"))
    assert plan.labels["io.lanectl.lane"] == "h2-REF"
    assert plan.labels["io.lanectl.inputs"] == plan.input_hash
    assert "00e9393f353c1092ae687d13ab839b078f5c209a" in plan.labels["io.lanectl.kernels"]
    assert "vllm/60945-rejection-sampler-guard.patch" in plan.labels["io.lanectl.patches"]


def test_secrets_are_passed_by_name_only(shipped):
    from lanectl.image.containers import plan_containers

    lane = shipped.lane("h2-REF")
    primary, rtx = plan_containers(lane, plan_image(lane))
    assert primary.secret_env == ["HF_TOKEN"] and "HF_TOKEN" not in primary.env
    assert (primary.name, rtx.name) == ("dsv41-vllm-1017-h2-REF", "dsv41-vllm-1017-h2-REF-rtx")
    assert primary.gpus == {"device_ids": ["0"]} and rtx.gpus == {"device_ids": ["1"]}
    assert primary.command is None, "the primary's serve flags live in the image's CMD"


def test_builtin_templates_serve_a_project_without_images(project, write_recipe):
    shutil.rmtree(project / "images")
    write_recipe(GOOD)
    plan = plan_image(load_catalog(Project.locate()).lane("a"))
    assert plan.dockerfile.startswith(
        "# Rendered by lanectl from lanectl's built-in template stub-engine/Dockerfile.j2: lane a")
    assert "image/stubengine/__main__.py" in {f.path for f in plan.files}


def test_a_project_template_overrides_the_builtin_one_of_the_same_name(project, write_recipe):
    (project / "images" / "stub-engine" / "Dockerfile.j2").write_text(
        'FROM {{ base }}\n{% include "_lane/engine.j2" %}# the project\'s own\n')
    (project / "images" / "_lane").mkdir()
    (project / "images" / "_lane" / "engine.j2").write_text("LABEL block=project\nCMD {{ cmd | tojson }}\n")
    write_recipe(GOOD)
    plan = plan_image(load_catalog(Project.locate()).lane("a"))
    assert plan.dockerfile == ('FROM lanectl/base-python:bookworm\nLABEL block=project\n'
                               'CMD ["/model", "--served-model-name", "m", "--port", "8000", '
                               '"--shutdown-timeout", "15"]\n# the project\'s own\n')


def test_a_template_neither_the_project_nor_lanectl_has_is_refused(project, write_recipe):
    write_recipe(GOOD.replace("template: stub-engine", "template: nope"))
    assert "known templates: stub-engine, vllm" in str(problems(project))
