"""Batched continuation of equal-length prompts with a KV cache: zoo building, not serving.

Prompts are cut to one token length so a batch needs no padding, no attention mask and no position
bookkeeping; the zoo chooses its prompts that way on purpose. Sampling draws from an explicit
generator, so on-policy distillation data is deterministic for the build's seed.
"""

from __future__ import annotations

import torch
from tqdm import tqdm
from transformers import DynamicCache, PreTrainedModel

ROLLOUT_BATCH = 16  # rows per forward pass; larger batches barely help on 2 cores


@torch.inference_mode()
def continue_batch(
    model: PreTrainedModel,
    prompts: torch.Tensor,  # [B, P] token ids, one length for all rows
    new_tokens: int,
    temperature: float,  # 0 = greedy
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Return [B, P + new_tokens]: each prompt followed by the model's continuation."""
    cache = DynamicCache(config=model.config)
    prompts = prompts.to(model.device)
    logits = model(input_ids=prompts, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    rows = [prompts]
    for _ in range(new_tokens):
        if temperature == 0:
            token = logits.argmax(-1, keepdim=True)  # [B, 1]
        else:
            probs = torch.softmax(logits.float() / temperature, dim=-1).cpu()  # the generator lives on the CPU
            token = torch.multinomial(probs, 1, generator=generator).to(model.device)  # [B, 1]
        rows.append(token)
        logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]
    return torch.cat(rows, dim=1).cpu()


def continue_all(
    model: PreTrainedModel,
    prompts: torch.Tensor,  # [N, P]
    new_tokens: int,
    temperature: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``continue_batch`` over any number of prompts, ROLLOUT_BATCH at a time: [N, P + new_tokens]."""
    batches = range(0, prompts.shape[0], ROLLOUT_BATCH)
    parts = [continue_batch(model, prompts[i : i + ROLLOUT_BATCH], new_tokens, temperature, generator)
             for i in tqdm(batches, desc="target continuations", unit="batch", leave=False, disable=None)]
    return torch.cat(parts)
