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

import torch

from .sampling import LogitsProcessing


def processed(processing: LogitsProcessing, logits: torch.Tensor, outputs: Sequence[Sequence[int]]) -> torch.Tensor:
    """``logits`` [n, V], row i after the output ``outputs[i]``: the rows ``processing`` makes of them (float32)."""
    rows = logits.float().clone()
    vocab = rows.shape[-1]
    if processing.presence_penalty or processing.frequency_penalty:
        for row, output in zip(rows, outputs, strict=True):
            if output:
                counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=vocab)[:vocab].float()
                row -= processing.presence_penalty * (counts > 0).float() + processing.frequency_penalty * counts
    for token, bias in processing.logit_bias:
        if token < vocab:
            rows[:, token] += bias
    return rows
