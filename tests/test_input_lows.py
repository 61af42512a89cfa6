"""The low findings of the fifth input pass (issue 52): YAML that meant something else than it read, numbers and
paths that ran away, and text that reached the terminal raw. Each through the CLI, in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli import lanectl
from tests.test_recipe_validation import GOOD


def validate(project: Path) -> tuple[int, str, str]:
    result = lanectl("validate", cwd=project)
    return result.returncode, result.stdout, result.stderr


@pytest.mark.parametrize(("written", "message"), [
    ("true", "Input should be a valid integer, got True"),
    ("1:30", "Input should be a valid integer, got '1:30'"),
    ('"18000"', "'18000' is text, not an integer; write 18000, without quotes"),
])
def test_a_port_that_is_no_number_is_refused(project, write_recipe, written, message):
    """`host: true` published port 1, and `host: 1:30` (YAML 1.1's base 60) port 90."""
    write_recipe(GOOD.replace("host: 18000", f"host: {written}"))
    code, _, stderr = validate(project)
    assert code == 2
    assert stderr.splitlines()[0] == f"recipes/r.yaml:12:33: defaults.engine.ports[0].host: {message}"


def test_a_recipe_with_a_utf8_byte_order_mark_is_recognised(project, write_recipe):
    path = write_recipe(GOOD)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert validate(project) == (0, "ok: 2 lanes in 1 recipes (a, b)\n", "")


def test_a_yaml_merge_override_is_the_value_and_two_own_keys_are_still_a_duplicate(project, write_recipe):
    """`<<: *health` then `startup_budget_minutes: 5` is YAML's way to override a merged key; it was refused as a
    duplicate key."""
    merged = GOOD.replace("  health:\n", "  health: &health\n", 1)
    merged = merged.replace("  a: {}\n", "  a:\n    health:\n      <<: *health\n      startup_budget_minutes: 5\n")
    write_recipe(merged)
    assert validate(project) == (0, "ok: 2 lanes in 1 recipes (a, b)\n", "")
    write_recipe(merged.replace("      startup_budget_minutes: 5\n",
                                "      startup_budget_minutes: 5\n      startup_budget_minutes: 6\n"))
    code, _, stderr = validate(project)
    assert code == 2 and "lanes.a.health.startup_budget_minutes: duplicate key" in stderr


def test_a_merged_value_is_overridden_by_the_mappings_own(tmp_path):
    from lanectl.recipe.yaml_source import load_yaml

    doc = load_yaml("base: &b {port: 1, host: a}\nlane:\n  <<: *b\n  port: 9000\n", "x.yaml")
    assert doc.data["lane"] == {"port": 9000, "host": "a"}



def test_a_folder_without_a_recipe_is_an_error_not_0_lanes(project, tmp_path):
    """`--recipes /etc` said "ok: 0 lanes in 0 recipes ()" and exited 0."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    result = lanectl("--recipes", str(tmp_path / "etc"), "validate", cwd=project)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"lanectl: no lanectl recipe found in {tmp_path / 'etc'}: a recipe is a .yaml with "
                             "`schema: lanectl/v1`; `lanectl init` starts one\n")


@pytest.mark.parametrize("folder", ['"/var/lib/text\\0file"', "textfile", '"/var/lib/\\x1b[2Jtext"'])
def test_a_textfile_dir_that_no_pass_could_write_is_refused(project, write_recipe, folder):
    """A NUL in textfile_dir passed validate, then made every `watchdog check` exit 2."""
    write_recipe(GOOD.replace("  health:\n", f"  watchdog:\n    alert: {{textfile_dir: {folder}}}\n  health:\n", 1))
    code, _, stderr = validate(project)
    assert code == 2
    assert stderr.splitlines()[0].startswith("recipes/r.yaml:14:27: defaults.watchdog.alert.textfile_dir: must be an "
                                             "absolute folder without control characters, got ")


@pytest.mark.parametrize("duration", ["9" * 400, "9" * 400 + "d", "1" + "0" * 308 + "d"])
def test_an_infinite_duration_is_refused_before_anything_waits(project, write_recipe, duration):
    """`--lock-wait` of 400 nines is float infinity: `down` waited for the engine lock forever."""
    write_recipe(GOOD)
    result = lanectl("down", "--lock-wait", duration, cwd=project, env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("lanectl: --lock-wait ")
    assert result.stderr.endswith(": not a finite duration; give one like 90s, 10m or 2h\n")


@pytest.mark.parametrize("command", [["history"], ["watchdog", "status"]])
def test_a_state_dir_that_is_a_file_is_bad_input(project, write_recipe, tmp_path, command):
    """A state folder that is a file exited 1 (or with a traceback, for `history`): it is the user's setting."""
    write_recipe(GOOD)
    (tmp_path / "state").write_text("")
    result = lanectl(*command, cwd=project, env={"LANECTL_STATE_DIR": str(tmp_path / "state"),
                                                "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"lanectl: state folder {tmp_path / 'state'}: {tmp_path / 'state'} is not a folder; "
                             "set LANECTL_STATE_DIR to a folder (lanectl makes it when missing)\n")


@pytest.mark.parametrize("args", [["validate", "--\u202eevil"], ["lanes", "extra\u2028argument"]])
def test_a_usage_error_shows_what_was_typed_escaped(project, args):
    """click's usage errors quoted the typed option raw: U+202E turned the rest of the line around."""
    from lanectl.output import has_controls

    result = lanectl(*args, cwd=project)
    assert result.returncode == 2
    assert not has_controls(result.stderr), repr(result.stderr)
    assert "\\u202e" in result.stderr or "\\u2028" in result.stderr


def test_report_draws_hostile_names_without_a_raw_control_on_stderr(tmp_path):
    """matplotlib's missing-glyph warnings quoted a lane name's ESC and BEL raw on stderr; a `$` in one started
    its mathtext."""
    import json

    pytest.importorskip("matplotlib")
    from lanectl.output import has_controls
    from tests.test_note_hostile import forged_results

    results = json.loads(json.dumps(forged_results()).replace("demo-h1", "demo-h1 $\\\\frac{"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(results))
    from tests.test_cli import lanectl_process

    # Its own process: in this one, pytest would catch the warnings before they reached stderr.
    result = lanectl_process("report", str(run), cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    assert not has_controls(result.stderr) and "Glyph" not in result.stderr, repr(result.stderr)
    assert (run / "ratios.png").read_bytes().startswith(b"\x89PNG")
