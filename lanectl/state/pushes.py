"""Which registry holds each lane image, by digest: `state_dir/pushes/`, one file per pushed content tag.

`lanectl build --push` writes a record only after the registry has answered with the manifest digest, so a
push that failed or stopped half-way leaves none. `up --fleet` reads it: Swarm services name the image as
`<registry>/lanectl/<recipe>@sha256:…`, so every node pulls the same bytes.

One file per remote tag, each written whole (temp file, rename): two builds recording at once never
rewrite each other's records, and a crash leaves the old file or the new one. Content tags never move
(a build refuses to push one the registry holds as another image), so a record is only ever replaced
by the same digest, or by a newer push to a registry whose storage was wiped.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lanectl.errors import OperationFailed
from lanectl.records import frozen
from lanectl.state.atomic import write_atomically
from lanectl.state.paths import NotAStateFile, StateFiles, check_state_file, create_state_dir, read_state_file

MAX_RECORD_BYTES = 64 * 1024
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@frozen
class PushRecord:
    """A lane image the registry holds: `repository:tag` answers `digest`."""

    registry: str  # HOST[:PORT][/NAMESPACE]
    repository: str  # <registry>/lanectl/<recipe>
    tag: str  # the content tag: <lane>-<12 hex of the inputs>
    digest: str  # sha256:… of the manifest, as the registry returned it
    local_tag: str  # lanectl/<recipe>:<tag>, the image's name on the host that built it
    recipe: str
    lane: str
    inputs: str
    at: str  # when it was recorded (UTC, ISO)

    @property
    def reference(self) -> str:
        """What a node pulls: the repository pinned by digest."""
        return f"{self.repository}@{self.digest}"

    @property
    def remote_tag(self) -> str:
        return f"{self.repository}:{self.tag}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reference": self.reference}


class PushStore:
    def __init__(self, state_dir: Path):
        self.directory = StateFiles(state_dir).pushes

    def _path(self, remote_tag: str) -> Path:
        # A hash names the file: registry names hold ':' and '/', and a name must not reach outside the folder.
        return self.directory / f"{hashlib.sha256(remote_tag.encode()).hexdigest()[:32]}.json"

    def record(self, push: PushRecord) -> None:
        if not DIGEST.fullmatch(push.digest):
            raise ValueError(f"not a sha256 digest: {push.digest!r}")
        text = json.dumps(asdict(push), indent=2, sort_keys=True) + "\n"
        path = self._path(push.remote_tag)
        try:
            create_state_dir(self.directory)
            check_state_file(path)
            write_atomically(path, text.encode())
        except OSError as exc:
            raise OperationFailed(f"could not record the push of {push.remote_tag} in {path}: "
                                  f"{exc.strerror or exc}") from exc

    def find(self, local_tag: str, registry: str | None = None) -> PushRecord | None:
        """The push of `local_tag` to `registry`; else (or with no registry named) its latest push anywhere."""
        if registry is not None:
            repository, _, tag = local_tag.rpartition(":")
            found = self._load(self._path(f"{registry}/{repository}:{tag}"))
            if found is not None and found.local_tag == local_tag:
                return found
        if not self.directory.is_dir():
            return None
        matches = [r for r in map(self._load, sorted(self.directory.glob("*.json"))) if r and r.local_tag == local_tag]
        return max(matches, key=lambda r: r.at) if matches else None

    def _load(self, path: Path) -> PushRecord | None:
        """A record, or None when there is none; a file lanectl did not write this way counts as none."""
        try:
            raw = read_state_file(path, MAX_RECORD_BYTES)
        except NotAStateFile:
            return None
        except OSError as exc:
            raise OperationFailed(f"could not read {path}: {exc.strerror or exc}") from exc
        if raw is None or len(raw) > MAX_RECORD_BYTES:
            return None
        try:
            data = json.loads(raw)
            record = PushRecord(**{name: data[name] for name in PushRecord.__dataclass_fields__})
        except (ValueError, TypeError, KeyError):
            return None
        if not all(isinstance(value, str) for value in asdict(record).values()) or not DIGEST.fullmatch(record.digest):
            return None
        return record if self._consistent(record, path) else None

    def _consistent(self, record: PushRecord, path: Path) -> bool:
        """Whether the record is one `record` wrote for its own lane: a file copied from another record's
        name, or one whose repository points at another registry or image than its tag names, is not
        believed (up --fleet would otherwise hand nodes whatever image a planted record names)."""
        local_repository, _, local_tag = record.local_tag.rpartition(":")
        return (path.name == self._path(record.remote_tag).name
                and record.repository == f"{record.registry}/{local_repository}"
                and local_repository == f"lanectl/{record.recipe}"
                and record.tag == local_tag == f"{record.lane}-{record.inputs[:12]}")
