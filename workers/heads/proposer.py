"""An EAGLE-3 head as one request's proposer: it drafts from the target's hidden states.

The verify pass hands the head, with each verdict, the target's aux hidden states of the positions
it committed (``AUX_HIDDEN`` in ``Verified.extras``); the head holds the request's tokens, its own
cache of the positions the target fed, and drafts a proposal in 1 + (k - 1) passes of one layer:
the first over every position the target fed since the last proposal (their features, each with the
token after it), each later one over the token just drafted with the head's own output before it.

Before the target's first pass there are no hidden states: the first step proposes nothing (the
target-only pass that prefills the prompt also returns them), as vLLM's EAGLE drafts after prefill.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from ..acceptance import SamplingParams, SparseDist
from ..drafting import DRAFT_MAX_SUPPORT, DraftTokens, draw, stack_rows
from ..proposing import AUX_HIDDEN, NO_EXTRAS, Proposer, ProposerGone, StepRecorder
from .eagle3 import Eagle3Head, HeadCache


class HeadDraft(Proposer):
    """Drafts with ``head`` for one request, alone (a batch of one)."""

    needs = frozenset({AUX_HIDDEN})

    def __init__(self, name: str, head: Eagle3Head, capacity: int, sampling: SamplingParams,
                 generator: torch.Generator, recorder: StepRecorder, max_support: int = DRAFT_MAX_SUPPORT) -> None:
        self.name = name
        self.head = head
        self.cache = HeadCache(head.config, capacity, head.fc.weight.dtype, head.fc.weight.device)
        self.sampling = sampling
        self.generator = generator
        self.recorder = recorder
        self.max_support = max_support
        self.deterministic = sampling.greedy
        self.aux_layers = head.config.aux_layers
        self.committed: list[int] = []
        self.fed = 0  # positions whose target features the cache holds (its entries past them are a proposal's)
        self.features: list[torch.Tensor] = []  # aux hidden states of committed positions not fed yet
        self.proposed = DraftTokens.empty()

    async def open(self, committed: Sequence[int]) -> None:
        self.committed = list(committed)

    async def propose(self, k: int) -> DraftTokens:
        waiting = sum(len(f) for f in self.features)
        # Nothing new to feed (the target's first pass is still to come, or a verifier that gave no
        # hidden states): no proposal, a target-only step.
        if self.fed + waiting > len(self.committed) - 1:  # a verifier out of step: its features are not these tokens
            raise ProposerGone(f"the head holds hidden states of {self.fed + waiting} positions for "
                               f"{len(self.committed)} committed tokens")
        if k < 1 or not waiting or self.fed + waiting < len(self.committed) - 1:
            self.proposed = DraftTokens.empty()
            return self.proposed
        started = time.perf_counter()
        self.proposed = self._draft(k)
        seconds = time.perf_counter() - started
        self.recorder.waited(seconds)
        self.recorder.drafted(len(self.proposed.ids), seconds)
        return self.proposed

    @torch.inference_mode()
    def _draft(self, k: int) -> DraftTokens:
        head, cache = self.head, self.cache
        cache.length = self.fed  # the last proposal's entries go
        aux = torch.cat(self.features)
        self.features = []
        n = len(aux)  # positions fed..fed+n-1, each with the token after it
        device = cache.keys.device
        ids = torch.tensor(self.committed[self.fed + 1 : self.fed + n + 1], device=device)
        logits, hidden = head.step(ids, head.fuse(aux.to(device)), torch.arange(self.fed, self.fed + n), cache)
        self.fed += n
        tokens: list[int] = []
        rows: list[SparseDist] = []
        while True:
            token, q = draw(head.to_target(logits[-1:]), self.sampling, self.generator, self.max_support)
            tokens.append(token)
            rows.append(q)
            if len(tokens) == k:
                return DraftTokens(tokens, stack_rows(rows))
            position = torch.tensor([self.fed + len(tokens) - 1])
            logits, hidden = head.step(torch.tensor([token], device=device), hidden[-1:], position, cache)

    def follow(self, accepted: int, appended: Sequence[int], extras: Mapping[str, object] = NO_EXTRAS) -> None:
        self.committed += list(self.proposed.ids[:accepted]) + list(appended)
        if (aux := extras.get(AUX_HIDDEN)) is not None:
            self.features.append(aux)
        self.proposed = DraftTokens.empty()
