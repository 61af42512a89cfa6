"""The upstream fetcher and `patches check`: a local package index served over real HTTP, faked
httpx transports only for retry behaviour, and (marked `network`) the real #60945 patch against
the real pinned vLLM 0.31.0 sdist from PyPI.
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import py_compile
import shutil
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from tenacity import wait_none

from lanectl.image import upstream
from lanectl.image.in_image.patching import PatchFormatError, PatchStatus, apply, parse_patch_file
from lanectl.image.patch_check import check_patch_files
from lanectl.image.upstream import UpstreamError, extract_files, fetch_sdist

REPO = Path(__file__).resolve().parents[1]
REAL_PATCH = REPO / "patches" / "vllm" / "60945-rejection-sampler-guard.patch"
VLLM_TARGET = "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"
VLLM_0_31_0_SHA256 = "dde46f1efbe846e5bd0c5c4ec6ec71842c42254c7ff3d9bebb2a57028715d380"
VLLM_0_31_0_SIZE = 43_419_411
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def make_sdist(top: str, files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for relpath, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{relpath}")
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def simple_page(filename: str, url: str, content: bytes, sha256: str | None = None) -> bytes:
    entry = {
        "filename": filename,
        "url": url,
        "hashes": {"sha256": sha256 or hashlib.sha256(content).hexdigest()},
        "size": len(content),
        "yanked": False,
    }
    return json.dumps({"meta": {"api-version": "1.1"}, "name": "demo", "files": [entry]}).encode()


DEMO_SDIST = make_sdist(
    "demo-1.0",
    {
        "PKG-INFO": "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
        "demo/mod.py": "one\ntwo\nthree\n",
        "demo/other.py": "alpha\nBETA\ngamma\n",
    },
)


class LocalIndex:
    """A PEP 691 index on 127.0.0.1 that serves `pages` and records every request path."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, bytes]] = {}
        self.requests: list[str] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                index.requests.append(self.path)
                if self.path not in index.pages:
                    self.send_error(404)
                    return
                content_type, body = index.pages[self.path]
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def publish_demo(self, sdist: bytes = DEMO_SDIST, sha256: str | None = None) -> None:
        # A relative file URL, as PEP 691 allows: the fetcher must resolve it against the page.
        self.pages["/simple/demo/"] = (
            SIMPLE_JSON,
            simple_page("demo-1.0.tar.gz", "../../files/demo-1.0.tar.gz", sdist, sha256),
        )
        self.pages["/files/demo-1.0.tar.gz"] = ("application/octet-stream", sdist)


@pytest.fixture
def local_index(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalIndex]:
    index = LocalIndex()
    thread = threading.Thread(target=index.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("LANECTL_PYPI_INDEX", index.url)
    try:
        yield index
    finally:
        index.server.shutdown()
        index.server.server_close()


@pytest.fixture
def instant_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upstream, "RETRY_WAIT", wait_none())


def demo_patch(directory: Path, name: str, target: str, old: str, new: str, base: str = "pypi:demo==1.0") -> Path:
    path = directory / "demo" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"Subject: change {target}\nUpstream: https://example.invalid/1\nTarget: {target}\nBase: {base}\n---\n"
        f"--- a/{target}\n+++ b/{target}\n@@ -2 +2 @@\n-{old}\n+{new}\n"
    )
    return path


def cached_files(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in (cache_dir / "sdists").iterdir())


# ------------------------------------------------------------------------- local index, real HTTP


def test_check_fetches_each_pinned_sdist_once_then_answers_from_the_cache(
    tmp_path: Path, local_index: LocalIndex
) -> None:
    local_index.publish_demo()
    patches = [
        demo_patch(tmp_path / "patches", "a.patch", "demo/mod.py", "two", "TWO"),
        demo_patch(tmp_path / "patches", "b.patch", "demo/other.py", "beta", "BETA"),
    ]
    progress: list[tuple[int, int]] = []

    reports = check_patch_files(
        patches, tmp_path, tmp_path / "cache", progress=lambda done, total: progress.append((done, total))
    )

    assert [(r.patch, r.status) for r in reports] == [
        ("demo/a.patch", PatchStatus.APPLIES),
        ("demo/b.patch", PatchStatus.ALREADY_UPSTREAM),
    ]
    assert local_index.requests == ["/simple/demo/", "/files/demo-1.0.tar.gz"]
    assert progress[-1] == (len(DEMO_SDIST), len(DEMO_SDIST))
    assert cached_files(tmp_path / "cache") == ["demo-1.0.json", "demo-1.0.tar.gz"]

    again = check_patch_files(patches, tmp_path, tmp_path / "cache")

    assert again == reports
    assert local_index.requests == ["/simple/demo/", "/files/demo-1.0.tar.gz"]


def test_a_corrupted_cached_sdist_is_detected_and_downloaded_again(tmp_path: Path, local_index: LocalIndex) -> None:
    local_index.publish_demo()
    cached = fetch_sdist("demo", "1.0", tmp_path / "cache")
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes: only the sha256 can tell
    cached.write_bytes(bytes(data))
    local_index.requests.clear()

    refetched = fetch_sdist("demo", "1.0", tmp_path / "cache")

    assert refetched == cached
    assert local_index.requests == ["/simple/demo/", "/files/demo-1.0.tar.gz"]
    assert refetched.read_bytes() == DEMO_SDIST


