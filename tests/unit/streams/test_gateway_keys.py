"""API keys: kept hashed in a file, each a tenant with limits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from streams.gateway.keys import (
    KeyRing,
    KeysFileError,
    add_key,
    hash_key,
    load_keys,
    remove_keys,
)


def test_a_key_is_shown_once_and_only_its_hash_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    key, entry = add_key(path, "acme", rpm=60, tpm=1000)
    stored = path.read_text()
    assert key.startswith("lw-") and key not in stored
    assert entry.sha256 == hash_key(key) and entry.sha256 in stored
    assert entry.id == f"k-{entry.sha256[:8]}"
    assert (entry.tenant, entry.rpm, entry.tpm) == ("acme", 60, 1000)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert load_keys(path).keys == (entry,)


def test_keys_are_removed_by_id_or_by_tenant(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    _, a1 = add_key(path, "a", rpm=None, tpm=None)
    _, a2 = add_key(path, "a", rpm=None, tpm=None)
    _, b = add_key(path, "b", rpm=None, tpm=None)
    assert remove_keys(path, b.id) == [b]
    assert remove_keys(path, "a") == [a1, a2]
    assert load_keys(path).keys == ()
    assert remove_keys(path, "nobody") == []


def test_the_ring_finds_a_key_by_its_hash_and_sees_changes(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    ring = KeyRing(path, reload_s=0.0)
    assert not ring.open and ring.lookup("anything") is None, "a named file, even missing"
    key, entry = add_key(path, "acme", rpm=None, tpm=None)
    assert ring.lookup(key) == entry and not ring.open
    assert ring.lookup("lw-wrong") is None and ring.lookup(None) is None
    remove_keys(path, "acme")
    assert ring.lookup(key) is None and not ring.open, "the last key removed opens nothing"
    assert KeyRing(None).open, "only a gateway with no keys file takes any key"


def test_a_broken_file_is_refused_at_start_and_ignored_once_running(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [{"tenant": "x"}]}))
    with pytest.raises(KeysFileError, match="keys file"):
        KeyRing(path)
    path.unlink()
    ring = KeyRing(path, reload_s=0.0)
    key, _ = add_key(path, "acme", rpm=None, tpm=None)
    assert ring.lookup(key) is not None
    path.write_text("{not json")
    assert ring.lookup(key) is not None, "the keys held stay in force"
