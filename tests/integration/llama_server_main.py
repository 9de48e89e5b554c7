"""``python tests/integration/llama_server_main.py ARGS``: ``llama_cpp.server``
with ARGS, its weights loaded without llama.cpp's extra CPU buffer types
where they crash (a CPU with AMX: ``workers.backends.llama_batch.
extra_buffers_work``). The server has no option for it, so the default model
parameters it starts from are wrapped before it starts."""

from __future__ import annotations

import runpy
from typing import Any

import llama_cpp.llama_cpp as bindings

from workers.backends.llama_batch import extra_buffers_work


def _without_extra_buffers(default: Any) -> Any:
    def params() -> Any:
        chosen = default()
        chosen.use_extra_bufts = False
        return chosen

    return params


if __name__ == "__main__":
    if not extra_buffers_work():
        bindings.llama_model_default_params = _without_extra_buffers(
            bindings.llama_model_default_params
        )
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
