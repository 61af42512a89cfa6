"""Fetch pinned upstream source distributions from a PEP 691 package index, once, verified.

The per-version JSON API (``/pypi/<project>/<version>/json``) is not served by every index or
mirror; the PEP 691 simple API is, and it carries the sha256 that makes a download trustworthy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urljoin

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from lanectl.errors import OperationFailed
from lanectl.records import frozen
from lanectl.state.atomic import replacing, write_atomically

DEFAULT_INDEX_URL = "https://pypi.org/simple/"
INDEX_URL_ENV = "LANECTL_PYPI_INDEX"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
SDIST_SUFFIX = ".tar.gz"
DOWNLOAD_ATTEMPTS = 4
# Module level so tests can make retries instant; production waits 0.5, 1, 2 s between attempts.
RETRY_WAIT = wait_exponential(multiplier=0.5, max=8)
_CHUNK_BYTES = 1 << 20
# Written files are 0600 by default; the cache is shared by whoever builds images and checks patches.
_CACHE_FILE_MODE = 0o644

Progress = Callable[[int, int], None]


class UpstreamError(OperationFailed):
    """Pinned upstream source could not be resolved, downloaded, verified or extracted."""


@frozen
class SdistFile:
    filename: str
    url: str
    sha256: str
    size: int | None


def normalize_project_name(name: str) -> str:
    # PEP 503 normalisation: the simple API's URL for a project and PEP 625 sdist names use it.
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve_index_url(index_url: str | None) -> str:
    """The index to ask: `index_url`, else $LANECTL_PYPI_INDEX, else PyPI; an http(s) URL with a host, or bad
    input naming where it came from."""
    from lanectl.errors import BadInput

    url = index_url or os.environ.get(INDEX_URL_ENV) or DEFAULT_INDEX_URL
    try:
        parsed = httpx.URL(url)
        usable = parsed.scheme in ("http", "https") and bool(parsed.host)
    except (httpx.InvalidURL, TypeError, ValueError):
        usable = False
    if not usable:
        where = "the index URL" if index_url else f"${INDEX_URL_ENV}"
        raise BadInput(f"{where} {url!r} is not an http(s) URL of a package index; give one like "
                       f"{DEFAULT_INDEX_URL}")
    return url


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, httpx.TransportError):
        return True
    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code >= 500 or error.response.status_code == 429
    return False


def _retrying() -> Retrying:
    return Retrying(
        retry=retry_if_exception(_is_transient),
        stop=stop_after_attempt(DOWNLOAD_ATTEMPTS),
        wait=RETRY_WAIT,
        reraise=True,
    )


def _http_error(url: str, error: httpx.HTTPError) -> UpstreamError:
    if isinstance(error, httpx.HTTPStatusError):
        return UpstreamError(f"GET {url} answered HTTP {error.response.status_code}")
    return UpstreamError(f"GET {url} failed: {type(error).__name__}: {error}")


def _sdist_matches(filename: str, project: str, version: str) -> bool:
    if not filename.endswith(SDIST_SUFFIX):
        return False
    name, _, file_version = filename[: -len(SDIST_SUFFIX)].rpartition("-")
    return normalize_project_name(name) == normalize_project_name(project) and file_version == version


def _simple_page(project: str, index_url: str | None, client: httpx.Client) -> tuple[str, list[dict[str, Any]]]:
    """The project's PEP 691 page on the index: its URL and its files."""
    page_url = f"{resolve_index_url(index_url).rstrip('/')}/{normalize_project_name(project)}/"

    def get_page() -> httpx.Response:
        response = client.get(page_url, headers={"Accept": SIMPLE_JSON})
        response.raise_for_status()
        return response

    try:
        response = _retrying()(get_page)
    except httpx.HTTPError as error:
        raise _http_error(page_url, error) from error
    if not response.headers.get("content-type", "").startswith(SIMPLE_JSON):
        raise UpstreamError(
            f"{page_url} did not answer with {SIMPLE_JSON} (got {response.headers.get('content-type')!r}); "
            "the index must support the PEP 691 JSON simple API"
        )
    try:
        page = response.json()
    except ValueError:  # not JSON, or not UTF-8
        raise UpstreamError(f"{page_url} answered {SIMPLE_JSON} that is not JSON; check the index") from None
    files = page.get("files") if isinstance(page, dict) else None
    if not isinstance(files, list):
        raise UpstreamError(f"{page_url} answered a page without a list of files (PEP 691); check the index")
    return page_url, [_file_entry(page_url, i, entry) for i, entry in enumerate(files)]