def test_a_download_that_does_not_match_the_index_hash_is_not_cached(tmp_path: Path, local_index: LocalIndex) -> None:
    local_index.publish_demo(sha256="0" * 64)

    with pytest.raises(
        UpstreamError, match=r"/files/demo-1\.0\.tar\.gz: sha256 [0-9a-f]{64} does not match the index's 0{64}"
    ):
        fetch_sdist("demo", "1.0", tmp_path / "cache")

    assert cached_files(tmp_path / "cache") == []


def test_no_sdist_for_the_pinned_version(tmp_path: Path, local_index: LocalIndex) -> None:
    local_index.publish_demo()

    with pytest.raises(UpstreamError, match=r"/simple/demo/ has no sdist \(\.tar\.gz\) for demo==2\.0$"):
        fetch_sdist("demo", "2.0", tmp_path / "cache")


def test_an_explicit_index_url_wins_over_the_environment(
    tmp_path: Path, local_index: LocalIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_index.publish_demo()
    monkeypatch.setenv("LANECTL_PYPI_INDEX", "http://127.0.0.1:9/unused/")

    path = fetch_sdist("demo", "1.0", tmp_path / "cache", index_url=local_index.url)

    assert path.read_bytes() == DEMO_SDIST


# --------------------------------------------------------------- retries, faked at the transport


def test_connect_errors_and_5xx_are_retried(tmp_path: Path, instant_retries: None) -> None:
    answers: list[str] = ["connect-error", "503"]
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.path}")
        answer = answers.pop(0) if answers else "ok"
        if answer == "connect-error":
            raise httpx.ConnectError("connection refused", request=request)
        if answer == "503":
            return httpx.Response(503)
        if request.url.path == "/simple/demo/":
            page = simple_page("demo-1.0.tar.gz", "https://files.invalid/demo-1.0.tar.gz", DEMO_SDIST)
            return httpx.Response(200, headers={"Content-Type": SIMPLE_JSON}, content=page)
        return httpx.Response(200, content=DEMO_SDIST)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        path = fetch_sdist("demo", "1.0", tmp_path / "cache", index_url="https://index.invalid/simple/", client=client)

    assert seen == ["/simple/demo/", "/simple/demo/", "/simple/demo/", "/demo-1.0.tar.gz"]
    assert path.read_bytes() == DEMO_SDIST


def test_retries_are_bounded(tmp_path: Path, instant_retries: None) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(502)

    with (
        httpx.Client(transport=httpx.MockTransport(handler)) as client,
        pytest.raises(UpstreamError, match=r"^GET https://index\.invalid/simple/demo/ answered HTTP 502$"),
    ):
        fetch_sdist("demo", "1.0", tmp_path / "cache", index_url="https://index.invalid/simple/", client=client)

    assert len(seen) == upstream.DOWNLOAD_ATTEMPTS


def test_404_is_not_retried(tmp_path: Path, instant_retries: None) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(404)

    with (
        httpx.Client(transport=httpx.MockTransport(handler)) as client,
        pytest.raises(UpstreamError, match=r"^GET https://index\.invalid/simple/no-such-project/ answered HTTP 404$"),
    ):
        fetch_sdist(
            "No_Such.Project", "1.0", tmp_path / "cache", index_url="https://index.invalid/simple/", client=client
        )

    assert seen == ["https://index.invalid/simple/no-such-project/"]


# ------------------------------------------------------------------------------------ extraction


def test_extract_files_strips_the_top_directory(tmp_path: Path) -> None:
    sdist = tmp_path / "demo-1.0.tar.gz"
    sdist.write_bytes(DEMO_SDIST)

    extract_files(sdist, ["demo/mod.py", "demo/other.py"], tmp_path / "out")

    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.py")) == [
        "demo/mod.py",
        "demo/other.py",
    ]
    assert (tmp_path / "out/demo/mod.py").read_text() == "one\ntwo\nthree\n"


def test_extract_files_refuses_paths_outside_the_archive_and_missing_members(tmp_path: Path) -> None:
    sdist = tmp_path / "demo-1.0.tar.gz"
    sdist.write_bytes(DEMO_SDIST)

    with pytest.raises(UpstreamError, match=r"'\.\./etc/passwd' must be a relative path inside the sdist"):
        extract_files(sdist, ["../etc/passwd"], tmp_path / "out")
    with pytest.raises(UpstreamError, match=r"has no demo-1\.0/demo/missing\.py$"):
        extract_files(sdist, ["demo/missing.py"], tmp_path / "out")

    extract_files(sdist, ["demo/missing.py", "demo/mod.py"], tmp_path / "out", missing_ok=True)
    assert (tmp_path / "out/demo/mod.py").is_file()
    assert not (tmp_path / "out/demo/missing.py").exists()


