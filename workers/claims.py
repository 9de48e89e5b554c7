"""Identical requests on different workers run once.

``workers.coalesce`` joins the copies of one question that reach the same
worker. A burst can also reach several: two replicas of a lane, or realtime
and medium when the copies differ in urgency. Each worker marks the answer
keys it starts decoding in Redis (``SET NX`` with a TTL), and a worker whose
request is marked by another waits for that answer to reach the cache
instead of decoding it again.

Redis layout (``P`` = the process's key prefix)::

    P:cache:busy:<key>   string, TTL claim_ttl_s: ``<lane>:<token>`` of the
                         claiming worker, set when its decode starts and
                         deleted once the answer was stored in the cache
                         (or failed)

A worker waits only on a worker of its own lane or a faster one: a
realtime copy never waits for a bulk batch to finish; it decodes its own.
A waiting request looks for the answer once the mark is gone: the claimer
stores before it lets go, so a miss then means its decode failed or gave
nothing the cache keeps, and the request runs on its own. It also stops
waiting, and runs, once half the time left before its deadline (when it
was claimed) has passed, or when the mark outlives its TTL (a worker that
died mid-decode). A worker lets its marks go as soon as its own decode
ends, before it waits on anyone's, so no two workers wait on each other.

Redis trouble never fails a request (``streams.stores.failopen``): a claim
that cannot be made is a claim of one's own, a wait that cannot ask runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schemas.messages import Lane, RoutedRequest
from streams.stores.failopen import FailOpen
from streams.stores.rounds import Round

__all__ = ["DecodeClaims"]

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How often a waiting request asks whether its mark is gone."""

SPEED = {Lane.REALTIME: 0, Lane.MEDIUM: 1, Lane.BULK: 2}
"""Lanes from the fastest: a worker waits on marks of its rank or lower."""

# KEYS: marks (on a cluster, those of one slot). ARGV: token. Deletes only the
# marks this worker still holds:
# one that expired and was claimed again by another worker stays.
_RELEASE = """
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    n = n + redis.call('DEL', key)
  end
end
return n
"""


class DecodeClaims:
    """The answer keys one worker is decoding, marked in Redis."""

    def __init__(self, client: aioredis.Redis, *, prefix: str, ttl_s: float, lane: Lane) -> None:
        self._redis = client
        self._prefix = f"{prefix}:cache:busy:"
        self._ttl_s = ttl_s
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._lane = lane
        self._token = f"{lane}:{uuid.uuid4().hex}"
        self._release = client.register_script(_RELEASE)
        self._failopen = FailOpen("decode claims", log=log, label="claims")

    def _mark(self, key: str) -> str:
        return self._prefix + key

    async def mark(self, keys: dict[int, str | None], marked: list[str]) -> dict[int, str]:
        """Of a batch's requests about to be decoded (index: answer key,
        ``None`` for one whose answer is its own), mark the ones no worker
        holds as this one's (added to ``marked``); returns the ones a worker
        of this lane or a faster one marked first, to wait for instead.
        Cancelled mid-claim, it adds every key it
        tried to ``marked``: the caller's ``let_go`` then deletes whichever
        it set, rather than leaving them to hold other workers until their
        TTL."""
        shareable = {i: key for i, key in keys.items() if key is not None}
        if not shareable:
            return {}
        try:
            mine, theirs = await self._claim(list(shareable.values()))
        except asyncio.CancelledError:
            # The marks may have been set before the reply was read:
            # ``let_go`` deletes only the ones that carry this worker's token.
            marked += shareable.values()
            raise
        marked += [key for key in shareable.values() if key in mine]
        return {i: key for i, key in shareable.items() if key in theirs}

    async def let_go(self, marked: list[str]) -> None:
        """``release`` the marks in ``marked`` and empty it: a second call
        does nothing."""
        keys = list(marked)
        marked.clear()
        await self.release(keys)

    async def outwait(self, theirs: dict[int, str], requests: dict[int, RoutedRequest]) -> set[int]:
        """Wait while other workers hold ``theirs`` (index: answer key),
        each request no longer than half the time its deadline leaves it
        (no deadline: the mark's TTL); the indexes whose mark is gone, whose
        answer the cache now has unless that decode failed."""
        now, now_ms = time.monotonic(), int(time.time() * 1000)
        until: dict[int, float] = {}
        for i in theirs:
            left_ms = requests[i].remaining_ms(now_ms)
            at_most_s = self._ttl_s if left_ms is None else left_ms / 2000
            until[i] = now + max(0.0, at_most_s)
        return await self._wait(theirs, until)

    async def _claim(self, keys: Sequence[str]) -> tuple[set[str], set[str]]:
        """Mark ``keys`` as decoded here, in one round trip. Returns the
        ones now this worker's, and the ones a worker of this lane or a
        faster one marked first, to wait on. The rest (marked by a slower
        lane, or Redis failed) are decoded here, unmarked."""
        if not keys or self._failopen.resting():
            return set(), set()
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.set(self._mark(key), self._token, nx=True, px=self._ttl_ms)
                    pipe.get(self._mark(key))
                replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._failopen.failed("claim", exc)
            return set(), set()
        self._failopen.answered()
        mine: set[str] = set()
        theirs: set[str] = set()
        for key, taken, holder in zip(keys, replies[::2], replies[1::2], strict=True):
            if taken:
                mine.add(key)
            elif holder is not None and self._no_slower(holder):
                theirs.add(key)
        return mine, theirs

    def _no_slower(self, holder: bytes | str) -> bool:
        text = holder.decode() if isinstance(holder, bytes) else holder
        try:
            lane = Lane(text.split(":", 1)[0])
        except ValueError:
            return False
        return SPEED[lane] <= SPEED[self._lane]

    async def release(self, keys: Sequence[str]) -> None:
        """Let go of the marks on ``keys`` that are still this worker's."""
        if not keys:
            return
        # One script call for all marks on one Redis; on a cluster one per
        # slot of them (a script's keys must share a slot), pipelined.
        round_ = Round(self._redis)
        groups: dict[int, list[str]] = {}
        for key in keys:
            groups.setdefault(round_.group_of(self._mark(key)), []).append(self._mark(key))
        for marks in groups.values():
            round_.script(self._release, marks, [self._token])
        try:
            replies = await round_.run()
        except (RedisError, OSError) as exc:  # the marks expire by themselves
            self._failopen.failed("release", exc)
            return
        failure = next((r for r in replies if isinstance(r, RedisError | OSError)), None)
        if failure is not None:
            self._failopen.failed("release", failure)

    async def _wait(self, keys: dict[int, str], until: dict[int, float]) -> set[int]:
        """Wait while other workers hold ``keys`` (by the caller's index),
        each no later than its ``until`` (``time.monotonic()``); the indexes
        whose mark is gone. The others ran out of time (or Redis failed)."""
        pending = dict(keys)
        gone: set[int] = set()
        while pending:
            now = time.monotonic()
            pending = {i: key for i, key in pending.items() if until[i] > now}
            if not pending or self._failopen.resting():
                break
            await asyncio.sleep(POLL_S)
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for key in pending.values():
                        pipe.exists(self._mark(key))
                    held = await pipe.execute()
            except (RedisError, OSError) as exc:
                self._failopen.failed("wait", exc)
                break
            for i, still in zip(list(pending), held, strict=True):
                if not still:
                    gone.add(i)
                    del pending[i]
        return gone
