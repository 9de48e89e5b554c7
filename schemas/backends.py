"""The one list of backend kinds: per kind, the class that implements it
(imported only when that kind is chosen: ``workers.backends.create_backend``),
where it runs (as the worker board announces it), and the
``BackendSettings`` field a registry entry's ``max_batch`` sets for it.

``BackendName`` is the type of a kind's name wherever one is configured
(``BackendSettings.light``/``heavy``, a registry entry's ``backend``); it is
checked against ``BACKEND_KINDS`` when this module loads, so a kind is
added here, in one place, or the import fails saying what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["BACKEND_KINDS", "BackendKind", "BackendName", "Device", "backend_kind"]

BackendName = Literal["llamacpp", "openai", "vllm", "rules"]
"""A backend kind's name, as configured (one of ``BACKEND_KINDS``)."""

Device = Literal["cpu", "cuda", "remote"]


@dataclass(frozen=True, slots=True)
class BackendKind:
    name: BackendName
    target: str
    """``module:Class`` of the backend, imported only when it is chosen."""
    device: Device
    """Where it runs: ``remote`` for a server reached over the network."""
    max_batch_field: str | None = None
    """The ``BackendSettings`` field a registry entry's ``max_batch`` sets
    (``None``: the backend sizes its batches itself)."""
    extra: str | None = None
    """The laneway extra that installs its library, when a plain install lacks it."""
    adapter: str | None = None
    """What a registry entry's LoRA ``adapter`` is for this kind (``None``:
    it takes none, and an entry that gives one is refused when the registry
    loads)."""


BACKEND_KINDS: dict[BackendName, BackendKind] = {
    kind.name: kind
    for kind in (
        BackendKind(
            "llamacpp",
            "workers.backends.llamacpp:LlamaCppBackend",
            "cpu",
            max_batch_field="llamacpp_max_sequences",
            adapter="a GGUF LoRA adapter (or a directory holding adapter.gguf), applied at load",
        ),
        BackendKind("openai", "workers.backends.openai:OpenAIBackend", "remote"),
        BackendKind(
            "vllm",
            "workers.backends.vllm:VLLMBackend",
            "cuda",
            max_batch_field="vllm_max_num_seqs",
            extra="gpu",
            adapter="a PEFT LoRA directory (or one holding peft/), served as a LoRARequest",
        ),
        BackendKind("rules", "workers.backends.rules:RulesBackend", "cpu"),
    )
}
"""Every backend kind laneway can load, by name."""


def backend_kind(name: str) -> BackendKind | None:
    """The kind called ``name``; ``None`` when laneway has none of that name."""
    for kind in BACKEND_KINDS.values():
        if kind.name == name:
            return kind
    return None


if set(get_args(BackendName)) != set(BACKEND_KINDS):
    raise ImportError(
        f"BackendName lists {sorted(get_args(BackendName))} "
        f"but BACKEND_KINDS has {sorted(BACKEND_KINDS)}: list each kind in both"
    )
