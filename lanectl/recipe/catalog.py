"""Loading recipes into a catalog of lanes: parse, validate every lane, check what they refer to.

Every problem in every file is collected before anything is reported, so one run of
`lanectl validate` lists all there is to fix. A catalog without problems is kept on disk
(lanectl.recipe.catalog_cache) and reused until a file it was validated from changes.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import re
import typing
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lanectl.errors import BadInput, Problem, RecipeInvalid
from lanectl.project import Project, known_templates, leaves, template_dir
from lanectl.recipe.kernel import KernelSpec
from lanectl.recipe.model import (
    CONTROL_CHARACTER,
    DEV_MODE_ENV,
    SLEEP_MODE_FLAG,
    TEMPLATE_NAME,
    LaneSpec,
    Naming,
    RecipeFile,
    flag_value,
    merge,
    validated,
)
from lanectl.recipe.shutdown import check_shutdown, with_shutdown_timeouts
from lanectl.records import frozen

if TYPE_CHECKING:
    # Only a catalog that is not in the cache is parsed and validated: these are imported then.
    from lanectl.recipe.yaml_source import PathKey, YamlDocument

ROLE_PRIMARY = "primary"


@frozen
class Recipe:
    """One recipe file's own settings, shared by its lanes."""

    id: str
    file: Path
    project_root: Path
    description: str
    naming: Naming
    keep_stopped_lanes: int


@frozen
class Lane:
    """A validated lane: its merged spec, its recipe and the kernels it builds."""

    name: str
    recipe: Recipe
    spec: LaneSpec
    kernels: tuple[KernelSpec, ...] = ()
    declared_at: tuple[int, int] = field(default=(0, 0), compare=False)

    @property
    def roles(self) -> list[str]:
        """Start order: the primary first, then companions; stop in reverse."""
        return [ROLE_PRIMARY, *self.spec.companions]

    def container_name(self, role: str = ROLE_PRIMARY) -> str:
        primary = self.recipe.naming.container.replace("{lane}", self.name)
        if role == ROLE_PRIMARY:
            return primary
        return self.recipe.naming.companion.replace("{container}", primary).replace("{role}", role)


@frozen
class Catalog:
    """Every validated lane of a project, by name."""

    project: Project
    lanes: dict[str, Lane] = field(default_factory=dict)

    def lane(self, name: str) -> Lane:
        if name in self.lanes:
            return self.lanes[name]
        close = difflib.get_close_matches(name, list(self.lanes), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else f"; known lanes: {', '.join(sorted(self.lanes))}"
        raise BadInput(f"no lane {name!r}{hint}")

    @cached_property
    def recipes(self) -> list[Recipe]:
        return sorted({lane.recipe.id: lane.recipe for lane in self.lanes.values()}.values(), key=lambda r: r.id)


def recipe_files(project: Project, paths: Iterable[Path] = ()) -> list[Path]:
    return [path for path, kind in _yaml_files(project, paths) if kind == "recipe"]


def unrecognised_files(project: Project, paths: Iterable[Path] = ()) -> list[Path]:
    """The .yaml files under the folders searched that are neither recipes nor a known other kind
    (workloads, probes): not loaded, and named, so that a recipe is never skipped without a word."""
    return [path for path, kind in _yaml_files(project, paths) if kind == "unknown"]


YamlKind = Literal["recipe", "other", "unknown"]


def _yaml_files(project: Project, paths: Iterable[Path]) -> list[tuple[Path, YamlKind]]:
    chosen = list(paths)
    if not chosen:
        if _kind(project.recipes_dir) != "dir":
            raise BadInput(
                f"no recipes folder at {project.display(project.recipes_dir)}; "
                "run lanectl inside a project or pass --recipes DIR (or set LANECTL_RECIPES)"
            )
        chosen = [project.recipes_dir]
    files: list[tuple[Path, YamlKind]] = []
    for path in chosen:
        kind = _kind(path)
        if kind == "dir":
            # Only files that declare a lanectl schema are recipes; workloads and probes live beside them.
            files.extend((p, yaml_kind(p)) for p in sorted(path.rglob("*.yaml")))
        elif kind != "missing":
            files.append((path, "recipe"))
        else:
            raise BadInput(f"{path}: no such recipe file or folder")
    return files


def _kind(path: Path) -> Literal["dir", "other", "missing"]:
    """What is at `path`, links followed; a path the OS refuses (a name too long) is bad input, and a loop of
    links is there but leads nowhere (loading says so)."""
    try:
        return "dir" if path.is_dir() else "other" if os.path.lexists(path) else "missing"
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror or exc}; give a usable recipe file or folder") from None


