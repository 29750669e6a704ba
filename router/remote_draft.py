"""A draft model on a draft worker, as one request's proposer.

The draft's session lives on a worker, over one stream; the router mirrors which of its tokens stand
(``DraftMirror``, workers/draft_steps.py: the in-process engine's proposer tells its session alike),
and the verdict rides to the worker on the next step request, so a step costs one round trip. With
``lookahead``, the draft drafts the next proposal while the target verifies this one, as if all of
it will be accepted, one token further (its guess of the target's own token: its likeliest, sampled
requests too). When the verdict agrees, the next proposal is ready at once; when it does not, the
router asks for a fresh proposal at once (the draft rewound by a length), and the worker stops the
stale lookahead at its next pass. With ``branch`` (SSD), a lookahead also drafts for the likeliest
rejection, in the same passes: the proposal rejected at the token where the draft's own odds of that
rejection and of its runner-up being the target's correction are best, and that runner-up there
(``fork_for``); a verdict that rejects there with that token uses the branch, and the worker adopts
it (its cache moved, nothing drafted again). Either way the proposal is the one the draft would
draft afresh: greedy, by argmax; sampled, because a draft's uniforms are keyed by position
(workers/seeds.py). So the lookahead changes speed only, never the output or its distribution.

A worker that fails mid-request is replaced by another, opened holding every committed token (the
router holds the truth), up to ``MAX_DRAFT_REOPENS`` times; then the request goes on target-only.
A worker that refuses the session as full is no failure: the draft opens on another that has not
refused it (a draft is optional, so there is no waiting for room), else the request goes target-only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from specserve.proto.v1 import internal_pb2 as pb
from specserve.workers.draft_length import DraftLength
from specserve.workers.draft_steps import DraftMirror, Fork
from specserve.workers.drafting import NO_CASCADE, Cascade, DraftTokens
from specserve.workers.proposing import AUX_HIDDEN, Committed, Proposer, ProposerGone, StepRecorder, VerifyNeeds
from specserve.workers.wire import join_hidden, proposal_from, step_message

from .context import RequestContext
from .directory import NoWorker
from .streams import WorkerStream, WorkerFailed

log = logging.getLogger("specserve.router")
OPEN_ATTEMPTS = 2  # draft workers tried per opening before a request goes target-only
MAX_DRAFT_REOPENS = 2  # per request, mid-request


class RemoteDraft(Proposer):
    """``aux_layers``: the draft is an EAGLE-3 head reading these hidden states of the target: they
    ride from the target's replies to the worker with each step (no lookahead: the head drafts from
    the verify pass's own hidden states), and a worker lost mid-request is not reopened (the router
    does not keep them): the request goes on target-only."""

    def __init__(self, name: str, context: RequestContext, length: DraftLength, recorder: StepRecorder,
                 aux_layers: tuple[int, ...] = (), branch: bool = True, cascade: Cascade = NO_CASCADE) -> None:
        """``branch``: its lookaheads may draft a branch (where the service does: ``context.branch_odds``);
        off for a tree's member (workers/proposers.py). ``cascade``: prompt lookup under the draft
        model, which it verifies as it drafts (workers/drafting.py)."""
        self.name = name
        self.branch = branch
        self.cascade = cascade
        self.needs = VerifyNeeds(aux_layers)
        self.hidden: pb.HiddenStates | None = None  # the target's, for the worker's next step
        self.context = context
        self.length = length  # the request's k schedule: the lookahead's k, and the confidence stop
        self.recorder = recorder
        self.deterministic = context.params.sampling.greedy
        self.stream: WorkerStream | None = None
        self.opened = False  # its first session was asked for (on the first ``propose``)
        self.mirror = DraftMirror(len(context.history.prompt_ids))  # the draft's tokens, as the router knows them
        self.ahead: asyncio.Task | None = None  # the next proposal, drafted while the target verifies
        self.reopens = 0  # draft workers replaced mid-request: its own count bounds them (MAX_DRAFT_REOPENS); the recorder hears of each
        self.refused_by: set[str] = set()  # workers that refused this request's draft as full
        self.proposed: list[int] = []  # its last proposal
        self.verdicts = 0  # verdicts it has been told
        # The target's token after a verdict that accepted all of the last proposal (what a
        # lookahead has guessed if it was right); None after any other verdict.
        self.after_all: int | None = None
        # After a verdict that rejected the last proposal: (tokens accepted, the target's token).
        self.rejected: tuple[int, int] | None = None
        self.fork: tuple[int, int] | None = None  # the pending lookahead's branch: (at, token), as rejected reads

    async def _open(self) -> None:
        """A draft session on a worker serving this draft (a second worker if the first fails),
        holding every committed token: on the first ``propose``, and after a worker failed."""
        directory, timeouts = self.context.directory, self.context.timeouts
        why = ""
        for _ in range(OPEN_ATTEMPTS):
            try:
                worker, _ = await directory.pick_for("draft", self.name, avoid=self.refused_by,
                                                     prompt=self.context.history.committed_ids())
            except NoWorker as exc:
                why = str(exc)
                break
            self.stream = directory.stream(worker, timeouts.draft_step_seconds,
                                           first_step_timeout=timeouts.draft_prefill_seconds)
            try:
                opening = self.context.draft_opening(self.name, self.reopens, self.cascade,
                                                     self.context.lookahead and self.context.branch_odds is not None)
                await self.stream.send(pb.DraftRequest(open=opening))
                self.mirror.reopen(len(opening.prompt_ids))
                return
            except WorkerFailed as exc:
                why = str(exc)
                self._drop(exc)
        raise ProposerGone(why)

    async def propose(self, k: int) -> DraftTokens:
        """The next proposal; after the worker fails, from another one opened where the request
        stands. Returning it, the draft starts on the one after while the target verifies this one."""
        if not self.opened:  # the first step: a session on a worker (later ones reopen in _propose)
            self.opened = True
            await self._open()
        message = await self._propose(k)
        self.proposed = list(message.ids)
        proposal = proposal_from(message)
        self._draft_ahead(proposal)
        return proposal

    async def _propose(self, k: int) -> pb.Proposal:
        started = time.perf_counter()
        try:
            return await self._draft(k, self._take_ahead())
        except WorkerFailed as exc:
            self._drop(exc)
            if self.needs:
                raise ProposerGone(f"an EAGLE-3 head's worker failed mid-request; its hidden states of the "
                                   f"committed positions are on no other: {exc}") from None
            if not exc.full:  # a full worker failed nothing: no reopen spent
                if self.reopens >= MAX_DRAFT_REOPENS:
                    raise ProposerGone(f"failed mid-request, {self.reopens} times already: {exc}") from None
                self.reopens += 1
                self.recorder.reopened()
                log.warning("request %s: draft %s failed mid-request; reopening it elsewhere: %s",
                            self.context.request_id, self.name, exc)
            await self._open()
        try:
            # The reopened session's first step prefills every committed token: no draft step's cost.
            return await self._draft(k, None, timed=False)
        except WorkerFailed as exc:
            self._drop(exc)
            raise ProposerGone(f"{'refused' if exc.full else 'failed again'} mid-request: {exc}") from None
        finally:
            self.recorder.recovered(started)

    def commit(self, step: Committed) -> None:
        accepted, appended = step.accepted, step.appended
        self.mirror.verdict(accepted, appended)  # the worker learns it with its next step
        if (hidden := step.extras.get(AUX_HIDDEN)) is not None:  # and a head, the target's hidden states
            self.hidden = join_hidden(self.hidden, hidden)
        whole = accepted == len(self.proposed) and len(appended) == 1
        self.after_all = appended[0] if whole else None
        self.rejected = (accepted, appended[0]) if not whole and len(appended) == 1 else None
        self.verdicts += 1

    async def close(self) -> None:
        ahead, self.ahead = self.ahead, None
        if ahead is not None:  # the request ended (a stop, the end of text) before its verdict
            self.recorder.lookahead_unjudged()
            if not ahead.done():  # drafted past the end: drop it with the session
                ahead.cancel()
                if self.stream is not None:
                    self.stream.cancel()
                return
        if self.stream is not None:
            await self.stream.close()

    def abandon(self) -> None:
        if self.ahead is not None:
            self.ahead.cancel()
        if self.stream is not None:
            self.stream.cancel()

    async def _draft(self, k: int, ahead: asyncio.Task | None, timed: bool = True) -> pb.Proposal:
        """The lookahead's proposal (or its branch's) when it guessed the verdict, else a fresh draft.

        Drafting ahead, the first step proposes nothing: the target's prefill answers the first
        token alone, as fast as target-only decoding would, while the draft prefills and drafts
        ahead of it; otherwise the first token would wait for the draft's prefill and k tokens.
        """
        fork, self.fork = self.fork, None
        if not self.verdicts and (self.context.lookahead or self.needs):  # (a head has no hidden states yet)
            return pb.Proposal()
        waited = time.perf_counter()
        branch_hit = fork is not None and self.rejected == fork
        if ahead is not None and self.after_all is None and not branch_hit and k >= 1:
            return await self._redraft(k, ahead, waited)
        drafted = await ahead if ahead is not None else None
        used = None if drafted is None or k < 1 else self._used(drafted, branch_hit)
        if drafted is not None:
            self._count(drafted)
            self.recorder.lookahead_missed(_drawn(drafted) - _used_drawn(drafted, used, k))
        if k < 1:
            return pb.Proposal()
        if used is not None:
            self.recorder.lookahead_hit(branch=used is not drafted)
            if used is not drafted:
                self.mirror.branch_hit()
            else:
                self.mirror.lookahead_hit()
            self.recorder.waited(time.perf_counter() - waited)
            return _after_guess(used, k)  # its first token is the target's; past k, k shrank since
        proposal = await self.stream.ask(pb.DraftRequest(step=self._step(k)))
        if timed:
            self.recorder.waited(time.perf_counter() - waited)
        self._count(proposal)
        return proposal

    async def _redraft(self, k: int, ahead: asyncio.Task, waited: float) -> pb.Proposal:
        """The verdict rejected part of what the lookahead assumed accepted: its work is stale. Ask
        for the right proposal at once, saying so: the worker stops the stale one at its next pass
        (its answer, what it drafted until then, still comes first) instead of finishing k + 1
        tokens no one will use."""
        await self.stream.send(pb.DraftRequest(step=self._step(k, drop_previous=True)))
        stale = await ahead
        self._count(stale)
        self.recorder.lookahead_missed(_drawn(stale))
        proposal = await self.stream.receive()
        self.recorder.waited(time.perf_counter() - waited)
        self._count(proposal)
        return proposal

    def _step(self, k: int, drop_previous: bool = False) -> pb.DraftStep:
        """A step from what is committed (the hidden states that came with the verdict, for a head)."""
        step = self.mirror.step(k, self.length.min_confidence)
        aux, self.hidden = self.hidden, None
        return step_message(dataclasses.replace(step, drop_previous=drop_previous) if drop_previous else step, aux)

    def _count(self, drafted: pb.Proposal) -> None:
        """A proposal the worker drafted (used or not: a lookahead that missed cost its time too)."""
        self.recorder.drafted(_drawn(drafted), drafted.seconds, drafted.pass_info)

    def _used(self, drafted: pb.Proposal, branch_hit: bool) -> pb.Proposal | None:
        """What of the lookahead the verdict lets the request use: itself, where it assumed the
        verdict (all of the last proposal accepted, its first token the target's own), or its
        branch, where the verdict rejected at the branch's fork with the branch's token; either
        holds at least one more token, the next proposal. None: neither."""
        if len(drafted.ids) > 1 and self.after_all is not None and drafted.ids[0] == self.after_all:
            return drafted
        if branch_hit and len(drafted.branch.ids) > 1:
            return drafted.branch
        return None

    def _draft_ahead(self, proposal: DraftTokens) -> None:
        """Ask the draft for the proposal after this one, assuming all of this one is accepted (and,
        with ``branch``, the one after its likeliest rejection)."""
        proposed = len(proposal.ids)
        after_all_accepted = self.context.history.remaining - proposed - 1
        k = min(self.length.next_k(proposed, proposed), after_all_accepted - 1) + 1  # one more: its guess
        if not (self.context.lookahead and self.context.ahead and self.stream and (proposed or not self.verdicts)
                and k >= 2):
            return
        if self.needs:  # a head drafts from the verify pass's hidden states: nothing to draft ahead from
            return
        # A cascade's lookahead would not be the proposal it drafts afresh: its guesses would come
        # from lookup over a context without the target's token, and a hit is cut at k. So a seeded
        # request's output would depend on whether it drafted ahead; a cascade drafts in turn.
        if self.cascade.guesses:
            return
        self.recorder.looked_ahead()
        step = self.mirror.ahead(proposed, k, self.length.min_confidence)
        odds = self.context.branch_odds if self.branch else None
        if odds is not None and (fork := fork_for(proposal.wire, proposed, odds)) is not None:
            # The k the request will ask for after that verdict (the schedule moves k by it, and a
            # branch shorter than that is no fresh draft), and its first token.
            at = fork[0]
            branch_k = min(self.length.next_k(proposed, at), self.context.history.remaining - at - 2) + 1
            if branch_k >= 2:
                self.fork = fork
                step = dataclasses.replace(step, fork=Fork(step.keep - proposed + at, fork[1], branch_k))
        self.ahead = asyncio.create_task(self.stream.ask(pb.DraftRequest(step=step_message(step))))
        # A lookahead may fail unawaited (the request ends first); mark its error as seen, or asyncio
        # logs "exception never retrieved". One that is awaited raises there as usual.
        self.ahead.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _take_ahead(self) -> asyncio.Task | None:
        ahead, self.ahead = self.ahead, None
        return ahead

    def _drop(self, failure: WorkerFailed) -> None:
        """End the session on the failed worker; new requests pass it over for a while."""
        if self.stream is not None and self.stream.worker.worker_id == failure.worker.worker_id:
            self.stream.cancel()
            self.stream = None
        if failure.full:
            self.refused_by.add(failure.worker.worker_id)
        if failure.broken:
            self.context.directory.mark_failed(failure.worker)


def fork_for(proposal: pb.Proposal | None, proposed: int, min_odds: float) -> tuple[int, int] | None:
    """Where a branch beside the lookahead past ``proposal`` forks: (tokens accepted, the target's
    token there), the rejection and correction the draft itself gives the best odds, the product of
    its probabilities of the tokens before and of its runner-up there (the runner-up stands for
    the target's correction, which no one knows before the verdict). None: no proposal from a
    draft (or none with its alternatives), or no outcome with at least ``min_odds``."""
    if proposal is None or len(proposal.runner_up) != proposed:
        return None
    best, odds, before = None, min_odds, 1.0
    for at in range(proposed):
        if proposal.runner_up[at] >= 0 and before * proposal.runner_up_p[at] >= odds:
            best, odds = (at, proposal.runner_up[at]), before * proposal.runner_up_p[at]
        before *= proposal.token_p[at]
    return best


def _drawn(drafted: pb.Proposal) -> int:
    """Tokens the worker drew for a reply: its own (a lookahead's guess among them) and its branch's
    after the branch's first (assumed, not drawn)."""
    return len(drafted.ids) + max(len(drafted.branch.ids) - 1, 0)


def _used_drawn(drafted: pb.Proposal, used: pb.Proposal | None, k: int) -> int:
    """Of the tokens drawn for a lookahead's reply, those the request used: the proposal after its
    first token (at most k), and that first token where it is the lookahead's guess, drawn and now
    the target's (a branch's first token was assumed, never drawn)."""
    if used is None:
        return 0
    return min(len(used.ids) - 1, k) + (used is drafted)


def _after_guess(drafted: pb.Proposal, k: int) -> pb.Proposal:
    """A lookahead's (or a branch's) proposal: its tokens after the first, at most k, with their q
    and alternatives."""
    tail = pb.Proposal(ids=drafted.ids[1 : k + 1], q=drafted.q[1 : k + 1])
    if len(drafted.runner_up) == len(drafted.ids):
        tail.runner_up.extend(drafted.runner_up[1 : k + 1])
        tail.token_p.extend(drafted.token_p[1 : k + 1])
        tail.runner_up_p.extend(drafted.runner_up_p[1 : k + 1])
    return tail
