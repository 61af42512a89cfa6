"""The recipe format `lanectl/v1` as frozen dataclasses, validated by pydantic.

Unknown keys are errors everywhere (`extra="forbid"`): a misspelt key silently ignored is a
lane that serves with a default nobody chose. Field descriptions become the JSON Schema that
`lanectl schema` prints for editors.

The records are stdlib dataclasses rather than pydantic models so that a command that reads the validated,
cached catalog (`status`, the watchdog's cron pass, `up`) imports neither pydantic nor builds its model
classes, about a third of such a command's start-up (`make bench ONLY=cli_startup`). What a field accepts
is still written once, here: its annotation and its `Field(...)` rules, which pydantic reads when
`validated()` checks a file (a `TypeAdapter` of the dataclass). A check of a single field is an `After`
marker in its annotation, so that its error names the field; a check across fields is `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, cast

from lanectl.dockerapi.sizes import size_in_bytes
from lanectl.records import frozen

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

Record = TypeVar("Record")


def Field(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,  # noqa: N802
          **rules: Any) -> Any:
    """A dataclass field with pydantic's Field arguments (description, ge, le, gt, pattern, min_length,
    max_length, alias) as its metadata: pydantic applies them when it validates the record."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata=rules)


class After:
    """In an annotation, `check(value)` after the type's own checks and the field's rules; its ValueError is
    the field's error. pydantic is imported only when a record is validated, never when one is read."""

    def __init__(self, check: Callable[[Any], Any]):
        self.check = check

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(self.check, handler(source))


class Bounds:
    """In an annotation of `int` or `float`, inside a union where a field's own rules cannot reach it."""

    def __init__(self, **limits: float):
        self.limits = limits

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return {**handler(source), **self.limits}  # type: ignore[typeddict-item]


# pydantic's core schema types that, unless strict, read text: "30" as 30, "139.8" as 139.8, "no" as false.
PLAIN_SCALARS = frozenset({"int", "float", "bool"})


class Strict:
    """The base of every record: unknown keys are refused; `.inf` and `.nan`, valid YAML floats, are no budget,
    window or timeout; and a number or boolean is a YAML number or boolean, never text that reads like one."""

    __pydantic_config__ = {"extra": "forbid", "allow_inf_nan": False}

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return plain_scalars(handler(source))


def plain_scalars(schema: Any) -> Any:
    """`schema` with every integer, number and boolean in it strict, wherever it sits (a union, a list's items, a
    map's values): the field reference says integer, number and boolean, and so does an editor reading the
    JSON Schema, where `init: "no"` and `stop_timeout_seconds: "30"` are text. Strict still takes an integer
    where a number is asked for."""
    if isinstance(schema, dict):
        if schema.get("type") in PLAIN_SCALARS:
            schema["strict"] = True
        for key, value in schema.items():
            if key not in ("default", "metadata"):  # data and pydantic's notes, not schemas
                plain_scalars(value)
    elif isinstance(schema, list | tuple):
        for item in schema:
            plain_scalars(item)
    return schema


def validated(cls: type[Record], data: Any) -> Record:
    """`data` as a `cls`, or pydantic's ValidationError naming every place that is wrong."""
    return cast(Record, _adapter(cast(Any, cls)).validate_python(data))


@cache
def _adapter(cls: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)




def record_fields(cls: type) -> list[tuple[str, str, Any]]:
    """Each field of a record class: its name, its key in the file (the alias, where it has one) and its
    annotation, markers included."""
    import typing

    hints = typing.get_type_hints(cls, include_extras=True)
    return [(f.name, f.metadata.get("alias", f.name), hints[f.name]) for f in dataclasses.fields(cls)]


def is_record(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, Strict)


def as_data(record: Any, *, exclude_none: bool = False) -> dict[str, Any]:
    """A record as plain data (what it was validated from, with defaults filled in)."""
    if exclude_none:
        return dataclasses.asdict(record, dict_factory=lambda items: {k: v for k, v in items if v is not None})
    return dataclasses.asdict(record)

LANE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
# Docker's name grammar for containers and volumes (daemon/names: RestrictedNamePattern).
DOCKER_OBJECT_NAME = r"[a-zA-Z0-9][a-zA-Z0-9_.-]*"
# `user` as Docker takes it: name, uid, name:group or uid:gid (names in the shadow-utils character set).
USER_SPEC = r"(?:[a-z_][a-z0-9_.-]{0,31}\$?|[0-9]{1,10})(?::(?:[a-z_][a-z0-9_.-]{0,31}\$?|[0-9]{1,10}))?"
ROLE_NAME = r"^[a-z][a-z0-9-]{0,30}$"
TEMPLATE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
# The id names the image repository lanectl/<id>: a path component of a Docker reference, which is lowercase
# letters and digits joined by one ".", one or two "_", or dashes, and neither starts nor ends with a separator.
RECIPE_ID = r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$"
# The patterns below are text, compiled by `re` (and kept in its cache) when a recipe is first validated: a
# command served from the catalog cache validates nothing, and compiling them at import cost it ~1.5 ms.
DIGEST_PIN = r"@sha256:[0-9a-f]{64}$"
SHA256_HEX = r"^[0-9a-f]{64}$"
GIT_COMMIT = r"^[0-9a-f]{40}$"
SIZE = r"^[0-9]{1,13}[bkmgBKMG]?$"
# A vLLM release as PyPI names it: 0.31.0, 0.32.0.post1, 0.33.0rc1.
VLLM_RELEASE = r"^[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(?:(?:rc|\.post|\.dev)[0-9]{1,4})?$"
PORT = Annotated[int, Bounds(ge=1, le=65535)]
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Secrets must reach the container from lanectl's environment at start, never through the image or labels.
CONTROL_CHARACTER = r"[\x00-\x1f\x7f]"

