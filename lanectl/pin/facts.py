"""What a vLLM release (and the flashinfer it pins) says about the things a lane depends on, read from its source.

Each reader names the file and the construct it looks for, and says where it found the answer (`file:line`). When a
release no longer has that construct the reader raises `SourceChanged` with what it looked for: a check that cannot
read its fact says so, it never passes by default. Nothing here is restated from memory of a release: the same
readers give 0.31.0's answers from 0.31.0's source and 0.33.0's from 0.33.0's.
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, field
from typing import Any

from lanectl.errors import OperationFailed
from lanectl.pin.log_calls import LogCall, log_calls
from lanectl.pin.release import ReleaseSource
from lanectl.records import frozen

KERNEL_WARMUP = "vllm/model_executor/warmup/kernel_warmup.py"
AUTOTUNE_CACHE = "vllm/model_executor/warmup/flashinfer_autotune_cache.py"
ENVS = "vllm/envs.py"
SLEEP_ROUTER = "vllm/entrypoints/serve/dev/sleep/api_router.py"
DOWNLOAD_KERNELS = "vllm/entrypoints/cli/download_kernels.py"
VLLM_CONFIG = "vllm/config/vllm.py"
FLASHINFER_STORE = "flashinfer/autotune_cache.py"
FLASHINFER_JIT_ENV = "flashinfer/jit/env.py"
# The flashinfer functions whose line says a start found its tuned results: the JSON file's loader (vLLM's
# legacy cache) and the managed store's bulk read at attach (autotune_v2).
WARM_LEGACY_FUNCTION = "AutoTuner.load_configs"
WARM_MANAGED_FUNCTION = "_hydrate_from_store"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
ROUTE_METHODS = {"get", "post", "put", "delete", "patch", "api_route"}


class SourceChanged(OperationFailed):
    """A release's source no longer has what a reader looks for: the check must be brought up to date."""


@frozen
class ManagedStore:
    """vLLM's use of flashinfer's managed autotune store (autotune_v2, vLLM 0.33.0 on)."""

    where: str  # the call in flashinfer_autotune()
    single_rank_only: bool  # use_flashinfer_autotune_v2 falls back to the legacy file when world_size > 1
    root_env: str | None  # the vLLM variable that places the store (else flashinfer's default)
    log_line: str  # what vLLM logs when it uses it
    log_where: str


@frozen
class AutotuneFacts:
    legacy_file: str  # the file a rank reads and writes: autotune_configs.json, autotune_configs_dp{dp}_rank{rank}.json
    legacy_file_where: str
    legacy_root_env: str | None  # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR
    legacy_root_default: str  # "$VLLM_CACHE_ROOT/flashinfer_autotune_cache"
    managed: ManagedStore | None


@frozen
class VllmFacts:
    version: str
    flashinfer: str | None  # the flashinfer-python version the release pins
    torch: str | None
    serve_flags: list[str]
    dev_routes: dict[str, str]  # path -> file:line of its route
    sleep_answers: dict[str, str]  # "/sleep" -> what a 200 carries
    download_kernels: str | None  # where `vllm download-kernels` is defined, None before it existed
    download_kernels_warning: str | None  # where the engine warns at start without its kernels
    compile_key_version: str | None  # where the torch.compile cache key takes in vLLM's version
    cache_root_default: str  # VLLM_CACHE_ROOT's default, as a path with ~
    autotune: AutotuneFacts
    log_calls: list[LogCall] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VllmFacts:
        autotune = data["autotune"]
        managed = autotune["managed"]
        facts = AutotuneFacts(**{**autotune, "managed": ManagedStore(**managed) if managed else None})
        return cls(**{**data, "log_calls": [LogCall(**call) for call in data["log_calls"]], "autotune": facts})


@frozen
class FlashinferFacts:
    version: str
    managed_root_env: str | None  # FLASHINFER_AUTOTUNE_CACHE_DIR, None before the managed store existed
    managed_root_default: str | None  # "~/.cache/flashinfer/autotune" (with FLASHINFER_WORKSPACE_BASE for ~)
    workspace_base_env: str | None
    log_calls: list[LogCall] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FlashinferFacts:
        return cls(**{**data, "log_calls": [LogCall(**call) for call in data["log_calls"]]})


# --- reading helpers -------------------------------------------------------------------------------------------

def _tree(source: ReleaseSource, relpath: str) -> ast.Module:
    text = source.text(relpath)
    if text is None:
        raise SourceChanged(f"{source.project} {source.version} has no {relpath}")
    return ast.parse(text)


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    return None


