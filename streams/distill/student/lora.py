"""LoRA training with peft: the light model learns the teacher's answers.

Each pair is the chat prompt (``model.prompt_text``) followed by the
teacher's answer and the end-of-turn token; the loss is the mean
cross-entropy of the answer's tokens only (the prompt's are masked). Plain
AdamW on the adapter's weights, a fixed learning rate after a short warm-up,
batches drawn in a seeded order that goes round the pairs. It runs where
the model is (``model.device``): CPU, or CUDA where torch sees one.

Only modules whose GGUF rows llama.cpp stores as transformers does are
adapted by default: ``v_proj``, ``o_proj`` and the MLP. For llama models
llama.cpp's converter permutes the rows of ``q_proj``/``k_proj`` (rotary
layout); ``export`` permutes their ``lora_b`` the same way when they are
asked for.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streams.distill.student.data import Pair
from streams.distill.student.model import LightModel, prompt_text

__all__ = ["DEFAULT_TARGETS", "LoraConfig", "Trained", "train_lora"]

DEFAULT_TARGETS = ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class LoraConfig:
    r: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = DEFAULT_TARGETS
    steps: int = 60
    lr: float = 1e-3
    batch_size: int = 8
    max_tokens: int = 256
    """A pair longer than this (prompt and answer, in tokens) is cut at its end."""
    seed: int = 0


@dataclass(slots=True)
class Trained:
    model: Any
    """The peft model (the base with the adapter in place)."""
    losses: list[float] = field(default_factory=list)
    """Training loss of each step."""

    @property
    def loss_first(self) -> float | None:
        return self.losses[0] if self.losses else None

    @property
    def loss_last(self) -> float | None:
        """The mean of the last five steps' losses (one batch is noisy)."""
        tail = self.losses[-5:]
        return sum(tail) / len(tail) if tail else None


def _encode(light: LightModel, pair: Pair, max_tokens: int) -> tuple[list[int], list[int]]:
    tokenizer = light.tokenizer
    prompt = tokenizer.encode(
        prompt_text(tokenizer, pair.prompt, light.system), add_special_tokens=False
    )
    answer = tokenizer.encode(pair.answer + light.end_text, add_special_tokens=False)
    ids = (prompt + answer)[:max_tokens]
    labels = ([-100] * len(prompt) + answer)[:max_tokens]
    return ids, labels


def train_lora(
    light: LightModel,
    pairs: Sequence[Pair],
    config: LoraConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> Trained:
    """Train a LoRA adapter on ``pairs``; ``on_step(step, loss)`` after each step."""
    import torch
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    if not pairs:
        raise ValueError("no pairs to train on")
    torch.manual_seed(config.seed)
    peft_config = PeftLoraConfig(
        r=config.r,
        lora_alpha=config.alpha,  # type: ignore[arg-type]  # peft takes a float
        target_modules=list(config.targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(light.model, peft_config)
    model.train()
    device = next(model.parameters()).device
    encoded = [_encode(light, pair, config.max_tokens) for pair in pairs]
    encoded = [(ids, labels) for ids, labels in encoded if any(t != -100 for t in labels)]
    if not encoded:
        raise ValueError(f"every pair's prompt fills the {config.max_tokens} tokens trained on")
    pad = light.tokenizer.pad_token_id
    pad = light.tokenizer.eos_token_id if pad is None else pad
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    warmup = max(1, config.steps // 10)
    order: list[int] = []
    rng = random.Random(config.seed)
    trained = Trained(model)
    for step in range(config.steps):
        batch: list[int] = []
        while len(batch) < min(config.batch_size, len(encoded)):
            if not order:
                order = list(range(len(encoded)))
                rng.shuffle(order)
            batch.append(order.pop())
        width = max(len(encoded[i][0]) for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            seq, lab = encoded[i]
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, : len(lab)] = torch.tensor(lab)
            mask[row, : len(seq)] = 1
        for group in optimiser.param_groups:
            group["lr"] = config.lr * min(1.0, (step + 1) / warmup)
        out = model(
            input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)
        )
        loss = out.loss
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        value = float(loss.detach().cpu())
        if not math.isfinite(value):
            raise ValueError(f"training loss became {value} at step {step + 1}: lower --lr")
        trained.losses.append(value)
        if on_step is not None:
            on_step(step + 1, value)
    model.eval()
    return trained
