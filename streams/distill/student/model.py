"""The light model as transformers sees it, and the prompt every side reads.

transformers loads a GGUF by dequantizing it (``from_pretrained(dir,
gguf_file=...)``, the ``gguf`` package reading the file), so the weights
trained against are the ones llama.cpp serves, to its quantization error.
The tokenizer, and its chat template, come from the same file.

``prompt_text`` is the chat template applied to one user message, after
the system prompt the lane workers add (``LANEWAY_BACKEND_SYSTEM_PROMPT``),
with the assistant's turn opened: the text the llama.cpp backend renders from the
same template, so training, the agreement check and serving read the same
prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LightModel", "device", "load_base", "prompt_text"]


@dataclass(slots=True)
class LightModel:
    model: Any
    """A ``transformers`` causal LM (float32)."""
    tokenizer: Any
    gguf: Path
    architecture: str
    """``general.architecture`` of the GGUF (``llama``)."""
    n_head: int
    n_head_kv: int
    system: str = ""
    """The system prompt the lane workers put before a request without one
    (``LANEWAY_BACKEND_SYSTEM_PROMPT``); empty: the template's own default."""

    @property
    def end_text(self) -> str:
        """What the chat template puts after an assistant's answer (``<|im_end|>``),
        trailing whitespace dropped: the training target ends with it. (The GGUF's
        ``eos_token`` need not be it: SmolLM2's names ``<|im_start|>``.)"""
        marker = "\x00ANSWER\x00"
        text = str(
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": "?"}, {"role": "assistant", "content": marker}],
                tokenize=False,
            )
        )
        return text.split(marker, 1)[1].rstrip() if marker in text else ""


def device() -> str:
    """``cuda`` where torch sees a GPU, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _metadata(path: Path) -> dict[str, Any]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out: dict[str, Any] = {}
    for key in ("general.architecture",):
        field = reader.get_field(key)
        if field is not None:
            out[key] = field.contents()
    arch = out.get("general.architecture", "")
    for key in (f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"):
        field = reader.get_field(key)
        if field is not None:
            out[key] = field.contents()
    return out


def load_base(gguf: Path, system: str = "") -> LightModel:
    """The GGUF's model and tokenizer in transformers, on ``device()``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = _metadata(gguf)
    arch = str(meta.get("general.architecture", ""))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    model.to(device())  # type: ignore[arg-type]
    n_head = int(meta.get(f"{arch}.attention.head_count", 0))
    return LightModel(
        model=model,
        tokenizer=tokenizer,
        gguf=gguf,
        architecture=arch,
        n_head=n_head,
        n_head_kv=int(meta.get(f"{arch}.attention.head_count_kv", n_head)),
        system=system,
    )


def prompt_text(tokenizer: Any, prompt: str, system: str = "") -> str:
    """One user message (after ``system``, when given) in the model's chat
    template, the assistant's turn opened: what a lane worker renders."""
    messages = [{"role": "system", "content": system}] if system else []
    text = tokenizer.apply_chat_template(
        [*messages, {"role": "user", "content": prompt}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return str(text)
