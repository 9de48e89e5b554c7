"""One llama.cpp context decoding many sequences together, with continuous
batching.

The context holds ``max_sequences`` sequences (seq ids), each with a KV
cache of its own: with ``kv_unified=False`` this llama.cpp splits the
context's cells evenly between the sequences, so the context is sized
``n_ctx * max_sequences`` and every sequence gets ``n_ctx``. One thread owns
every llama.cpp call: it loads the model, tokenizes, and runs ONE
``llama_decode`` per step for all sequences in flight: a token of each
generating sequence, and the prompt chunks of newly admitted ones in what is
left of ``n_batch``.

A greedy SmolLM2 answer does not depend on what it was batched with (32 of
32 bench prompts alike at batch 8 and 16); a Gemma-3 answer mostly does not
(24-28 of 32: its logits still move a little with the other sequences in a
step). That took two choices, each measured here: separate KV caches (in a
unified one a sequence's logits moved with the cells its neighbours filled)
and weights loaded without llama.cpp's repacking (its Q4_K kernels compute
rows 4 at a time, so a row's result depended on the step's size).

llama.cpp computes each run of consecutive seq ids in a step as a ubatch of
its own, so the sequences in flight are kept on ids 0..n-1: a new one takes
the lowest free id, the highest moves into an id freed below it (its KV
cache copied whole), and the batch is laid out in id order (with holes, 4
sequences on ids 0, 2, 4, 6 cost Gemma as much CPU as 8 on 0..7).

Prompts that begin alike (the system prompt every request carries, a
conversation's earlier turns) share that beginning's KV cache: the decoder
keeps the longest common start of two consecutive prompts (at least
``MIN_SHARED_PREFIX`` tokens by default) on a sequence id of its own, one past the
last, copied from the sequence that decoded it; a new sequence whose prompt
starts the same way gets that KV cache copied into its own, and decodes only
the rest. Every sequence that uses it reads the same cached values, so the
batch-invariance above holds with it (greedy answers still do not depend on
the batch-mates); what the first prompt computed alone may differ from them
in the last bits, like any other change of step shape.

Callers ``submit`` sequences from any thread and get a future per sequence.
Between steps the thread admits waiting sequences, oldest first, while a
sequence slot is free and the prompt + ``max_tokens`` of the sequences in
flight stays within ``max_batch_tokens``; so a request that arrives while a
long batch runs starts at the next step, and a short one finishes first.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import llama_cpp
import numpy as np
from llama_cpp import Llama
from llama_cpp._utils import suppress_stdout_stderr

from schemas.errors import (
    BackendUnavailable,
    DeadlineExceeded,
    InvalidRequest,
    LanewayError,
    OutOfMemory,
)
from workers.backends.base import COMMON_ERRORS, ErrorMap, map_backend_exception
from workers.backends.sampling import Sampler, StopScanner

__all__ = [
    "LLAMA_CPP_ERRORS",
    "MIN_SHARED_PREFIX",
    "BatchDecoder",
    "Decoded",
    "Result",
    "SequenceRequest",
    "admit_count",
    "common_prefix",
    "extra_buffers_work",
    "plan_step",
]

LLAMA_CPP_ERRORS: ErrorMap = {
    **COMMON_ERRORS,
    RuntimeError: BackendUnavailable,  # llama_decode or a context failing
    ValueError: BackendUnavailable,  # a model file llama.cpp cannot read
}
"""llama-cpp-python's errors: it has no classes of its own, and a failed
allocation in its C code is a failed decode (``RuntimeError``), not a
``MemoryError``."""

log = logging.getLogger(__name__)

CUT_OFF = "generation was cut off at the request's deadline"

MIN_SHARED_PREFIX = 8
"""Fewest tokens worth sharing: with separate KV caches a copy moves a
sequence's whole cache (tens of MB), which costs about what decoding a few
prompt tokens does."""


@dataclass(frozen=True, slots=True)
class SequenceRequest:
    prompt: str
    """Text to tokenize, special tokens parsed (a rendered chat template)."""
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0
    stops: tuple[str, ...] = ()
    top_p: float = 1.0
    """Nucleus sampling at ``temperature > 0`` (1: every token may be drawn)."""
    deadline: float | None = None
    """On the ``time.monotonic()`` clock; ``None`` = none."""
    on_piece: Callable[[bytes], None] | None = field(default=None, compare=False)
    """Called on the decode thread after each step with the answer's bytes
    that no stop string can take back any more, and with the rest when the
    sequence ends, before its future resolves: the pieces join into the
    answer's text (``None``: not streamed). It must be quick and must not
    raise: hand the bytes to another thread."""


@dataclass(frozen=True, slots=True)
class Decoded:
    text: str
    """Generated text up to the first stop string; end-of-generation tokens excluded."""
    prompt_tokens: int
    completion_tokens: int
    finish: Literal["stop", "length", "eog"]


Result = Decoded | LanewayError


def extra_buffers_work() -> bool:
    """Whether llama.cpp's extra CPU buffer types can be used. On a CPU with
    AMX (Intel Sapphire Rapids and later) they include the AMX one, and the
    first decode of llama-cpp-python 0.3.36 with Gemma-3 or SmolLM2 weights
    there segfaults in ``ggml_backend_amx_mul_mat`` (seen under gdb on a
    Xeon with AMX_INT8; llama.cpp issue 20824 reports a crash there too)."""
    return b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info()


def admit_count(costs: Sequence[int], free_slots: int, in_use: int, budget: int) -> int:
    """How many of the waiting sequences (their prompt + ``max_tokens``,
    oldest first) start now: strictly in order, so a large one is never
    overtaken for ever by small ones behind it."""
    n = 0
    for cost in costs:
        if n == free_slots or in_use + cost > budget:
            break
        in_use += cost
        n += 1
    return n


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` begin with alike."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def plan_step(todo: Sequence[int], n_batch: int) -> list[int]:
    """Tokens each sequence feeds into the next decode, given how many it
    has to feed (1 for a generating sequence, its prompt for a new one):
    one each first, so generation never waits for a long prompt, then
    prompt chunks, oldest sequence first, up to ``n_batch`` in all."""
    counts = [min(1, n) for n in todo]
    room = n_batch - sum(counts)
    for i, n in enumerate(todo):
        extra = max(0, min(n - counts[i], room))
        counts[i] += extra
        room -= extra
    return counts


@dataclass(eq=False, slots=True)
class _Sequence:
    request: SequenceRequest
    future: concurrent.futures.Future[Result]
    prompt: list[int] = field(default_factory=list)
    todo: list[int] = field(default_factory=list)
    """Tokens not yet decoded: the rest of the prompt, or the last sampled one."""
    slot: int = -1
    n_past: int = 0
    completion: int = 0
    sampler: Sampler | None = None
    scanner: StopScanner | None = None
    max_tokens: int = 0
    """The request's ``max_tokens``, shortened to the room its prompt leaves."""
    donate: int = 0
    """Prompt tokens this sequence leaves as the shared prefix once decoded."""

    @property
    def cost(self) -> int:
        return len(self.prompt) + self.max_tokens