def _required_function(source: ReleaseSource, relpath: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    found = _function(_tree(source, relpath), name)
    if found is None:
        raise SourceChanged(f"{source.project} {source.version}'s {relpath} has no function {name}()")
    return found


def _mentions(node: ast.AST, text: str) -> bool:
    return text in ast.unparse(node)


def all_log_calls(source: ReleaseSource, package: str) -> list[LogCall]:
    return [call for relpath, text in source.python_files(f"{package}/") for call in log_calls(text, relpath)]


# --- serve flags -------------------------------------------------------------------------------------------------

_FLAG = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$")


def serve_flags(source: ReleaseSource) -> list[str]:
    """Every option `vllm serve` can know: the literal flags passed to `add_argument` in the engine's and the
    entrypoints' argument code, and `--<field>` of every `*Args` class there (the frontend turns its fields into
    flags by name). A flag spelt with underscores is the same flag (vLLM's parser normalises them)."""
    flags: set[str] = set()
    for relpath, text in source.python_files("vllm/"):
        if not (relpath == "vllm/engine/arg_utils.py" or relpath.startswith("vllm/entrypoints/")):
            continue
        if "add_argument" not in text and "Args" not in text:
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                flags.update(arg.value for arg in node.args
                             if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _FLAG.match(arg.value))
            elif isinstance(node, ast.ClassDef) and node.name.endswith("Args"):
                flags.update("--" + item.target.id.replace("_", "-") for item in node.body
                             if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                             and not item.target.id.startswith("_"))
    if "--model" not in flags and "--served-model-name" not in flags:
        raise SourceChanged(f"vllm {source.version}: no serve flags found in vllm/engine/arg_utils.py or "
                            "vllm/entrypoints/")
    return sorted(flag.replace("_", "-") for flag in flags)


# --- development routes ------------------------------------------------------------------------------------------

def _module_file(source: ReleaseSource, module: str) -> str | None:
    for candidate in (module.replace(".", "/") + ".py", module.replace(".", "/") + "/__init__.py"):
        if source.text(candidate) is not None:
            return candidate
    return None


def _absolute(module: str | None, level: int, relpath: str) -> str:
    if not level:
        return module or ""
    package = relpath.removesuffix(".py").split("/")[:-1]  # a module's package; an __init__'s own folder
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _routes_in(tree: ast.Module, relpath: str) -> dict[str, str]:
    routes = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                        and decorator.func.attr in ROUTE_METHODS and decorator.args
                        and isinstance(decorator.args[0], ast.Constant) and isinstance(decorator.args[0].value, str)):
                    routes[decorator.args[0].value] = f"{relpath}:{decorator.lineno}"
    return routes


def _imports_in(body: list[ast.stmt], relpath: str) -> list[tuple[str, str]]:
    """(module, name) of every `from M import name` in `body`, nested blocks included."""
    found: list[tuple[str, str]] = []
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.ImportFrom):
                module = _absolute(node.module, node.level, relpath)
                found.extend((module, alias.name) for alias in node.names)
    return found


def dev_routes(source: ReleaseSource) -> dict[str, str]:
    """The routes vLLM mounts only under `if envs.VLLM_SERVER_DEV_MODE:`: the block's imports are followed into
    the functions it calls and the routers those import, and every `@router.<method>("/path")` there is one."""
    blocks = []
    for relpath, text in source.python_files("vllm/entrypoints/"):
        if DEV_MODE_ENV not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.If) and _mentions(node.test, DEV_MODE_ENV):
                blocks.append((relpath, node.body))
    if not blocks:
        raise SourceChanged(f"vllm {source.version}: no `if envs.{DEV_MODE_ENV}:` block under vllm/entrypoints/")
    routes: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    pending = [pair for relpath, body in blocks for pair in _imports_in(body, relpath)]
    while pending:
        module, name = pending.pop()
        if (module, name) in seen:
            continue
        seen.add((module, name))
        module_file = _module_file(source, module)
        if module_file is None:
            submodule = _module_file(source, f"{module}.{name}")
            if submodule is not None:
                routes.update(_routes_in(_tree(source, submodule), submodule))
            continue
        tree = _tree(source, module_file)
        routes.update(_routes_in(tree, module_file))
        function = _function(tree, name)
        if function is not None:
            pending.extend(_imports_in(function.body, module_file))
    return dict(sorted(routes.items()))


# --- answers, build steps, compile cache ---------------------------------------------------------------------------

def sleep_answers(source: ReleaseSource) -> dict[str, str]:
    """What `/sleep` and `/wake_up` answer on success: an empty 200, or the JSON they return."""
    answers = {}
    tree = _tree(source, SLEEP_ROUTER)
    for path, name in (("/sleep", "sleep"), ("/wake_up", "wake_up")):
        function = _function(tree, name)
        if function is None:
            raise SourceChanged(f"vllm {source.version}'s {SLEEP_ROUTER} has no {name}()")
        returned = [node.value for node in ast.walk(function) if isinstance(node, ast.Return) and node.value]
        if not returned or not isinstance(returned[-1], ast.Call):
            raise SourceChanged(f"vllm {source.version}'s {SLEEP_ROUTER} {name}() returns no response object")
        call = returned[-1]
        content = next((kw.value for kw in call.keywords if kw.arg == "content"), None)
        answers[path] = f"200 {ast.unparse(content)}" if content is not None else "200, empty"
    return answers


