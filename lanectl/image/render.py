"""Rendering a lane into what Docker needs: a build context (Dockerfile and files) and container specs.

Pure: reads project files, never talks to Docker. Recipe values reach the Dockerfile only
through quoting filters (`tojson` for exec-form arrays, `env_value` for ENV), so no recipe
value can start a new instruction.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lanectl.dockerapi.labels import LABEL_PREFIX
from lanectl.errors import BadInput
from lanectl.project import BUILTIN_IMAGES_DIR, CacheFolder, leaves, template_dir
from lanectl.recipe.catalog import Lane
from lanectl.recipe.kernel import KernelSpec
from lanectl.recipe.model import as_data
from lanectl.records import frozen

if TYPE_CHECKING:
    import tarfile

    from jinja2.sandbox import SandboxedEnvironment

RENDERED_KEEP = 256

HELPERS_DIR = Path(__file__).parent / "in_image"  # stdlib-only scripts that run inside the image
# How a lane image runs its engine: under in_image/exit_guard.py (_lane/engine.j2 puts it there). -S: no
# site-packages to read before the guard's first line takes the stop signals.
EXIT_GUARD = ("python3", "-S", "/lanectl/exit_guard.py")
KERNEL_OUT = "/lanectl/kernel-out"
KERNEL_SRC = "/lanectl/kernel-src"
# `vllm download-kernels` (vLLM 0.32.0 on) installs FlashInfer's precompiled kernels, which vLLM otherwise downloads or
# compiles at every start. Whether the image's vLLM has the command is read from its files, not by importing vLLM (a
# GPU-less build step may not import it), so one recipe serves releases before and after.
DOWNLOAD_KERNELS_COMMAND = "vllm/entrypoints/cli/download_kernels.py"


def download_kernels_script(python_site: str) -> str:
    """The build step's shell script; `python_site` is a validated plain path (recipe.model.DOCKERFILE_PATH)."""
    return (f"if [ -f {python_site.rstrip('/')}/{DOWNLOAD_KERNELS_COMMAND} ]; then vllm download-kernels; "
            "else echo 'lanectl: this vLLM has no download-kernels command (before 0.32.0): nothing to install'; fi")


# Docker's classic builder stamps files with their tar mtime; a fixed one keeps the context bytes,
# and so the layer cache, independent of when the checkout was made.
FIXED_MTIME = 0


@frozen
class ContextFile:
    """A file of an image's build context."""

    path: str
    content: bytes
    mode: int = 0o644


@frozen
class FetchedTree:
    """A kernel's pinned source, fetched on the host (lanectl.image.kernel_source), sent under `prefix`."""

    kernel: str
    prefix: str  # folder in the build context
    origin: str  # "git URL @ commit"
    path: Path | None  # None: not fetched yet (render shows it; a build fetches it first)


@frozen
class ImagePlan:
    """Everything needed to build one lane's image, and its content-addressed name."""

    lane: str
    recipe_id: str
    dockerfile: str
    files: tuple[ContextFile, ...]
    input_hash: str
    local_images: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)
    # Pinned by commit, so hashed by their pins (a `kernels/<name>.pin` file), not by their bytes.
    fetched_trees: tuple[FetchedTree, ...] = ()

    @property
    def repository(self) -> str:
        return f"lanectl/{self.recipe_id}"

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.lane}-{self.input_hash[:12]}"

    @property
    def moving_tag(self) -> str:
        return f"{self.repository}:{self.lane}"

    def context_tar(self, labels: Mapping[str, str] | None = None) -> bytes:
        """The build context; with `labels`, its Dockerfile ends in one LABEL line that sets them all."""
        missing = [tree.kernel for tree in self.fetched_trees if tree.path is None]
        if missing:
            raise ValueError(f"kernel sources not fetched: {', '.join(missing)}")
        buffer = io.BytesIO()
        import tarfile  # a build sends a context; status, up and the watchdog only plan one

        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for item in self.files:
                content = item.content
                if item.path == "Dockerfile" and labels:
                    content = content.rstrip(b"\n") + b"\n" + label_line(labels).encode()
                info = tarfile.TarInfo(item.path)
                info.size = len(content)
                info.mode = item.mode
                info.mtime = FIXED_MTIME
                tar.addfile(info, io.BytesIO(content))
            for tree in self.fetched_trees:
                assert tree.path is not None
                _add_tree(tar, tree.path, tree.prefix)
        return buffer.getvalue()


