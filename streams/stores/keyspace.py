"""Which Redis keys share a Redis Cluster slot.

A Redis (or Valkey) Cluster runs a Lua script or a MULTI transaction only
when all its keys hash to one slot. A key's slot is taken from its hash tag,
the part between its first ``{`` and the next ``}``, where it has one. Every
key a script or a transaction takes together is built here with the same
tag; the others have no tag and spread over the cluster's nodes. The layout
is the same with one Redis, where the braces are plain characters, so a
stack behaves the same on both (``docs/redis-cluster.md`` draws it whole).

``P`` is ``LANEWAY_REDIS_KEY_PREFIX`` (braces refused there, so a prefix
never sets a tag of its own):

- ``P:{cache}:…``          the response cache's entries, index and version
  counter: its store script trims the index and deletes the trimmed entries,
  and its fetch script reads a batch's entries in one call.
- ``P:{batch}:…``          batch jobs, their parts and the job lists: one
  script records a result, counts it and lists a new job in one step.
- ``P:gateway:{batches}:…``  the gateway's batch objects and their lists,
  written together in one transaction.
- ``P:gateway:file:{<id>}…``   one uploaded file and its bytes.
- ``P:gateway:limit:{<key id>}:…``  one API key's shared limits.
- ``P:hot:{<day>}:…``      one day's hot questions (``streams.cache.hot_questions``).

Keys a batch reads or writes together but that no script or transaction
needs in one slot (its sessions, rate-limit buckets, a worker's stored
results and claims) carry no shared tag: on a cluster such commands are
split by slot (``streams.stores.rounds.Round.group_of``, ``get_many``), and
the cluster client sends a pipeline to each node at once, one round trip
to each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["BATCH", "CACHE", "GATEWAY_BATCHES", "get_many", "own_slot", "tagged"]

CACHE = "cache"
BATCH = "batch"
GATEWAY_BATCHES = "batches"


def tagged(prefix: str, tag: str, *parts: str) -> str:
    """``<prefix>:{<tag>}:<part>:…``: a key in the slot of ``tag``."""
    if not tag or "{" in tag or "}" in tag:
        raise ValueError(f"a hash tag must be non-empty and hold no braces, not {tag!r}")
    return ":".join((prefix, "{" + tag + "}", *parts))


def own_slot(base: str, item: str) -> str:
    """``<base>:{<item>}``: the base of the keys of one item (a file, an API
    key), which then add ``:<part>``, in one slot of their own, so the items
    spread over the nodes. An id holding braces itself (one asked for by a
    client) still gives all its keys one tag: they share this whole base."""
    return f"{base}:{{{item}}}"


async def get_many(redis: Any, keys: Sequence[str]) -> list[Any]:
    """The values of ``keys`` in order (``None`` where absent): one MGET on
    one Redis; on a cluster client one MGET per slot, pipelined, so at most
    one round trip per node (a plain MGET across slots is refused there)."""
    if not keys:
        return []
    spread = getattr(redis, "mget_nonatomic", None)
    if spread is not None:
        return list(await spread(list(keys)))
    return list(await redis.mget(list(keys)))
