"""A trained adapter in the forms the lane workers load.

- ``adapter.gguf``: a GGUF LoRA adapter, which llama.cpp applies at load
  (``Llama(model_path=base, lora_path=adapter)``). Keys ``general.type``
  ``adapter``, ``adapter.type`` ``lora``, ``adapter.lora.alpha``; per adapted
  module ``blk.N.<name>.weight.lora_a`` (``r x in``) and ``.lora_b``
  (``out x r``) in float32, named as llama.cpp names the base's tensors.
  llama.cpp scales by ``alpha / r`` as peft does.
- ``peft/``: the PEFT adapter directory (``adapter_config.json``,
  ``adapter_model.safetensors``) for vLLM's ``LoRARequest``.

For llama models llama.cpp's converter permutes the rows of the ``q`` and
``k`` projections (the rotary halves interleaved) and transformers' GGUF
loader undoes it; an adapter of those modules gets its ``lora_b`` rows
permuted the same way, so it adds to the weights as llama.cpp stores them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from streams.distill.student.model import LightModel

__all__ = ["GGUF_NAMES", "adapter_tensors", "write_gguf_adapter", "write_peft_adapter"]

GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
"""transformers' module (under ``model.layers.N``) to llama.cpp's tensor name (under ``blk.N``)."""

_PARAM = re.compile(r"layers\.(\d+)\.(.+)\.lora_([AB])\.[^.]+\.weight$")


def _permute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's row permutation for q/k (``LlamaModel.permute``)."""
    return (
        rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def adapter_tensors(light: LightModel, peft_model: Any) -> dict[str, np.ndarray]:
    """The adapter's tensors under llama.cpp's names (float32, numpy layout)."""
    out: dict[str, np.ndarray] = {}
    for name, param in peft_model.named_parameters():
        found = _PARAM.search(name)
        if not found or "lora_" not in name:
            continue
        layer, module, which = found.groups()
        gguf_name = GGUF_NAMES.get(module)
        if gguf_name is None:
            raise ValueError(f"no llama.cpp tensor name for the adapted module {module!r}")
        value = param.detach().float().cpu().numpy().copy()
        if which == "B" and light.architecture == "llama" and gguf_name in ("attn_q", "attn_k"):
            value = _permute(value, light.n_head if gguf_name == "attn_q" else light.n_head_kv)
        out[f"blk.{layer}.{gguf_name}.weight.lora_{which.lower()}"] = value
    if not out:
        raise ValueError("the model has no LoRA weights to export")
    return out


def write_gguf_adapter(light: LightModel, peft_model: Any, alpha: float, path: Path) -> Path:
    """``path``: the adapter as llama.cpp's GGUF LoRA (see the module's docstring)."""
    import gguf

    tensors = adapter_tensors(light, peft_model)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), arch=light.architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    for name in sorted(tensors):
        writer.add_tensor(name, np.ascontiguousarray(tensors[name], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)
    return path


def write_peft_adapter(peft_model: Any, directory: Path) -> Path:
    """The PEFT adapter directory (vLLM's ``LoRARequest(name, id, directory)``).
    peft looks for the base's ``config.json`` to see whether the vocabulary
    grew; a GGUF base has none and the vocabulary is the GGUF's, so its
    warning about it is silenced."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Could not find a config file", category=UserWarning
        )
        peft_model.save_pretrained(str(directory))
    return directory
