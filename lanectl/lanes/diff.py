"""What differs between two lanes, from their rendered inputs, and what stays the same.

The release note's "what shipped" table is this comparison: the kernel and its commit, each patch and the
upstream change it backports, the serve flags and environment that changed, and a short list of what did
not ("same checkpoint, same KV settings, ..."). Everything here is computed from the recipe model and the
image plan; the only file content read is each patch's header, passed in by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lanectl.image.render import ImagePlan
from lanectl.recipe.catalog import Lane
from lanectl.recipe.model import Engine, as_data
from lanectl.records import frozen

# Serve flags grouped by what the release note calls them when they did not change.
SAME_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("speculative schedule", ("--speculative-config",)),
    ("expert offload", ("--offload-backend", "--cpu-offload-gb", "--cpu-offload-params", "--engram-config")),
    ("KV settings", ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
                     "--kv-cache-dtype", "--block-size")),
    ("served model name", ("--served-model-name",)),
)
# The stub engine states its KV size in its environment; a real engine's comes from the flags above.
KV_SIZE_ENV = "STUB_KV_CACHE_TOKENS"
UPSTREAM_HEADER = re.compile(r"^Upstream:\s*(.+?)\s*$", re.MULTILINE)
SUBJECT_HEADER = re.compile(r"^Subject:\s*(.+?)\s*$", re.MULTILINE)


def serve_flags(args: Sequence[str]) -> dict[str, str | None]:
    """Engine arguments as flag -> value (None for a switch); leading positionals under `<arg N>`.

    `--flag value`, `--flag=value` and multi-value flags (`--cpu-offload-params a b`) all read as one entry,
    so a changed value reads as one change, not as a removal and an addition."""
    flags: dict[str, str | None] = {}
    current: str | None = None
    for index, arg in enumerate(args):
        if arg.startswith("--"):
            name, has_value, value = arg.partition("=")
            flags[name] = value if has_value else None
            current = None if has_value else name
        elif current is not None:
            previous = flags[current]
            flags[current] = arg if previous is None else f"{previous} {arg}"
        else:
            flags[f"<arg {index + 1}>"] = arg
    return flags


def patch_header(text: str) -> tuple[str, str]:
    """A patch's Subject and Upstream header lines (empty when absent)."""
    subject, upstream = SUBJECT_HEADER.search(text), UPSTREAM_HEADER.search(text)
    return (subject.group(1) if subject else "", upstream.group(1) if upstream else "")


@frozen
class LaneInputs:
    """One lane as the comparison sees it: plain, sorted data."""

    name: str
    image: str
    base: str
    local_base: bool
    kernels: dict[str, dict[str, str]]
    patches: dict[str, dict[str, str]]
    roles: dict[str, dict[str, Any]]  # role -> args, env, ports, volumes, ...
    health: dict[str, Any]
    standby: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {"lane": self.name, "image": self.image, "base": self.base, "local_base": self.local_base,
                "kernels": self.kernels, "patches": self.patches}


def _engine_inputs(engine: Engine) -> dict[str, Any]:
    return {
        "args": serve_flags(engine.args),
        "env": dict(sorted(engine.env.items())),
        "secret_env": sorted(engine.secret_env),
        "ports": [f"{p.host_ip}:{p.published}->{p.container}/{p.protocol}" for p in engine.ports],
        "volumes": [f"{v.source or v.volume}:{v.target}{':ro' if v.read_only else ''}" for v in engine.volumes],
        "gpus": (as_data(engine.gpus, exclude_none=True) if engine.gpus else None),
        "settings": {"entrypoint": engine.entrypoint, "ipc": engine.ipc, "shm_size": engine.shm_size,
                     "init": engine.init, "user": engine.user, "stop_timeout_seconds": engine.stop_timeout_seconds},
    }


def lane_inputs(lane: Lane, plan: ImagePlan, patch_texts: Mapping[str, str]) -> LaneInputs:
    """The lane's inputs; `patch_texts` maps each patch's path (as in the recipe) to its text."""
    kernels = {}
    for kernel in lane.kernels:
        source = kernel.source
        origin = f"{source.git} @ {source.commit}" if source.git else f"path {source.path}"
        kernels[kernel.name] = {"source": origin, "upstream": kernel.upstream or "",
                                "module": f"{kernel.install.package}.{kernel.install.module}",
                                "beside": f"{kernel.install.package}.{kernel.install.beside}"}
    patches = {}
    for patch in lane.spec.patches:
        subject, upstream = patch_header(patch_texts.get(patch.path, ""))
        patches[patch.path] = {"sha256": patch.sha256, "subject": subject, "upstream": upstream}
    spec = lane.spec
    roles = {role: _engine_inputs(engine) for role, engine in spec.engines()}
    for role, companion in spec.companions.items():
        roles[role]["image"] = companion.image
    standby = as_data(spec.standby) if spec.standby else None
    return LaneInputs(name=lane.name, image=plan.tag, base=spec.image.base, local_base=spec.image.local_base,
                      kernels=kernels, patches=patches, roles=roles,
                      health=as_data(spec.health), standby=standby)


