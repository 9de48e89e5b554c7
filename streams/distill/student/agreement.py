"""Base against student on the held-out prompts, answered by llama.cpp.

Each model answers every held-out prompt greedily (the highest logit each
step, no repeat penalty: one answer per prompt, whatever the sampler
settings of a lane) with the same context, threads and token limit, the
student being the same GGUF with the adapter applied at load. Agreement
with the teacher is ``labels.agreement_scores`` at ``agree_at``, the
measure ``laneway distill train`` labels rows with; tokens/s is generated
tokens over the time spent generating them (prompt evaluation included).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streams.distill.labels import agreement_scores

__all__ = ["Answers", "agreement", "greedy_answers"]


@dataclass(frozen=True, slots=True)
class Answers:
    texts: list[str]
    tokens: list[list[int]]
    seconds: float

    @property
    def tokens_per_s(self) -> float | None:
        n = sum(len(t) for t in self.tokens)
        return n / self.seconds if self.seconds > 0 and n else None


def greedy_answers(
    gguf: Path,
    prompts: Sequence[str],
    *,
    adapter: Path | None = None,
    max_tokens: int = 64,
    n_ctx: int = 1024,
    n_threads: int | None = None,
) -> Answers:
    """llama.cpp's greedy answer to each rendered prompt (``model.prompt_text``)."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(gguf),
        lora_path=str(adapter) if adapter is not None else None,
        n_ctx=n_ctx,
        n_threads=n_threads,
        verbose=False,
    )
    try:
        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        n_vocab = llm.n_vocab()
        texts: list[str] = []
        tokens: list[list[int]] = []
        spent = 0.0
        for prompt in prompts:
            started = time.perf_counter()
            llm.reset()
            llm.eval(llm.tokenize(prompt.encode(), add_bos=False, special=True))
            out: list[int] = []
            while len(out) < max_tokens and llm.n_tokens < n_ctx:
                logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
                token = int(np.argmax(np.ctypeslib.as_array(logits, shape=(n_vocab,))))
                if llama_cpp.llama_vocab_is_eog(vocab, token):
                    break
                out.append(token)
                llm.eval([token])
            spent += time.perf_counter() - started
            tokens.append(out)
            texts.append(llm.detokenize(out).decode("utf-8", errors="replace").strip())
        return Answers(texts, tokens, spent)
    finally:
        llm.close()


def agreement(
    answers: Sequence[str],
    teacher: Sequence[str],
    embed: Callable[[list[str]], np.ndarray] | None,
    agree_at: float,
) -> float | None:
    """Share of answers that agree with the teacher's (prompts with no verdict left out)."""
    scores = agreement_scores(list(zip(answers, teacher, strict=True)), embed)
    judged = scores[~np.isnan(scores)]
    return float(np.mean(judged >= agree_at)) if len(judged) else None
