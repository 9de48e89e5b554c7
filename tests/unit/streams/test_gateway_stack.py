"""``laneway up``'s gateway child: declared only when asked for, on the
port after the batch tracker's, with its API port in its environment."""

from __future__ import annotations

from schemas.settings import Settings
from streams.devstack.supervisor import Stack


def test_the_stack_declares_a_gateway_child_only_when_asked() -> None:
    settings = Settings()
    plain = Stack(settings, use_external_redis=True, http_port_base=9400)
    assert "gateway" not in [c.name for c in plain.children] and plain.gateway_port is None

    stack = Stack(settings, use_external_redis=True, http_port_base=9400, gateway_port=8123)
    gateway = stack.child("gateway")
    assert (gateway.args, gateway.http_port, stack.gateway_port) == (["gateway"], 9406, 8123)
    env = stack._env(gateway)
    assert env["LANEWAY_GATEWAY_PORT"] == "8123" and env["LANEWAY_HTTP_PORT"] == "9406"
    assert stack._env(stack.child("classifier")).get("LANEWAY_GATEWAY_PORT") != "8123"

    free = Stack(settings, use_external_redis=True, http_port_base=None, gateway_port=0)
    assert free.gateway_port and free.gateway_port > 0
    workers = Stack(settings, use_external_redis=True, workers_only=True, gateway_port=8123)
    assert all(c.name.startswith("worker-") for c in workers.children)