@dataclass
class LaneDiff:
    a: LaneInputs
    b: LaneInputs
    changes: list[dict[str, Any]] = field(default_factory=list)  # {what, key, a, b}
    same: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"a": self.a.as_dict(), "b": self.b.as_dict(), "changes": self.changes, "same": self.same}


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    """Nested settings as dotted keys, so a change names the one field that moved."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flat(f"{prefix}.{key}" if prefix else str(key), inner))
        return flat
    return {prefix: value}


def _compare(what: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One change per key added, removed or changed, in A's order then B's new keys."""
    changes = []
    for key in [*a, *(k for k in b if k not in a)]:
        if key not in b:
            changes.append({"what": what, "change": "removed", "key": key, "a": a[key], "b": None})
        elif key not in a:
            changes.append({"what": what, "change": "added", "key": key, "a": None, "b": b[key]})
        elif a[key] != b[key]:
            changes.append({"what": what, "change": "changed", "key": key, "a": a[key], "b": b[key]})
    return changes


def _listed(items: Sequence[str]) -> dict[str, str]:
    return {item: item for item in items}


def diff_lanes(a: LaneInputs, b: LaneInputs) -> LaneDiff:
    """Pure: every difference from A to B, then what is the same where both lanes state it."""
    result = LaneDiff(a, b)
    changes = result.changes
    if a.base != b.base:
        changes.append({"what": "base image", "change": "changed", "key": "base", "a": a.base, "b": b.base})
    changes += _compare("kernel", a.kernels, b.kernels)
    changes += _compare("patch", a.patches, b.patches)
    for role in [*a.roles, *(r for r in b.roles if r not in a.roles)]:
        ra, rb = a.roles.get(role), b.roles.get(role)
        where = "" if role == "primary" else f" ({role})"
        if ra is None or rb is None:
            changes.append({"what": "companion", "change": "added" if ra is None else "removed", "key": role,
                            "a": None if ra is None else "present", "b": None if rb is None else "present"})
            continue
        changes += _compare(f"engine arg{where}", ra["args"], rb["args"])
        changes += _compare(f"env{where}", ra["env"], rb["env"])
        changes += _compare(f"secret env{where}", _listed(ra["secret_env"]), _listed(rb["secret_env"]))
        changes += _compare(f"port{where}", _listed(ra["ports"]), _listed(rb["ports"]))
        changes += _compare(f"volume{where}", _listed(ra["volumes"]), _listed(rb["volumes"]))
        changes += _compare(f"engine{where}", _flat("", {"gpus": ra["gpus"], **ra["settings"],
                                                           "image": ra.get("image")}),
                            _flat("", {"gpus": rb["gpus"], **rb["settings"], "image": rb.get("image")}))
    changes += _compare("health", _flat("", a.health), _flat("", b.health))
    changes += _compare("standby", _flat("", a.standby or {}), _flat("", b.standby or {}))
    if (a.standby is None) != (b.standby is None):
        changes.append({"what": "standby", "change": "changed", "key": "rollback",
                        "a": "wake from standby" if a.standby else "cold start",
                        "b": "wake from standby" if b.standby else "cold start"})
    result.same = _same(a, b)
    return result


def _checkpoint(roles: Mapping[str, dict[str, Any]]) -> tuple[str | None, list[str]]:
    primary = roles["primary"]
    model = primary["args"].get("<arg 1>") or primary["args"].get("--model")
    mounts = [v for v in primary["volumes"] if model and f":{model}" in v]
    return model, mounts


def _same(a: LaneInputs, b: LaneInputs) -> list[str]:
    """What the two lanes state alike, in the release note's words; nothing that only one of them states."""
    same = []
    if a.base == b.base:
        same.append(f"same base image ({a.base}" + (", built on this host: no registry digest)" if a.local_base
                                                     else ")"))
    model_a, mounts_a = _checkpoint(a.roles)
    model_b, mounts_b = _checkpoint(b.roles)
    if model_a and (model_a, mounts_a) == (model_b, mounts_b):
        same.append(f"same checkpoint ({mounts_a[0] if mounts_a else model_a})")
    args_a, args_b = a.roles["primary"]["args"], b.roles["primary"]["args"]
    for name, flags in SAME_GROUPS:
        stated = [f for f in flags if f in args_a or f in args_b]
        if stated and all(f in args_a and f in args_b and args_a[f] == args_b[f] for f in stated):
            same.append(f"same {name} ({', '.join(_flag_text(f, args_a[f]) for f in stated)})")
    env_a, env_b = a.roles["primary"]["env"], b.roles["primary"]["env"]
    if KV_SIZE_ENV in env_a and env_a.get(KV_SIZE_ENV) == env_b.get(KV_SIZE_ENV):
        same.append(f"same KV size ({int(env_a[KV_SIZE_ENV]):,} tokens)")
    if args_a == args_b:
        same.append("same serve flags")
    if set(a.roles) == set(b.roles) and len(a.roles) > 1:
        same.append(f"same companions ({', '.join(r for r in a.roles if r != 'primary')})")
    if a.health == b.health:
        same.append("same health gate")
    if a.standby == b.standby:
        same.append("same rollback (" + ("wake from standby" if a.standby else "cold start") + ")")
    return same


def _flag_text(flag: str, value: str | None) -> str:
    return flag if value is None else f"{flag} {value}"

