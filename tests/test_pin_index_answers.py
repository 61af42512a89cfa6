"""`lanectl pin check` against a package index that answers in the wrong shape, or an index URL that is none:
one line and an exit code, never a traceback. The index is a real HTTP server on 127.0.0.1 (LocalIndex)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lanectl.image.upstream import SIMPLE_JSON
from tests.test_cli import lanectl
from tests.test_patch_check_upstream import LocalIndex, local_index  # noqa: F401  # the fixture, by name
from tests.test_pin_check import copy_project

GOOD_ENTRY = {"filename": "vllm-0.32.0.tar.gz", "url": "../../files/vllm-0.32.0.tar.gz",
              "hashes": {"sha256": "0" * 64}, "size": 10}
WRONG_SHAPES = {
    "not-json": b"{\"files\": [",
    "not-utf8": b"\xff\xfe{}",
    "a-list": json.dumps([GOOD_ENTRY]).encode(),
    "files-is-an-object": json.dumps({"files": {"0": GOOD_ENTRY}}).encode(),
    "entry-is-a-string": json.dumps({"files": ["vllm-0.32.0.tar.gz"]}).encode(),
    "filename-is-a-number": json.dumps({"files": [{**GOOD_ENTRY, "filename": 32}]}).encode(),
    "hashes-is-a-list": json.dumps({"files": [{**GOOD_ENTRY, "hashes": ["sha256", "0" * 64]}]}).encode(),
    "sha256-is-a-number": json.dumps({"files": [{**GOOD_ENTRY, "hashes": {"sha256": 12}}]}).encode(),
    "url-is-null": json.dumps({"files": [{**GOOD_ENTRY, "url": None}]}).encode(),
    "size-is-text": json.dumps({"files": [{**GOOD_ENTRY, "size": "10"}]}).encode(),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_project(tmp_path_factory.mktemp("pin") / "p")


@pytest.mark.parametrize("body", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
def test_a_wrong_shaped_index_answer_is_one_line_not_a_traceback(project, tmp_path, local_index, body):  # noqa: F811
    local_index.pages["/simple/vllm/"] = (SIMPLE_JSON, body)
    result = lanectl("pin", "check", "0.32.0", cwd=project,
                     env={"LANECTL_CACHE_DIR": str(tmp_path / "cache"), "LANECTL_PYPI_INDEX": local_index.url})
    assert (result.returncode, result.stdout) == (1, "")
    lines = result.stderr.splitlines()
    assert lines[-1].startswith(f"lanectl: {local_index.url}vllm/ answered ") and lines[-1].endswith(
        "; check the index"), result.stderr


@pytest.mark.parametrize("index", ["not a url", "ftp://mirror.example/simple/", "http://", "https://[::1/simple/",
                                   "file:///etc/passwd"])
def test_an_index_url_that_is_none_is_bad_input(project, tmp_path, index):
    result = lanectl("pin", "check", "0.32.0", cwd=project,
                     env={"LANECTL_CACHE_DIR": str(tmp_path / "cache"), "LANECTL_PYPI_INDEX": index})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == (f"lanectl: $LANECTL_PYPI_INDEX {index!r} is not an http(s) URL of a "
                                              "package index; give one like https://pypi.org/simple/")
