"""The target's log-probabilities of the tokens a request commits, with its likeliest alternatives.

They are the target's own, whoever drafted the token: a verify pass computes the target's logits at
every position of a proposal anyway, so the logprob of an accepted draft token is read off the row
that verified it, and the target's token's off the row after the accepted ones. They are the model's
distribution before temperature, top-k and top-p (as vLLM reports them by default), in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch



@dataclass(frozen=True)
class TokenLogprobs:
    """Per committed token, in order: its logprob, and the ``top`` likeliest ids with theirs."""

    chosen: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top: list[list[float]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.chosen)

    def followed_by(self, later: TokenLogprobs) -> TokenLogprobs:
        return TokenLogprobs(self.chosen + later.chosen, self.top_ids + later.top_ids, self.top + later.top)

    def first(self, n: int) -> TokenLogprobs:
        return TokenLogprobs(self.chosen[:n], self.top_ids[:n], self.top[:n])


NO_LOGPROBS = TokenLogprobs()


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int) -> TokenLogprobs:
    """``logits`` [m, V]: the rows that predicted each of the m ``tokens``; their logprobs and the
    ``top`` likeliest alternatives of each row."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)].tolist()
    if not top:
        return TokenLogprobs(chosen, [[] for _ in tokens], [[] for _ in tokens])
    values, ids = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)
    return TokenLogprobs(chosen, ids.tolist(), values.tolist())
