"""Medusa heads drafting where the target verifies: their guesses in the verify pass, relayed.

``MedusaGuesser`` is the verifier's side (a target session's: a replica's, or the in-process
engine's). After each verdict it reads the target's last hidden state of the last position the
pass committed, whose own output is the token the verdict appended: head i guesses the token
i + 1 after that one. So the next proposal is ready when the verdict is, at the price of K small
products on one row, with no draft pass, no cache of its own and no trip to a draft worker.

``MedusaDraft`` is the request's proposer (workers/proposing.py): it asks for the guesses in its
``needs`` and proposes what the last verify pass sent, cut to the k asked. The first step of a
request, before any pass, is target-only.

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
import time
from collections.abc import Sequence

import torch

from ..acceptance import SparseDist, sample_sparse
from ..sampling import SamplingParams
from ..drafting import DRAFT_MAX_SUPPORT, DraftTokens, draw, stack_rows
from ..proposing import MEDUSA_NEXT, Committed, Proposer, StepRecorder, VerifyNeeds, proposal_depth
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
            greedy = [i for i, (guesser, _, _, _) in enumerate(pending) if guesser.sampling.greedy]
            # [n_greedy, K, width], best first: one top-k and one copy for all of them
            tops = logits[:, greedy].topk(TREE_WIDTH, -1).indices.transpose(0, 1).tolist() if greedy else []
        except Exception:  # noqa: BLE001 - no guesses is a target-only step, never another output
            log.exception("Medusa heads failed to guess for %d sessions; their next steps go target-only", len(pending))
            return
        for i, top in zip(greedy, tops, strict=True):
            pending[i][1].next = _tree(top)
        for i, (guesser, owner, _, position) in enumerate(pending):
            if not guesser.sampling.greedy:
                try:
                    owner.next = guesser.drawn(logits[:, i].float(), position)
                except Exception:  # noqa: BLE001 - this session's next step goes target-only, the others' not
                    log.exception("Medusa heads failed to draw a session's guesses; its next step goes target-only")


class MedusaGuesser:
    """One session's side of the heads (``batch``'s); ``draws`` keyed as a draft's of their name (a
    depth's runner-up draws of its own, independent of them)."""

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

    def owe(self, owner, segment, proposed: int, kept: Sequence[int]) -> None:
        """Owe ``owner`` the heads' next proposal, from the hidden state of the verdict's last
        position: the last of the proposal's rows ``kept``, or the row before the proposal if none
        was. Made with the pass's other sessions' once its verdicts are in (``batch.flush``)."""
        if not segment.logits:
            return
        fixed = len(segment.tokens) - proposed
        row = segment.aux[fixed + kept[-1]] if kept else segment.aux[fixed - 1]
        self.batch.owe(self, owner, row, len(owner.sequence.committed))

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


def cut(proposal: DraftTokens, depth: int) -> DraftTokens:
    """The proposal's tokens at most ``depth`` deep, with their q (a chain's first ``depth``; a
    tree's nodes renumbered)."""
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
    rows = torch.tensor(list(kept))
    return DraftTokens([proposal.ids[n] for n in kept], SparseDist(proposal.q.ids[rows], proposal.q.probs[rows]),
                       [-1 if proposal.parents[n] < 0 else kept[proposal.parents[n]] for n in kept])


class MedusaDraft(Proposer):
    """A request's proposer over heads that run where its target session does: Medusa heads, or a
    head fed by hidden states drafting ``depth`` tokens after each verdict (heads/fed_guess.py)."""

    def __init__(self, name: str, sampling: SamplingParams, recorder: StepRecorder, depth: int = 0) -> None:
        self.name = name
        self.recorder = recorder
        self.deterministic = sampling.greedy
        self.needs = VerifyNeeds(medusa=name, depth=depth)
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
