"""Drafting where the target verifies, as one request's proposer: the proposal the verify pass
made (Medusa heads guessing in it, heads/medusa_draft.py; a head fed by hidden states drafting after
it on the target replica, heads/fed_guess.py), relayed with the verdict (``VERIFIER_NEXT``) and cut
to the k asked. The first step of a request, before any pass, is target-only.
"""

from __future__ import annotations

import logging
import time

import torch

from .acceptance import SparseDist
from .drafting import DraftTokens
from .proposing import VERIFIER_NEXT, Committed, Proposer, StepRecorder, VerifyNeeds, proposal_depth
from .sampling import SamplingParams

log = logging.getLogger("specserve.workers")


def cut(proposal: DraftTokens, depth: int) -> DraftTokens:
    """The proposal's tokens at most ``depth`` deep, with their q (a chain's first ``depth``; a
    tree's nodes renumbered)."""
    if proposal.parents is None:
        return proposal.first(depth)  # (one that came over a stream keeps its encoding)
    depths: list[int] = []
    kept: dict[int, int] = {}  # old index -> new
    for node, parent in enumerate(proposal.parents):
        depths.append(1 if parent < 0 else depths[parent] + 1)
        if depths[-1] <= depth:
            kept[node] = len(kept)
    if len(kept) == len(proposal.ids):
        return proposal
    rows = torch.tensor(list(kept))
    return DraftTokens([proposal.ids[n] for n in kept], SparseDist(proposal.q.ids[rows], proposal.q.probs[rows]),
                       [-1 if proposal.parents[n] < 0 else kept[proposal.parents[n]] for n in kept])


class VerifierDraft(Proposer):
    """A request's proposer over heads that draft where its target session verifies: Medusa heads
    (heads/medusa_draft.py), or a head fed by hidden states drafting ``depth`` tokens after each
    verdict (heads/fed_guess.py)."""

    def __init__(self, name: str, sampling: SamplingParams, recorder: StepRecorder, depth: int = 0) -> None:
        self.name = name
        self.recorder = recorder
        self.deterministic = sampling.greedy
        self.needs = VerifyNeeds(on_verifier=name, depth=depth)
        self.next: DraftTokens | None = None  # the last verify pass's guesses

    async def propose(self, k: int) -> DraftTokens:
        if k < 1 or self.next is None:  # before the first pass: nothing guessed yet
            return DraftTokens.empty()
        started = time.perf_counter()
        try:
            proposal = cut(self.next, k)
        except (IndexError, KeyError, ValueError):  # a malformed tree from the wire: a target-only step
            log.warning("the verifier's proposal came malformed (parents %s); this step goes target-only",
                        self.next.parents)
            return DraftTokens.empty()
        self.recorder.waited(time.perf_counter() - started)
        self.recorder.drafted(proposal_depth(proposal), 0.0)  # guessed in the verify pass: its time is the pass's
        return proposal

    def commit(self, step: Committed) -> None:
        self.next = step.extras.get(VERIFIER_NEXT)
