"""A real Docker registry for the tests: Debian's docker-registry (the CNCF distribution registry 2.8), started
and stopped by scripts/registry.sh, each with its own storage, config and log under a test folder.

`registry` (in conftest.py) is one session-wide registry on a free loopback port (Docker trusts loopback without
TLS); tests that need a broken one (stopped, read-only, full) start their own with `start_registry`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "registry.sh"
MANIFEST_TYPES = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                            "application/vnd.oci.image.manifest.v1+json"])


@dataclass
class Registry:
    addr: str  # HOST:PORT, what a recipe's image.registry or --registry names
    folder: Path
    ca: Path | None = None  # the CA of its TLS certificate; None: plain HTTP on loopback

    @property
    def url(self) -> str:
        return f"{'https' if self.ca else 'http'}://{self.addr}"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=str(self.ca) if self.ca else True, timeout=10)

    def digest(self, repository: str, tag: str) -> str | None:
        """The manifest digest the registry holds for `repository:tag` (repository without the host), or None."""
        with self.client() as client:
            reply = client.head(f"/v2/{repository}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES})
        if reply.status_code == 404:
            return None
        reply.raise_for_status()
        return reply.headers["Docker-Content-Digest"]

    def delete(self, repository: str, digest: str) -> None:
        """Remove a manifest, as a registry that lost an image would be without it."""
        with self.client() as client:
            client.delete(f"/v2/{repository}/manifests/{digest}").raise_for_status()

    def log(self) -> str:
        return (self.folder / "registry.log").read_text(errors="replace")

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "stop", str(self.folder)], check=True, timeout=30)


def missing_registry() -> str | None:
    if shutil.which("docker-registry") is None:
        return "docker-registry is not installed (apt-get install docker-registry; `make setup` does)"
    return None


def skip_or_fail(reason: str) -> None:
    if os.environ.get("LANECTL_CI"):
        pytest.fail(f"CI must run the registry tests: {reason}")  # a skip would let CI pass untested
    pytest.skip(reason)


def start_registry(folder: Path, addr: str, *extra: str, ca: Path | None = None) -> Registry:
    """Start a registry serving `addr` from `folder` (extra: --readonly, --storage PATH, --tls CERT KEY)."""
    reason = missing_registry()
    if reason:
        skip_or_fail(reason)
    started = subprocess.run(["bash", str(SCRIPT), "start", str(folder), "--addr", addr, *extra],
                             capture_output=True, text=True, timeout=60)
    if started.returncode != 0:
        raise RuntimeError(f"scripts/registry.sh start failed:\n{started.stdout}{started.stderr}")
    return Registry(addr=addr, folder=folder, ca=ca)


def session_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """The body of conftest's session-wide `registry` fixture."""
    from tests.lane_fixtures import free_port

    server = start_registry(tmp_path_factory.mktemp("registry"), f"127.0.0.1:{free_port()}")
    try:
        yield server
    finally:
        server.stop()