def _add_tree(tar: tarfile.TarFile, root: Path, prefix: str) -> None:
    # Links are sent as links, never followed: nothing outside the fetched tree enters the context.
    for folder, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if (Path(folder) / d).is_symlink()]:
            path = Path(folder) / name
            info = tar.gettarinfo(str(path), f"{prefix}/{path.relative_to(root).as_posix()}")
            info.mtime = FIXED_MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isreg():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            elif info.issym():
                tar.addfile(info)


def label_line(labels: Mapping[str, str]) -> str:
    """An image's labels as one LABEL instruction, after everything else. One instruction is one build step:
    the engine's own `labels` build parameter adds a step per label, each a container created and committed,
    and the labels that name the recipe and the inputs differ from one project to the next, so those steps
    never come from the cache."""
    return "LABEL " + " ".join(f"{env_value(key)}={env_value(value)}" for key, value in sorted(labels.items())) + "\n"


def env_value(value: str) -> str:
    """A value for a Dockerfile ENV line: double-quoted, with `$` escaped so Docker does not expand it."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def render_dockerfile(images_dir: Path, template: str, context: dict[str, Any]) -> str:
    """`template` rendered with `context`, from the cache folder while the templates are unchanged.

    Rendering is a function of the context and of the templates it loads (the template and what it
    includes), so the result is kept with the digest of every template loaded, and used again while each
    of them still has that digest: `status` and `up` then need neither Jinja's import nor its compiling.
    """
    try:
        key = hashlib.sha256(json.dumps([_code_stamp(), str(images_dir), template, context],
                                        sort_keys=True).encode()).hexdigest()
    except (TypeError, OSError):  # a context JSON cannot hold, lanectl's sources unreadable: no memo
        key = None
    cache = CacheFolder("dockerfiles", RENDERED_KEEP)
    if key is not None and (raw := cache.read(key)) is not None:
        try:
            entry = json.loads(raw)
            if all(_template_digest(images_dir, name) == digest for name, digest in entry["templates"].items()):
                return str(entry["dockerfile"])
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # a torn or foreign entry: render
    env, loaded = _environment(images_dir)
    dockerfile = _rendered(env, images_dir, template, context)
    if any(_template_digest(images_dir, name) != digest for name, digest in loaded.items()):
        # Jinja re-reads a changed file, but not a project file that now overrides a built-in one it
        # compiled: start again from the files as they are.
        env.cache.clear()  # type: ignore[union-attr]
        loaded.clear()
        dockerfile = _rendered(env, images_dir, template, context)
    if key is not None:
        # Every template this environment has loaded, each at the digest of its source when Jinja last
        # read it: the ones this render used are among them, as they are now.
        cache.write(key, json.dumps({"templates": loaded, "dockerfile": dockerfile}).encode())
    return dockerfile


class TemplateFailed(BadInput):
    """A Dockerfile template that does not render: the template file and line at fault (0: unknown), and why."""

    def __init__(self, file: str, line: int, reason: str):
        self.file, self.line, self.reason = file, line, reason
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: the image template does not render: {reason}; fix the template")


def _rendered(env: SandboxedEnvironment, images_dir: Path, template: str, context: dict[str, Any]) -> str:
    from jinja2 import TemplateSyntaxError

    try:
        return env.get_template(f"{template}/Dockerfile.j2").render(context)
    except TemplateSyntaxError as exc:
        file = _template_file(exc.filename, images_dir) if exc.filename else f"{template}/Dockerfile.j2"
        raise TemplateFailed(file, exc.lineno, exc.message or str(exc)) from None
    except Exception as exc:  # the template is the project's code (in Jinja's sandbox): what it raises is its fault
        file, line = _failing_line(exc, images_dir, template)
        raise TemplateFailed(file, line, f"{type(exc).__name__}: {exc}") from None


def _failing_line(exc: Exception, images_dir: Path, template: str) -> tuple[str, int]:
    """The template line an error was raised at: Jinja rewrites its traceback to show the templates' lines."""
    import traceback

    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename.endswith(".j2")]
    if not frames:
        return _template_file(str(images_dir / template / "Dockerfile.j2"), images_dir), 0
    return _template_file(frames[-1].filename, images_dir), frames[-1].lineno or 0


