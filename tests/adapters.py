"""A real GGUF LoRA adapter for the tests, written with the ``gguf`` package:
``general.type`` "adapter", ``adapter.type`` "lora", ``adapter.lora.alpha``,
and a ``.lora_a``/``.lora_b`` pair per target tensor of a base model, shaped
as llama.cpp checks them (``llama-adapter.cpp``): for a weight of ggml shape
``(n_in, n_out)``, A is ``(n_in, r)`` and B is ``(r, n_out)`` (numpy: the
reverse). The shapes are read from the base model's GGUF, so the adapter
fits the wheel's SmolLM2-135M whatever its dimensions.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

__all__ = ["write_lora_adapter"]


def write_lora_adapter(
    path: Path,
    base: Path,
    *,
    targets: tuple[str, ...] = ("attn_q", "attn_v"),
    rank: int = 4,
    scale: float = 0.01,
    seed: int = 0,
    layers: int | None = None,
    arch: str | None = None,
) -> Path:
    """A LoRA adapter of ``base`` (a GGUF model) at ``path``: for each
    ``blk.N.<target>.weight`` (the first ``layers`` blocks, else all), A and
    B drawn uniformly from ``[-scale, scale]`` (never zero), alpha = rank.
    ``arch``: the architecture the adapter says it is for (default: the
    base model's; another one makes an adapter llama.cpp refuses)."""
    reader = gguf.GGUFReader(base)
    arch = arch or bytes(reader.fields["general.architecture"].parts[-1]).decode()
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    blocks = sorted({int(name.split(".")[1]) for name in shapes if name.startswith("blk.")})
    for block in blocks[:layers]:
        for target in targets:
            n_in, n_out = shapes[f"blk.{block}.{target}.weight"][:2]
            name = f"blk.{block}.{target}.weight"
            a = rng.uniform(scale / 2, scale, (rank, n_in)) * rng.choice([-1, 1], (rank, n_in))
            b = rng.uniform(scale / 2, scale, (n_out, rank)) * rng.choice([-1, 1], (n_out, rank))
            writer.add_tensor(f"{name}.lora_a", a.astype(np.float32))
            writer.add_tensor(f"{name}.lora_b", b.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
