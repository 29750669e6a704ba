"""The target side of one session: verify a proposal in one forward pass and commit the verdict."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .acceptance import SamplingParams, Verdict, verify, verify_greedy, warp
from .drafting import Proposal
from .kv_cache import SequenceCache


class TargetSession:
    """Holds one request's target KV cache; a proposal of k tokens costs one target pass.

    An empty proposal is plain target-only decoding: the same pass, the same sampling rule.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        prompt_ids: list[int],
        sampling: SamplingParams,
        generator: torch.Generator,
        max_length: int | None = None,  # positions its cache may hold (kv_cache.session_capacity)
    ) -> None:
        self.sequence = SequenceCache(model, prompt_ids, max_length)
        self.sampling = sampling
        self.generator = generator

    def verify(self, proposal: Proposal) -> Verdict:
        k = len(proposal.ids)
        logits = self.sequence.catch_up(proposal.ids)  # [k+1, V]
        draft_ids = torch.tensor(proposal.ids, dtype=torch.long)
        if self.sampling.greedy:
            verdict = verify_greedy(logits.argmax(-1), draft_ids)
        else:
            uniforms = torch.rand(k + 1, generator=self.generator)
            verdict = verify(warp(logits, self.sampling), draft_ids, proposal.q, uniforms)
        self.sequence.commit(proposal.ids, verdict.num_accepted, verdict.token)
        return verdict
