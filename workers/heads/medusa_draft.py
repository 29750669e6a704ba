"""Medusa heads drafting where the target verifies: their guesses in the verify pass, relayed.

``MedusaGuesser`` is the verifier's side (a target session's: a replica's, or the in-process
engine's). After each verdict it reads the target's last hidden state of the last position the
pass committed, whose own output is the token the verdict appended: head i guesses the token
i + 1 after that one. So the next proposal is ready when the verdict is, at the price of K small
products on one row, with no draft pass, no cache of its own and no trip to a draft worker.

``MedusaDraft`` is the request's proposer (workers/proposing.py): it asks for the guesses in its
``needs`` and proposes what the last verify pass sent, cut to the k asked. The first step of a
request, before any pass, is target-only.

Greedy, a proposal is a token tree: each head's best guess as the main chain, and beside each its
next ``width - 1`` guesses as leaves (the heads do not read each other's guesses, so a runner-up
at one depth has no guess after it). The verifier keeps the longest path the target agrees with:
the target's own tokens. Sampled, a chain: head i's token drawn from its own distribution, warped
as the request's sampling says, which is the q the rejection rule needs; that a head's
distribution does not depend on the tokens drawn before it does not matter to the rule, only that
each token was drawn from the q it is sent with.
"""

from __future__ import annotations

import logging
import time

import torch

from ..acceptance import SamplingParams, SparseDist
from ..drafting import DRAFT_MAX_SUPPORT, DraftTokens, draw, stack_rows
from ..proposing import MEDUSA_NEXT, Committed, Proposer, StepRecorder, VerifyNeeds, proposal_depth
from ..seeds import DraftDraws
from .medusa import MedusaHeads

log = logging.getLogger("specserve.workers")
# Guesses per depth of a greedy proposal's tree (1: a chain). Two: a head's runner-up is right
# often enough (Medusa's trees take the top few per head) for k more rows in the pass.
TREE_WIDTH = 2


class GuessBatch:
    """The guesses one set of heads owes the sessions a pass verified, made together once the pass's
    verdicts are in (``flush``, the steps' ``after_pass``): one product of the heads for every
    session, one top-k for the greedy ones. Per session they would cost more than the pass."""

    def __init__(self, heads: MedusaHeads) -> None:
        self.heads = heads
        self.pending: list[tuple[MedusaGuesser, object, torch.Tensor, int]] = []

    def owe(self, guesser: MedusaGuesser, owner, hidden: torch.Tensor, position: int) -> None:
        """``owner.next`` gets the heads' guesses from ``hidden`` [H], the first at ``position``."""
        self.pending.append((guesser, owner, hidden, position))

    @torch.inference_mode()
    def flush(self) -> None:
        pending, self.pending = self.pending, []
        if not pending:
            return
        weight = self.heads.lm_heads[0].weight
        try:
            rows = torch.stack([hidden for _, _, hidden, _ in pending]).to(weight.device, weight.dtype)
            logits = self.heads(rows)  # [K, n, V]
            greedy = [i for i, (guesser, _, _, _) in enumerate(pending) if guesser.width > 1]
            # [n_greedy, K, width], best first: one top-k and one copy for all of them
            tops = logits[:, greedy].topk(TREE_WIDTH, -1).indices.transpose(0, 1).tolist() if greedy else []
        except Exception:  # noqa: BLE001 - no guesses is a target-only step, never another output
            log.exception("Medusa heads failed to guess for %d sessions; their next steps go target-only", len(pending))
            return
        for i, top in zip(greedy, tops, strict=True):
            pending[i][1].next = _tree(top)
        for i, (guesser, owner, _, position) in enumerate(pending):
            if guesser.width == 1:
                try:
                    owner.next = guesser.drawn(logits[:, i].float(), position)
                except Exception:  # noqa: BLE001 - this session's next step goes target-only, the others' not
                    log.exception("Medusa heads failed to draw a session's guesses; its next step goes target-only")


class MedusaGuesser:
    """One session's side of the heads (``batch``'s); ``draws`` keyed as a draft's of their name."""

    def __init__(self, batch: GuessBatch, layer: int, sampling: SamplingParams, draws: DraftDraws,
                 max_support: int = DRAFT_MAX_SUPPORT) -> None:
        self.batch = batch
        self.layer = layer  # the target's hidden_states index they read (its last)
        self.sampling = sampling
        self.draws = draws
        self.max_support = max_support
        self.width = TREE_WIDTH if sampling.greedy else 1

    def drawn(self, logits: torch.Tensor, position: int) -> DraftTokens:
        """A sampled chain from the heads' logits [K, V]: head i's token drawn at ``position`` + i
        from its warped distribution, which is its q."""
        drawn = [draw(row[None], self.sampling, self.draws.uniform(position + i), self.max_support)
                 for i, row in enumerate(logits)]
        return DraftTokens([token for token, _ in drawn], stack_rows([q for _, q in drawn]))


def _tree(guesses: list[list[int]]) -> DraftTokens:
    """Each depth's best guess under the one before, its runners-up beside it as leaves."""
    ids: list[int] = []
    parents: list[int] = []
    parent = -1
    for row in guesses:  # best first
        main = len(ids)
        ids += row
        parents += [parent] * len(row)
        parent = main
    return DraftTokens.of_ids(ids, parents)


def cut(proposal: DraftTokens, depth: int) -> DraftTokens:
    """The proposal's tokens at most ``depth`` deep (a chain's first ``depth``), parents renumbered."""
    if proposal.parents is None:
        if len(proposal.ids) <= depth:
            return proposal
        return DraftTokens(proposal.ids[:depth], SparseDist(proposal.q.ids[:depth], proposal.q.probs[:depth]))
    depths: list[int] = []
    kept: dict[int, int] = {}  # old index -> new
    for node, parent in enumerate(proposal.parents):
        depths.append(1 if parent < 0 else depths[parent] + 1)
        if depths[-1] <= depth:
            kept[node] = len(kept)
    if len(kept) == len(proposal.ids):
        return proposal
    return DraftTokens.of_ids([proposal.ids[n] for n in kept],
                              [-1 if proposal.parents[n] < 0 else kept[proposal.parents[n]] for n in kept])


class MedusaDraft(Proposer):
    """A request's proposer over Medusa heads that run where its target session does."""

    def __init__(self, name: str, sampling: SamplingParams, recorder: StepRecorder) -> None:
        self.name = name
        self.recorder = recorder
        self.deterministic = sampling.greedy
        self.needs = VerifyNeeds(medusa=name)
        self.next: DraftTokens | None = None  # the last verify pass's guesses

    async def propose(self, k: int) -> DraftTokens:
        if k < 1 or self.next is None:  # before the first pass: nothing guessed yet
            return DraftTokens.empty()
        started = time.perf_counter()
        try:
            proposal = cut(self.next, k)
        except (IndexError, KeyError, ValueError):  # a malformed tree from the wire: a target-only step
            log.warning("Medusa heads' guesses came malformed (parents %s); this step goes target-only",
                        self.next.parents)
            return DraftTokens.empty()
        self.recorder.waited(time.perf_counter() - started)
        self.recorder.drafted(proposal_depth(proposal), 0.0)  # guessed in the verify pass: its time is the pass's
        return proposal

    def commit(self, step: Committed) -> None:
        self.next = step.extras.get(MEDUSA_NEXT)
