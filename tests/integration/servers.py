"""Real servers that integration tests start and stop themselves."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path as FsPath

from streams.embedded import wait_for_port
from workers.models import resolve_gguf


@contextlib.contextmanager
def llama_cpp_server(port: int, model: str = "smollm2-135m") -> Iterator[str]:
    """A real OpenAI-compatible server (llama_cpp.server) serving a wheel's
    GGUF model under the alias ``smollm2``; yields its base URL."""
    path = resolve_gguf(model, FsPath("."))
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(path)]
    command += ["--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--n_threads", "1"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, 60, proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)
