"""Medusa heads drafting where the target verifies: their guesses in the verify pass, relayed.

``MedusaGuesser`` is the verifier's side (a target session's: a replica's, or the in-process
engine's). After each verdict it reads the target's last hidden state of the last position the
pass committed, whose own output is the token the verdict appended: head i guesses the token
i + 1 after that one. So the next proposal is ready when the verdict is, at the price of K small
products on one row, with no draft pass, no cache of its own and no trip to a draft worker.

The request's proposer is ``VerifierDraft`` (workers/verifier_draft.py), as for every head that
drafts where the target verifies: it asks for the guesses in its ``needs`` and proposes what the
last verify pass sent, cut to the k asked. The first step of a request, before any pass, is
target-only.

A proposal is a token tree: a main chain, one token a head, and beside each of its tokens a
runner-up as a leaf (the heads do not read each other's guesses, so a runner-up at one depth has no
guess after it). Greedy, each head's best guess and its second best; the verifier keeps the longest
path the target agrees with: the target's own tokens. Sampled, both drawn independently from the
head's own distribution, warped as the request's sampling says, which is the q each is sent with;
the tree rule (workers/acceptance.py) needs only that every candidate was drawn from its q
independently of the others, not that a head's distribution read the tokens drawn before it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from ..acceptance import SparseDist, sample_sparse
from ..sampling import SamplingParams
from ..drafting import DRAFT_MAX_SUPPORT, DraftTokens, draw, stack_rows
from ..pass_hooks import DraftsHere
from ..seeds import DraftDraws
from .medusa import MedusaHeads

log = logging.getLogger("specserve.workers")
# Candidates per depth of a proposal's tree (1: a chain). Two: a head's runner-up is right often
# enough (Medusa's trees take the top few per head) for k more rows in the pass.
TREE_WIDTH = 2


class GuessBatch:
    """The guesses one set of heads owes the sessions a pass verified, made together once the pass's
    verdicts are in (``flush``, the steps' ``after_pass``): one product of the heads for every
    session, one top-k for the greedy ones. Per session they would cost more than the pass."""

    def __init__(self, heads: MedusaHeads, layer: int) -> None:
        self.heads = heads
        self.layer = layer  # the target's hidden_states index they read (its last)
        self.pending: list[tuple[MedusaGuesser, torch.Tensor, int]] = []

    def owe(self, guesser: MedusaGuesser, hidden: torch.Tensor, position: int) -> None:
        """``guesser.next`` gets the heads' guesses from ``hidden`` [H], the first at ``position``."""
        self.pending.append((guesser, hidden, position))

    @torch.inference_mode()
    def flush(self) -> None:
        pending, self.pending = self.pending, []
        if not pending:
            return
        weight = self.heads.lm_heads[0].weight
        try:
            rows = torch.stack([hidden for _, hidden, _ in pending]).to(weight.device, weight.dtype)
            logits = self.heads(rows)  # [K, n, V]
            greedy = [i for i, (guesser, _, _) in enumerate(pending) if guesser.sampling.greedy]
            # [n_greedy, K, width], best first: one top-k and one copy for all of them
            tops = logits[:, greedy].topk(TREE_WIDTH, -1).indices.transpose(0, 1).tolist() if greedy else []
        except Exception:  # noqa: BLE001 - no guesses is a target-only step, never another output
            log.exception("Medusa heads failed to guess for %d sessions; their next steps go target-only", len(pending))
            return
        for i, top in zip(greedy, tops, strict=True):
            pending[i][0].next = _tree(top)
        for i, (guesser, _, position) in enumerate(pending):
            if not guesser.sampling.greedy:
                try:
                    guesser.next = guesser.drawn(logits[:, i].float(), position)
                except Exception:  # noqa: BLE001 - this session's next step goes target-only, the others' not
                    log.exception("Medusa heads failed to draw a session's guesses; its next step goes target-only")


class MedusaGuesser(DraftsHere):
    """One session's side of the heads (``batch``'s), the hook its target session serves them by
    (workers/pass_hooks.py); ``draws`` keyed as a draft's of their name (a depth's runner-up draws of
    its own, independent of them)."""

    def __init__(self, batch: GuessBatch, sampling: SamplingParams, draws: DraftDraws,
                 max_support: int = DRAFT_MAX_SUPPORT, runner_up: DraftDraws | None = None) -> None:
        self.batch = batch
        self.sampling = sampling
        self.draws = draws
        self.runner_up = runner_up
        self.max_support = max_support

    def layers(self, segment) -> tuple[int, ...]:
        """The target layers a pass keeps of the segment's rows: the heads read the row a verdict
        comes from, none of a prefill chunk's."""
        return (self.batch.layer,) if segment.logits else ()

    def passed(self, session, segment, proposed: int, kept: Sequence[int]) -> None:
        """After a verdict, owe the heads' next proposal, from the hidden state of the verdict's last
        position: the last of the proposal's rows ``kept``, or the row before the proposal if none
        was. Made with the pass's other sessions' once its verdicts are in (``batch.flush``)."""
        if not segment.logits or segment.aux is None:
            return
        fixed = len(segment.tokens) - proposed
        row = segment.aux[fixed + kept[-1]] if kept else segment.aux[fixed - 1]
        self.batch.owe(self, row, len(session.sequence.committed))

    def drawn(self, logits: torch.Tensor, position: int) -> DraftTokens:
        """A sampled tree from the heads' logits [K, V]: at depth i, at ``position`` + i, two tokens
        drawn independently from head i's warped distribution, their q (one, without runner-up draws)."""
        ids: list[int] = []
        rows: list[SparseDist] = []
        parents: list[int] = []
        parent = -1
        for i, row in enumerate(logits):
            token, q = draw(row[None], self.sampling, self.draws.uniform(position + i), self.max_support)
            main = len(ids)
            ids.append(token)
            rows.append(q)
            if self.runner_up is not None:
                ids.append(sample_sparse(q, self.runner_up.uniform(position + i)))
                rows.append(q)
            parents += [parent] * (len(ids) - main)
            parent = main
        return DraftTokens(ids, stack_rows(rows), parents if self.runner_up is not None else None)


def runner_up(name: str) -> str:
    """The name a depth's runner-up draws are keyed by: another draft's, as far as the draws go."""
    return f"{name}/runner-up"


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
