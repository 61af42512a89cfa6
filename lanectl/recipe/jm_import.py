"""A J-M-Recipes recipe (`jm-recipe/v1`: `recipe.yaml` and its launch command) as a `lanectl/v1` recipe.

Pure: a parsed `recipe.yaml` and the launch command's text in, the lanectl recipe (a dict in the format's
key order) and every jm field it did not map out, each with its location. Bad input (another schema
version, a launch command that is not `vllm serve …`, unbalanced quotes) raises `RecipeInvalid` with
every problem located.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any

from lanectl.errors import Problem, RecipeInvalid
from lanectl.recipe.model import VLLM_RELEASE
from lanectl.recipe.yaml_source import PathKey, YamlDocument, format_path
from lanectl.records import frozen

JM_SCHEMA = "jm-recipe/v1"
DEFAULT_LAUNCH_FILE = "launch-command.txt"
# Where vLLM lives in the official vllm-openai images (Python 3.12): the patch and kernel install root.
VLLM_PYTHON_SITE = "/usr/local/lib/python3.12/dist-packages"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")

# The jm fields this import maps, by path; a mapping's children count as mapped with it.
MAPPED: tuple[PathKey, ...] = (
    ("schema",), ("id",), ("title",),
    ("runtime", "engine"), ("runtime", "engine_version"), ("runtime", "container", "image"),
    ("runtime", "container", "digest"),
    ("launch", "command_file"), ("launch", "ports"), ("launch", "env"), ("launch", "secret_env"),
    ("launch", "volumes"), ("launch", "ipc"), ("launch", "shm_size"), ("launch", "gpus"),
    ("health", "ready", "path"), ("health", "ready", "timeout_s"), ("health", "liveness", "path"),
    ("health", "log_expect"), ("health", "log_forbid"),
)


@frozen
class JmImport:
    recipe: dict[str, Any]  # the lanectl/v1 recipe
    unmapped: list[Problem]  # each jm field with no place in it, located in recipe.yaml
    # Where each value of the recipe came from, by its path in the recipe: a jm field or a line of the launch
    # command (a Problem without a message). A problem lanectl's validation finds in the recipe is reported there.
    origins: dict[PathKey, Problem]

    def origin_of(self, path: PathKey) -> Problem | None:
        """The source of the value at `path`, or of its nearest ancestor that has one."""
        for cut in range(len(path), 0, -1):
            if path[:cut] in self.origins:
                return self.origins[path[:cut]]
        return None


def launch_file_name(doc: YamlDocument) -> str:
    """The launch command's file, beside recipe.yaml: `launch.command_file`, else launch-command.txt.

    Raises `RecipeInvalid` for a name that leaves the recipe's folder (absolute, `..`): a recipe from
    elsewhere must not make lanectl read, or quote, any other file. Links are checked where it is opened.
    """
    launch = doc.data.get("launch") if isinstance(doc.data, dict) else None
    name = launch.get("command_file") if isinstance(launch, dict) else None
    if not (isinstance(name, str) and name):
        return DEFAULT_LAUNCH_FILE
    if name.startswith("/") or ".." in name.split("/") or "\0" in name:
        raise RecipeInvalid([doc.problem(("launch", "command_file"),
                                         "must name a file inside the recipe's folder (a relative path without "
                                         "`..`); copy the launch command next to recipe.yaml")])
    return name


def import_jm(doc: YamlDocument, launch_text: str, launch_file: str, *, lane: str = "main") -> JmImport:
    problems: list[Problem] = []
    origins: dict[PathKey, Problem] = {}

    def came_from(recipe_path: PathKey, jm_path: PathKey) -> None:
        origins[("defaults", *recipe_path) if recipe_path[0] in ("image", "engine", "health") else recipe_path] = \
            doc.problem(jm_path, "")
    data = doc.data if isinstance(doc.data, dict) else {}
    if not isinstance(doc.data, dict) or data.get("schema") != JM_SCHEMA:
        found = data.get("schema") if data else doc.data
        raise RecipeInvalid([doc.problem(("schema",), f"{found!r} is not a J-M recipe schema lanectl knows; "
                                                      f"`lanectl import jm` reads {JM_SCHEMA}")])

    def get(path: PathKey, kind: type | tuple[type, ...], *, required: bool = False) -> Any:
        value: Any = data
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            if required:
                problems.append(doc.problem(path, "required to import this recipe", key=True))
            return None
        if not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            problems.append(doc.problem(path, f"expected {names}, got {type(value).__name__}"))
            return None
        return value

    engine = get(("runtime", "engine"), str, required=True)
    if engine is not None and engine != "vllm":
        problems.append(doc.problem(("runtime", "engine"), f"{engine!r}: lanectl imports vLLM recipes only"))
    engine_version = get(("runtime", "engine_version"), str)
    if engine_version is not None and not re.fullmatch(VLLM_RELEASE, engine_version):
        problems.append(doc.problem(("runtime", "engine_version"), f"{engine_version!r} is not a vLLM release "
                                                                   "version (e.g. 0.31.0)"))
        engine_version = None
    image = get(("runtime", "container", "image"), str, required=True)
    digest = get(("runtime", "container", "digest"), str, required=True)
    if digest is not None and not DIGEST.fullmatch(digest):
        problems.append(doc.problem(("runtime", "container", "digest"), "expected sha256:<64 hex digits>"))

    came_from(("id",), ("id",))
    came_from(("description",), ("title",))
    came_from(("image", "base"), ("runtime", "container", "image"))
    came_from(("image", "vllm"), ("runtime", "engine_version"))
    origins[("lanes",)] = Problem("--lane", 0, 0, "", "")

    args = _serve_args(launch_text, launch_file, problems)
    lines = _arg_lines(launch_text)
    for i in range(len(args)):
        at = lines[i] if i < len(lines) else 1
        origins[("defaults", "engine", "args", i)] = Problem(launch_file, at, 1, f"`vllm serve` argument {i + 1}", "")
    origins[("defaults", "engine", "args")] = Problem(launch_file, 1, 1, "", "")
    served = _flag_value(args, "--served-model-name")
    if not args and not problems and launch_text.strip():
        problems.append(Problem(launch_file, 1, 1, "", "`vllm serve` names no model: expected `vllm serve MODEL "
                                                        "--served-model-name NAME …`"))
    if args and served is None:
        problems.append(Problem(launch_file, 1, 1, "", "no --served-model-name: the health gate needs the name "
                                                        "/v1/models lists"))
    if served is not None:
        at = args.index("--served-model-name") if "--served-model-name" in args else 0
        origins[("defaults", "health", "served_model_name")] = origins.get(("defaults", "engine", "args", at),
                                                                          Problem(launch_file, 1, 1, "", ""))

    engine_fields: dict[str, Any] = {"args": args}
    env = get(("launch", "env"), dict)
    if env:
        engine_fields["env"] = {str(k): _scalar(doc, ("launch", "env", k), v, problems) for k, v in env.items()}
        came_from(("engine", "env"), ("launch", "env"))
        for key in env:
            came_from(("engine", "env", str(key)), ("launch", "env", key))
    secret_env = get(("launch", "secret_env"), list)
    if secret_env:
        engine_fields["secret_env"] = [_scalar(doc, ("launch", "secret_env", i), name, problems)
                                       for i, name in enumerate(secret_env)]
        for i in range(len(secret_env)):
            came_from(("engine", "secret_env", i), ("launch", "secret_env", i))
    ports = get(("launch", "ports"), list)
    if ports:
        engine_fields["ports"] = [{"container": p, "host": p} for p in _ports(doc, ports, problems)]
        came_from(("engine", "ports"), ("launch", "ports"))
        for i in range(len(ports)):
            came_from(("engine", "ports", i), ("launch", "ports", i))
    volumes = get(("launch", "volumes"), list)
    if volumes:
        engine_fields["volumes"] = [_volume(doc, i, v, problems) for i, v in enumerate(volumes)]
        came_from(("engine", "volumes"), ("launch", "volumes"))
        for i, volume in enumerate(volumes):
            came_from(("engine", "volumes", i), ("launch", "volumes", i))
            for ours, theirs in (("source", "host"), ("volume", "volume"), ("target", "container")):
                if isinstance(volume, dict) and theirs in volume:
                    came_from(("engine", "volumes", i, ours), ("launch", "volumes", i, theirs))
    for key in ("ipc", "shm_size"):
        value = get(("launch", key), str)
        if value is not None:
            engine_fields[key] = value
            came_from(("engine", key), ("launch", key))
    gpus = get(("launch", "gpus"), list)
    if gpus:
        engine_fields["gpus"] = {"device_ids": [_scalar(doc, ("launch", "gpus", i), g, problems)
                                                for i, g in enumerate(gpus)]}
        came_from(("engine", "gpus"), ("launch", "gpus"))
    came_from(("engine",), ("launch",))

    health: dict[str, Any] = {}
    timeout = get(("health", "ready", "timeout_s"), (int, float))
    if isinstance(timeout, bool) or (timeout is not None and not (math.isfinite(timeout) and timeout > 0)):
        # YAML reads `yes`, `.inf` and `.nan` as numbers too; none is a time to wait for an engine.
        problems.append(doc.problem(("health", "ready", "timeout_s"),
                                    f"expected a positive, finite number of seconds, got {timeout!r}"))
    elif timeout is not None:
        health["startup_budget_minutes"] = math.ceil(timeout / 60)
        came_from(("health", "startup_budget_minutes"), ("health", "ready", "timeout_s"))
    liveness = get(("health", "liveness", "path"), str)
    if liveness is not None:
        health["health_path"] = liveness
        came_from(("health", "health_path"), ("health", "liveness", "path"))
    ready = get(("health", "ready", "path"), str)
    if ready is not None:
        health["models_path"] = ready
        came_from(("health", "models_path"), ("health", "ready", "path"))
    came_from(("health",), ("health",))
    came_from(("health", "startup_log", "expect"), ("health", "log_expect"))
    for key in ("forbid", "stall"):
        came_from(("health", "startup_log", key), ("health", "log_forbid"))
    if served is not None:
        health["served_model_name"] = served
    startup_log = _startup_log(
        [str(line) for line in get(("health", "log_expect"), list) or []],
        [str(line) for line in get(("health", "log_forbid"), list) or []],
        args,
    )
    if startup_log:
        health["startup_log"] = startup_log

    jm_id = str(get(("id",), str, required=True) or "")
    title = str(get(("title",), str) or "")
    if problems:
        raise RecipeInvalid(problems)
    recipe: dict[str, Any] = {
        "schema": "lanectl/v1",
        "id": re.sub(r"[^a-z0-9._-]+", "-", jm_id.rsplit("/", 1)[-1].lower()).strip("-._") or "imported",
        "description": title,
        "defaults": {
            "image": {"template": "vllm", "base": f"{image}@{digest}", "python_site": VLLM_PYTHON_SITE,
                      **({"vllm": engine_version} if engine_version else {})},
            "engine": engine_fields,
            "health": health,
        },
        "lanes": {lane: {}},
    }
    return JmImport(recipe=recipe, unmapped=_unmapped(doc), origins=origins)


# What vLLM 0.31.0 prints where the J-M recipe's rules assumed otherwise (its own format strings; the
# contract suite checks them): jm's rules were written against lines no 0.31.0 engine prints.
AUTOTUNE_STARTS = "[Autotuner]: Autotuning process starts ..."
# flashinfer's lines for a warm autotune cache: vLLM's JSON file (0.31.0, 0.32.0) and flashinfer's managed store
# (0.33.0 on a single GPU), each with the count of tuned configs.
WARM_CACHE_LINE = "[Autotuner]: Loaded 210 configs from /root/.cache/vllm/flashinfer_autotune_cache/autotune.json"
WARM_COUNT = re.compile(r"Loaded (\[0-9\]\+|\d+) configs")
AUTOTUNE_STALL = {"after": "Autotuning process starts", "until": "Autotuning process ends", "minutes": 10,
                  "name": "autotune", "why": "a warm cache ends it at once; a cold retune takes 74 min"}
# A cold retune (74 min measured) is allowed once: the first start on a new vLLM or flashinfer release has no cache.
COLD_AUTOTUNE_MINUTES = 90
ENGRAM_LINE = "Engram table offloaded to pinned host memory: 48002473 rows x 256, 11.80 GiB per rank"
ENGRAM_EXPECT = "^Engram table offloaded to pinned host memory: "


def _startup_log(expect: list[str], forbid: list[str], args: list[str]) -> dict[str, Any]:
    """jm's log rules as lanectl's, with its two misreadings of vLLM 0.31.0 mapped to what they meant:

    - a forbid of `Autotuning process starts`: flashinfer_autotune() logs it on *every* start and `... ends`
      at once on a warm cache, so the rule failed every start; what jm meant (the line followed by silence, a
      74-minute retune) is a stall rule. An expect of the warm cache's `Loaded N configs` becomes the stall's
      `warm` (with the managed store's `Preloaded N/M managed cache entries`, vLLM 0.33.0's line for it), so the
      first start on a new release, which has no cache, may retune once instead of failing every try;
    - an expect like `[Oo]ffload.*GiB`: the UVA expert offload logs `Total CPU offloaded parameters: 60.0`
      (GiB without a unit), so the rule matched only the Engram line and passed a lane that offloaded no
      expert; with `--cpu-offload-gb N` it becomes the UVA line with N, and the Engram line when
      `--engram-config` asks for cpu_offload.
    """
    gib = _flag_value(args, "--cpu-offload-gb")
    mapped_expect: list[str] = []
    for pattern in expect:
        if gib is not None and _searches(pattern, ENGRAM_LINE) and not _searches(pattern, f"Total CPU offloaded "
                                                                                           f"parameters: {gib}"):
            mapped_expect.append(f"^Total CPU offloaded parameters: {re.escape(gib)}(\\.0+)?$")
            if _engram_offload(args):
                mapped_expect.append(ENGRAM_EXPECT)
        else:
            mapped_expect.append(pattern)
    stall = [dict(AUTOTUNE_STALL, after=p) for p in forbid if _searches(p, AUTOTUNE_STARTS)]
    kept_forbid = [p for p in forbid if not _searches(p, AUTOTUNE_STARTS)]
    warm = [p for p in mapped_expect if _searches(p, WARM_CACHE_LINE)] if stall else []
    if warm:
        mapped_expect = [p for p in mapped_expect if p not in warm]
        count = WARM_COUNT.search(warm[0])
        managed = f"Preloaded {count[1]}/[0-9]+ managed cache entries" if count else "Preloaded [0-9]+/[0-9]+ managed"
        stall = [dict(rule, warm=f"{warm[0]}|{managed}", cold_minutes=COLD_AUTOTUNE_MINUTES) for rule in stall]
    out: dict[str, Any] = {}
    for key, value in (("expect", list(dict.fromkeys(mapped_expect))), ("forbid", kept_forbid), ("stall", stall)):
        if value:
            out[key] = value
    return out


def _searches(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False  # kept as written: recipe validation names the bad regex with its location


def _engram_offload(args: list[str]) -> bool:
    raw = _flag_value(args, "--engram-config")
    try:
        config = json.loads(raw) if raw is not None else None
    except ValueError:
        return False
    return isinstance(config, dict) and config.get("cpu_offload") is True


def _serve_args(text: str, file: str, problems: list[Problem]) -> list[str]:
    """The arguments after `vllm serve`, as a shell would split the command (line continuations joined)."""
    opening = _unclosed_quote(text)
    if opening is not None:
        # The shell only sees the last quote left open; the mistake is usually on the first line whose
        # quotes do not pair up on their own (serve flags rarely quote across lines).
        line, column, quote = opening
        for number, row in enumerate(text.splitlines(), 1):
            alone = _unclosed_quote(row)
            if alone is not None:
                line, column, quote = number, alone[1], alone[2]
                break
        problems.append(Problem(file, line, column, "", f"unbalanced quotes: this {quote} is never closed"))
        return []
    operator = _shell_operator(text)
    if operator is not None:
        line, column, word = operator
        problems.append(Problem(file, line, column, "", f"the command runs more than `vllm serve` (shell operator "
                                                        f"`{word}`); lanectl imports the one command: remove what "
                                                        "the shell would run besides it"))
        return []
    # A backslash-newline continues the command; shlex would keep the newline as a word of its own.
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError:  # the only one left once quotes pair up: a last backslash, with nothing to escape
        end = text.rstrip("\n")
        line, column = end.count("\n") + 1, len(end) - (end.rfind("\n") + 1)
        problems.append(Problem(file, line, column, "", "the command ends in a backslash that escapes nothing; "
                                                        "remove it"))
        return []
    if words[:2] != ["vllm", "serve"]:
        line = next((i for i, row in enumerate(text.splitlines(), 1) if row.strip()), 1)
        # The file's words are not quoted back: a command_file that names another file must not print it.
        found = "nothing" if not words else "another command"
        problems.append(Problem(file, line, 1, "", f"expected a `vllm serve …` command, found {found}"))
        return []
    return words[2:]


_OPERATOR_CHARACTERS = ";&|<>()"


def _shell_operator(text: str) -> tuple[int, int, str] | None:
    """Line, column and text of the first control or redirection operator the shell would see outside quotes
    (`;`, `&&`, `|`, `>`, …): where a launch command runs or writes more than `vllm serve`. None when there is none."""
    quote, i = "", 0
    while i < len(text):
        char = text[i]
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"':
                i += 1
        elif char == "\\":
            i += 1
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            i = text.find("\n", i)
            if i < 0:
                break
        elif char in _OPERATOR_CHARACTERS:
            end = i
            while end < len(text) and text[end] in _OPERATOR_CHARACTERS:
                end += 1
            line = text.count("\n", 0, i) + 1
            return line, i - (text.rfind("\n", 0, i) + 1) + 1, text[i:end]
        i += 1
    return None


def _unclosed_quote(text: str) -> tuple[int, int, str] | None:
    """Line, column and character of a quote the shell would never see closed, or None."""
    quote, start, i = "", 0, 0
    while i < len(text):
        char = text[i]
        if quote == "'":
            if char == "'":
                quote = ""
        elif quote == '"':
            if char == "\\":
                i += 1
            elif char == '"':
                quote = ""
        elif char == "\\":
            i += 1
        elif char in "'\"":
            quote, start = char, i
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            i = text.find("\n", i)
            if i < 0:
                break
        i += 1
    if not quote:
        return None
    line = text.count("\n", 0, start) + 1
    return line, start - (text.rfind("\n", 0, start) + 1) + 1, quote


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, word in enumerate(args):
        if word == flag and i + 1 < len(args):
            return args[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def _scalar(doc: YamlDocument, path: PathKey, value: Any, problems: list[Problem]) -> str:
    """A jm value that becomes a string of the recipe (an env value, a name, a GPU): a string or a number; a list, a
    mapping or null would be written as its Python text."""
    if value is None or isinstance(value, dict | list):
        problems.append(doc.problem(path, f"expected a string or a number, got {_show(value)}"))
        return ""
    return str(value)


def _ports(doc: YamlDocument, ports: list[Any], problems: list[Problem]) -> list[Any]:
    """jm's ports, each a port number: YAML's `true` is no port, though Python would take it for 1."""
    for i, port in enumerate(ports):
        if isinstance(port, bool) or not isinstance(port, int):
            problems.append(doc.problem(("launch", "ports", i), f"expected a port number (1-65535), got "
                                                                f"{_show(port)}"))
    return ports


def _arg_lines(text: str) -> list[int]:
    """The line each word after `vllm serve` is on, as the shell splits the command (for locating a problem)."""
    lexer = shlex.shlex(text.replace("\\\n", " \n"), posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    lines = []
    try:
        for _word in iter(lexer.get_token, None):
            lines.append(lexer.lineno)
    except ValueError:  # unbalanced quotes: reported by _serve_args
        return []
    return lines[2:]


def _volume(doc: YamlDocument, index: int, volume: Any, problems: list[Problem]) -> dict[str, Any]:
    path: PathKey = ("launch", "volumes", index)
    if not isinstance(volume, dict) or not isinstance(volume.get("container"), str):
        problems.append(doc.problem(path, "expected {host: PATH | volume: NAME, container: PATH, mode: ro|rw}"))
        return {}
    if "host" in volume and "volume" in volume:
        problems.append(doc.problem(path, "give host (a bind mount) or volume (a named volume), not both"))
    source = {"source": volume["host"]} if "host" in volume else {"volume": volume.get("volume")}
    out: dict[str, Any] = {**source, "target": volume["container"]}
    if volume.get("mode") == "ro":
        out["read_only"] = True
    for key in sorted(set(volume) - {"host", "volume", "container", "mode"}):
        problems.append(doc.problem((*path, key), "unknown volume field; expected host, volume, container, mode",
                                    key=True))
    return out


def _unmapped(doc: YamlDocument) -> list[Problem]:
    """Every leaf (or whole list) of recipe.yaml outside MAPPED, at its key, in file order."""
    found = []
    for path in doc.value_at:
        if not path or any(path[:len(m)] == m for m in MAPPED):
            continue
        value = _at(doc.data, path)
        inside_list = any(isinstance(_at(doc.data, path[:cut]), list) for cut in range(len(path)))
        if isinstance(value, dict) or inside_list:
            continue  # reported through its keys, or with its whole list
        line, column = doc.position(path, key=True)
        found.append(Problem(doc.file, line, column, format_path(path), "not mapped: " + _show(value)))
    return sorted(found, key=lambda p: (p.line, p.column))


def _at(data: Any, path: PathKey) -> Any:
    for part in path:
        data = data[part]
    return data


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, list) else f"list of {len(value)}"
    return text if len(text) <= 60 else text[:57] + "..."
