"""``laneway distill student``: the light model fine-tuned on the heavy model's answers.

- ``data``: training pairs (prompt, the teacher's answer) from the fine-tune
  set or straight from export rows, with badly rated and failed answers
  left out, and a seeded held-out share of prompts.
- ``model``: the light model loaded by transformers from the wheel's GGUF,
  and the prompt both transformers and llama.cpp read.
- ``lora``: LoRA training with peft, CPU by default, CUDA where torch sees it.
- ``export``: the adapter as a GGUF LoRA file llama.cpp applies at load, and
  as a PEFT directory (vLLM's ``LoRARequest``).
- ``agreement``: base and student answers by llama.cpp on the held-out
  prompts, their agreement with the teacher (``labels.agreement_scores``,
  the measure ``train`` labels with) and their tokens/s.
- ``provenance``: ``student.json``, written beside ``adapter.gguf``.
- ``pipeline``: the whole run, with its rails (a floor of rows; a student
  no better than its base is written but not offered).

Nothing is imported here: torch, transformers and peft load only when a
student is trained.
"""
