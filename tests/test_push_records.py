"""The push records `build --push` writes and `up --fleet` and `status` read (state_dir/pushes/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lanectl.state.paths import StateDirUnsafe
from lanectl.state.pushes import PushRecord, PushStore

TAG = "lanectl/demo:demo-h1-0123456789ab"


def push(registry: str, digit: str, at: str, local_tag: str = TAG) -> PushRecord:
    repository, _, tag = local_tag.rpartition(":")
    return PushRecord(registry=registry, repository=f"{registry}/{repository}", tag=tag, digest="sha256:" + digit * 64,
                      local_tag=local_tag, recipe="demo", lane="demo-h1", inputs="0123456789ab" + "0" * 52, at=at)


def test_a_record_is_found_by_its_registry_else_the_latest_anywhere(tmp_path: Path):
    store = PushStore(tmp_path / "state")
    assert store.find(TAG) is None and store.find(TAG, "127.0.0.1:5000") is None
    store.record(push("127.0.0.1:5000", "a", "2026-12-01T10:00:00.000Z"))
    store.record(push("registry.example:443/team", "b", "2026-12-01T11:00:00.000Z"))
    store.record(push("127.0.0.1:5000", "c", "2026-12-01T09:00:00.000Z", local_tag="lanectl/demo:demo-h2-0123456789ab"))
    assert store.find(TAG, "127.0.0.1:5000").digest == "sha256:" + "a" * 64
    assert store.find(TAG, "registry.example:443/team").reference == (
        "registry.example:443/team/lanectl/demo@sha256:" + "b" * 64)
    assert store.find(TAG).registry == "registry.example:443/team", "the latest push"
    assert store.find(TAG, "elsewhere.example").registry == "registry.example:443/team", "else the latest push"
    assert sorted(p.name for p in (tmp_path / "state" / "pushes").iterdir() if p.name.startswith(".")) == [], (
        "no temp file is left behind")


def test_a_record_lanectl_did_not_write_counts_as_none(tmp_path: Path):
    store = PushStore(tmp_path)
    store.record(push("127.0.0.1:5000", "a", "2026-12-01T10:00:00.000Z"))
    (path,) = (tmp_path / "pushes").iterdir()
    for text in ("", "{", '{"digest": "sha256:00"}', path.read_text().replace("sha256:", "md5:"), "[]"):
        path.write_text(text)
        assert store.find(TAG, "127.0.0.1:5000") is None, text
        assert store.find(TAG) is None, text


def test_a_record_is_never_read_or_written_through_a_link(tmp_path: Path):
    store = PushStore(tmp_path)
    record = push("127.0.0.1:5000", "a", "2026-12-01T10:00:00.000Z")
    store.record(record)
    (path,) = (tmp_path / "pushes").iterdir()
    target = tmp_path / "elsewhere.json"
    target.write_text(path.read_text())
    path.unlink()
    os.symlink(target, path)
    with pytest.raises(StateDirUnsafe, match="symbolic link"):
        store.find(TAG, "127.0.0.1:5000")
    with pytest.raises(StateDirUnsafe, match="symbolic link"):
        store.record(record)


def test_only_a_sha256_digest_is_recorded(tmp_path: Path):
    with pytest.raises(ValueError, match="not a sha256 digest"):
        PushStore(tmp_path).record(PushRecord(**{**push("r.example", "a", "x").__dict__, "digest": "latest"}))
    assert not (tmp_path / "pushes").exists()


TAMPERED = {
    "another-lane": {"lane": "demo-h2"},
    "another-recipe": {"recipe": "other"},
    "repository-elsewhere": {"repository": "evil.example/lanectl/demo"},
    "repository-another-image": {"repository": "127.0.0.1:5000/lanectl/other"},
    "tag-of-another-build": {"tag": "demo-h1-ffffffffffff"},
    "inputs-of-another-build": {"inputs": "f" * 64},
}


@pytest.mark.parametrize("change", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_record_that_does_not_match_its_lane_and_image_is_not_believed(tmp_path: Path, change: dict[str, str]):
    import json

    store = PushStore(tmp_path)
    store.record(push("127.0.0.1:5000", "a", "2026-12-01T10:00:00.000Z"))
    (path,) = (tmp_path / "pushes").iterdir()
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))

    assert store.find(TAG, "127.0.0.1:5000") is None
    assert store.find(TAG) is None


def test_a_record_copied_under_another_records_name_is_not_believed(tmp_path: Path):
    store = PushStore(tmp_path)
    store.record(push("127.0.0.1:5000", "a", "2026-12-01T10:00:00.000Z"))
    (path,) = (tmp_path / "pushes").iterdir()
    path.rename(path.with_name("0" * 32 + ".json"))

    assert store.find(TAG, "127.0.0.1:5000") is None
    assert store.find(TAG) is None
