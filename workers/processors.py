"""Logits processors a request may ask for: presence and frequency penalties and a logit bias.

They change the target's distribution (OpenAI's definitions: a token's logit minus the presence
penalty if it occurs in the output so far, minus the frequency penalty times its count there, plus
its bias), so speculation stays lossless against the processed target: the verify pass processes
each row with the output as that row sees it (the committed tokens, then the proposal's tokens
before it), and the acceptance rule runs on the processed rows. Proposals are not processed: a
draft's q is what it sampled from, which is all the rule needs; a draft that ignores a strong bias
is only accepted less often.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_PENALTY = 2.0  # OpenAI's range for presence and frequency penalties: -2..2
MAX_BIAS = 100.0  # ...and for a logit bias: -100..100
MAX_BIASED_TOKENS = 300


@dataclass(frozen=True)
class LogitsProcessing:
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ValueError(f"{name} must be -{MAX_PENALTY:g}..{MAX_PENALTY:g}, got {value}")
        if len(self.logit_bias) > MAX_BIASED_TOKENS:
            raise ValueError(f"logit_bias takes at most {MAX_BIASED_TOKENS} tokens, got {len(self.logit_bias)}")
        for token, bias in self.logit_bias:
            if token < 0 or not -MAX_BIAS <= bias <= MAX_BIAS:
                raise ValueError(f"logit_bias maps token ids >= 0 to -{MAX_BIAS:g}..{MAX_BIAS:g}, got {token}: {bias}")

    @property
    def active(self) -> bool:
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty)

    def apply(self, logits: torch.Tensor, outputs: Sequence[Sequence[int]]) -> torch.Tensor:
        """``logits`` [n, V], row i after the output ``outputs[i]``: the processed rows (float32)."""
        processed = logits.float().clone()
        vocab = processed.shape[-1]
        if self.presence_penalty or self.frequency_penalty:
            for row, output in zip(processed, outputs, strict=True):
                if output:
                    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=vocab)[:vocab].float()
                    row -= self.presence_penalty * (counts > 0).float() + self.frequency_penalty * counts
        for token, bias in self.logit_bias:
            if token < vocab:
                processed[:, token] += bias
        return processed


NO_PROCESSING = LogitsProcessing()