def test_extract_files_refuses_a_link_member(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        link = tarfile.TarInfo("demo-1.0/demo/mod.py")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        archive.addfile(link)
    sdist = tmp_path / "demo-1.0.tar.gz"
    sdist.write_bytes(buffer.getvalue())

    with pytest.raises(UpstreamError, match=r"demo-1\.0/demo/mod\.py is not a regular file"):
        extract_files(sdist, ["demo/mod.py"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------- Base forms


def test_a_path_base_is_checked_in_place_without_writing(tmp_path: Path) -> None:
    tree = tmp_path / "images" / "stub"
    (tree / "demo").mkdir(parents=True)
    (tree / "demo/mod.py").write_text("one\ntwo\nthree\n")
    patch = demo_patch(tmp_path / "patches", "p.patch", "demo/mod.py", "two", "TWO", base="path:images/stub")

    [report] = check_patch_files([patch], tmp_path, tmp_path / "cache")

    assert report.status == PatchStatus.APPLIES
    assert (tree / "demo/mod.py").read_text() == "one\ntwo\nthree\n"


@pytest.mark.parametrize("base", ["git:vllm@v0.31.0", "pypi:vllm>=0.31.0", "path:../outside", "path:/abs"])
def test_an_unknown_base_is_a_format_error_naming_the_accepted_forms(tmp_path: Path, base: str) -> None:
    patch = demo_patch(tmp_path / "patches", "p.patch", "demo/mod.py", "two", "TWO", base=base)

    with pytest.raises(PatchFormatError) as raised:
        check_patch_files([patch], tmp_path, tmp_path / "cache")

    assert raised.value.line == 4
    if base.startswith("path:"):
        assert "the directory must be relative and inside the project" in str(raised.value)
    else:
        assert str(raised.value) == (
            f"{patch}:4: Base {base!r} is not understood; "
            "use 'pypi:<project>==<version>' or 'path:<directory relative to the project root>'"
        )
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------- the real patch against real PyPI


@pytest.fixture(scope="session")
def shared_cache_dir() -> Path:
    # One download of the 43 MB sdist per machine, not per test run.
    return Path(os.environ.get("LANECTL_TEST_CACHE", Path.home() / ".cache" / "lanectl-test"))


class RecordingTransport(httpx.BaseTransport):
    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.urls: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        return self.inner.handle_request(request)


@pytest.mark.network
def test_real_60945_patch_applies_to_the_pinned_vllm_0_31_0(shared_cache_dir: Path) -> None:
    [report] = check_patch_files([REAL_PATCH], REPO, shared_cache_dir)

    assert report.patch == "vllm/60945-rejection-sampler-guard.patch"
    assert report.status == PatchStatus.APPLIES
    assert report.offsets == (0,)


@pytest.mark.network
def test_a_cached_sdist_is_reused_without_any_request(shared_cache_dir: Path) -> None:
    fetch_sdist("vllm", "0.31.0", shared_cache_dir)
    recorder = RecordingTransport(httpx.HTTPTransport())

    with httpx.Client(transport=recorder) as client:
        path = fetch_sdist("vllm", "0.31.0", shared_cache_dir, client=client)

    assert recorder.urls == []
    assert path.name == "vllm-0.31.0.tar.gz"
    assert path.stat().st_size == VLLM_0_31_0_SIZE
    assert hashlib.sha256(path.read_bytes()).hexdigest() == VLLM_0_31_0_SHA256


@pytest.mark.network
def test_real_60945_patch_is_already_upstream_once_applied(shared_cache_dir: Path, tmp_path: Path) -> None:
    sdist = fetch_sdist("vllm", "0.31.0", shared_cache_dir)
    extract_files(sdist, [VLLM_TARGET], tmp_path / "pristine")
    (tmp_path / "project" / "patched" / VLLM_TARGET).parent.mkdir(parents=True)
    shutil.copy(tmp_path / "pristine" / VLLM_TARGET, tmp_path / "project" / "patched" / VLLM_TARGET)
    applied = apply(parse_patch_file(REAL_PATCH), tmp_path / "project" / "patched")
    assert (applied.status, applied.written) == (PatchStatus.APPLIES, True)
    patched_file = tmp_path / "project" / "patched" / VLLM_TARGET
    py_compile.compile(str(patched_file), cfile=str(tmp_path / "compiled.pyc"), doraise=True)
    changes = [
        line
        for line in difflib.unified_diff(
            (tmp_path / "pristine" / VLLM_TARGET).read_text().splitlines(), patched_file.read_text().splitlines(), n=0
        )
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changes == [
        "+    # Adaptive verification can end before num_speculative_steps.",
        "+    if logit_idx + 1 >= tl.num_programs(0):",
        "+        return",
    ]
    same_patch_on_path_base = tmp_path / "project" / "patches" / "vllm" / REAL_PATCH.name
    same_patch_on_path_base.parent.mkdir(parents=True)
    same_patch_on_path_base.write_text(REAL_PATCH.read_text().replace("Base: pypi:vllm==0.31.0", "Base: path:patched"))

    [report] = check_patch_files([same_patch_on_path_base], tmp_path / "project", tmp_path / "unused-cache")

    assert report.status == PatchStatus.ALREADY_UPSTREAM
