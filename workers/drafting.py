"""The draft side of one session: propose k tokens and the exact distributions they came from."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .acceptance import SamplingParams, SparseDist, Verdict, one_hot, sample_sparse, sparsify, warp
from .kv_cache import SequenceCache

# The draft samples from its warped distribution truncated to this many tokens. q stays exact (the
# draft samples from the truncation itself) and a proposal stays a few hundred bytes on the wire;
# the mass beyond the top 32 of a small draft is negligible for acceptance.
DRAFT_MAX_SUPPORT = 32


@dataclass(frozen=True)
class Proposal:
    ids: list[int]  # [k] proposed tokens
    q: SparseDist  # [k, m] the distribution each was sampled from

    @staticmethod
    def empty() -> Proposal:
        return Proposal([], SparseDist(torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, 1)))


class DraftSession:
    """Proposes continuations of one request's committed tokens with a draft model."""

    def __init__(
        self,
        model: PreTrainedModel,
        prompt_ids: list[int],
        sampling: SamplingParams,
        generator: torch.Generator,
        max_support: int = DRAFT_MAX_SUPPORT,
        max_length: int | None = None,  # positions its cache may hold (kv_cache.session_capacity)
    ) -> None:
        self.sequence = SequenceCache(model, prompt_ids, max_length)
        self.sampling = sampling
        self.generator = generator
        self.max_support = max_support

    def propose(self, k: int, min_confidence: float = 0.0, min_tokens: int = 1) -> Proposal:
        """Up to k tokens; with `min_confidence`, stop after a token (past the first `min_tokens`)
        the draft gave less probability than that. The stopping rule looks at the draft's own
        draws only, so the verified output keeps the target's distribution."""
        ids: list[int] = []
        rows: list[SparseDist] = []
        logits = self.sequence.catch_up()  # [1, V] after the last committed token
        for i in range(k):
            if i:
                logits = self.sequence.lm.extend(ids[-1:])
            token, q = self._draw(logits)
            ids.append(token)
            rows.append(q)
            if min_confidence and i + 1 >= min_tokens and self._confidence(logits, token, q) < min_confidence:
                break
        return Proposal(ids, _stack(rows))

    def commit(self, proposal: Proposal, verdict: Verdict) -> None:
        """Take the verifier's verdict: keep the accepted prefix, drop the rest of the cache."""
        self.sequence.commit(proposal.ids, verdict.num_accepted, verdict.token)

    def resync(self, proposal: Proposal | None, keep: int, append: list[int]) -> None:
        """The router's word on what stands (see SequenceCache.resync)."""
        self.sequence.resync(proposal.ids if proposal else [], keep, append)

    def _draw(self, logits: torch.Tensor) -> tuple[int, SparseDist]:
        if self.sampling.greedy:
            token = logits[0].argmax()
            return int(token), one_hot(token)
        q = sparsify(warp(logits, self.sampling), self.max_support)
        u = float(torch.rand(1, generator=self.generator))
        return sample_sparse(q, u), q


    def _confidence(self, logits: torch.Tensor, token: int, q: SparseDist) -> float:
        """The probability the draft gave its token: of its plain softmax under greedy (where q is
        one-hot), of the distribution it sampled from otherwise."""
        if self.sampling.greedy:
            return float(torch.softmax(logits[0].float(), dim=-1)[token])
        return float(q.probs[q.ids == token].sum())


def score_continuation(model: PreTrainedModel, ids: list[int], start: int) -> tuple[int, int]:
    """Full information (HedgeSpec): how many of ids[start:] the draft's greedy choice would have
    matched, each given the verified tokens before it. One teacher-forced pass, no cache."""
    if not 1 <= start < len(ids):
        raise ValueError(f"scoring needs a prompt and a continuation: start {start} of {len(ids)} tokens")
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=model.device)).logits[0]  # [n, V]
    guesses = logits[start - 1 : -1].argmax(dim=-1).cpu()  # [n - start]: the choice before each verified token
    positions = len(ids) - start
    return positions, int((guesses == torch.tensor(ids[start:])).sum())


def _stack(rows: list[SparseDist]) -> SparseDist:
    if not rows:
        return Proposal.empty().q
    return SparseDist(torch.cat([r.ids for r in rows]), torch.cat([r.probs for r in rows]))
