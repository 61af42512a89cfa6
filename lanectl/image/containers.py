"""Container specs: what each role of a lane runs as, resolved from the recipe and the image tag.

Pure. The engine adapter turns a spec into a create call; `lanectl render` prints it.
Secret variables appear here by name only: their values are read from lanectl's environment
at the moment a container is created.

A container is exactly its spec: `spec_fields` lists what goes into it (the fields below, the image by ID
rather than tag, secret values as keyed digests), `spec_digest` hashes them, and lanectl stamps both on the
container when it creates it. A container whose digest differs from its lane's current spec is recreated;
`spec_changes` says which fields changed, as a plan and `status` show them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lanectl.dockerapi.containers import ContainerSpec
from lanectl.dockerapi.labels import CREATED_AS_LABEL, LABEL_PREFIX, SPEC_FIELDS_LABEL, SPEC_LABEL
from lanectl.image.render import EXIT_GUARD, ImagePlan
from lanectl.recipe.catalog import ROLE_PRIMARY, Lane
from lanectl.recipe.model import Engine, as_data

# What a container's digest covers, in the order a change is named (README: "Exact to the recipe").
SPEC_FIELDS = ("image_id", "command", "entrypoint", "env", "secret_env", "ports", "volumes", "gpus", "shm_size",
               "ipc", "user", "init", "stop_timeout_seconds")


def plan_containers(lane: Lane, image: ImagePlan, *, with_gpus: bool = True) -> list[ContainerSpec]:
    """In start order: the primary, then its companions (stop in reverse). Without GPUs (`--no-gpu`) the specs
    ask for none, and that is part of what the containers are."""
    specs = []
    for role in lane.roles:
        if role == ROLE_PRIMARY:
            engine, image_ref = lane.spec.engine, image.tag
            # The image already carries the primary's env and serve flags (CMD); repeating them
            # here would let the two drift apart.
            command, env = None, {}
        else:
            companion = lane.spec.companions[role]
            engine, image_ref = companion.engine, companion.image or image.tag
            command, env = list(companion.engine.args), dict(companion.engine.env)
        entrypoint = None if role == ROLE_PRIMARY else engine.entrypoint
        if entrypoint is not None and image_ref == image.tag:
            # The lane's own image has the exit guard; an entrypoint given here replaces the image's,
            # so it runs under the guard too (_lane/engine.j2). Another image has no guard to run.
            entrypoint = [*EXIT_GUARD, *entrypoint]
        spec = _spec(lane, role, engine, image_ref, command, entrypoint, env, image.input_hash)
        specs.append(spec if with_gpus else replace(spec, gpus=None))
    return specs


def spec_fields(spec: ContainerSpec, image_id: str, secret_digests: Mapping[str, str]) -> dict[str, Any]:
    """The fields a container's digest covers. The image by ID, so a rebuild under the same tag is a change;
    each secret by name and keyed digest of its value (never the value), "" when lanectl's environment does
    not have it; ports and volumes in a fixed order."""
    return {
        "image_id": image_id,
        "command": spec.command,
        "entrypoint": spec.entrypoint,
        "env": dict(sorted(spec.env.items())),
        "secret_env": {name: secret_digests.get(name, "") for name in sorted(spec.secret_env)},
        "ports": sorted(_port_text(port) for port in spec.ports),
        "volumes": sorted(_volume_text(volume) for volume in spec.volumes),
        "gpus": spec.gpus,
        "shm_size": spec.shm_size,
        "ipc": spec.ipc,
        "user": spec.user,
        "init": spec.init,
        "stop_timeout_seconds": spec.stop_timeout_seconds,
    }


def spec_digest(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def stamped(spec: ContainerSpec, fields: Mapping[str, Any]) -> ContainerSpec:
    """The spec as lanectl creates it: labelled with the name it is created as, its digest and its fields."""
    labels = {**spec.labels, CREATED_AS_LABEL: spec.name, SPEC_LABEL: spec_digest(fields),
              SPEC_FIELDS_LABEL: json.dumps(fields, sort_keys=True, separators=(",", ":"))}
    return replace(spec, labels=labels)


def spec_changes(was: Mapping[str, Any] | None, now: Mapping[str, Any]) -> list[str]:
    """What differs between a container's recorded fields and the ones it would be created with now, one
    short phrase per field (`ports 127.0.0.1:30006->8000/tcp → 127.0.0.1:30007->8000/tcp`). A secret that
    lanectl's environment does not have is not judged (its value cannot be compared)."""
    if was is None:
        return ["created before lanectl recorded container specs"]
    changes = []
    for name in SPEC_FIELDS:
        old, new = was.get(name), now.get(name)
        if name == "secret_env":
            new = {key: digest or (old or {}).get(key, "") for key, digest in (new or {}).items()}
        if old != new:
            changes.append(_change(name, old, new))
    return changes