# A file entry of a PEP 691 page, as the fetcher reads it: each key, and the types its value may have.
_ENTRY_TYPES: dict[str, tuple[type, ...]] = {"filename": (str,), "url": (str,), "hashes": (dict,),
                                             "size": (int, type(None)), "yanked": (bool, str, type(None))}


def _file_entry(page_url: str, index: int, entry: Any) -> dict[str, Any]:
    """`entry` when it is shaped as PEP 691 says (sha256, when given, 64 hex digits); else the index is wrong."""
    if not isinstance(entry, dict):
        raise UpstreamError(f"{page_url} answered a file entry (files[{index}]) that is not an object; check the "
                            "index")
    for key, types in _ENTRY_TYPES.items():
        value = entry.get(key)
        if key in ("filename", "url", "hashes") and key not in entry or (
                not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            raise UpstreamError(f"{page_url} answered files[{index}].{key} of the wrong type; check the index")
    sha256 = entry["hashes"].get("sha256")
    if sha256 is not None and not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha256)):
        raise UpstreamError(f"{page_url} answered files[{index}].hashes.sha256 that is not 64 hex digits; check the "
                            "index")
    return entry


def resolve_sdist(project: str, version: str, *, index_url: str | None = None, client: httpx.Client) -> SdistFile:
    """Find the sdist of `project`==`version` on the index, with the sha256 the index publishes."""
    page_url, files = _simple_page(project, index_url, client)
    for entry in files:
        filename = entry.get("filename", "")
        if not _sdist_matches(filename, project, version):
            continue
        sha256 = entry.get("hashes", {}).get("sha256")
        if not sha256:
            raise UpstreamError(f"{page_url} lists {filename} without a sha256, so it cannot be verified")
        return SdistFile(
            filename=filename,
            url=urljoin(page_url, entry["url"]),
            sha256=sha256.lower(),
            size=entry.get("size"),
        )
    raise UpstreamError(f"{page_url} has no sdist ({SDIST_SUFFIX}) for {project}=={version}")


def released_versions(project: str, *, index_url: str | None = None, client: httpx.Client | None = None) -> list[str]:
    """Every version of `project` the index has an sdist of (yanked ones left out), in the index's order."""
    owned = client is None
    http = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0, read=120.0))
    try:
        _, files = _simple_page(project, index_url, http)
    finally:
        if owned:
            http.close()
    prefix = normalize_project_name(project)
    versions = []
    for entry in files:
        filename = entry.get("filename", "")
        name, _, version = filename.removesuffix(SDIST_SUFFIX).rpartition("-")
        if filename.endswith(SDIST_SUFFIX) and normalize_project_name(name) == prefix and not entry.get("yanked"):
            versions.append(version)
    return list(dict.fromkeys(versions))


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_intact(path: Path, sdist: SdistFile) -> bool:
    if not path.is_file():
        return False
    if sdist.size is not None and path.stat().st_size != sdist.size:
        return False
    return _sha256_of(path) == sdist.sha256


def _record_path(sdists_dir: Path, project: str, version: str) -> Path:
    return sdists_dir / f"{normalize_project_name(project)}-{version}.json"