def _template_file(filename: str, images_dir: Path) -> str:
    """A template's file as the user finds it: under the project (images/…), or lanectl's own, in full."""
    path = Path(filename)
    root = images_dir.parent
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _template_digest(images_dir: Path, name: str) -> str | None:
    """As the environment's loaders read `name` (text, UTF-8, universal newlines): the project's file, else
    lanectl's own."""
    for folder in (images_dir, BUILTIN_IMAGES_DIR):
        path = folder.joinpath(*name.split("/"))
        if path.is_file():
            try:
                return hashlib.sha256(path.read_text(encoding="utf-8").encode()).hexdigest()
            except (OSError, ValueError):
                return None
    return None


@functools.cache
def _code_stamp() -> str:
    """The code a rendering depends on besides the templates: this module's filters, Jinja, lanectl."""
    import importlib.util

    from lanectl import __version__

    digest = hashlib.sha256(__version__.encode() + Path(__file__).read_bytes())
    spec = importlib.util.find_spec("jinja2")
    if spec is not None and spec.origin:
        digest.update(Path(spec.origin).read_bytes())  # holds jinja2's __version__
    return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def _environment(images_dir: Path) -> tuple[SandboxedEnvironment, dict[str, str]]:
    """One environment per images folder: it caches compiled templates (re-read when a file changes).
    With it, the digest of each template it loaded, as it last loaded it.

    The project's files come first, so its `images/<name>/` (or `images/_lane/<block>.j2`) overrides
    lanectl's own file of that name.
    """
    from jinja2 import ChoiceLoader, Environment, FileSystemLoader, StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    loaded: dict[str, str] = {}

    class RecordingLoader(FileSystemLoader):
        def get_source(self, environment: Environment, template: str) -> tuple[str, str, Any]:
            source, filename, uptodate = super().get_source(environment, template)
            loaded[template] = hashlib.sha256(source.encode()).hexdigest()
            return source, filename, uptodate

    env = SandboxedEnvironment(
        loader=ChoiceLoader([RecordingLoader(str(images_dir)), RecordingLoader(str(BUILTIN_IMAGES_DIR))]),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    env.filters["env_value"] = env_value
    return env, loaded


def plan_image(lane: Lane, fetched: Mapping[str, Path] | None = None) -> ImagePlan:
    """The lane's build: Dockerfile, context and content-addressed tag.

    `fetched` maps git kernels to their fetched trees (lanectl.image.kernel_source); the tag does not
    depend on it, so `render` and `status` need no fetch, and only a build's context needs the trees.
    """
    return _plan_image(lane, fetched, {})


def plan_images(lanes: Iterable[Lane]) -> dict[str, ImagePlan]:
    """Each lane's plan, as `plan_image` makes it. A folder several of them send (the template they share, a
    kernel's source) is read once for all: `status` plans every lane of the recipes."""
    folders: dict[tuple[Path, str, frozenset[str]], list[ContextFile]] = {}
    return {lane.name: _plan_image(lane, None, folders) for lane in lanes}


def plan_images_apart(lanes: Iterable[Lane]) -> tuple[dict[str, ImagePlan], dict[str, str]]:
    """Each lane's plan as `plan_images` makes it, and for each lane whose image does not render (a template
    broken since `validate` passed, a template folder deleted) why not: one lane that does not render keeps
    no other from being planned, and what runs from it can still be seen and stopped."""
    folders: dict[tuple[Path, str, frozenset[str]], list[ContextFile]] = {}
    plans: dict[str, ImagePlan] = {}
    unrendered: dict[str, str] = {}
    for lane in lanes:
        try:
            plans[lane.name] = _plan_image(lane, None, folders)
        except BadInput as exc:
            unrendered[lane.name] = str(exc)
    return plans, unrendered


def _plan_image(lane: Lane, fetched: Mapping[str, Path] | None,
                folders: dict[tuple[Path, str, frozenset[str]], list[ContextFile]]) -> ImagePlan:
    def folder_files(folder: Path, prefix: str, *, skip: set[str]) -> list[ContextFile]:
        key = (folder, prefix, frozenset(skip))
        if key not in folders:
            folders[key] = _folder_files(folder, prefix, skip=skip)
        return folders[key]

    project_root = lane.recipe.project_root
    images_dir = project_root / "images"
    spec = lane.spec
    files: list[ContextFile] = []

    template = template_dir(images_dir, spec.image.template)
    if template is None:  # validation refuses it; a file deleted since would reach here
        raise BadInput(f"no image template {spec.image.template!r} in {images_dir} or among lanectl's own")
    files.extend(folder_files(template, "image", skip={"Dockerfile.j2", "README.md"}))

    kernels = []
    trees = []
    for kernel in lane.kernels:
        context_dir = f"kernels/{kernel.name}"
        if kernel.source.path is not None:
            files.extend(folder_files(project_root / kernel.source.path, context_dir, skip=set()))
        else:
            pin = {"git": kernel.source.git, "commit": kernel.source.commit, "submodules": kernel.source.submodules}
            files.append(ContextFile(f"{context_dir}.pin", (json.dumps(pin, sort_keys=True) + "\n").encode()))
            trees.append(FetchedTree(kernel.name, context_dir, f"{kernel.source.git} @ {kernel.source.commit}",
                                     (fetched or {}).get(kernel.name)))
        kernels.append(_kernel_context(kernel, lane, context_dir))

    patches = []
    for patch in spec.patches:
        path = project_root / "patches" / patch.path
        files.append(ContextFile(f"patches/{patch.path}", path.read_bytes()))
        patches.append({"name": patch.path, "file": f"/lanectl/patches/{patch.path}"})
    if kernels:
        files.append(ContextFile("lanectl-build/kernel_smoke.py", (HELPERS_DIR / "kernel_smoke.py").read_bytes()))
    if patches:
        files.append(ContextFile("lanectl-build/patching.py", (HELPERS_DIR / "patching.py").read_bytes()))
    files.append(ContextFile("lanectl-run/exit_guard.py", (HELPERS_DIR / "exit_guard.py").read_bytes()))

    name = spec.image.template
    context = {
        # Where the Dockerfile came from, for its first line: the project's own template, or lanectl's.
        "template_source": f"images/{name}/Dockerfile.j2" if template.parent == images_dir
        else f"lanectl's built-in template {name}/Dockerfile.j2",
        "lane": lane.name,
        "recipe": lane.recipe.id,
        "base": spec.image.base,
        "python_site": spec.image.python_site,
        "download_kernels": download_kernels_script(spec.image.python_site) if spec.image.download_kernels else None,
        "kernels": kernels,
        "patches": patches,
        "env": dict(sorted(spec.engine.env.items())),
        "entrypoint": spec.engine.entrypoint,
        "exit_guard": list(EXIT_GUARD),
        "cmd": spec.engine.args,
    }
    dockerfile = render_dockerfile(images_dir, spec.image.template, context)
    files.insert(0, ContextFile("Dockerfile", dockerfile.encode()))

    local_images = []
    if spec.image.local_base:
        local_images.append(spec.image.base)
    for kernel in lane.kernels:
        if kernel.builder.image and kernel.builder.local:
            local_images.append(kernel.builder.image)

    input_hash = _hash_inputs(files)
    labels = {
        LABEL_PREFIX + "recipe": lane.recipe.id,
        LABEL_PREFIX + "lane": lane.name,
        LABEL_PREFIX + "inputs": input_hash,
        LABEL_PREFIX + "base": spec.image.base,
        LABEL_PREFIX + "patches": json.dumps({p.path: p.sha256 for p in spec.patches}, sort_keys=True),
        LABEL_PREFIX + "kernels": json.dumps(
            {k.name: k.source.commit or f"path:{k.source.path}@{_folder_digest(files, f'kernels/{k.name}/')}"
             for k in lane.kernels}, sort_keys=True),
    }
    return ImagePlan(lane=lane.name, recipe_id=lane.recipe.id, dockerfile=dockerfile, files=tuple(files),
                     input_hash=input_hash, local_images=tuple(dict.fromkeys(local_images)), labels=labels,
                     fetched_trees=tuple(trees))


def _kernel_context(kernel: KernelSpec, lane: Lane, context_dir: str) -> dict[str, Any]:
    env = {
        **kernel.env,
        "LANECTL_KERNEL_MODULE": kernel.install.module,
        "LANECTL_KERNEL_OUT": KERNEL_OUT,
    }
    if kernel.arch_switches:
        # The source picks its own -gencode list (FlashMLA's setup.py ignores TORCH_CUDA_ARCH_LIST);
        # its switches turn off each arch the recipe does not ask for.
        env.update({switch: "1" for arch, switch in kernel.arch_switches.items() if arch not in kernel.archs})
    elif kernel.archs:
        env["TORCH_CUDA_ARCH_LIST"] = ";".join(kernel.archs)
    # The output may hold only the side module: anything else copied beside the shipped
    # module could shadow or replace it.
    guard = (
        f'for f in "$LANECTL_KERNEL_OUT"/*; do case "${{f##*/}}" in "$LANECTL_KERNEL_MODULE".*) ;; '
        f'*) echo "kernel {kernel.name}: build left ${{f##*/}} in its output; only '
        f'$LANECTL_KERNEL_MODULE.* may be installed" >&2; exit 1;; esac; done\n'
        f'ls "$LANECTL_KERNEL_OUT"/"$LANECTL_KERNEL_MODULE".* >/dev/null 2>&1 || '
        f'{{ echo "kernel {kernel.name}: build produced no $LANECTL_KERNEL_MODULE module" >&2; exit 1; }}'
    )
    preflight = [_PREFLIGHT[need].format(kernel=kernel.name) for need in kernel.builder.requires]
    build_script = "\n".join([*preflight, 'mkdir -p "$LANECTL_KERNEL_OUT"', *kernel.build, guard])
    install_dir = lane.spec.image.python_site.rstrip("/") + "/" + kernel.install.package.replace(".", "/")
    smoke = {"dir": install_dir, "module": kernel.install.module, "beside": kernel.install.beside,
             **as_data(kernel.smoke.op_schema)}
    return {
        "name": kernel.name,
        "builder": kernel.builder.image or lane.spec.image.base,
        "context_dir": context_dir,
        "env": dict(sorted(env.items())),
        "build_script": build_script,
        "src": KERNEL_SRC,
        "out": KERNEL_OUT,
        "install_dir": install_dir,
        "smoke": json.dumps(smoke, sort_keys=True),
    }


# What a builder image must have, checked before anything is compiled so a wrong builder fails
# with its cause instead of a compiler error several minutes in.
_PREFLIGHT = {
    "nvcc": ('command -v nvcc >/dev/null 2>&1 || {{ echo "kernel {kernel}: the builder image has no nvcc '
             '(CUDA toolkit); set builder.image to an image that ships it" >&2; exit 1; }}'),
    "torch": ("python3 -c 'import os, torch.utils.cpp_extension as e; "
              "raise SystemExit(not any(os.path.isfile(os.path.join(p, \"torch\", \"extension.h\")) "
              "for p in e.include_paths()))' 2>/dev/null || "
              '{{ echo "kernel {kernel}: the builder image has no torch with C++ headers (torch/extension.h); '
              'set builder.image to one that has them" >&2; exit 1; }}'),
}


def _sh(value: str) -> str:
    import shlex

    return shlex.quote(value)


_NOT_THERE = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)  # what `Path.is_dir` answers False for


