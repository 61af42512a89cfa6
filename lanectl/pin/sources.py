"""A vLLM release's facts and the flashinfer it pins, read from their sdists once and kept in lanectl's cache.

Reading a release (two sdists, ~90 MB, every logger call parsed) takes seconds; the facts are kept as JSON in
`$LANECTL_CACHE_DIR/pin-facts/`, keyed by the sdist's sha256 and the bytes of the code that read them, so a second
check of the same release reads one small file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lanectl.image.upstream import Progress, UpstreamError, fetch_sdist
from lanectl.pin.facts import FlashinferFacts, VllmFacts, flashinfer_facts, vllm_facts
from lanectl.pin.release import read_release
from lanectl.project import CacheFolder
from lanectl.records import frozen

FACTS_KEEP = 16


@frozen
class Release:
    """One vLLM release as pin check sees it: its sdist (for patches), its facts and its flashinfer's."""

    version: str
    sdist: Path
    vllm: VllmFacts
    flashinfer: FlashinferFacts | None


def _code_stamp() -> str:
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(here.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:32]


def _cached_facts(project: str, version: str, package: str, cache_dir: Path, progress: Progress | None
                  ) -> tuple[Path, dict]:
    sdist = fetch_sdist(project, version, cache_dir, progress=progress)
    folder = CacheFolder("pin-facts", FACTS_KEEP)
    key = f"{project}-{version}-{_file_digest(sdist)}-{_code_stamp()}.json"
    cached = folder.read(key)
    if cached is not None:
        try:
            return sdist, json.loads(cached)
        except ValueError:
            pass
    source = read_release(project, version, package, cache_dir)
    facts = vllm_facts(source) if package == "vllm" else flashinfer_facts(source)
    data = facts.to_json()
    folder.write(key, json.dumps(data).encode())
    return sdist, data


def load_release(version: str, cache_dir: Path, progress: Progress | None = None) -> Release:
    """vLLM `version` and the flashinfer-python it pins, from the package index (cached)."""
    sdist, data = _cached_facts("vllm", version, "vllm", cache_dir, progress)
    vllm = VllmFacts.from_json(data)
    flashinfer = None
    if vllm.flashinfer is not None:
        try:
            _, fi_data = _cached_facts("flashinfer-python", vllm.flashinfer, "flashinfer", cache_dir, progress)
        except UpstreamError as error:
            raise UpstreamError(f"vllm {version} pins flashinfer-python=={vllm.flashinfer}: {error}") from error
        flashinfer = FlashinferFacts.from_json(fi_data)
    return Release(version, sdist, vllm, flashinfer)