# Docker's image reference grammar (github.com/distribution/reference, regexp.go), matched in full:
# a value that is not exactly one reference cannot reach a FROM line, where a line break would start a new
# instruction and a space would add `AS <stage>` or `--platform` arguments. Digests are sha256 only.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[A-Fa-f0-9:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
IMAGE_REFERENCE = rf"(?P<name>{_NAME})(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?"
IMAGE_NAME_MAX = 255
# A path written into a Dockerfile (COPY destinations, the patch and kernel install root). Docker expands
# `$VAR` in COPY and splits arguments on whitespace, so only plain characters are allowed, and no `.`/`..`.
DOCKERFILE_PATH = r"(?:/(?!\.\.?(?:/|$))[A-Za-z0-9._+-]+)+/?"


def image_reference(value: str) -> str:
    match = re.fullmatch(IMAGE_REFERENCE, value)
    if match is None or len(match["name"]) > IMAGE_NAME_MAX:
        raise ValueError(f"{value!r} is not a Docker image reference ([registry/]name[:tag][@sha256:<64 hex>])")
    return value


# Where lane images are pushed: a registry host (Docker's domain grammar, with an optional port) and optionally a
# namespace under it (`ghcr.io/acme`). The host must hold a `.` or a `:`, or be `localhost`: Docker reads a first
# component without them as a Docker Hub namespace, so `registry: myhost` would push to docker.io/myhost/….
REGISTRY = rf"(?P<host>{_DOMAIN})(?:/{_PATH_COMPONENT})*"
# <registry>/lanectl/<recipe id> must stay within Docker's 255-character name, and a recipe id takes up to 128.
REGISTRY_MAX = IMAGE_NAME_MAX - 128 - len("/lanectl/")


def registry_name(value: str) -> str:
    match = re.fullmatch(REGISTRY, value)
    host = match["host"] if match else ""
    if match is None or not ("." in host or ":" in host or host == "localhost") or len(value) > REGISTRY_MAX:
        raise ValueError(f"{value!r} is not a registry (HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000 or ghcr.io/acme; "
                         f"the host needs a '.' or a port, or is localhost; at most {REGISTRY_MAX} characters)")
    return value


def dockerfile_path(value: str) -> str:
    if not re.fullmatch(DOCKERFILE_PATH, value):
        raise ValueError(f"{value!r} must be an absolute path of letters, digits and . _ + - (no spaces, "
                         "quotes, '$', '..' or control characters)")
    return value


# A name looks like a credential when one of its parts (split at '_' and at lower-to-upper case changes) is a
# credential word: HF_TOKEN, MY_API_KEY, DB_PASSWORD, GITHUB_PAT, AUTH_HEADER, AWS_SECRET_ACCESS_KEY. Whole
# parts only, so PATH, KEYBOARD, MONKEY, TOKENIZERS_PARALLELISM and MAX_TOKENS (plural: a count) stay plain.
# A credential word followed by a part that measures it (STUB_TOKEN_SEED, KEY_SIZE) names a number, not a secret.
SECRET_WORDS = frozenset({
    "TOKEN", "KEY", "APIKEY", "ACCESSKEY", "PRIVATEKEY", "SECRET", "SECRETS", "PASS", "PASSWD", "PASSWORD",
    "PASSPHRASE", "PAT", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "AUTHTOKEN", "WEBHOOK",
})
MEASURE_WORDS = frozenset({"SEED", "COUNT", "LIMIT", "SIZE", "LEN", "LENGTH", "BITS", "PER", "BUDGET"})
# An engine flag that carries a credential (`--api-key X`, `--hf-token=X`, `--db-password X`): its value would sit
# in the image's CMD and every `docker inspect`; engines read the same secrets from their environment.
SECRET_FLAG = r"(?i)--?(?:[A-Za-z0-9]+[-_])*(?:token|key|apikey|secret|password|passwd|credentials?)"
_SECRET_FLAG_WORDS = ("token", "key", "apikey", "secret", "password", "passwd", "credentials")
# vLLM's FlexibleArgumentParser (argparse) expands a unique prefix of a long option: `--api-ke X` is
# `--api-key X`, `--hf-tok=X` is `--hf-token=X`. A long flag whose last word begins a credential word is
# taken for one (a false alarm costs a rename; a miss bakes the secret into the image).
SECRET_FLAG_ABBREVIATED = (
    r"(?i)--(?:[A-Za-z0-9]+[-_])+(?:"
    + "|".join(sorted({re.escape(w[:n]) for w in _SECRET_FLAG_WORDS for n in range(1, len(w) + 1)}, key=len,
                      reverse=True))
    + ")")


def looks_like_secret(name: str) -> bool:
    parts = [p.upper() for p in re.split(r"_|(?<=[a-z0-9])(?=[A-Z])", name) if p]
    return any(part in SECRET_WORDS and (i + 1 == len(parts) or parts[i + 1] not in MEASURE_WORDS)
               for i, part in enumerate(parts))


