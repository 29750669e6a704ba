"""The speculative loop, written once: propose, verify, commit, emit.

It runs in process (the engine: a local verifier and local proposers) and in the service (the
router: a verifier backed by a target replica's stream, proposers on draft workers or in the
router). Only the verifier and the proposer differ; the loop does not know which it drives.

Target-only decoding is the same loop with no proposer: an empty proposal each step, so both paths
share the target's pass, its sampling rule and its stop handling. A proposer that is gone mid-request
(``ProposerGone``) leaves the request target-only: the output does not depend on the draft.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

from .decoding import Decoding
from .draft_length import DraftLength
from .drafting import DraftTokens
from .proposing import (NEEDS_NOTHING, Committed, Proposer, ProposerGone, StepRecorder, Verified, VerifyNeeds,
                        accepted_ids, proposal_depth)
from .stopping import Chunk
from .verifying import NO_PROPOSAL

log = logging.getLogger("specserve.loop")
T = TypeVar("T")


class Verifier(Protocol):
    """The target's side of one request: a local session, or a stream to a target replica."""

    async def open(self) -> None:
        """Hold the request's committed tokens, ready to verify after them."""

    async def verify(self, proposal: DraftTokens, alone: bool, needs: VerifyNeeds) -> Verified:
        """The verdict on ``proposal`` (empty: a target-only step), committed on the target's side.
        ``alone``: no proposal will come again (the verifier may decode ahead); ``needs``: what the
        proposer wants from the pass besides the verdict."""

    def arrived(self) -> Verified | None:
        """A target-only token's verdict that is already here (a decode run's next token, answered
        while the loop was busy), taken without waiting; None when there is none."""

    async def close(self) -> None:
        """The request is done: free the target's side."""

    def abandon(self) -> None:
        """The request was cancelled or failed: free everything now (idempotent)."""


class SpeculativeLoop:
    """One request's loop. ``lost`` is called with the reason when its proposer is gone."""

    def __init__(self, decoding: Decoding, verifier: Verifier, proposer: Proposer | None, length: DraftLength,
                 recorder: StepRecorder, lost: Callable[[str], None] = lambda why: None) -> None:
        self.decoding = decoding
        self.verifier = verifier
        self.proposer = proposer  # None: target-only (from the start, or once it is gone)
        self.length = length  # k per step
        self.recorder = recorder
        self.lost = lost

    async def run(self) -> AsyncIterator[Chunk]:
        finished = False
        try:
            await self.verifier.open()
            while not self.decoding.finished:
                proposal = await self.propose()
                verified = await self.verify(proposal)
                yield self.arrivals(self.commit(proposal, verified))  # emit
            if self.proposer is not None:
                await self.proposer.close()
            await self.verifier.close()
            finished = True
        finally:
            if not finished:  # cancelled or failed mid-way: free what the workers hold now
                self.abandon()

    async def propose(self) -> DraftTokens:
        """The proposer's next proposal, or none (a target-only step): once it is gone, for good."""
        k = self.decoding.draft_length(self.length.k)
        if self.proposer is None:
            return NO_PROPOSAL
        try:
            proposal = await self.proposer.propose(k)
        except ProposerGone as exc:
            self._lose_proposer(str(exc))
            return NO_PROPOSAL
        # A cascade's chain may run past k (workers/drafting.py), never past what the request may
        # still commit: the rest would be verified for nothing.
        return proposal if proposal.parents is not None else proposal.first(max(0, self.decoding.remaining - 1))

    async def verify(self, proposal: DraftTokens) -> Verified:
        needs = self.proposer.needs if self.proposer is not None else NEEDS_NOTHING
        verified = await self.verifier.verify(proposal, self.proposer is None, needs)
        # A token tree counts as a proposal of its depth: what its accepted path could have reached.
        self.recorder.verified(proposal_depth(proposal), verified.verdict.num_accepted, verified.seconds)
        return verified

    def arrivals(self, chunk: Chunk) -> Chunk:
        """The chunk, with the target-only tokens whose verdicts are already here committed into it:
        a router busy with many sessions finds a decode run's next tokens waiting, and emits them
        once (one client write, one turn of this loop) instead of once per token."""
        while self.proposer is None and not self.decoding.finished:
            verified = self.verifier.arrived()
            if verified is None:
                break
            self.recorder.verified(0, 0, verified.seconds)
            chunk = chunk.followed_by(self.commit(NO_PROPOSAL, verified))
        return chunk

    def commit(self, proposal: DraftTokens, verified: Verified) -> Chunk:
        """Commit the verdict everywhere the loop keeps it: the k schedule, the proposer, and the
        output (the request's truth), whose new text is what the loop emits."""
        verdict = verified.verdict
        self.length.update(proposal_depth(proposal), verdict.num_accepted)
        if self.proposer is not None:
            self.proposer.commit(Committed.of(verified))
        return self.decoding.commit(accepted_ids(proposal, verdict), verdict.num_accepted, verdict.token,
                                    verified.logprobs, verified.ended)

    def abandon(self) -> None:
        """Free the request's state on every worker now (idempotent): its client is gone."""
        self.verifier.abandon()
        if self.proposer is not None:
            self.proposer.abandon()

    def _lose_proposer(self, why: str) -> None:
        self.proposer.abandon()
        self.proposer = None
        self.lost(why)


def run_now(step: Awaitable[T]) -> T:
    """The result of a coroutine that never waits (every in-process verb returns at once), with no
    event loop: so the engine runs the same loop as the service, from sync code or inside a loop."""
    driver = step.__await__()
    try:
        driver.send(None)
    except StopIteration as done:
        return done.value
    driver.close()
    raise RuntimeError("an in-process step waited on something: run it on an event loop instead")