# The schemas of the files that live under recipes/ beside the recipes.
OTHER_SCHEMAS = ("lanectl-workload/", "lanectl-probe/")
# `schema: lanectl/v1` as a block or flow key, the key or the value quoted or not.
_SCHEMA_KEY = re.compile(r"""(?:^|[{,])[ \t]*["']?schema["']?[ \t]*:[ \t]*["']?(?P<schema>[\w.-]+/)""",
                         re.MULTILINE)
_HEAD_BYTES = 4096


def yaml_kind(path: Path) -> YamlKind:
    """What a .yaml under a recipes folder is, from its `schema:` key: a lanectl recipe, a known other kind,
    or unknown. Anything that loading must explain (not a regular file, not UTF-8) counts as a recipe."""
    if not path.is_file() or path.is_symlink():
        # Loading it reports what is wrong (a directory or FIFO named *.yaml, a symlink out of the folder).
        return "recipe"
    with path.open("rb") as handle:
        head = handle.read(_HEAD_BYTES)
        found = _schema_of(head)
        if found is None and len(head) == _HEAD_BYTES:
            from lanectl.recipe.yaml_source import MAX_FILE_BYTES

            # The key may come after a long comment block: look through the file (at most what loading reads).
            found = _schema_of(head + handle.read(MAX_FILE_BYTES))
    if found is None:
        # UTF-16 or UTF-32 (a BOM, or NULs between the ASCII letters): loading says to save it as UTF-8.
        return "recipe" if head[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in head else "unknown"
    if found == "lanectl/":
        return "recipe"
    return "other" if found in OTHER_SCHEMAS else "unknown"


def _schema_of(data: bytes) -> str | None:
    # An editor's UTF-8 byte order mark before the first key: YAML skips it, and so does this.
    match = _SCHEMA_KEY.search(data.decode("utf-8", errors="replace").removeprefix("\ufeff"))
    return match["schema"] if match else None


def load_catalog(project: Project, paths: Iterable[Path] = ()) -> Catalog:
    """Every lane of every recipe, validated; raises `RecipeInvalid` listing all problems.

    The project's whole recipes folder (no `paths`) is answered from the cache while none of the
    files its validation read has changed.
    """
    from lanectl.recipe.catalog_cache import CatalogCache

    chosen = list(paths)
    files = recipe_files(project, chosen)
    cache = CatalogCache() if not chosen else None
    if cache is not None:
        cached = cache.load(project.recipes_dir, files)
        if isinstance(cached, Catalog) and cached.project == project:
            return cached
    inputs: set[Path] = {project.root, project.recipes_dir, project.images_dir, project.kernels_dir,
                         project.patches_dir}
    catalog = _validate(project, files, inputs)
    if cache is not None:
        cache.store(project.recipes_dir, files, inputs, catalog)
    return catalog


def load_readable(project: Project) -> tuple[Catalog, tuple[str, ...]]:
    """The lanes of the recipes that load, and every problem of those that do not (each `file:line: what`): what
    `status` and `down` work from, so that a broken recipe never hides what runs or keeps it from being stopped.

    With every recipe valid this is `load_catalog`. Otherwise each recipe file is loaded on its own, and a lane
    that two of them have (or whose container name another lane's takes) is left out: which one runs is then
    for the engine's labels to say."""
    try:
        return load_catalog(project), ()
    except RecipeInvalid as exc:
        problems = tuple(str(problem) for problem in exc.problems)
    except BadInput as exc:  # no recipes folder: nothing loads
        return Catalog(project=project), (str(exc),)
    found: dict[str, list[Lane]] = {}
    for file in recipe_files(project):
        try:
            loaded = load_catalog(project, [file])
        except BadInput:
            continue  # its problems are among those of the whole folder
        for lane in loaded.lanes.values():
            found.setdefault(lane.name, []).append(lane)
    lanes = {name: same[0] for name, same in found.items() if len(same) == 1}
    names = Counter(lane.container_name(role) for lane in lanes.values() for role in lane.roles)
    clear = {name: lane for name, lane in lanes.items() if all(names[lane.container_name(r)] == 1 for r in lane.roles)}
    return Catalog(project=project, lanes=clear), problems


def unread_summary(problems: Sequence[str]) -> str:
    """Recipes that do not load, in one line: the first problem (its file and line) and how many there are."""
    more = f" ({len(problems)} problems; `lanectl validate` lists them)" if len(problems) > 1 else ""
    return f"recipes do not all load: {problems[0]}{more}"


def _validate(project: Project, files: list[Path], inputs: set[Path]) -> Catalog:
    """Parse and validate `files`, adding to `inputs` every file and folder the checks looked at."""
    problems: list[Problem] = []
    lanes: dict[str, Lane] = {}
    kernels = _KernelLoader(project, problems, inputs)
    for file in files:
        for lane in _load_recipe_file(project, file, kernels, problems, inputs):
            if lane.name in lanes:
                other = lanes[lane.name].recipe.file
                problems.append(
                    Problem(project.display(file), *lane.declared_at, f"lanes.{lane.name}",
                            f"lane name already used in {project.display(other)}; lane names are unique "
                            "across recipes")
                )
                continue
            lanes[lane.name] = lane
    problems.extend(_container_name_clashes(project, lanes))
    if problems:
        raise RecipeInvalid(problems)
    return Catalog(project=project, lanes=lanes)


def _container_name_clashes(project: Project, lanes: dict[str, Lane]) -> list[Problem]:
    seen: dict[str, str] = {}
    problems = []
    for lane in lanes.values():
        for role in lane.roles:
            name = lane.container_name(role)
            if name in seen and seen[name] != lane.name:
                problems.append(Problem(project.display(lane.recipe.file), *lane.declared_at, f"lanes.{lane.name}",
                                        f"container name {name!r} is also lane {seen[name]}'s; "
                                        "change naming.container or the companion role"))
            seen[name] = lane.name
    return problems


def _load_recipe_file(project: Project, file: Path, kernels: _KernelLoader,
                      problems: list[Problem], inputs: set[Path]) -> list[Lane]:
    from pydantic import ValidationError

    from lanectl.recipe.validation import problems_from_validation
    from lanectl.recipe.yaml_source import YamlSyntaxError, read_yaml_file

    shown = project.display(file)
    try:
        doc = read_yaml_file(file, shown)
    except YamlSyntaxError as exc:
        problems.append(exc.problem)
        return []
    if not isinstance(doc.data, dict):
        problems.append(Problem(shown, 1, 1, "", "a recipe is a YAML mapping with schema, id and lanes"))
        return []
    raw = dict(doc.data)
    # An empty lane (`h1-REF:` with nothing under it) inherits every default.
    if isinstance(raw.get("lanes"), dict):
        raw["lanes"] = {name: ({} if body is None else body) for name, body in raw["lanes"].items()}
    try:
        recipe_file = validated(RecipeFile, raw)
    except ValidationError as exc:
        problems.extend(problems_from_validation(exc, doc, RecipeFile))
        # A top-level problem (a bad id, an unknown key) must not hide the lanes' own: one run lists them all.
        for name, body in _readable_lanes(raw):
            problems.extend(_check_lane(project, doc, raw.get("defaults") or {}, name, body, kernels, inputs)[0])
        return []
    recipe = Recipe(id=recipe_file.id, file=file, project_root=project.root, description=recipe_file.description,
                    naming=recipe_file.naming, keep_stopped_lanes=recipe_file.keep_stopped_lanes)
    lanes = []
    locators: dict[str, typing.Callable[[PathKey], PathKey]] = {}
    for name, body in recipe_file.lanes.items():
        lane_problems, spec, lane_kernels, locate = _check_lane(project, doc, recipe_file.defaults, name, body,
                                                                kernels, inputs)
        problems.extend(lane_problems)
        if spec is None:
            continue
        # From here on every role that runs `vllm serve` carries the --shutdown-timeout it will stop with.
        spec = with_shutdown_timeouts(spec)
        lanes.append(Lane(name=str(name), recipe=recipe, spec=spec, kernels=tuple(lane_kernels),
                          declared_at=doc.position(("lanes", name), key=True)))
        locators[str(name)] = locate
    problems.extend(_check_standby_neighbours(doc, lanes, locators))
    return lanes


def _readable_lanes(raw: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
    """The lanes of a file whose top level is invalid that can still be checked: those of a `lanes` mapping, under
    `defaults` that are a mapping (else their merge means nothing)."""
    lanes, defaults = raw.get("lanes"), raw.get("defaults", {})
    if not isinstance(lanes, dict) or not isinstance(defaults, dict | None):
        return []
    return [(name, body) for name, body in lanes.items() if isinstance(body, dict)]


def _check_lane(project: Project, doc: YamlDocument, defaults: dict[str, Any], name: Any, body: dict[str, Any],
                kernels: _KernelLoader, inputs: set[Path]
                ) -> tuple[list[Problem], LaneSpec | None, list[KernelSpec], typing.Callable[[PathKey], PathKey]]:
    """One lane's problems, located in the file; its spec and kernels when it has none."""
    from pydantic import ValidationError

    from lanectl.recipe.validation import problems_from_validation

    merged = merge(defaults, body)

    def locate(loc: PathKey) -> PathKey:
        own = ("lanes", name, *loc)
        if doc.has(own) or not doc.has(("defaults", *loc)):
            return own
        return ("defaults", *loc)

    # File references are checked even when the lane has type errors, so one run lists both.
    lane_problems, lane_kernels = _check_files(project, doc, merged, locate, kernels, inputs)
    try:
        spec = validated(LaneSpec, merged)
    except ValidationError as exc:
        return [*lane_problems, *problems_from_validation(exc, doc, LaneSpec, locate)], None, [], locate
    lane_problems.extend(_check_consistency(doc, spec, locate))
    lane_problems.extend(_check_standby(doc, spec, locate))
    lane_problems.extend(_check_swarm_ports(doc, spec, locate))
    lane_problems.extend(check_shutdown(doc, spec, locate))
    return lane_problems, None if lane_problems else spec, lane_kernels, locate


def _check_files(project: Project, doc: YamlDocument, merged: dict[str, Any],
                 locate: typing.Callable[[PathKey], PathKey],
                 kernels: _KernelLoader, inputs: set[Path]) -> tuple[list[Problem], list[KernelSpec]]:
    """What pydantic cannot see: the template, kernels and patches a lane refers to must exist."""
    problems = []
    image = merged.get("image")
    template_name = image.get("template") if isinstance(image, dict) else None
    if isinstance(template_name, str) and re.fullmatch(TEMPLATE_NAME, template_name):
        template = project.images_dir / template_name / "Dockerfile.j2"
        inputs.update((template, template.parent))
        if leaves(template.parent, project.images_dir):
            problems.append(doc.problem(locate(("image", "template")),
                                     f"{template_name} leads out of images/ (through '..' or a symlink); "
                                     "keep templates inside images/"))
        elif os.path.lexists(template) and leaves(template, template.parent):
            problems.append(doc.problem(locate(("image", "template")),
                                     f"images/{template_name}/Dockerfile.j2 is a symbolic link out of its folder; "
                                     f"copy the template into images/{template_name}/"))
        elif template_dir(project.images_dir, template_name) is None:
            problems.append(doc.problem(locate(("image", "template")),
                                     f"no template {project.display(template)}; known templates: "
                                     f"{', '.join(known_templates(project.images_dir)) or 'none'}"))
    found_kernels = []
    names = merged.get("kernels")
    for i, kernel_name in enumerate(names if isinstance(names, list) else []):
        if not isinstance(kernel_name, str):
            continue
        kernel = kernels.get(kernel_name)
        if kernel is None:
            problems.append(doc.problem(locate(("kernels", i)),
                                     f"no kernel {kernel_name!r}: expected kernels/{kernel_name}.yaml"
                                     f"{kernels.known_hint()}"))
        elif kernel is not _INVALID:
            found_kernels.append(kernel)
    patches = merged.get("patches")
    for i, patch in enumerate(patches if isinstance(patches, list) else []):
        path_text = patch.get("path") if isinstance(patch, dict) else None
        if not isinstance(path_text, str) or re.search(CONTROL_CHARACTER, path_text):
            continue  # the model reports it
        path = project.patches_dir / patch["path"]
        inputs.add(path)
        if leaves(path, project.patches_dir):
            problems.append(doc.problem(locate(("patches", i, "path")),
                                     f"{patch['path']} leads out of patches/ (through '..' or a symlink); "
                                     "keep patch files inside patches/"))
            continue
        try:
            actual = _patch_digest(path)
        except OSError as exc:
            why = "" if isinstance(exc, FileNotFoundError) else f" ({exc.strerror or exc})"
            problems.append(doc.problem(locate(("patches", i, "path")),
                                     f"no patch file patches/{patch['path']}{why}; paths are relative to patches/"))
            continue
        if isinstance(patch.get("sha256"), str) and actual != patch["sha256"]:
            problems.append(doc.problem(locate(("patches", i, "sha256")),
                                     f"sha256 does not match {project.display(path)} (it hashes to {actual}); "
                                     "review the patch, then update sha256"))
    return problems, found_kernels


def _patch_digest(path: Path) -> str:
    """The sha256 of a regular file's bytes; FileNotFoundError for anything else (a FIFO would block the read)."""
    if not path.is_file():
        raise FileNotFoundError(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_consistency(doc: YamlDocument, spec: LaneSpec,
                       locate: typing.Callable[[PathKey], PathKey]) -> list[Problem]:
    """Clashes within a valid lane: host ports published twice, a served model the checks would never see."""
    problems = []
    seen_ports: dict[tuple[str, int], str] = {}
    roles = [("primary", ("engine",), spec.engine)] + [
        (role, ("companions", role, "engine"), companion.engine) for role, companion in spec.companions.items()
    ]
    for role, base, engine in roles:
        for i, port in enumerate(engine.ports):
            key = (port.protocol, port.published)
            if key in seen_ports:
                problems.append(doc.problem(locate((*base, "ports", i)),
                                         f"host port {port.published}/{port.protocol} is already published by "
                                         f"the {seen_ports[key]} container; give each a distinct host port"))
            seen_ports[key] = role
    served = flag_value(spec.engine.args, "--served-model-name")
    if served is not None and served != spec.health.served_model_name:
        problems.append(doc.problem(locate(("health", "served_model_name")),
                                 f"is {spec.health.served_model_name!r} but the engine serves {served!r} "
                                 "(--served-model-name); the readiness check would never pass"))
    return problems


def _engine_path(role: str) -> PathKey:
    return ("engine",) if role == ROLE_PRIMARY else ("companions", role, "engine")


def _check_standby(doc: YamlDocument, spec: LaneSpec, locate: typing.Callable[[PathKey], PathKey]) -> list[Problem]:
    """A standby lane must be able to sleep, and its development routes must stay on the box.

    `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1` are required in the recipe rather than added by lanectl:
    both are baked into the image and shown by `render`, so what the recipe says is what runs, and turning on
    routes that run engine methods must be a line someone wrote and reviewed, not a side effect of a key.
    """
    import ipaddress

    standby = spec.standby
    if standby is None:
        return []
    problems = []
    if spec.placement.backend == "swarm":
        problems.append(doc.problem(locate(("standby",)),
                                 "Swarm lanes (placement.backend: swarm) cannot keep a standby yet: an update replaces "
                                 "the service's task, so no process is left to wake. Remove standby for this lane"))
    if not spec.uses_gpus():
        problems.append(doc.problem(locate(("standby",)),
                                 "a standby frees GPU memory for the next lane, and this lane asks for no GPU "
                                 "(engine.gpus): it has nothing to free. Remove standby, or give the lane its GPUs"))
    for role, engine in spec.engines():
        base = _engine_path(role)
        if SLEEP_MODE_FLAG not in engine.args:
            problems.append(doc.problem(locate((*base, "args")),
                                     f"standby needs {SLEEP_MODE_FLAG} in the {role} engine's args: vLLM picks the "
                                     "allocator that can give memory back at start, and without it POST /sleep fails. "
                                     f"Add {SLEEP_MODE_FLAG}"))
        if engine.env.get(DEV_MODE_ENV) != "1":
            problems.append(doc.problem(locate((*base, "env")),
                                     f"standby needs {DEV_MODE_ENV}: \"1\" in the {role} engine's env: vLLM mounts "
                                     "POST /sleep, POST /wake_up and GET /is_sleeping only in development mode"))
        if not engine.ports:
            problems.append(doc.problem(locate(base),
                                     f"a standby's {role} must publish a port: lanectl puts it to sleep and wakes it "
                                     "through its sleep routes there"))
        if standby.acknowledge_exposed_dev_routes:
            continue
        for i, port in enumerate(engine.ports):
            if ipaddress.ip_address(port.host_ip).is_loopback:
                continue
            path = (*base, "ports", i, "host_ip")
            problems.append(doc.problem(locate(path if doc.has(locate(path)) else path[:-1]),
                                     f"host_ip {port.host_ip} publishes the {role}'s port {port.published} off the "
                                     f"box, and with {DEV_MODE_ENV}=1 vLLM serves development routes on it: anyone who "
                                     "reaches it can put the lane to sleep or wake it, and /collective_rpc runs engine "
                                     "methods. Publish on 127.0.0.1 and let clients in through a proxy on the box, or "
                                     "set standby.acknowledge_exposed_dev_routes: true"))
    return problems


def _check_swarm_ports(doc: YamlDocument, spec: LaneSpec, locate: typing.Callable[[PathKey], PathKey]) -> list[Problem]:
    """A Swarm lane's port that the recipe limits to one address would be published on every address of its node
    (Swarm has no host address for a port): refused unless the recipe says the port may be public."""
    if spec.placement.backend != "swarm":
        return []
    problems = []
    for role, engine in spec.engines():
        dev_mode = engine.env.get(DEV_MODE_ENV) == "1"
        for i, port in enumerate(engine.ports):
            if port.host_ip in ("0.0.0.0", "::") or port.public:
                continue
            danger = (f"; with {DEV_MODE_ENV}=1 vLLM serves its development routes there, so anyone who reaches "
                      "the node can POST /sleep (the lane then answers /health and generates nothing) or /wake_up, "
                      "and /collective_rpc runs engine methods") if dev_mode else ""
            path = (*_engine_path(role), "ports", i, "host_ip")
            problems.append(doc.problem(locate(path if doc.has(locate(path)) else path[:-1]),
                                     f"host_ip {port.host_ip} limits the {role}'s port {port.published} to that "
                                     "address, but Swarm publishes a port on every address of its node (it has no "
                                     f"host address){danger}. Keep this lane local (placement.backend: local), or "
                                     "say that the port may be public: `public: true` on it"))
    return problems


def _check_standby_neighbours(doc: YamlDocument, lanes: list[Lane],
                              locators: dict[str, typing.Callable[[PathKey], PathKey]]) -> list[Problem]:
    """A standby lane sleeps beside the lanes that take its GPUs: by the recipe's own numbers, each must be able
    to start there (its port free, its share of GPU memory left over)."""
    problems = []
    for lane in lanes:
        standby = lane.spec.standby
        if standby is None or lane.spec.placement.backend != "local":
            continue
        locate = locators[lane.name]
        for other in lanes:
            if other is lane or other.spec.placement.backend != "local":
                continue
            own_ports = {(role, i): (p.protocol, p.published) for role, engine in lane.spec.engines()
                         for i, p in enumerate(engine.ports)}
            theirs = {(p.protocol, p.published) for _, engine in other.spec.engines() for p in engine.ports}
            for (role, i), key in own_ports.items():
                if key in theirs:
                    problems.append(doc.problem(locate((*_engine_path(role), "ports", i)),
                                             f"lane {other.name} publishes host port {key[1]}/{key[0]} too; asleep, "
                                             f"this lane keeps its port, so {other.name} could not start beside it. "
                                             "Give each lane its own port (clients reach the serving lane through a "
                                             "proxy on the box)"))
            problems.extend(_standby_fit(doc, lane, other, locate))
    return problems


def _standby_fit(doc: YamlDocument, lane: Lane, other: Lane, locate: typing.Callable[[PathKey], PathKey]
                 ) -> list[Problem]:
    """vLLM refuses to start when a GPU's free memory is below its --gpu-memory-utilization share of the whole."""
    standby = lane.spec.standby
    assert standby is not None
    for _, mine in lane.spec.engines():
        for role, engine in other.spec.engines():
            if mine.gpus is None or engine.gpus is None:
                continue
            if mine.gpus.device_ids is not None and engine.gpus.device_ids is not None and not (
                    set(mine.gpus.device_ids) & set(engine.gpus.device_ids)):
                continue
            share = engine.gpu_memory_utilization()
            if share is None:
                continue
            left = (1 - share) * standby.gpu_memory_gib
            if standby.resident_gib > left:
                most = max(0.0, 1 - standby.resident_gib / standby.gpu_memory_gib)
                return [doc.problem(locate(("standby", "resident_gib")),
                                 f"asleep, this lane holds {standby.resident_gib:g} GiB of each "
                                 f"{standby.gpu_memory_gib:g} GiB GPU, but lane {other.name}'s {role} asks vLLM for "
                                 f"--gpu-memory-utilization "
                                 f"{share:g} of it, which leaves {left:.1f} GiB: vLLM would refuse to start "
                                 f"{other.name} beside it. Lower that to {int(most * 100) / 100:.2f} or less, or "
                                 f"prove a resident_gib of {math.floor(round(left * 100, 6)) / 100:g} or less "
                                 f"(`lanectl standby check "
                                 f"{lane.name} --beside {other.name}` measures both), or leave standby off")]
    return []


_INVALID: Any = object()


class _KernelLoader:
    """Loads each kernels/<name>.yaml once; its problems are reported once, located in that file."""

    def __init__(self, project: Project, problems: list[Problem], inputs: set[Path]):
        self.project = project
        self.problems = problems
        self.inputs = inputs
        self.cache: dict[str, KernelSpec | None] = {}

    def known_hint(self) -> str:
        names = sorted(p.stem for p in self.project.kernels_dir.glob("*.yaml"))
        return f"; known kernels: {', '.join(names)}" if names else ""

    def get(self, name: str) -> KernelSpec | None:
        if name not in self.cache:
            self.cache[name] = self._load(name)
        return self.cache[name]

    def _load(self, name: str) -> Any:
        from pydantic import ValidationError

        from lanectl.recipe.validation import problems_from_validation
        from lanectl.recipe.yaml_source import YamlSyntaxError, read_yaml_file

        path = self.project.kernels_dir / f"{name}.yaml"
        self.inputs.add(path)
        if not os.path.lexists(path):
            return None
        shown = self.project.display(path)
        if leaves(path, self.project.kernels_dir):
            self.problems.append(Problem(shown, 0, 0, "", "leads out of kernels/ (through '..' or a symlink); "
                                                          "keep kernel files inside kernels/"))
            return _INVALID
        try:
            doc = read_yaml_file(path, shown)
        except YamlSyntaxError as exc:
            self.problems.append(exc.problem)
            return _INVALID
        try:
            kernel = validated(KernelSpec, doc.data if isinstance(doc.data, dict) else {})
        except ValidationError as exc:
            self.problems.extend(problems_from_validation(exc, doc, KernelSpec))
            return _INVALID
        if kernel.name != name:
            self.problems.append(doc.problem(("name",), f"is {kernel.name!r} but the file is {name}.yaml; "
                                                          "they must match"))
            return _INVALID
        if kernel.source.path is not None:
            self.inputs.add(self.project.root / kernel.source.path)
        if kernel.source.path is not None and leaves(self.project.root / kernel.source.path, self.project.root):
            self.problems.append(doc.problem(("source", "path"),
                                          f"{kernel.source.path} leads out of the project (through '..' or a "
                                          "symlink); keep kernel sources inside the project"))
            return _INVALID
        if kernel.source.path is not None and not (self.project.root / kernel.source.path).is_dir():
            self.problems.append(doc.problem(("source", "path"),
                                          f"no folder {kernel.source.path} in the project"))
            return _INVALID
        return kernel


__all__ = ["Catalog", "Lane", "Recipe", "load_catalog"]
