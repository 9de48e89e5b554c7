"""API keys: each is a tenant with limits, kept as its sha256 in a JSON
file (``LANEWAY_GATEWAY_KEYS_FILE``), managed by ``laneway keys``::

    {"keys": [{"id": "k-1a2b3c4d", "tenant": "acme", "sha256": "…",
               "rpm": 600, "tpm": 100000, "created_at": "2026-…"}]}

A key itself is shown once, by ``laneway keys add``, and never stored:
``KeyRing.lookup`` hashes what a client presents and finds its entry. The
file is written whole to a temporary file and renamed over the old one,
so a gateway reading it never sees half of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "ApiKey",
    "KeyRing",
    "KeysFile",
    "KeysFileError",
    "add_key",
    "hash_key",
    "load_keys",
    "remove_keys",
]

KEY_PREFIX = "lw-"


class KeysFileError(ValueError):
    """The keys file cannot be used; the message says why."""


class ApiKey(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^k-[0-9a-f]{8,64}$")
    """A name to list and remove the key by: ``k-`` and the hash's first 8 hex digits."""
    tenant: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    """The tenant its requests carry (the gateway sets ``tenant``; a client cannot)."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute at most (unset: no limit)."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens (prompt + completion) per minute at most (unset: no limit)."""
    created_at: str = ""


class KeysFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    keys: tuple[ApiKey, ...] = ()


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def load_keys(path: Path) -> KeysFile:
    """The keys in ``path``; none when it does not exist."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return KeysFile()
    except OSError as exc:
        raise KeysFileError(f"keys file {path}: {exc}") from exc
    try:
        return KeysFile.model_validate_json(text)
    except ValidationError as exc:
        raise KeysFileError(f"keys file {path}: {exc}") from exc


def _save(path: Path, keys: KeysFile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(keys.model_dump(), out, indent=2)
            out.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_key(path: Path, tenant: str, *, rpm: int | None, tpm: int | None) -> tuple[str, ApiKey]:
    """Make a new key for ``tenant``, store its hash; returns the key (to
    show once) and its entry."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    digest = hash_key(key)
    entry = ApiKey(
        id=f"k-{digest[:8]}",
        tenant=tenant,
        sha256=digest,
        rpm=rpm,
        tpm=tpm,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    keys = load_keys(path)
    _save(path, KeysFile(keys=(*keys.keys, entry)))
    return key, entry


def remove_keys(path: Path, name: str) -> list[ApiKey]:
    """Remove the key with id ``name``, or every key of tenant ``name``;
    returns those removed."""
    keys = load_keys(path)
    gone = [k for k in keys.keys if name in (k.id, k.tenant)]
    if gone:
        _save(path, KeysFile(keys=tuple(k for k in keys.keys if k not in gone)))
    return gone


class KeyRing:
    """The keys a gateway accepts, read again from the file when it changes
    (checked at most every ``reload_s``). ``open`` when no file is named:
    any key is accepted (``laneway up``'s default). A named file with no
    keys (missing, or its last key removed) accepts none: removing keys
    never opens the door."""

    def __init__(self, path: Path | None, reload_s: float = 2.0) -> None:
        self.path = path
        self._reload_s = reload_s
        self._by_hash: dict[str, ApiKey] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked = float("-inf")
        self.reload()

    @property
    def open(self) -> bool:
        return self.path is None

    def __len__(self) -> int:
        return len(self._by_hash)

    def reload(self) -> None:
        """Read the file again if it changed (a bad file keeps the keys held)."""
        self._checked = time.monotonic()
        if self.path is None:
            return
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            stamp = (0, 0)
        if stamp == self._stamp:
            return
        keys = load_keys(self.path)  # raises KeysFileError: the caller logs it
        self._by_hash = {k.sha256: k for k in keys.keys}
        self._stamp = stamp

    def lookup(self, presented: str | None) -> ApiKey | None:
        """The entry of the key a client presented, ``None`` when unknown."""
        if time.monotonic() - self._checked >= self._reload_s:
            try:
                self.reload()
            except KeysFileError:
                pass  # the keys held stay in force; the next check tries again
        if not presented:
            return None
        return self._by_hash.get(hash_key(presented))
