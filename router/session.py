"""One request through the cluster: propose, verify, commit, emit, over the workers' streams.

The router owns the truth (DESIGN.md invariant 2): the committed tokens live here, in the output
assembler; the workers' KV caches are derived from them. A proposal travels from the draft worker
to the target replica as the same protobuf message, untouched; the verdict rides back to the draft
worker on its next step request, so a step costs one round trip to each worker.

Because the truth is here, a worker that fails mid-request loses nothing: a target replica is
replaced by another (or the restarted one) re-prefilled from the committed tokens, and the failed
step is verified again there; a draft worker is replaced the same way, or dropped (target-only).
Either way the client's stream neither loses nor repeats a token.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from transformers import PreTrainedTokenizerBase

from specserve.cluster.config import TimeoutsConfig
from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc
from specserve.workers.engine import replacement_seed
from specserve.workers.stats import SpecStats
from specserve.workers.stopping import Chunk, OutputAssembler
from specserve.workers.wire import sampling_message

from .directory import NoWorker, WorkerDirectory
from .draft_length import DraftLength
from .policy import Observation, Route
from .streams import SessionStream, WorkerFailed
from .tasks import ResolvedTask
from .validation import ValidRequest

EMPTY_PROPOSAL = pb.Proposal()
log = logging.getLogger("specserve.router")
# Route reasons a session sets itself when its draft is not there: none could be opened, or it
# failed mid-request. The request goes on target-only: the target alone decides every token.
DRAFT_UNAVAILABLE, DRAFT_LOST = "unavailable", "lost"
OPEN_ATTEMPTS = 2  # draft workers tried per opening before a request goes target-only
# Per request. A request that keeps killing replicas (say, one whose prefill exhausts memory) must
# not take the whole fleet down with it, one resume at a time.
MAX_TARGET_RESUMES = 2
MAX_DRAFT_REOPENS = 2
TARGET_POLL_SECONDS = 0.25  # while waiting for a target replica to resume on
# The router gives up waiting this long before the client's deadline, so the client hears why
# (UNAVAILABLE, with the reason) rather than a bare DEADLINE_EXCEEDED.
DEADLINE_MARGIN_SECONDS = 0.25


class TargetUnavailable(NoWorker):
    """No target replica could take (or take back) the request in time: the client gets UNAVAILABLE."""


@dataclass
class StepTimes:
    """What the router waited for per step, and what the workers computed, over one request."""

    draft_steps: list[float] = field(default_factory=list)  # waits for proposals (a lookahead hit: ~0)
    verify_steps: list[float] = field(default_factory=list)  # waits for verdicts on proposals
    plain_steps: list[float] = field(default_factory=list)  # waits for target-only passes
    verify_device: float = 0.0
    plain_device: float = 0.0

    def record(self, drafted: bool, wait: float, device: float) -> None:
        if drafted:
            self.verify_steps.append(wait)
            self.verify_device += device
        else:
            self.plain_steps.append(wait)
            self.plain_device += device


class Session:
    """A request in flight. Iterate ``run()`` for chunks as they are committed.

    With ``lookahead`` (greedy requests only), the draft worker drafts the next proposal while the
    target verifies this one, as if all of it will be accepted, one token further (its guess of the
    target's own token). When the verdict agrees, the next proposal is ready at once; when it does
    not, the draft is rewound by a length and drafts again. Greedy output does not depend on what
    was proposed, so this changes speed only.

    ``deadline`` (time.monotonic(), None: none) is the client's: waits for a replica end before it.
    """

    def __init__(self, request: ValidRequest, task: ResolvedTask, route: Route, length: DraftLength,
                 tokenizer: PreTrainedTokenizerBase, directory: WorkerDirectory, timeouts: TimeoutsConfig,
                 lookahead: bool = False, deadline: float | None = None) -> None:
        self.request = request
        self.task = task
        self.route = route
        self.length = length  # k per step
        self.params = request.params
        self.directory = directory
        self.timeouts = timeouts
        self.deadline = deadline
        self.lookahead = lookahead and request.params.sampling.greedy
        self.stats = SpecStats(seed=request.params.resolved_seed())
        self.times = StepTimes()
        self.output = OutputAssembler(tokenizer, request.params.max_tokens, request.params.stop)
        self.session_id = uuid.uuid4().hex[:12]
        self.target: SessionStream | None = None
        self.drafter: SessionStream | None = None
        self.target_resumes = 0  # target replicas replaced mid-request
        self.draft_reopens = 0  # draft workers replaced mid-request
        # The router's mirror of the draft session, in absolute lengths (see DraftStep): the tokens
        # it has committed, and where the proposal under verification starts in its last proposal.
        # A draft session opened mid-request holds every committed token and no verdict to apply yet.
        self.draft_committed = len(request.prompt_ids)
        self.draft_offset = 0
        self.draft_fresh = False
        self.verdict: pb.Verdict | None = None
        self.started = time.perf_counter()
        self.first_token_seconds = 0.0
        self.first_chunk_tokens = 0

    async def run(self) -> AsyncIterator[Chunk]:
        ahead: asyncio.Task | None = None
        finished = False
        try:
            await self._open_target()
            if self.route.draft:
                await self._open_draft()
            proposal = EMPTY_PROPOSAL
            while not self.output.finish_reason:
                proposal = await self._propose(proposal, ahead)
                ahead = self._draft_ahead(proposal)  # on the draft's device, while the target verifies
                verdict = await self._verify(proposal)
                tokens = self._commit(proposal, verdict)
                chunk = self.output.add(tokens)  # emit
                if not self.first_token_seconds:
                    self.first_token_seconds = time.perf_counter() - self.started
                    self.first_chunk_tokens = len(tokens)
                yield chunk
            if ahead is not None and not ahead.done():  # drafted past the end: drop it with the session
                ahead.cancel()
                if self.drafter is not None:
                    self.drafter.cancel()
            for stream in self._streams():
                await stream.close()
            finished = True
        finally:
            if not finished:  # cancelled or failed mid-way: free the sessions on the workers now
                if ahead is not None:
                    ahead.cancel()
                self.abandon()

    def abandon(self) -> None:
        """Cancel the request's sessions on every worker now (idempotent): its client is gone."""
        for stream in self._streams():
            stream.cancel()

    def _streams(self) -> list[SessionStream]:
        return [s for s in (self.target, self.drafter) if s is not None]

    def committed_ids(self) -> list[int]:
        """The prompt and every token committed so far: what a replacement worker prefills."""
        return list(self.request.prompt_ids) + self.output.token_ids

    def _opening(self, model: str = "") -> pb.SessionOpen:
        """The open message of a session holding every committed token. A worker replacing a failed
        one draws from a seed of its own (fresh draws keep the target's distribution), so a replay
        with the same seed and the same faults gives the same output."""
        kind, replaced = ("draft", self.draft_reopens) if model else ("target", self.target_resumes)
        seed = replacement_seed(self.stats.seed, kind, replaced)
        return pb.SessionOpen(session_id=self.session_id, prompt_ids=self.committed_ids(), model=model,
                              sampling=sampling_message(self.params.sampling, seed), max_new_tokens=self.output.remaining)

    async def _open_target(self, after: WorkerFailed | None = None) -> None:
        """A session on a target replica, waiting for one to be registered (a replica restarting
        after a failure) until the target wait or the client's deadline, whichever is first."""
        give_up = time.monotonic() + self.timeouts.target_wait_seconds
        if self.deadline is not None:
            give_up = min(give_up, self.deadline - DEADLINE_MARGIN_SECONDS)
        while True:
            try:
                target = await self.directory.pick("target")
                stream = SessionStream(target, rpc.VerifierStub(self.directory.channel(target)).Verify(),
                                       self.timeouts.target_step_seconds, self.directory.load)  # a prefill is one step
                self.target = stream
                await stream.send(pb.VerifyRequest(open=self._opening()))
                return
            except (NoWorker, WorkerFailed) as exc:
                if isinstance(exc, WorkerFailed):
                    self._drop(exc)
                if time.monotonic() + TARGET_POLL_SECONDS >= give_up:
                    last = after or exc
                    raise TargetUnavailable(f"no target replica could serve request {self.session_id} "
                                            f"within {self.timeouts.target_wait_seconds:g} s or its deadline, "
                                            f"after {len(self.output.token_ids)} tokens ({last}); retry") from None
                await asyncio.sleep(TARGET_POLL_SECONDS)
                await self.directory.refresh(force=True)  # a restarted replica registers anew

    async def _open_draft(self) -> None:
        """A draft session on a worker serving the route's draft (a second worker if the first
        fails), holding every committed token; else none, and the request goes on target-only."""
        why = ""
        for _ in range(OPEN_ATTEMPTS):
            try:
                worker = await self.directory.pick("draft", self.route.draft)
            except NoWorker as exc:
                why = str(exc)
                break
            self.drafter = SessionStream(worker, rpc.DrafterStub(self.directory.channel(worker)).Draft(),
                                         self.timeouts.draft_step_seconds, self.directory.load,
                                         first_step_timeout=self.timeouts.draft_prefill_seconds)
            try:
                await self.drafter.send(pb.DraftRequest(open=self._opening(self.route.draft)))
                self.draft_committed, self.draft_offset = len(self.committed_ids()), 0
                self.draft_fresh = self.verdict is not None
                return
            except WorkerFailed as exc:
                why = str(exc)
                self._drop(exc)
        self._lose_draft(why)

    def _drop(self, failure: WorkerFailed) -> None:
        """End the session on a failed worker; new requests pass it over for a while."""
        stream = self.target if failure.worker.kind == "target" else self.drafter
        if stream is not None and stream.worker.worker_id == failure.worker.worker_id:
            stream.cancel()
            if stream is self.target:
                self.target = None
            else:
                self.drafter = None
        if failure.broken:
            self.directory.mark_failed(failure.worker)

    def _lose_draft(self, why: str) -> None:
        """Go on target-only: the output does not depend on the draft, only the speed does."""
        log.warning("request %s continues target-only: draft %s: %s", self.session_id, self.route.draft, why)
        if self.drafter is not None:
            self.drafter.cancel()
            self.drafter = None
        drafted = self.stats.proposed > 0
        self.route = Route(self.route.draft if drafted else None, self.route.k if drafted else 0,
                           DRAFT_LOST if drafted else DRAFT_UNAVAILABLE)

    async def _propose(self, verified: pb.Proposal, ahead: asyncio.Task | None) -> pb.Proposal:
        """The next proposal; after a draft worker fails, from another one opened where the request
        stands, or none (a target-only step) when there is none to open."""
        try:
            return await self._draft(verified, ahead)
        except WorkerFailed as exc:
            self._drop(exc)
            if self.draft_reopens >= MAX_DRAFT_REOPENS:
                self._lose_draft(f"failed mid-request, {self.draft_reopens} times already: {exc}")
                return EMPTY_PROPOSAL
            self.draft_reopens += 1
            log.warning("request %s: draft %s failed mid-request; reopening it elsewhere: %s",
                        self.session_id, self.route.draft, exc)
            await self._open_draft()
        try:
            return await self._draft(verified, None)
        except WorkerFailed as exc:
            self._drop(exc)
            self._lose_draft(f"failed again mid-request: {exc}")
            return EMPTY_PROPOSAL

    async def _draft(self, verified: pb.Proposal, ahead: asyncio.Task | None) -> pb.Proposal:
        """The next proposal: the lookahead's when it guessed the verdict, else a fresh draft.

        Drafting ahead, the first step proposes nothing: the target's prefill answers the first
        token alone, as fast as target-only decoding would, while the draft prefills and drafts
        ahead of it; otherwise the first token would wait for the draft's prefill and k tokens.
        """
        if self.verdict is None and self.lookahead and self.drafter:
            return EMPTY_PROPOSAL
        waited = time.perf_counter()
        drafted = await ahead if ahead is not None else None
        if drafted is not None:
            self._count_draft(drafted)
        # k + 1 tokens may be committed per step; never draft past max_tokens.
        k = min(self.length.k, self.output.remaining - 1)
        if not self.drafter or k < 1:
            return EMPTY_PROPOSAL
        keep, append = self.draft_committed, []
        if self.draft_fresh:  # opened mid-request: bring it up to what is committed now
            append = self.committed_ids()[keep:]
        elif self.verdict is not None:  # keep what the verdict accepted, then the target's token
            keep, append = self.draft_committed + self.draft_offset + self.verdict.num_accepted, [self.verdict.token]
            if (drafted is not None and len(drafted.ids) > 1 and self.verdict.num_accepted == len(verified.ids)
                    and drafted.ids[0] == self.verdict.token):
                self.stats.lookahead_hits += 1
                self.draft_committed, self.draft_offset = keep, 1  # the guessed token is the target's
                self.times.draft_steps.append(time.perf_counter() - waited)
                return pb.Proposal(ids=drafted.ids[1 : k + 1], q=drafted.q[1 : k + 1])
        step = pb.DraftStep(keep=keep, append=append, k=k, min_confidence=self.length.min_confidence)
        proposal = await self.drafter.ask(pb.DraftRequest(step=step))
        self.times.draft_steps.append(time.perf_counter() - waited)
        self.draft_committed, self.draft_offset, self.draft_fresh = keep + len(append), 0, False
        self._count_draft(proposal)
        return proposal

    def _draft_ahead(self, proposal: pb.Proposal) -> asyncio.Task | None:
        """Ask the draft for the proposal after this one, assuming all of this one is accepted."""
        after_all_accepted = self.output.remaining - len(proposal.ids) - 1
        next_k = self.length.next_k(len(proposal.ids), len(proposal.ids))
        k = min(next_k, after_all_accepted - 1) + 1  # one more: its guess of the target's token
        if not (self.lookahead and self.drafter and (proposal.ids or self.verdict is None) and k >= 2):
            return None
        self.stats.lookaheads += 1
        keep = self.draft_committed + self.draft_offset + len(proposal.ids)
        # At least the guess and one token after it, or a hit would have nothing to propose.
        step = pb.DraftStep(keep=keep, k=k, min_confidence=self.length.min_confidence, min_tokens=2)
        task = asyncio.create_task(self.drafter.ask(pb.DraftRequest(step=step)))
        # A lookahead may fail unawaited (the session ends first); mark its error as seen, or asyncio
        # logs "exception never retrieved". One that is awaited raises there as usual.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    def _count_draft(self, proposal: pb.Proposal) -> None:
        self.stats.draft_seconds += proposal.seconds
        self.stats.draft_passes += len(proposal.ids)

    async def _verify(self, proposal: pb.Proposal) -> pb.Verdict:
        """The target's verdict on the proposal. If its replica fails, the request moves to another
        (or the restarted one), re-prefilled from the committed tokens, and the step is asked again."""
        waited = time.perf_counter()
        reply = None
        while reply is None:
            try:
                reply = await self.target.ask(pb.VerifyRequest(step=proposal))
            except WorkerFailed as exc:
                await self._resume_target(exc)
                waited = None  # this step's wait includes a prefill: no cost sample
        if self.verdict is not None and waited is not None:  # the prefill is no decode step: left out
            self.times.record(bool(proposal.ids), time.perf_counter() - waited, reply.seconds)
        self.stats.verify_seconds += reply.seconds
        self.stats.record_step(len(proposal.ids), reply.verdict.num_accepted)
        return reply.verdict

    async def _resume_target(self, failure: WorkerFailed) -> None:
        self._drop(failure)
        if failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not self.output.token_ids:
            raise failure  # every replica is full: the client backs off (RESOURCE_EXHAUSTED)
        if self.target_resumes >= MAX_TARGET_RESUMES:
            raise TargetUnavailable(f"request {self.session_id} lost its target replica "
                                    f"{self.target_resumes + 1} times; giving up ({failure}); retry") from None
        self.target_resumes += 1
        log.warning("request %s resumes after %d tokens on another target replica: %s", self.session_id,
                    len(self.output.token_ids), failure)
        await self._open_target(after=failure)

    def _commit(self, proposal: pb.Proposal, verdict: pb.Verdict) -> list[int]:
        self.verdict = verdict  # the draft worker learns it with its next step
        self.length.update(len(proposal.ids), verdict.num_accepted)
        return list(proposal.ids[: verdict.num_accepted]) + [verdict.token]

    def observation(self) -> Observation:
        """What this request tells the routing policy."""
        s, t = self.stats, self.times
        return Observation(accepted=s.accepted, rejections=s.rejections, draft_tokens=s.proposed,
                           draft_seconds=sum(t.draft_steps), verify_passes=len(t.verify_steps),
                           verify_seconds=sum(t.verify_steps), verify_device_seconds=t.verify_device,
                           plain_passes=len(t.plain_steps), plain_seconds=sum(t.plain_steps),
                           plain_device_seconds=t.plain_device, accepted_per_position=s.accepted_per_position,
                           tested_per_position=s.tested_per_position)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


