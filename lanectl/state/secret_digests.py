"""Keyed digests of secret values: how a container's spec can record that `HF_TOKEN` changed without holding it.

A lane's `secret_env` values reach a container only when it is created; the container's spec label keeps, for
each secret, HMAC-SHA256 under a random key of this state folder (`secret-digest.key`, 0600) instead of the
value. A plain hash would let anyone who can read the label (everyone who can run `docker inspect`) test
guesses of a short secret offline; without the key they cannot.

A state folder without a key has not created a container yet: a read-only command (`status`) then cannot judge
secrets and says so, and does not create the key (it leaves no trace on a fresh box).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path

from lanectl.errors import OperationFailed
from lanectl.state.atomic import write_atomically
from lanectl.state.paths import NotAStateFile, check_state_file, create_state_dir, read_state_file

KEY_BYTES = 32


def secret_digests(key_file: Path, names: Iterable[str], environ: Mapping[str, str], *,
                   create: bool) -> dict[str, str]:
    """For each secret set in `environ`, its keyed digest; unset ones are left out (nothing to compare).
    Without a key file: the key is made when `create`, else nothing can be judged ({})."""
    wanted = sorted({name for name in names if name in environ})
    if not wanted:
        return {}
    key = _key(key_file, create=create)
    if key is None:
        return {}
    return {name: hmac.new(key, environ[name].encode(), hashlib.sha256).hexdigest()[:32] for name in wanted}


def _key(key_file: Path, *, create: bool) -> bytes | None:
    try:
        raw = read_state_file(key_file, KEY_BYTES)
    except NotAStateFile as exc:
        raise OperationFailed(f"{key_file}: {exc}; move it aside (mv {key_file} {key_file}.aside)") from None
    if raw is not None and len(raw) == KEY_BYTES:
        return raw
    if not create:
        return None
    # A short or empty file is one a killed writer could not have left (the write is atomic): replaced whole.
    key = secrets.token_bytes(KEY_BYTES)
    try:
        create_state_dir(key_file.parent)
        check_state_file(key_file)
        write_atomically(key_file, key, mode=0o600)
    except OSError as exc:
        raise OperationFailed(f"could not write {key_file}: {exc.strerror or exc}") from exc
    os.chmod(key_file, 0o600)
    return key
