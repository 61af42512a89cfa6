"""Paths stay inside the project: `..` and symlinks out of a folder are refused with the path named
(exit 2), through the real CLI."""

from __future__ import annotations

from pathlib import Path

from tests.test_cli import lanectl
from tests.test_recipe_validation import GOOD

B_ENV = '  b:\n    engine:\n      env: {X: "1"}\n'
ZEROS = "0" * 64


def test_a_recipe_patch_path_with_dotdot_is_refused(project: Path, write_recipe) -> None:
    (project / "outside.patch").write_text("x")
    write_recipe(GOOD.replace(B_ENV, f"  b:\n    patches: [{{path: ../outside.patch, sha256: '{ZEROS}'}}]\n"))

    result = lanectl("validate", cwd=project)

    assert result.returncode == 2
    assert "lanes.b.patches[0].path: ../outside.patch leads out of patches/ (through '..' or a symlink); " \
           "keep patch files inside patches/" in result.stderr


def test_a_patch_file_symlinked_out_of_the_project_is_refused(project: Path, write_recipe, tmp_path: Path) -> None:
    secret = tmp_path / "secret.patch"
    secret.write_text("secret")
    (project / "patches" / "vllm" / "evil.patch").symlink_to(secret)
    write_recipe(GOOD.replace(B_ENV, f"  b:\n    patches: [{{path: vllm/evil.patch, sha256: '{ZEROS}'}}]\n"))

    validate = lanectl("validate", cwd=project)
    check = lanectl("patches", "check", cwd=project)

    assert validate.returncode == 2
    assert "lanes.b.patches[0].path: vllm/evil.patch leads out of patches/" in validate.stderr
    assert check.returncode == 2
    assert f"patches/vllm/evil.patch leads out of patches/ (a symlink to {secret})" in check.stderr


def test_a_kernel_source_path_out_of_the_project_is_refused(project: Path, write_recipe) -> None:
    (project / "kernels" / "away.yaml").write_text(
        (project / "kernels" / "stub-splitkv.yaml").read_text().replace("name: stub-splitkv", "name: away")
        .replace("path: kernels/src/stub-splitkv", "path: ../elsewhere")
    )
    write_recipe(GOOD.replace(B_ENV, "  b:\n    kernels: [away]\n"))

    result = lanectl("validate", cwd=project)

    assert result.returncode == 2
    assert "source.path: ../elsewhere leads out of the project (through '..' or a symlink); " \
           "keep kernel sources inside the project" in result.stderr, result.stderr


def test_a_template_out_of_images_is_refused(project: Path, write_recipe) -> None:
    # '..' is refused by the template name's grammar; a symlinked template folder by the path check.
    write_recipe(GOOD.replace("template: stub-engine", "template: ../recipes"))
    result = lanectl("validate", cwd=project)
    assert result.returncode == 2
    assert "recipes/r.yaml:5:15: defaults.image.template: String should match pattern" in result.stderr

    (project / "images" / "elsewhere").symlink_to(project / "recipes")
    write_recipe(GOOD.replace("template: stub-engine", "template: elsewhere"))
    result = lanectl("validate", cwd=project)
    assert result.returncode == 2
    assert "defaults.image.template: elsewhere leads out of images/" in result.stderr


def test_a_symlink_in_the_image_folder_never_reaches_the_build_context(
    project: Path, write_recipe, tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("do not ship")
    (project / "images" / "stub-engine" / "leak.txt").symlink_to(secret)
    write_recipe(GOOD)

    rendered = lanectl("render", "a", cwd=project)
    built = lanectl("build", "a", cwd=project)

    for result in (rendered, built):
        assert result.returncode == 2, result.stderr
        assert f"images/stub-engine/leak.txt leads out of {project}/images/stub-engine (a symlink to {secret})" \
            in result.stderr
        assert "Traceback" not in result.stderr


def test_render_out_writes_to_a_new_folder_anywhere_but_never_into_a_full_one(
    project: Path, write_recipe, tmp_path: Path
) -> None:
    write_recipe(GOOD)
    elsewhere = tmp_path / "rendered" / "a"

    fresh = lanectl("render", "a", "--out", str(elsewhere), cwd=project)
    again = lanectl("render", "a", "--out", str(elsewhere), cwd=project)

    assert fresh.returncode == 0, fresh.stderr
    assert (elsewhere / "containers.json").is_file()
    assert again.returncode == 2
    assert f"--out {elsewhere} is not empty; give a new or empty folder" in again.stderr