def _folder_files(folder: Path, prefix: str, *, skip: set[str]) -> list[ContextFile]:
    # Resolved once, not once per file: every lane of a `status` or `up` plans its image, each file of its
    # template and kernel folders checked against it.
    try:
        inside: Path | None = folder.resolve()
    except (ValueError, OSError):
        inside = None  # `leaves` meets the same error and answers that the file leaves
    out = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if leaves(path, folder, resolved_folder=inside):
            # A symlink in the project must not carry a host file into the image.
            raise BadInput(f"{path} leads out of {folder} (a symlink to {path.resolve()}); "
                           "copy the file into the folder instead")
        try:
            info: os.stat_result | None = path.stat()  # one stat, where `is_dir` and the mode took two
        except OSError as error:
            if error.errno not in _NOT_THERE:
                raise
            info = None  # not a folder, as `is_dir` answers; the file's own stat below raises as it did
        if (info is not None and stat.S_ISDIR(info.st_mode)) or rel.as_posix() in skip or "__pycache__" in rel.parts \
                or path.suffix == ".pyc":
            continue
        mode = 0o755 if (info or path.stat()).st_mode & 0o111 else 0o644
        out.append(ContextFile(f"{prefix}/{rel.as_posix()}", path.read_bytes(), mode))
    return out


def _hash_inputs(files: list[ContextFile]) -> str:
    digest = hashlib.sha256()
    for item in sorted(files, key=lambda f: f.path):
        digest.update(f"{item.path}\0{item.mode:o}\0{len(item.content)}\0".encode())
        digest.update(item.content)
    return digest.hexdigest()


def _folder_digest(files: list[ContextFile], prefix: str) -> str:
    return _hash_inputs([f for f in files if f.path.startswith(prefix)])[:12]