def env_names_changed(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """The variables two environments differ in, by name only (`+ADDED -REMOVED CHANGED (value)`): an image's
    env, shown beside its change, never shows a value."""
    parts = [f"+{k}" for k in sorted(set(new) - set(old))] + [f"-{k}" for k in sorted(set(old) - set(new))]
    parts += [f"{k} (value)" for k in sorted(set(old) & set(new)) if old[k] != new[k]]
    return " ".join(parts)


def _change(name: str, old: Any, new: Any) -> str:
    if name == "image_id":
        return f"image {_short(old)} → {_short(new)}"
    if name == "secret_env":
        old, new = old or {}, new or {}
        added = sorted(set(new) - set(old))
        removed = sorted(set(old) - set(new))
        changed = sorted(k for k in set(old) & set(new) if old[k] != new[k])
        parts = [*(f"+{k}" for k in added), *(f"-{k}" for k in removed), *(f"{k} (value)" for k in changed)]
        return f"secret_env {' '.join(parts)}"
    if name == "env":
        old, new = old or {}, new or {}
        parts = [f"+{k}" for k in sorted(set(new) - set(old))] + [f"-{k}" for k in sorted(set(old) - set(new))]
        parts += [f"{k}={old[k]}→{new[k]}" for k in sorted(set(old) & set(new)) if old[k] != new[k]]
        return f"env {' '.join(parts)}"
    if name == "gpus":
        return f"gpus {_gpus(old)} → {_gpus(new)}"
    return f"{name} {_text(old)} → {_text(new)}"


def _short(image_id: Any) -> str:
    text = str(image_id or "none")
    if "@" in text:  # a fleet service's image, `registry/repository@sha256:…`: its digest is what differs
        return text.rpartition("@")[2][:len("sha256:") + 12] + "…"
    return text.removeprefix("sha256:")[:12]


def _gpus(gpus: Any) -> str:
    if not gpus:
        return "none"
    if "device_ids" in gpus:
        return "device " + ",".join(str(d) for d in gpus["device_ids"])
    return f"count {gpus.get('count')}"


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]" if value else "[]"
    return str(value)


def _port_text(port: Mapping[str, Any]) -> str:
    address = f"{port['host_ip']}:" if port.get("host_ip") else ""
    return f"{address}{port['host']}->{port['container']}/{port['protocol']}"


def _volume_text(volume: Mapping[str, Any]) -> str:
    source = volume.get("source") or volume.get("volume")
    return f"{source}:{volume['target']}:{'ro' if volume.get('read_only') else 'rw'}"


def _spec(lane: Lane, role: str, engine: Engine, image_ref: str, command: list[str] | None,
          entrypoint: list[str] | None, env: dict[str, str], input_hash: str) -> ContainerSpec:
    return ContainerSpec(
        name=lane.container_name(role),
        role=role,
        image=image_ref,
        command=command,
        entrypoint=entrypoint,
        env=env,
        secret_env=list(engine.secret_env),
        ports=[as_data(p) | {"host": p.published} for p in engine.ports],
        volumes=[as_data(v, exclude_none=True) for v in engine.volumes],
        gpus=as_data(engine.gpus, exclude_none=True) if engine.gpus else None,
        shm_size=engine.shm_size,
        ipc=engine.ipc,
        init=engine.init,
        user=engine.user,
        stop_timeout_seconds=engine.stop_timeout_seconds,
        labels={
            LABEL_PREFIX + "recipe": lane.recipe.id,
            LABEL_PREFIX + "lane": lane.name,
            LABEL_PREFIX + "role": role,
            LABEL_PREFIX + "inputs": input_hash,
        },
    )