def download_kernels(source: ReleaseSource, calls: list[LogCall]) -> tuple[str | None, str | None]:
    """Where `vllm download-kernels` is defined (a CLI subcommand named so), and where the engine warns at start
    that the kernels it installs are missing."""
    text = source.text(DOWNLOAD_KERNELS)
    if text is None:
        return None, None
    line = next((i for i, row in enumerate(text.splitlines(), 1) if '"download-kernels"' in row), None)
    if line is None:
        raise SourceChanged(f"vllm {source.version}'s {DOWNLOAD_KERNELS} defines no `download-kernels` command")
    warnings = [call for call in calls if call.file.startswith("vllm/") and "vllm download-kernels" in call.template
                and call.level == "WARNING"]
    warnings.sort(key=lambda call: "precompiled" not in call.template)
    warning = warnings[0].where if warnings else None
    return f"{DOWNLOAD_KERNELS}:{line}", warning


def compile_key_version(source: ReleaseSource) -> str | None:
    """Where vLLM's version enters the torch.compile cache key: `VllmConfig.compute_hash(include_version=True)`
    appending `__version__`, called without `include_version=False` where the torch_compile_cache folder is made."""
    compute = _required_function(source, VLLM_CONFIG, "compute_hash")
    defaults = compute.args.defaults
    takes_version = any(arg.arg == "include_version" for arg in compute.args.args)
    appends = [node for node in ast.walk(compute) if isinstance(node, ast.Name) and node.id == "__version__"]
    if not (takes_version and appends and defaults and isinstance(defaults[-1], ast.Constant) and defaults[-1].value):
        return None
    for relpath, text in source.python_files("vllm/compilation/"):
        if "torch_compile_cache" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compute_hash"
                    and _mentions(node.func.value, "vllm_config")
                    and not any(kw.arg == "include_version" for kw in node.keywords)):
                return f"{VLLM_CONFIG}:{appends[0].lineno}, {relpath}:{node.lineno}"
    return None


def cache_root_default(source: ReleaseSource) -> str:
    """VLLM_CACHE_ROOT's default in vllm/envs.py: `$XDG_CACHE_HOME/vllm`, else `~/.cache/vllm`."""
    text = source.text(ENVS) or ""
    entry = re.search(r'"VLLM_CACHE_ROOT":\s*lambda:(.*?)\n    \),', text, re.S)
    if entry is None or "get_default_cache_root()" not in entry[1] or '"vllm"' not in entry[1]:
        raise SourceChanged(f"vllm {source.version}'s {ENVS}: VLLM_CACHE_ROOT's default is not "
                            "os.path.join(get_default_cache_root(), \"vllm\")")
    return "~/.cache/vllm"


# --- the flashinfer autotune cache ----------------------------------------------------------------------------------

def _rendered_name(node: ast.JoinedStr, stem: str, suffix: str) -> str:
    out = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            out.append(str(value.value))
            continue
        assert isinstance(value, ast.FormattedValue)
        expression = ast.unparse(value.value)
        if expression.endswith(".stem"):
            out.append(stem)
        elif expression.endswith(".suffix"):
            out.append(suffix)
        else:
            out.append("{dp}" if "dp" in expression else "{rank}" if "rank" in expression else "{…}")
    return "".join(out)


def _legacy_file(source: ReleaseSource) -> tuple[str, str]:
    resolve = _required_function(source, AUTOTUNE_CACHE, "resolve_flashinfer_autotune_file")
    bases = [node for node in ast.walk(resolve) if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value.endswith(".json")]
    if not bases:
        raise SourceChanged(f"vllm {source.version}'s {AUTOTUNE_CACHE} resolve_flashinfer_autotune_file() names "
                            "no .json file")
    base = str(bases[0].value)
    stem, suffix = base.rsplit(".", 1)[0], "." + base.rsplit(".", 1)[1]
    per_rank = _function(_tree(source, AUTOTUNE_CACHE), "flashinfer_autotune_filename")
    if per_rank is not None:
        names = [node for node in ast.walk(per_rank) if isinstance(node, ast.JoinedStr)]
        if names:
            return _rendered_name(names[0], stem, suffix), f"{AUTOTUNE_CACHE}:{names[0].lineno}"
    tune = _required_function(source, KERNEL_WARMUP, "flashinfer_autotune")
    for node in ast.walk(tune):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "with_name"
                and node.args and isinstance(node.args[0], ast.JoinedStr)):
            return _rendered_name(node.args[0], stem, suffix), f"{KERNEL_WARMUP}:{node.lineno}"
    return base, f"{AUTOTUNE_CACHE}:{bases[0].lineno}"