def _env_name(name: str) -> str:
    if not re.fullmatch(ENV_NAME, name):
        raise ValueError(f"{name!r} is not a valid environment variable name")
    return name


def _plain_env_name(name: str) -> str:
    if looks_like_secret(_env_name(name)):
        raise ValueError(
            f"{name!r} looks like a secret; list it under 'secret_env' so it comes from the "
            "environment at start and never lands in the image"
        )
    return name


def _env_value(value: str) -> str:
    if re.search(CONTROL_CHARACTER, value):
        raise ValueError("holds a line break or control character; an environment value is one line")
    return value


EnvName = Annotated[str, After(_env_name)]
PlainEnvName = Annotated[str, After(_plain_env_name)]
EnvValue = Annotated[str, After(_env_value)]
ImageReference = Annotated[str, After(image_reference)]
RegistryName = Annotated[str, After(registry_name)]
DockerfilePath = Annotated[str, After(dockerfile_path)]



def _ip_address(value: str) -> str:
    import ipaddress

    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address (e.g. 127.0.0.1, 0.0.0.0 or ::1)") from None
    return value


@frozen(kw_only=True)
class PortMapping(Strict):
    """A port the engine listens on, and where the host publishes it."""

    container: PORT = Field(description="Port the engine listens on inside the container.")
    host: PORT | None = Field(None, description="Host port; defaults to the container port.")
    host_ip: Annotated[str, After(_ip_address)] = Field("0.0.0.0", description="Host address to publish on.")
    protocol: Literal["tcp", "udp"] = "tcp"
    public: bool = Field(False, description="On a Swarm lane: this port may be reached on every address of its "
                         "node. Swarm has no host address for a port, so a Swarm lane whose port names a narrower "
                         "host_ip is refused unless this says so.")

    @property
    def published(self) -> int:
        return self.host if self.host is not None else self.container


