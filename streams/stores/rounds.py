"""One pipelined Redis round trip shared by several helpers.

The batch classifier asks Redis for a whole batch at once: the rate-limit
scripts, the session reads, the exact cache entries and the cache version
go into one pipeline (``transaction=False``: no MULTI, one write and one
read on the socket). Each helper queues its commands and later reads its
own results by the index ``add``/``script`` returned.

On a Redis Cluster the pipeline goes to each node that holds one of its
keys, one round trip each, sent together; a script that takes several
keys is queued once per slot of them (``group_of``), and reads of several
keys as one command per key (redis-py's cluster pipelines refuse ``MGET``).

redis-py's pipelines check every registered script with ``SCRIPT EXISTS``
before they run, which is a second round trip per batch. ``Round`` sends
``EVALSHA`` instead and only when Redis answers ``NOSCRIPT`` (a restarted
or flushed Redis) loads the scripts and runs those commands again.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError

__all__ = ["Round"]


class Round:
    """Commands for one round trip; ``run`` gives each its result or error."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._cluster = isinstance(redis, RedisCluster)
        self._commands: list[tuple[str, tuple[Any, ...]]] = []
        self._scripts: dict[int, Any] = {}
        self.results: list[Any] = []

    def __len__(self) -> int:
        return len(self._commands)

    def add(self, command: str, *args: Any) -> int:
        """Queue ``pipe.<command>(*args)``; returns the index of its result."""
        self._commands.append((command, args))
        return len(self._commands) - 1

    @property
    def cluster(self) -> bool:
        """Whether the round goes to a Redis Cluster (one pipeline per node)."""
        return self._cluster

    def group_of(self, key: str) -> int:
        """Which keys one command may take together: on a cluster client,
        those of one slot (the slot of ``key``); on one Redis, all (0)."""
        return key_slot(key.encode()) if self._cluster else 0

    def script(self, script: Any, keys: list[Any], args: list[Any]) -> int:
        """Queue a registered script (``redis.register_script``) as EVALSHA."""
        index = self.add("evalsha", script.sha, len(keys), *keys, *args)
        self._scripts[index] = script
        return index

    async def run(self) -> list[Any]:
        """Send everything; each result is the reply or the exception Redis
        returned for that command. A connection or timeout error fails the
        whole round and is raised."""
        if not self._commands:
            self.results = []
            return self.results
        results = await self._execute(range(len(self._commands)))
        missing = [i for i in self._scripts if isinstance(results[i], NoScriptError)]
        if missing:
            for script in {id(self._scripts[i]): self._scripts[i] for i in missing}.values():
                script.sha = await self._redis.script_load(script.script)
            for i in missing:  # the new sha (the same unless the script text changed)
                command, args = self._commands[i]
                self._commands[i] = (command, (self._scripts[i].sha, *args[1:]))
            again = await self._execute(missing)
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        self.results = results
        return results

    async def _execute(self, indices: Any) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for i in indices:
            command, args = self._commands[i]
            getattr(pipe, command)(*args)
        return list(await pipe.execute(raise_on_error=False))
