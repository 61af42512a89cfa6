"""`lanectl init`: a starter project that validates as written, and never a file overwritten.

That `up` runs its first lane is checked from an installed wheel (tests/test_installed_wheel.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from lanectl.commands.init import project_id
from lanectl.recipe.schema import recipe_json_schema
from tests.test_cli import lanectl


def test_init_writes_a_project_that_validates(tmp_path):
    result = lanectl("init", "My Lanes", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    root = tmp_path / "My Lanes"
    assert result.stdout.splitlines() == [
        "wrote My Lanes/recipes/starter.yaml",
        "wrote My Lanes/recipes/workloads/smoke.yaml",
        "wrote My Lanes/recipes/workloads/probes/quick.yaml",
        "wrote My Lanes/lanectl.schema.json",
        "next: cd 'My Lanes' && lanectl validate && lanectl build --all && lanectl up stub-a --no-gpu",
    ]
    recipe = (root / "recipes" / "starter.yaml").read_text()
    assert recipe.startswith("# yaml-language-server: $schema=../lanectl.schema.json\n")
    assert json.loads((root / "lanectl.schema.json").read_text()) == recipe_json_schema()
    validated = lanectl("validate", cwd=root)
    assert (validated.returncode, validated.stdout) == (0, "ok: 2 lanes in 1 recipes (stub-a, stub-b)\n")
    lanes = lanectl("lanes", "--json", cwd=root)
    assert {row["recipe"] for row in json.loads(lanes.stdout)["data"]["lanes"]} == {"my-lanes"}


def test_init_in_the_current_folder(tmp_path):
    result = lanectl("init", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == ("next: lanectl validate && lanectl build --all && "
                                              "lanectl up stub-a --no-gpu")
    assert (tmp_path / "recipes" / "starter.yaml").is_file()


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path):
    (tmp_path / "recipes").mkdir()
    mine = tmp_path / "recipes" / "starter.yaml"
    mine.write_text("mine\n")
    result = lanectl("init", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (f"lanectl: {mine} already exists; lanectl init never overwrites a file: "
                             "choose a new or empty folder\n")
    assert mine.read_text() == "mine\n"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "recipes", "recipes/starter.yaml"]


def test_init_refuses_a_file_as_its_folder(tmp_path):
    (tmp_path / "f").write_text("")
    result = lanectl("init", "f", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, "lanectl: f is not a folder\n")


def test_the_recipe_id_comes_from_the_folder_name(tmp_path):
    assert project_id(tmp_path / "My Lanes!") == "my-lanes"
    assert project_id(tmp_path / "---") == "lanes"


def test_the_starter_workload_loads(tmp_path):
    from lanectl.bench.workload import load_workload, workload_file

    assert lanectl("init", cwd=tmp_path).returncode == 0
    workload = load_workload(workload_file(tmp_path / "recipes", "smoke"))
    assert (workload.name, sorted(workload.classes)) == ("smoke", ["code", "prose"])


# --- OS errors: a clear error (exit 2), no traceback, nothing left behind ---------------------------------

def tree(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_init_under_a_file_is_refused_clearly(tmp_path):
    (tmp_path / "f").write_text("")
    result = lanectl("init", "f/project", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, "lanectl: f is not a folder, and lanectl init would write "
                                                     "inside it\n")
    assert tree(tmp_path) == ["f"]


def test_init_on_a_dangling_link_is_refused_clearly(tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    result = lanectl("init", "gone", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, f"lanectl: gone is a link to nothing ({tmp_path / 'nowhere'}); "
                                                     "give a folder\n")
    assert tree(tmp_path) == ["gone"]


def test_init_with_a_name_too_long_is_a_clear_error(tmp_path):
    result = lanectl("init", "n" * 300, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.endswith(": File name too long; nothing was left behind. Choose a folder you can write to\n")
    assert tree(tmp_path) == []


def test_init_under_proc_is_a_clear_error(tmp_path):
    result = lanectl("init", "/proc/lanectl-init-test/p", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("lanectl: lanectl init could not write /proc/lanectl-init-test: ")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 24 KiB tmpfs: room for the recipe and the workload, not for the schema (~40 KiB)."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_init_on_a_full_disk_leaves_no_truncated_file(small_tmpfs, tmp_path):
    assert len(json.dumps(recipe_json_schema(), indent=2)) > 24 * 1024  # the fixture's premise
    result = lanectl("init", str(small_tmpfs / "p"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"lanectl: lanectl init could not write {small_tmpfs / 'p'}: No space left on device; "
                             "nothing was left behind. Choose a folder you can write to\n")
    assert tree(small_tmpfs) == []  # no truncated lanectl.schema.json to block the rerun


def test_init_on_a_read_only_disk_is_a_clear_error(small_tmpfs, tmp_path):
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    result = lanectl("init", str(small_tmpfs / "p"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (f"lanectl: lanectl init could not write {small_tmpfs / 'p'}: Read-only file system; "
                             "nothing was left behind. Choose a folder you can write to\n")


def test_the_starter_points_at_what_exists_and_its_gate_can_pass(tmp_path):
    """The gate command the starter suggests names a workload it wrote, whose probes exist (PASS needs them), and
    the format is pointed to where it is documented."""
    import re

    from lanectl.bench.workload import load_workload, workload_file

    assert lanectl("init", "p", "--port", "18777", cwd=tmp_path).returncode == 0
    recipe = (tmp_path / "p" / "recipes" / "starter.yaml").read_text()
    assert "README" not in recipe and "host: 18777" in recipe and "18100" not in recipe
    gate = re.search(r"lanectl gate .*", recipe).group(0)
    workload = re.search(r"--workload (\S+)", gate).group(1)
    loaded = load_workload(workload_file(tmp_path / "p" / "recipes", workload))
    assert loaded.probes, "a workload without probes can never PASS a gate"


@pytest.mark.parametrize("port", ["0", "70000"])
def test_a_port_out_of_range_is_refused(tmp_path, port):
    result = lanectl("init", "p", "--port", port, cwd=tmp_path)
    assert result.returncode == 2 and "a host port is a number from 1 to 65535" in result.stderr
    assert not (tmp_path / "p").exists()


def test_patches_check_passes_in_a_project_without_patches(tmp_path):
    """The CI step the docs give runs `patches check` in every project, the starter's included."""
    assert lanectl("init", "p", cwd=tmp_path).returncode == 0
    result = lanectl("patches", "check", cwd=tmp_path / "p")
    assert result.returncode == 0, result.stderr
    assert "no *.patch files under patches: nothing to check" in result.stderr
    as_json = lanectl("patches", "check", "--json", cwd=tmp_path / "p")
    assert (as_json.returncode, json.loads(as_json.stdout)["data"]) == (0, {"patches": []})