def _mount_path(value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise ValueError(f"must be an absolute path starting with '/', got {value!r}")
    # Docker joins a bind as `source:target:mode`; a colon would move the split.
    if value is not None and (re.search(CONTROL_CHARACTER, value) or ":" in value):
        raise ValueError(f"{value!r} holds a ':' or a control character; a mount path cannot")
    return value


def _volume_name(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(DOCKER_OBJECT_NAME, value):
        raise ValueError(f"{value!r} is not a Docker volume name ({DOCKER_OBJECT_NAME})")
    return value


@frozen(kw_only=True)
class Volume(Strict):
    """A mount into the container: a host path or a named volume."""

    target: Annotated[str, After(_mount_path)] = Field(description="Absolute path inside the container.")
    source: Annotated[str | None, After(_mount_path)] = Field(None, description="Absolute host path (bind mount).")
    volume: Annotated[str | None, After(_volume_name)] = Field(
        None, description="Named Docker volume, kept across lanes (e.g. the vLLM cache).")
    read_only: bool = False

    def __post_init__(self) -> None:
        if (self.source is None) == (self.volume is None):
            raise ValueError("give exactly one of 'source' (a host path) or 'volume' (a named volume)")


def _gpu_count(value: int | str | None) -> int | str | None:
    if isinstance(value, int) and value < 1:
        raise ValueError(f"must be at least 1 or 'all', got {value}")
    return value


def _device_ids(value: list[str] | None) -> list[str] | None:
    if value is None:
        return value
    if not value:
        raise ValueError("must list at least one GPU; omit 'gpus' for a lane without GPUs")
    for device in value:
        if not re.fullmatch(r"[0-9]{1,4}|GPU-[0-9a-fA-F-]{8,64}", device):
            raise ValueError(f"{device!r} is not a GPU index ('0') or UUID ('GPU-…')")
    if len(set(value)) != len(value):
        raise ValueError("lists a GPU twice")
    return value


@frozen(kw_only=True)
class GpuRequest(Strict):
    """The GPUs a container gets: a count or named devices."""

    count: Annotated[Annotated[int, Bounds(le=1024)] | Literal["all"] | None, After(_gpu_count)] = Field(
        None, description="How many GPUs, or 'all'.")
    device_ids: Annotated[list[str] | None, After(_device_ids)] = Field(
        None, description="GPU indices ('0', '1') or UUIDs ('GPU-…').")

    def __post_init__(self) -> None:
        if (self.count is None) == (self.device_ids is None):
            raise ValueError("give exactly one of 'count' or 'device_ids'")


def _user(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(USER_SPEC, value):
        raise ValueError(f"{value!r} is not a user: give name, uid, name:group or uid:gid")
    return value


def _shm_size(value: str | None) -> str | None:
    if value is not None:
        if not 2**20 <= size_in_bytes(value) <= 2**42:
            raise ValueError(f"{value!r} must be between 1m and 4096g")
    return value


def _no_baked_secret(value: list[str] | None) -> list[str] | None:
    for i, arg in enumerate(value or []):
        flag, has_value, _ = arg.partition("=")
        takes_next = i + 1 < len(value or []) and not (value or [])[i + 1].startswith("-")
        secret = re.fullmatch(SECRET_FLAG, flag) or re.fullmatch(SECRET_FLAG_ABBREVIATED, flag)
        if secret and (has_value or takes_next):
            raise ValueError(
                f"{flag} would bake a secret into the image and the container's config; drop its value, "
                "list the variable the engine reads (e.g. VLLM_API_KEY, HF_TOKEN) under 'secret_env' and "
                "set it in lanectl's environment"
            )
    return value


def _splitkv_settings(env: dict[str, str]) -> dict[str, str]:
    check_splitkv_env(env)
    return env


@frozen(kw_only=True)
class Engine(Strict):
    """One container of a lane: its command, environment, ports, mounts and GPUs."""

    entrypoint: Annotated[list[str] | None, After(_no_baked_secret)] = Field(
        None, description="The engine command (exec form) in place of the template's; runs under lanectl's exit guard.")
    args: Annotated[list[str], After(_no_baked_secret)] = Field(
        default_factory=list, description="Arguments to the entrypoint: the serve flags.")
    env: Annotated[dict[PlainEnvName, EnvValue], After(_splitkv_settings)] = Field(
        default_factory=dict, description="Plain environment, baked into the image."
    )
    secret_env: list[EnvName] = Field(
        default_factory=list,
        description="Names of variables passed from lanectl's own environment at container start; "
        "never written to an image, label, log or the journal.",
    )
    ports: list[PortMapping] = Field(default_factory=list)
    volumes: list[Volume] = Field(default_factory=list)
    shm_size: Annotated[str | None, After(_shm_size)] = Field(None, pattern=SIZE, description="e.g. '16g'.")
    ipc: Literal["host", "private", "shareable"] | None = None
    init: bool = Field(True, description="Run an init as PID 1 so SIGTERM reaches the engine promptly.")
    gpus: GpuRequest | None = None
    user: Annotated[str | None, After(_user)] = Field(None, description="name, uid, name:group or uid:gid.")
    stop_timeout_seconds: int = Field(30, ge=0, le=3600)

    def __post_init__(self) -> None:
        for attribute, what in (("source", "host path"), ("volume", "volume"), ("target", "target")):
            seen = [getattr(v, attribute) for v in self.volumes if getattr(v, attribute) is not None]
            twice = sorted({x for x in seen if seen.count(x) > 1})
            if twice:
                raise ValueError(f"volumes mount the {what} {twice[0]!r} twice; mount each once")

    def gpu_memory_utilization(self) -> float | None:
        """The share of each GPU vLLM takes (`--gpu-memory-utilization`, vLLM 0.31.0's default 0.92); None if
        unreadable."""
        raw = flag_value(self.args, GPU_MEMORY_UTILIZATION_FLAG)
        if raw is None:
            return VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        try:
            value = float(raw)
        except ValueError:
            return None
        return value if 0 < value <= 1 else None



GPU_MEMORY_UTILIZATION_FLAG = "--gpu-memory-utilization"
# vLLM 0.31.0's CacheConfig.gpu_memory_utilization (0.9 in older releases): a role without the flag takes this.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in an argument list (`--flag value` or `--flag=value`), None when absent."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


# The split-KV overlay (patches/vllm/57711-splitkv-overlay.patch) merges at most this many partials
# (its combine kernel's MAX_SPLITS); vLLM would otherwise log the overlay as off and serve unsplit.
SPLITKV_MAX_SPLITS = 8
SPLITKV_SPLITS_ENV = "VLLM_DSV41_MEGA_SPLITKV"
SPLITKV_TOKENS_ENV = "VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS"


def check_splitkv_env(env: dict[str, str]) -> None:
    """The overlay's settings, refused here rather than silently turned off in the engine."""
    splits = env.get(SPLITKV_SPLITS_ENV)
    if splits is not None:
        if not re.fullmatch(r"[0-9]{1,3}", splits.strip()) or not _splitkv_splits_ok(int(splits)):
            raise ValueError(f"{SPLITKV_SPLITS_ENV}={splits!r}: give 0 (off) or a power of two from 2 to "
                             f"{SPLITKV_MAX_SPLITS}, the most the overlay's combine kernel merges")
    tokens = env.get(SPLITKV_TOKENS_ENV)
    if tokens is not None and (not re.fullmatch(r"[0-9]{1,4}", tokens.strip()) or int(tokens) < 1):
        raise ValueError(f"{SPLITKV_TOKENS_ENV}={tokens!r}: give the decode query-token count of the one "
                         "request that splits (1 + draft tokens), at least 1")


def _splitkv_splits_ok(splits: int) -> bool:
    return splits in (0, 1) or (2 <= splits <= SPLITKV_MAX_SPLITS and splits & (splits - 1) == 0)



def _digest_pinned(value: str | None) -> str | None:
    if value is not None and not re.search(DIGEST_PIN, value):
        raise ValueError(f"{value!r} must be pinned by digest (name@sha256:<64 hex>)")
    return value


@frozen(kw_only=True)
class Companion(Strict):
    """A container that runs beside the lane's primary (the `-rtx` role)."""

    image: Annotated[ImageReference | None, After(_digest_pinned)] = Field(
        None, description="A prebuilt image pinned by digest, run as is; default: the lane's own image."
    )
    engine: Engine


@frozen(kw_only=True)
class ImageSpec(Strict):
    """How the lane's image is built: template, pinned base, engine site-packages and registry."""

    template: str = Field(pattern=TEMPLATE_NAME, description="Folder under images/ holding Dockerfile.j2.")
    base: ImageReference = Field(description="Base image, pinned by digest (name:tag@sha256:…).")
    local_base: bool = Field(
        False, description="The base is built on this host (make base-image) and has no registry digest."
    )
    python_site: DockerfilePath = Field(
        description="The engine's site-packages in the image: patch root and kernel install root."
    )
    registry: RegistryName | None = Field(
        None, description="Where `lanectl build --push` pushes the image (HOST[:PORT][/NAMESPACE]); the "
                          "repository is <registry>/lanectl/<recipe id>. `--registry` overrides it."
    )
    vllm: str | None = Field(
        None, pattern=VLLM_RELEASE, description="The vLLM release the base image carries (e.g. 0.31.0): the pin "
        "`lanectl pin check VERSION` compares a release with. Omit for an image without vLLM.")
    download_kernels: bool = Field(
        False, description="Run `vllm download-kernels` in the build when the image's vLLM has the command (0.32.0 "
        "on: FlashInfer's precompiled kernels, which vLLM otherwise downloads or compiles at every start); a vLLM "
        "without it skips the step. vllm template only.")

    def __post_init__(self) -> None:
        if self.download_kernels and self.template != "vllm":
            raise ValueError(f"download_kernels runs `vllm download-kernels`, which the vllm template does; template "
                             f"{self.template!r} has no such step")
        if not self.local_base and not re.search(DIGEST_PIN, self.base):
            raise ValueError(
                f"base {self.base!r} must be pinned by digest (name:tag@sha256:<64 hex>), "
                "or set local_base: true for an image built on this host"
            )


@frozen(kw_only=True)
class PatchRef(Strict):
    """A backported patch the image applies, pinned by its sha256."""

    path: str = Field(pattern=r"^[^\x00-\x1f\x7f]+$", description="Patch file, relative to patches/.")
    sha256: str = Field(pattern=SHA256_HEX, description="sha256 of the patch file, so a reviewed patch cannot drift.")


def _regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
    return pattern


LogRegex = Annotated[str, After(_regex)]


def _anchored_regex(pattern: str) -> str:
    """A rule that fails a lane must match from the start of a record's message: vLLM 0.31.0 writes a client's
    text into some of its records after their first words (engine_log._REQUEST_ECHO)."""
    _regex(pattern)
    if not pattern.startswith("^") or pattern.startswith(("^.*", "^.+")):
        body = pattern.lstrip("^").removeprefix(".*").removeprefix(".+")
        raise ValueError(f"{pattern!r} can match past the start of a record's message, where vLLM 0.31.0 writes "
                         "text a client sent (`Error with model %s` names the model a request asked for, a "
                         "request's own lines its X-Request-Id): anyone who reaches the port could set it off. "
                         f"Anchor it at the message's first words, e.g. '^{body}'")
    return pattern


AnchoredLogRegex = Annotated[str, After(_anchored_regex)]


@frozen(kw_only=True)
class StartupStall(Strict):
    """A phase of the start that must end within `minutes` once it began: flashinfer's autotuner logs
    `Autotuning process starts ...` on every start and `... ends` at once on a warm cache, while a cold one
    retunes for over an hour (74 min measured). The line itself is no failure; silence after it is."""

    after: LogRegex = Field(description="Regex of the engine record that starts the phase.")
    until: LogRegex = Field(description="Regex of the engine record that ends it.")
    # Not held below startup_budget_minutes: a lane may lower its budget under the defaults' stall, and the
    # budget then simply ends the start first.
    minutes: float = Field(gt=0, le=24 * 60, description="How long the phase may take before the start fails.")
    name: str = Field("", max_length=80, pattern=r"^[^\x00-\x1f\x7f]*$",
                      description="What the phase is called in the failure (default: the `after` regex).")
    why: str = Field("", max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$",
                     description="Appended to the failure, e.g. 'a retune takes 74 min'.")
    # A phase that starts from its cache is fast, one that has none is not, and some starts are meant to have none:
    # the first on a new vLLM or flashinfer release (or new serve flags) retunes from scratch. The engine says which
    # it is (flashinfer logs the tuned results it found), so the rule can hold each to its own limit.
    warm: LogRegex | None = Field(
        None, description="Regex of the engine record that says the phase starts from its cache (flashinfer: "
                          "'Loaded N configs' or 'Preloaded N/M managed cache entries'). Until one is seen, a phase "
                          "with `cold_minutes` counts as cold.")
    cold_minutes: float | None = Field(
        None, gt=0, le=24 * 60, description="How long a cold phase may take (no `warm` record seen); the start's "
                                            "budget grows by as much while it runs cold. Needs `warm`.")

    @property
    def label(self) -> str:
        return self.name or f"'{self.after}'"

    def __post_init__(self) -> None:
        if self.cold_minutes is not None and self.warm is None:
            raise ValueError("cold_minutes needs `warm`, the record that tells a warm phase from a cold one")
        if self.cold_minutes is not None and self.cold_minutes < self.minutes:
            raise ValueError(f"cold_minutes ({self.cold_minutes:g}) is below minutes ({self.minutes:g}); a phase "
                             "without its cache is the slow one")


@frozen(kw_only=True)
class StartupLog(Strict):
    """Rules over the engine's own records (`[file.py:NNN] message`), searched in the message only: never in
    uvicorn's access lines nor in a request log's echo of a prompt, whose text a client chose."""

    expect: list[LogRegex] = Field(default_factory=list,
                                   description="Regexes that must each match a startup log record.")
    forbid: list[AnchoredLogRegex] = Field(
        default_factory=list, description="Regexes of records that fail the start whenever they appear; each starts "
        "with '^' (the message's first words).")
    stall: list[StartupStall] = Field(
        default_factory=list, description="Phases that must end within their minutes (after -> until)."
    )


@frozen(kw_only=True)
class GenerationProbe(Strict):
    """The liveness probe that generates a few tokens, beyond /health."""

    prompt: str = Field("Say OK.", max_length=4096)
    max_tokens: int = Field(3, ge=1, le=3, description="A real liveness probe generates 1-3 tokens.")
    timeout_seconds: float = Field(10, gt=0, le=600)
    interval_seconds: float = Field(60, gt=0, le=24 * 3600)


URL_PATH = r"^/[!-~]{0,255}$"


@frozen(kw_only=True)
class Health(Strict):
    """What a lane must show to count as started, and how it is probed."""

    startup_budget_minutes: float = Field(
        gt=0, le=24 * 60, description="How long a start may take before it counts as failed (models load for minutes)."
    )
    poll_interval_seconds: float = Field(5, gt=0, le=600)
    request_timeout_seconds: float = Field(5, gt=0, le=600)
    health_path: str = Field("/health", pattern=URL_PATH)
    models_path: str = Field("/v1/models", pattern=URL_PATH)
    served_model_name: str
    startup_log: StartupLog = Field(default_factory=StartupLog)
    generation_probe: GenerationProbe = Field(default_factory=GenerationProbe)


@frozen(kw_only=True)
class RestartPolicy(Strict):
    """How often the watchdog may restart a lane, and how long it waits between restarts."""

    max_restarts: int = Field(3, ge=0, le=100)
    window_minutes: float = Field(30, gt=0, le=7 * 24 * 60)
    backoff_initial_seconds: float = Field(10, ge=0, le=3600)
    backoff_max_seconds: float = Field(300, ge=0, le=24 * 3600)

    def __post_init__(self) -> None:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError(f"backoff_max_seconds ({self.backoff_max_seconds:g}) is below backoff_initial_seconds "
                             f"({self.backoff_initial_seconds:g}); the backoff only grows")


XidCode = Annotated[int, Bounds(ge=1, le=999)]


# The Xid tables are imported when a recipe is validated, not with the model: a catalog loaded from the cache
# (`status`) has its lists already.
def _default_application_codes() -> list[int]:
    from lanectl.host.xid import DEFAULT_APPLICATION_CODES

    return sorted(DEFAULT_APPLICATION_CODES)


def _default_hardware_codes() -> list[int]:
    from lanectl.host.xid import DEFAULT_HARDWARE_CODES

    return sorted(DEFAULT_HARDWARE_CODES)


@frozen(kw_only=True)
class XidPolicy(Strict):
    """Which NVIDIA Xid codes restart the lane and which stop it; by default NVIDIA's Xid catalog's immediate actions
    (lanectl/host/xid.py XID_CATALOG). A code in neither list is recorded and counted, never acted on."""

    application_codes: list[XidCode] = Field(default_factory=_default_application_codes)
    hardware_codes: list[XidCode] = Field(default_factory=_default_hardware_codes)

    def __post_init__(self) -> None:
        both = sorted(set(self.application_codes) & set(self.hardware_codes))
        if both:
            raise ValueError(f"Xid codes {both} are listed as both application and hardware faults")


def _textfile_dir(value: str | None) -> str | None:
    # Written by every watchdog pass, from cron: a relative folder would be cron's, and a NUL made each pass fail.
    if value is not None and (not value.startswith("/") or re.search(CONTROL_CHARACTER, value)):
        raise ValueError(f"must be an absolute folder without control characters, got {value!r}")
    return value


@frozen(kw_only=True)
class Alert(Strict):
    """Where the watchdog reports what it did: a webhook, node_exporter's textfile folder."""

    webhook_url_env: str | None = Field(
        "LANECTL_ALERT_WEBHOOK", pattern=ENV_NAME, description="Name of the variable holding the webhook URL."
    )
    textfile_dir: Annotated[str | None, After(_textfile_dir)] = Field(
        None, description="node_exporter textfile collector folder (an absolute path).")


@frozen(kw_only=True)
class WatchdogPolicy(Strict):
    """When the watchdog acts on a failing lane, and how."""

    failures_before_action: int = Field(3, ge=1, le=100)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    gpu_memory_release_timeout_seconds: float = Field(120, ge=0, le=3600)
    xid: XidPolicy = Field(default_factory=XidPolicy)
    fatal_log_lines: list[AnchoredLogRegex] = Field(
        default_factory=list, description="Extra regexes, added to the built-in fatal vLLM lines; each starts with "
        "'^' (the message's first words)."
    )
    alert: Alert = Field(default_factory=Alert)


# vLLM's sleep mode (docs.vllm.ai/en/latest/features/sleep_mode/): the allocator that can give memory back
# is chosen at start, and the routes that drive it are mounted only in development mode.
SLEEP_MODE_FLAG = "--enable-sleep-mode"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# Every route vLLM mounts only in development mode, for whoever reaches the port and with no authentication of its own,
# by what it lets a caller do. Read from vLLM 0.31.0's, 0.32.0's and 0.33.0's own apps (the contract suite fails on a
# release that mounts one not named here; `lanectl pin check` reads them from a release's source); the README's
# exposed-routes warning names each.
DEV_MODE_ROUTES: dict[str, tuple[str, ...]] = {
    "put the engine to sleep or wake it": ("/sleep", "/wake_up", "/is_sleeping", "/release_kv_cache_memory"),
    "drop its caches": ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache"),
    "run any method of every worker by name": ("/collective_rpc",),
    "stop or abort everyone's requests": ("/pause", "/resume", "/is_paused", "/abort_requests"),
    "replace, check or zero the weights being served": (
        "/init_weight_transfer_engine", "/start_weight_update", "/start_draft_weight_update", "/update_weights",
        "/finish_weight_update", "/update_weight_version", "/weight_info", "/get_world_size",
        "/weight_checker", "/shutdown_weight_transfer_engine"),
    "read the whole engine config and every VLLM_* variable": ("/server_info",),
}


@frozen(kw_only=True)
class WakeCheck(Strict):
    """After a wake, greedy output for this prompt must equal what the lane generated when it last passed its
    gate: wakes have answered 200 on /health while generating garbage (vllm#17103)."""

    prompt: str = Field("List the first five prime numbers:", min_length=1, max_length=4096)
    max_tokens: int = Field(8, ge=1, le=64, description="Tokens generated at temperature 0 and compared.")


def _sleep_level_1(value: int) -> int:
    if value != 1:
        raise ValueError(f"level {value}: only level 1 is supported. Level 2 discards the weights, so a wake "
                         "must reload them (a wake without a reload serves garbage, vllm#29341): no faster than "
                         "a start")
    return value


@frozen(kw_only=True)
class Standby(Strict):
    """Leave this lane asleep (vLLM sleep mode) instead of stopped when another lane takes its GPUs, so a
    rollback to it is a wake (seconds) rather than a start (minutes)."""

    mode: Literal["sleep"] = Field(description="'sleep': vLLM sleep mode (--enable-sleep-mode).")
    level: Annotated[int, After(_sleep_level_1)] = Field(
        1, description="Sleep level; only 1 (weights kept in host memory).")
    weights_gib: float = Field(
        gt=0, le=65536, description="Host memory the weights take asleep (level 1 copies them to host RAM); "
        "checked against MemAvailable before the lane is put to sleep.")
    resident_gib: float = Field(
        ge=0, le=65536, description="GPU memory the lane still holds asleep (CUDA context and graphs; upstream "
        "reports ~1 to 16 GiB; vLLM logs it: 'N GiB memory is still in use').")
    gpu_memory_gib: float = Field(
        gt=0, le=65536, description="Memory of each GPU the lane uses: validation checks by it that the lanes "
        "sharing those GPUs can start beside this one asleep (nvidia-smi measures the truth at switch time).")
    wake_timeout_seconds: float = Field(
        120, gt=0, le=3600, description="How long POST /sleep or POST /wake_up may take, and the budget of the "
        "woken lane's health gate; past it the rollback takes the cold path.")
    wake_check: WakeCheck = WakeCheck()
    acknowledge_exposed_dev_routes: bool = Field(
        False, description="Allow the lane's ports on a non-loopback address although development mode mounts "
        "routes that put the engine to sleep and run engine methods (/collective_rpc) for anyone who reaches them.")


NODE_HOSTNAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
NODE_LABEL_KEY = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


def _hostnames(value: list[str]) -> list[str]:
    for node in value:
        if not re.fullmatch(NODE_HOSTNAME, node):
            raise ValueError(f"{node!r} is not a node hostname")
    if len(set(value)) != len(value):
        raise ValueError("lists a node twice")
    return value


def _label_keys(value: dict[str, str]) -> dict[str, str]:
    for key, label_value in value.items():
        if not re.fullmatch(NODE_LABEL_KEY, key):
            raise ValueError(f"{key!r} is not a node label key")
        if re.search(CONTROL_CHARACTER, label_value) or "==" in label_value or "!=" in label_value:
            raise ValueError(f"label {key}: {label_value!r} cannot be used in a placement constraint")
    return value


def _swarm_switch_given(data: Any) -> Any:
    # A lane that says `backend: local` may inherit a Swarm placement's nodes from the recipe's defaults;
    # nodes given without any backend are a Swarm placement missing its switch. Only the data as written
    # tells the two apart, so this runs before the fields are read.
    swarm_keys = ("nodes", "node_labels", "canary")
    if isinstance(data, dict) and "backend" not in data and any(data.get(key) for key in swarm_keys):
        raise ValueError("nodes, node_labels and canary place a lane on Swarm; add 'backend: swarm'")
    return data


@frozen(kw_only=True)
class Placement(Strict):
    """Where a lane runs: this box's engine, or Docker Swarm services across a fleet of boxes."""

    backend: Literal["local", "swarm"] = Field(
        "local", description="'local': containers on this engine. 'swarm': one Swarm service per role and node."
    )
    nodes: Annotated[list[str], After(_hostnames)] = Field(
        default_factory=list,
        description="Swarm node hostnames the lane runs on; default: every ready node matching node_labels.",
    )
    node_labels: Annotated[dict[str, str], After(_label_keys)] = Field(
        default_factory=dict, description="Swarm node labels a node must carry (node.labels.<key> == <value>)."
    )
    canary: str | None = Field(None, description="The node updated and gated first; default: the first node.")
    gpu_resource: str = Field(
        "NVIDIA-GPU", pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The generic resource kind the nodes advertise for their GPUs (dockerd --node-generic-resource).",
    )

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(_swarm_switch_given, plain_scalars(handler(source)))

    def __post_init__(self) -> None:
        if self.canary is not None and self.nodes and self.canary not in self.nodes:
            raise ValueError(f"canary {self.canary!r} is not one of the lane's nodes {self.nodes}")


def _companion_roles(value: dict[str, Companion]) -> dict[str, Companion]:
    for role in value:
        if not re.fullmatch(ROLE_NAME, role):
            raise ValueError(f"companion role {role!r} must match {ROLE_NAME}")
        if role == "primary":
            raise ValueError("'primary' is the lane's own container; name the companion otherwise")
    return value


@frozen(kw_only=True)
class LaneSpec(Strict):
    """A lane after the recipe's defaults were merged in."""

    description: str = ""
    image: ImageSpec
    kernels: list[str] = Field(default_factory=list, description="Names of kernels/<name>.yaml side extensions.")
    patches: list[PatchRef] = Field(default_factory=list)
    engine: Engine
    companions: Annotated[dict[str, Companion], After(_companion_roles)] = Field(default_factory=dict)
    health: Health
    watchdog: WatchdogPolicy = Field(default_factory=WatchdogPolicy)
    placement: Placement = Field(default_factory=Placement)
    standby: Standby | None = Field(
        None, description="Keep this lane asleep beside the next one instead of stopping it (a rollback wakes it).")

    def engines(self) -> list[tuple[str, Engine]]:
        """Every container's engine by role, the primary first."""
        return [("primary", self.engine), *((role, c.engine) for role, c in self.companions.items())]

    def gpu_ids(self) -> set[str] | None:
        """The GPUs the lane asks for; None means "all or an unnamed count" (conflicts with any GPU)."""
        ids: set[str] = set()
        for _, engine in self.engines():
            if engine.gpus is None:
                continue
            if engine.gpus.device_ids is None:
                return None
            ids.update(engine.gpus.device_ids)
        return ids

    def uses_gpus(self) -> bool:
        return any(engine.gpus is not None for _, engine in self.engines())

    def __post_init__(self) -> None:
        if self.placement.backend != "swarm":
            return
        if not self.engine.ports:
            raise ValueError("a lane on Swarm must publish a port: lanectl gates each node through it")
        for role, engine in self.engines():
            if engine.ipc is not None:
                raise ValueError(f"{role}: Swarm services cannot set an IPC mode (Docker API 1.41); remove 'ipc' "
                                 "for a Swarm lane (shm_size still applies, as a tmpfs at /dev/shm)")
            if engine.gpus is not None and engine.gpus.count == "all":
                raise ValueError(f"{role}: Swarm reserves GPUs by number; give gpus.count or gpus.device_ids, "
                                 "not 'all'")


def _container_name_template(value: str) -> str:
    # Lane names and roles are themselves valid Docker names, so one stand-in checks every expansion.
    expanded = value.replace("{container}", "a").replace("{lane}", "a").replace("{role}", "a")
    if not re.fullmatch(DOCKER_OBJECT_NAME, expanded):
        raise ValueError(f"{value!r} does not expand to a Docker container name ({DOCKER_OBJECT_NAME} "
                         "with the placeholders {lane}, {container}, {role})")
    return value


@frozen(kw_only=True)
class Naming(Strict):
    """How a lane's containers are named."""

    container: Annotated[str, After(_container_name_template)] = Field(
        "{lane}", description="Primary container name; must contain {lane}.")
    companion: Annotated[str, After(_container_name_template)] = Field(
        "{container}-{role}", description="Companion container name.")

    def __post_init__(self) -> None:
        if "{lane}" not in self.container:
            raise ValueError("naming.container must contain {lane}")
        if "{role}" not in self.companion:
            raise ValueError("naming.companion must contain {role}")


def _lane_names(value: dict[str, Any]) -> dict[str, Any]:
    for name in value:
        if not re.fullmatch(LANE_NAME, str(name)):
            raise ValueError(f"lane name {name!r} must match {LANE_NAME}")
    return value


@frozen(kw_only=True)
class RecipeFile(Strict):
    """One YAML file: recipe-level defaults and the lanes that inherit them (maps merge, lists replace)."""

    schema_: Literal["lanectl/v1"] = Field(alias="schema")
    id: str = Field(pattern=RECIPE_ID, max_length=128,
                    description="Recipe id; names the image repository lanectl/<id>.")
    description: str = ""
    naming: Naming = Field(default_factory=Naming)
    keep_stopped_lanes: int = Field(3, ge=0, le=20)
    defaults: dict[str, Any] = Field(default_factory=dict, description="Lane fields every lane inherits.")
    lanes: Annotated[dict[str, dict[str, Any]], After(_lane_names)] = Field(min_length=1)


def merge(defaults: Any, override: Any) -> Any:
    """The inheritance rule: maps merge key by key (recursively), lists and scalars replace."""
    if isinstance(defaults, dict) and isinstance(override, dict):
        merged = dict(defaults)
        for key, value in override.items():
            merged[key] = merge(defaults[key], value) if key in defaults else value
        return merged
    return override
