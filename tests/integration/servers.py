"""Real servers that integration tests start and stop themselves."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from streams.devstack.embedded import wait_for_port
from workers.models import resolve_gguf


@contextlib.contextmanager
def llama_cpp_server(port: int, model: str = "smollm2-135m") -> Iterator[str]:
    """A real OpenAI-compatible server (llama_cpp.server, started by
    ``llama_server_main.py`` so that it runs on a CPU with AMX too) serving a
    wheel's GGUF model under the alias ``smollm2``; yields its base URL."""
    path = resolve_gguf(model, Path("."))
    launcher = Path(__file__).with_name("llama_server_main.py")
    command = [sys.executable, str(launcher), "--model", str(path)]
    command += ["--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--n_threads", "1"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, 60, proc)
        base_url = f"http://127.0.0.1:{port}/v1"
        _warm(base_url)
        yield base_url
    finally:
        proc.terminate()
        proc.wait(10)


def _warm(base_url: str) -> None:
    """One completion before the server is handed out: the first one pays
    for warming the model, and a test measuring latency should not see it."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


class LocalHttpServer:
    """A real HTTP server on a free local port, serving ``handler`` from a
    thread of its own until ``close``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