def _resolve(future: concurrent.futures.Future[Result], result: Result) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_result(result)  # unless its caller cancelled it meanwhile


class BatchDecoder:
    """See the module docstring. ``start()`` loads; ``close()`` fails what is
    still queued or running with INF-502 and frees the context."""

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int,
        max_sequences: int,
        max_batch_tokens: int,
        n_threads: int,
        repeat_penalty: float,
        n_batch: int = 512,
        batch_invariant: bool = True,
        min_shared_prefix: int | None = MIN_SHARED_PREFIX,
        adapter: str | None = None,
    ) -> None:
        """``batch_invariant``: separate KV caches and no repacked kernels,
        so a greedy answer does not depend on its batch-mates (see above);
        ``False``: one unified KV cache and llama.cpp's repacked kernels,
        faster at batch, answers that may move with the batch.
        ``min_shared_prefix``: fewest tokens a shared prefix holds (``None``:
        prompts share nothing). ``adapter``: a GGUF LoRA adapter of the
        model, applied (at scale 1) to every sequence of the context; one
        llama.cpp cannot load fails ``start()`` with INF-502 naming it."""
        self.model_path = model_path
        self.adapter_path = adapter
        self.batch_invariant = batch_invariant
        self.repacked = not batch_invariant and extra_buffers_work()
        """Weights loaded into llama.cpp's extra CPU buffer types (repacked kernels)."""
        if not batch_invariant and not self.repacked:
            log.warning(
                "llama.cpp's extra CPU buffers include AMX on this CPU, and its AMX "
                "kernels crash on these models: %s keeps the unified KV cache but "
                "not the repacked kernels",
                model_path,
            )
        self.max_sequences = max_sequences
        self.max_batch_tokens = max_batch_tokens
        self._n_ctx = n_ctx
        self._n_batch = max(n_batch, max_sequences)
        self._n_threads = n_threads
        self._repeat_penalty = repeat_penalty
        self.metadata: dict[str, str] = {}
        self.bos_text = ""
        self.eos_text = ""
        self.n_ctx_seq = n_ctx
        """Longest prompt + ``max_tokens`` of one sequence (llama.cpp may pad it)."""
        self._cv = threading.Condition()
        self._inbox: list[_Sequence] = []
        self._closing = False
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name="llama-batch", daemon=True)
        # Owned by the decode thread:
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []
        self._free_slots: list[int] = []
        self._pieces: dict[int, bytes] = {}
        self.peak_sequences = 0
        """Most sequences that were ever decoded together (for tests and the bench)."""
        self.moved_sequences = 0
        """Sequences moved to a lower seq id (``_compact``)."""
        self.shared_tokens = 0
        """Prompt tokens not decoded because a shared prefix held them."""
        self._prefix: list[int] = []
        """The tokens whose KV cache the prefix sequence id holds."""
        self._last_prompt: list[int] = []
        self._prefix_id = max_sequences
        """The seq id that keeps the shared prefix: one past the sequences'."""
        self._min_shared = min_shared_prefix
        self._llama: Any = None
        self._model: Any = None
        self._adapter: Any = None
        self._ctx: Any = None
        self._mem: Any = None
        self._vocab: Any = None
        self._batch: Any = None
        self._n_vocab = 0
        self._add_bos = False

    # -- any thread ---------------------------------------------------------

    def start(self) -> concurrent.futures.Future[None]:
        """Starts the decode thread; the future resolves once the model is loaded."""
        self._thread.start()
        return self._ready

    @property
    def alive(self) -> bool:
        return self._ready.done() and self._ready.exception() is None and self._thread.is_alive()

    def submit(
        self, requests: Sequence[SequenceRequest]
    ) -> list[concurrent.futures.Future[Result]]:
        sequences = [_Sequence(r, concurrent.futures.Future()) for r in requests]
        with self._cv:
            if self._closing or not self._thread.is_alive():
                for seq in sequences:
                    _resolve(seq.future, BackendUnavailable("the llama.cpp decoder is closed"))
            else:
                self._inbox.extend(sequences)
                self._cv.notify()
        return [seq.future for seq in sequences]

    def close(self, timeout_s: float = 30.0) -> None:
        """Blocking: call it off the event loop."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- the decode thread --------------------------------------------------

    def _run(self) -> None:
        try:
            self._open()
        except BaseException as exc:
            self._free()
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        error: LanewayError = BackendUnavailable("the llama.cpp decoder closed before it finished")
        try:
            self._loop()
        except BaseException as exc:  # a llama.cpp failure: everything in flight gets it
            log.exception("llama.cpp decode thread failed")
            error = map_backend_exception(exc, LLAMA_CPP_ERRORS)
        finally:
            with self._cv:
                self._closing = True
                pending, self._inbox = self._inbox, []
            for seq in [*pending, *self._waiting, *self._active]:
                _resolve(seq.future, error)
            self._waiting.clear()
            self._active.clear()
            self._free()

    def _open(self) -> None:
        # The high-level Llama, vocabulary only, tokenizes and reads the
        # metadata; the weights are loaded here, without repacking (above).
        with suppress_stdout_stderr(disable=False):  # llama.cpp's load report
            self._llama = Llama(model_path=self.model_path, vocab_only=True, verbose=False)
            model_params = llama_cpp.llama_model_default_params()
            model_params.n_gpu_layers = 0
            model_params.use_extra_bufts = self.repacked
            self._model = llama_cpp.llama_model_load_from_file(
                self.model_path.encode(), model_params
            )
        if not self._model:
            raise BackendUnavailable(f"llama.cpp could not load {self.model_path}")
        model = self._model
        self.metadata = dict(self._llama.metadata)
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        bos, eos = self._llama.token_bos(), self._llama.token_eos()
        self.bos_text = self._piece(bos, special=True).decode(errors="ignore") if bos >= 0 else ""
        self.eos_text = self._piece(eos, special=True).decode(errors="ignore") if eos >= 0 else ""
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self._n_ctx * (self.max_sequences + 1)  # and the shared prefix
        params.n_seq_max = self.max_sequences + 1
        params.kv_unified = not self.batch_invariant
        params.n_batch = params.n_ubatch = self._n_batch
        params.n_threads = params.n_threads_batch = self._n_threads
        with suppress_stdout_stderr(disable=False):  # llama.cpp's load report
            self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not self._ctx:
            raise BackendUnavailable(f"llama.cpp could not create a context for {self.model_path}")
        if self.adapter_path is not None:
            self._apply_adapter(self.adapter_path)
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(self._ctx)
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self._free_slots = list(range(self.max_sequences))

    def _apply_adapter(self, path: str) -> None:
        """Load the LoRA adapter at ``path`` onto the model and set it on the
        context. llama.cpp says why a file is refused (wrong architecture or
        shapes, not an adapter) only in its log, which is printed here."""
        with suppress_stdout_stderr(disable=False):
            self._adapter = llama_cpp.llama_adapter_lora_init(self._model, path.encode())
        if not self._adapter:
            self._adapter = None
            raise BackendUnavailable(
                f"llama.cpp could not load the LoRA adapter {path} onto {self.model_path} "
                "(not a GGUF LoRA adapter of this model: its log above says why)"
            )
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self._adapter)
        scales = (ctypes.c_float * 1)(1.0)
        if llama_cpp.llama_set_adapters_lora(self._ctx, adapters, 1, scales) != 0:
            raise BackendUnavailable(
                f"llama.cpp could not apply the LoRA adapter {path} to {self.model_path}"
            )

    def _free(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._adapter is not None:
            llama_cpp.llama_adapter_lora_free(self._adapter)
            self._adapter = None
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None
        if self._llama is not None:
            self._llama.close()
            self._llama = None

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._closing or self._inbox or self._waiting or self._active):
                    self._cv.wait()
                if self._closing:
                    return
                arrived, self._inbox = self._inbox, []
            for seq in arrived:
                self._intake(seq)
            self._expire()
            self._admit()
            if self._active:
                self._step()

    def _intake(self, seq: _Sequence) -> None:
        """Tokenize, and refuse what can never fit."""
        request = seq.request
        text = request.prompt.encode()
        add_bos = self._add_bos and not (self.bos_text and request.prompt.startswith(self.bos_text))
        try:
            seq.prompt = self._llama.tokenize(text, add_bos=add_bos, special=True)
        except Exception as exc:
            _resolve(seq.future, InvalidRequest(f"the prompt cannot be tokenized: {exc}"))
            return
        limit = min(self.n_ctx_seq, self.max_batch_tokens)
        # A generous max_tokens is shortened to the room the prompt leaves, as
        # llama.cpp's own server does; only a prompt that leaves none is refused.
        seq.max_tokens = min(request.max_tokens, limit - len(seq.prompt))
        if not seq.prompt or seq.max_tokens < 1:
            which = (
                f"the context of {self.n_ctx_seq} tokens per sequence (LANEWAY_BACKEND_N_CTX)"
                if limit == self.n_ctx_seq
                else f"the batch budget of {limit} tokens "
                "(LANEWAY_BACKEND_LLAMACPP_MAX_BATCH_TOKENS)"
            )
            _resolve(
                seq.future,
                InvalidRequest(
                    f"the prompt is {len(seq.prompt)} tokens: it leaves no room to answer "
                    f"in {which}"
                ),
            )
            return
        seq.todo = list(seq.prompt)
        seq.sampler = Sampler(
            request.temperature, request.seed, self._repeat_penalty, request.top_p
        )
        seq.scanner = StopScanner(request.stops)
        self._waiting.append(seq)

    def _expire(self) -> None:
        """Drop what no one waits for any more, and end what is past its deadline."""
        now = time.monotonic()
        for seq in list(self._waiting):
            deadline = seq.request.deadline
            if seq.future.cancelled():
                self._waiting.remove(seq)
            elif deadline is not None and now > deadline:
                self._waiting.remove(seq)
                late_ms = (now - deadline) * 1000
                _resolve(
                    seq.future,
                    DeadlineExceeded(f"deadline passed {late_ms:.0f} ms before generation started"),
                )
        for seq in list(self._active):
            deadline = seq.request.deadline
            if seq.future.cancelled():
                self._release(seq)
            elif deadline is not None and now > deadline:
                self._finish(seq, DeadlineExceeded(CUT_OFF))

    def _admit(self) -> None:
        in_use = sum(seq.cost for seq in self._active)
        costs = [seq.cost for seq in self._waiting]
        for _ in range(admit_count(costs, len(self._free_slots), in_use, self.max_batch_tokens)):
            seq = self._waiting.popleft()
            seq.slot = min(self._free_slots)
            self._free_slots.remove(seq.slot)
            self._start_from_prefix(seq)
            self._active.append(seq)
        self.peak_sequences = max(self.peak_sequences, len(self._active))

    def _start_from_prefix(self, seq: _Sequence) -> None:
        """Give ``seq`` the shared prefix's KV cache when its prompt begins
        with enough of it; else, when it begins like the prompt before it,
        have it leave that beginning as the new shared prefix."""
        least = self._min_shared
        if least is None:
            return
        last = len(seq.prompt) - 1  # the last prompt token is decoded: its logits
        shared = min(common_prefix(seq.prompt, self._prefix), last)
        if shared >= least:
            llama_cpp.llama_memory_seq_cp(self._mem, self._prefix_id, seq.slot, -1, -1)
            llama_cpp.llama_memory_seq_rm(self._mem, seq.slot, shared, -1)
            seq.n_past = shared
            del seq.todo[:shared]
            self.shared_tokens += shared
        elif not any(other.donate for other in self._active):  # one donor at a time
            alike = min(common_prefix(seq.prompt, self._last_prompt), last)
            seq.donate = alike if alike >= least else 0
        self._last_prompt = seq.prompt

    def _keep_prefix(self, seq: _Sequence) -> None:
        """``seq`` decoded its prompt: its first ``donate`` tokens become the
        shared prefix."""
        prefix = self._prefix_id
        llama_cpp.llama_memory_seq_rm(self._mem, prefix, -1, -1)
        llama_cpp.llama_memory_seq_cp(self._mem, seq.slot, prefix, -1, -1)
        llama_cpp.llama_memory_seq_rm(self._mem, prefix, seq.donate, -1)
        self._prefix = seq.prompt[: seq.donate]
        seq.donate = 0

    def _compact(self) -> None:
        """Keep the sequences in flight on seq ids 0..n-1 (llama.cpp computes
        each run of consecutive ids as a ubatch of its own): the highest moves
        into the lowest free id, its KV cache copied whole."""
        while self._active and self._free_slots:
            top = max(self._active, key=lambda q: q.slot)
            hole = min(self._free_slots)
            if hole > top.slot:
                return
            llama_cpp.llama_memory_seq_cp(self._mem, top.slot, hole, -1, -1)
            llama_cpp.llama_memory_seq_rm(self._mem, top.slot, -1, -1)
            self._free_slots.remove(hole)
            self._free_slots.append(top.slot)
            top.slot = hole
            self.moved_sequences += 1

    def _step(self) -> None:
        self._compact()
        batch = self._batch
        planned = plan_step([len(seq.todo) for seq in self._active], self._n_batch)
        counts = dict(zip(self._active, planned, strict=True))
        outputs: list[tuple[_Sequence, int]] = []
        n = 0
        for seq in sorted(self._active, key=lambda q: q.slot):  # runs of consecutive seq ids
            count = counts[seq]
            for j in range(count):
                batch.token[n] = seq.todo[j]
                batch.pos[n] = seq.n_past + j
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq.slot
                batch.logits[n] = 0
                n += 1
            if count and count == len(seq.todo):
                batch.logits[n - 1] = 1
                outputs.append((seq, n - 1))
            seq.n_past += count
            del seq.todo[:count]
        batch.n_tokens = n
        rc = llama_cpp.llama_decode(self._ctx, batch)
        if rc != 0:
            error: LanewayError = (
                OutOfMemory("llama.cpp found no KV cache slot for the batch")
                if rc == 1
                else BackendUnavailable(f"llama_decode failed with {rc}")
            )
            for seq in list(self._active):
                self._finish(seq, error)
            return
        for seq, i in outputs:
            if seq.donate:
                self._keep_prefix(seq)
            pointer = llama_cpp.llama_get_logits_ith(self._ctx, i)
            logits = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
            assert seq.sampler is not None
            self._advance(seq, seq.sampler.sample(logits))

    def _advance(self, seq: _Sequence, token: int) -> None:
        assert seq.sampler is not None and seq.scanner is not None
        if llama_cpp.llama_vocab_is_eog(self._vocab, token):
            on_piece = seq.request.on_piece
            piece = seq.scanner.take(last=True) if on_piece is not None else b""
            if on_piece is not None and piece:
                on_piece(piece)
            self._finish(seq, self._decoded(seq, "eog"))
            return
        seq.sampler.accept(token)
        seq.completion += 1
        stopped = seq.scanner.feed(self._piece(token))
        ended = stopped or seq.completion >= seq.max_tokens
        on_piece = seq.request.on_piece
        if on_piece is not None:
            piece = seq.scanner.take(last=ended)
            if piece:
                on_piece(piece)
        if stopped:
            self._finish(seq, self._decoded(seq, "stop"))
        elif ended:
            self._finish(seq, self._decoded(seq, "length"))
        else:
            seq.todo.append(token)

    def _decoded(self, seq: _Sequence, finish: Literal["stop", "length", "eog"]) -> Decoded:
        assert seq.scanner is not None
        return Decoded(seq.scanner.text(), len(seq.prompt), seq.completion, finish)

    def _finish(self, seq: _Sequence, result: Result) -> None:
        self._release(seq)
        _resolve(seq.future, result)

    def _release(self, seq: _Sequence) -> None:
        llama_cpp.llama_memory_seq_rm(self._mem, seq.slot, -1, -1)
        self._active.remove(seq)
        self._free_slots.append(seq.slot)

    def _piece(self, token: int, special: bool = False) -> bytes:
        key = token if not special else -1 - token
        piece = self._pieces.get(key)
        if piece is None:
            buffer = ctypes.create_string_buffer(256)
            size = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 256, 0, special)
            piece = buffer.raw[: max(size, 0)]
            self._pieces[key] = piece
        return piece
