"""Held-out evaluation of a zoo: the target's perplexity, and greedy acceptance of every draft.

Greedy acceptance is measured without running speculative decoding: the target continues each
held-out prompt greedily once, then every draft scores that continuation in one teacher-forced pass.
A draft token is accepted exactly when the draft's argmax equals the target's token at that
position, so the fraction of matching positions is the greedy acceptance rate alpha.
"""

from __future__ import annotations

import math

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .training import fixed_length_prompts

EVAL_PROMPT_TOKENS = 32  # BOS + the first 31 tokens of a held-out document
PERPLEXITY_WINDOWS = 32  # held-out windows per task
SCORE_BATCH = 16  # sequences per teacher-forced pass


@torch.inference_mode()
def perplexity(model: PreTrainedModel, stream: torch.Tensor, seq_len: int) -> float:
    """exp(mean next-token loss) over consecutive windows from the start of ``stream``."""
    usable = min(PERPLEXITY_WINDOWS, stream.numel() // seq_len)
    if usable == 0:
        raise ValueError(f"held-out stream of {stream.numel()} tokens is shorter than one window ({seq_len})")
    windows = stream[: usable * seq_len].view(usable, seq_len)
    losses = [model(input_ids=w, labels=w).loss for w in windows.split(SCORE_BATCH)]
    return math.exp(float(torch.stack(losses).mean()))


def eval_prompts(tokenizer: PreTrainedTokenizerBase, documents: list[str], count: int) -> torch.Tensor:
    """The first ``count`` held-out documents long enough, cut to EVAL_PROMPT_TOKENS: [n, P]."""
    return fixed_length_prompts(tokenizer, documents, count, EVAL_PROMPT_TOKENS)


@torch.inference_mode()
def greedy_acceptance(draft: PreTrainedModel, references: torch.Tensor, eos_token_id: int) -> float:
    """Fraction of the target's greedy continuation positions where the draft's argmax agrees.

    references: [n, P + L], prompts of EVAL_PROMPT_TOKENS followed by the target's greedy tokens.
    Positions after a continuation's first EOS are not counted (decoding would have stopped).
    """
    matches = counted = 0
    for rows in references.split(SCORE_BATCH):
        predicted = draft(input_ids=rows).logits[:, EVAL_PROMPT_TOKENS - 1 : -1].argmax(-1)  # [b, L]
        actual = rows[:, EVAL_PROMPT_TOKENS:]  # [b, L]
        is_eos = (actual == eos_token_id).long()
        valid = (is_eos.cumsum(-1) - is_eos) == 0  # up to and including the first EOS
        matches += int(((predicted == actual) & valid).sum())
        counted += int(valid.sum())
    return matches / counted
