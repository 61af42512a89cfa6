"""A real Docker registry for the tests: Debian's docker-registry (the CNCF distribution registry 2.8), started
and stopped by scripts/registry.sh, each with its own storage, config and log under a test folder.

`registry` (in conftest.py) is one session-wide registry on a free loopback port (Docker trusts loopback without
TLS); tests that need a broken one (stopped, read-only, full) start their own with `start_registry`.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "registry.sh"
# Where every Docker engine on this host (the fleet tests' second one too) looks for a registry's CA, per HOST:PORT,
# on each push and pull: no engine restart needed.
CERTS_D = Path("/etc/docker/certs.d")
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
        verify = ssl.create_default_context(cafile=str(self.ca)) if self.ca else True
        return httpx.Client(base_url=self.url, verify=verify, timeout=10)

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
        if self.ca is not None:
            shutil.rmtree(CERTS_D / self.addr, ignore_errors=True)


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


def start_tls_registry(folder: Path, ip: str, port: int) -> Registry:
    """A registry on a non-loopback address (the fleet tests' manager address, which the second engine reaches):
    Docker trusts plain HTTP only on loopback, so it serves TLS with a self-signed certificate for `ip`, whose
    CA is installed in /etc/docker/certs.d/IP:PORT/ for every engine here; `stop()` removes it again."""
    if shutil.which("openssl") is None:
        skip_or_fail("a TLS registry needs openssl (apt-get install openssl; `make setup` does)")
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=lanectl test registry", "-addext", f"subjectAltName=IP:{ip}", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    addr = f"{ip}:{port}"
    # A run that crashed left its CA for this address under another port; only one such registry runs at a time
    # (the fleet tests and benchmark each hold the one two-node swarm).
    for stale in CERTS_D.glob(f"{ip}:*"):
        shutil.rmtree(stale, ignore_errors=True)
    (CERTS_D / addr).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cert, CERTS_D / addr / "ca.crt")
    try:
        return start_registry(folder / "server", addr, "--tls", str(cert), str(key), ca=cert)
    except BaseException:
        shutil.rmtree(CERTS_D / addr, ignore_errors=True)
        raise


def session_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """The body of conftest's session-wide `registry` fixture."""
    from tests.lane_fixtures import free_port

    server = start_registry(tmp_path_factory.mktemp("registry"), f"127.0.0.1:{free_port()}")
    try:
        yield server
    finally:
        server.stop()