def autotune_facts(source: ReleaseSource, calls: list[LogCall]) -> AutotuneFacts:
    legacy_file, legacy_where = _legacy_file(source)
    tree = _tree(source, AUTOTUNE_CACHE)
    root_env = "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR" if "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR" in ast.unparse(tree) \
        else None
    if "flashinfer_autotune_cache" not in ast.unparse(tree):
        raise SourceChanged(f"vllm {source.version}'s {AUTOTUNE_CACHE} no longer roots the cache in "
                            "VLLM_CACHE_ROOT/flashinfer_autotune_cache")
    tune = _required_function(source, KERNEL_WARMUP, "flashinfer_autotune")
    managed = None
    uses_v2 = [node for node in ast.walk(tune) if isinstance(node, ast.Call) and _mentions(node.func, "autotune_v2")
               and not _mentions(node.func, "use_")]
    if uses_v2:
        gate = _required_function(source, AUTOTUNE_CACHE, "use_flashinfer_autotune_v2")
        gate_text = ast.unparse(gate)
        root = _function(tree, "resolve_flashinfer_autotune_v2_root")
        line = next((call for call in calls
                     if call.file == KERNEL_WARMUP and "managed autotune cache" in call.template), None)
        if line is None:
            raise SourceChanged(f"vllm {source.version}'s {KERNEL_WARMUP} logs nothing about the managed "
                                "autotune cache")
        managed = ManagedStore(
            where=f"{KERNEL_WARMUP}:{uses_v2[0].lineno}",
            single_rank_only="world_size > 1" in gate_text and "pipeline_parallel_size > 1" in gate_text,
            root_env="VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR" if root is not None and _mentions(
                root, "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR") else None,
            log_line=line.template, log_where=line.where)
    return AutotuneFacts(legacy_file, legacy_where, root_env, "$VLLM_CACHE_ROOT/flashinfer_autotune_cache", managed)


def vllm_facts(source: ReleaseSource) -> VllmFacts:
    calls = all_log_calls(source, "vllm")
    command, warning = download_kernels(source, calls)
    return VllmFacts(
        version=source.version, flashinfer=source.pinned("flashinfer-python"), torch=source.pinned("torch"),
        serve_flags=serve_flags(source), dev_routes=dev_routes(source), sleep_answers=sleep_answers(source),
        download_kernels=command, download_kernels_warning=warning, compile_key_version=compile_key_version(source),
        cache_root_default=cache_root_default(source), autotune=autotune_facts(source, calls), log_calls=calls)


def flashinfer_facts(source: ReleaseSource) -> FlashinferFacts:
    """Where flashinfer keeps its managed autotune store by default (autotune_cache.get_default_cache_root: its
    variable, else FLASHINFER_CACHE_DIR/autotune, with FLASHINFER_CACHE_DIR = FLASHINFER_WORKSPACE_BASE or home,
    then .cache/flashinfer), and its logger calls."""
    calls = all_log_calls(source, "flashinfer")
    if source.text(FLASHINFER_STORE) is None:
        return FlashinferFacts(source.version, None, None, None, calls)
    default_root = _required_function(source, FLASHINFER_STORE, "get_default_cache_root")
    text = ast.unparse(default_root)
    env = re.search(r"getenv\('([A-Z_]+)'\)", text)
    if env is None or "FLASHINFER_CACHE_DIR / 'autotune'" not in text:
        raise SourceChanged(f"flashinfer {source.version}'s {FLASHINFER_STORE} get_default_cache_root() is not "
                            "os.getenv(X) else FLASHINFER_CACHE_DIR / 'autotune'")
    jit_env = source.text(FLASHINFER_JIT_ENV) or ""
    base = re.search(r"FLASHINFER_BASE_DIR[^=]*=\s*pathlib\.Path\(\s*os\.getenv\(\s*\"([A-Z_]+)\",\s*"
                     r"pathlib\.Path\.home\(\)", jit_env)
    if base is None or 'FLASHINFER_CACHE_DIR: pathlib.Path = FLASHINFER_BASE_DIR / ".cache" / "flashinfer"' \
            not in jit_env:
        raise SourceChanged(f"flashinfer {source.version}'s {FLASHINFER_JIT_ENV}: FLASHINFER_CACHE_DIR is not "
                            "$FLASHINFER_WORKSPACE_BASE (else home)/.cache/flashinfer")
    return FlashinferFacts(source.version, env[1], "~/.cache/flashinfer/autotune", base[1], calls)