def _read_record(path: Path) -> SdistFile | None:
    try:
        data = json.loads(path.read_text())
        return SdistFile(filename=data["filename"], url=data["url"], sha256=data["sha256"], size=data.get("size"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _download(sdist: SdistFile, final: Path, client: httpx.Client, progress: Progress | None) -> None:
    def attempt() -> None:
        # A download that fails or does not verify raises inside the block: nothing replaces `final`.
        with replacing(final, mode=_CACHE_FILE_MODE) as handle, client.stream("GET", sdist.url) as response:
            response.raise_for_status()
            digest = hashlib.sha256()
            total = sdist.size or int(response.headers.get("content-length", 0) or 0)
            done = 0
            for chunk in response.iter_bytes(_CHUNK_BYTES):
                handle.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
            if sdist.size is not None and done != sdist.size:
                raise UpstreamError(f"{sdist.url}: downloaded {done} bytes, the index says {sdist.size}; not cached")
            if digest.hexdigest() != sdist.sha256:
                raise UpstreamError(
                    f"{sdist.url}: sha256 {digest.hexdigest()} does not match the index's {sdist.sha256}; not cached"
                )

    try:
        _retrying()(attempt)
    except httpx.HTTPError as error:
        raise _http_error(sdist.url, error) from error


def fetch_sdist(
    project: str,
    version: str,
    cache_dir: Path,
    *,
    index_url: str | None = None,
    client: httpx.Client | None = None,
    progress: Progress | None = None,
) -> Path:
    """Return the verified sdist of `project`==`version` under ``cache_dir/sdists/``.

    The index is `index_url`, else ``$LANECTL_PYPI_INDEX``, else PyPI. A cached file is reused, with
    no request at all, when its size and sha256 still match what the index published when it was
    downloaded (kept next to it as ``<project>-<version>.json``); otherwise it is downloaded again.
    """
    sdists_dir = cache_dir / "sdists"
    sdists_dir.mkdir(parents=True, exist_ok=True)
    record_path = _record_path(sdists_dir, project, version)
    recorded = _read_record(record_path)
    if recorded is not None and _is_intact(sdists_dir / recorded.filename, recorded):
        return sdists_dir / recorded.filename

    owned_client = client is None
    http = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0, read=120.0))
    try:
        sdist = resolve_sdist(project, version, index_url=index_url, client=http)
        final = sdists_dir / sdist.filename
        if not _is_intact(final, sdist):
            _download(sdist, final, http, progress)
    finally:
        if owned_client:
            http.close()
    write_atomically(record_path, (json.dumps(asdict(sdist), indent=2) + "\n").encode(), mode=_CACHE_FILE_MODE)
    return final


def _check_member_path(relpath: str) -> None:
    path = PurePosixPath(relpath)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise UpstreamError(f"{relpath!r} must be a relative path inside the sdist")


def extract_files(sdist: Path, relpaths: Iterable[str], dest: Path, *, missing_ok: bool = False) -> None:
    """Extract ``<top>/<relpath>`` from the sdist tarball to ``dest/<relpath>`` for each relpath.

    ``<top>`` is the sdist's single top directory (``vllm-0.31.0/``). A relpath the sdist lacks is
    an UpstreamError unless `missing_ok`, in which case it is simply not extracted.
    """
    wanted = list(dict.fromkeys(relpaths))
    if not wanted:
        return
    for relpath in wanted:
        _check_member_path(relpath)
    pending: set[str] = set(wanted)
    top = ""
    try:
        # One sequential pass that stops once everything is found: random access by name
        # (getmember) would decompress the whole 43 MB archive for every call.
        with tarfile.open(sdist, "r:gz") as archive:
            for member in archive:
                top = top or member.name.split("/", 1)[0]
                if not member.name.startswith(f"{top}/"):
                    continue
                relpath = member.name[len(top) + 1 :]
                if relpath not in pending:
                    continue
                if not member.isfile():
                    raise UpstreamError(f"{sdist}: {member.name} is not a regular file")

                def strip_top(info: tarfile.TarInfo, path: str, relpath: str = relpath) -> tarfile.TarInfo | None:
                    # The data filter refuses absolute names, `..`, links out of `dest` and special files.
                    return tarfile.data_filter(info.replace(name=relpath, deep=False), path)

                archive.extract(member, path=dest, filter=strip_top)
                pending.discard(relpath)
                if not pending:
                    break
    except (tarfile.TarError, OSError) as error:
        raise UpstreamError(f"cannot extract from {sdist}: {error}") from error
    if pending and not missing_ok:
        missing = [relpath for relpath in wanted if relpath in pending]
        raise UpstreamError(f"{sdist} has no {', '.join(f'{top}/{relpath}' for relpath in missing)}")
