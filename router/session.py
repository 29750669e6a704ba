"""One request through the cluster: propose, verify, commit, emit, over the workers' streams.

The router owns the truth (DESIGN.md invariant 2): the committed tokens live here, in the output
assembler; the workers' KV caches are derived from them. A proposal travels from the draft worker
to the target replica as the same protobuf message, untouched; the verdict rides back to the draft
worker on its next step request, so a step costs one round trip to each worker. Target-only, a
request asks its replica for a run of tokens and reads them as they come (no round trip each).

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

from specserve.proto.v1 import internal_pb2 as pb
from specserve.workers.decoding import Decoding
from specserve.workers.request import GenerationParams
from specserve.workers.seeds import replacement_seed
from specserve.workers.stopping import Chunk
from specserve.workers.wire import sampling_message

from .config import TimeoutsConfig
from .cost_model import PassFit
from .directory import NoWorker, WorkerDirectory
from .draft_length import DraftLength
from .draft_mirror import DraftMirror
from .passes import PassLog
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
    """What the router waited for per step, what the workers computed, and the batched passes the
    steps ran in, over one request (decode steps: a prefill's wait and pass are no step's price)."""

    draft_steps: list[float] = field(default_factory=list)  # waits for proposals (a lookahead hit: ~0)
    verify_steps: list[float] = field(default_factory=list)  # waits for verdicts on proposals
    plain_steps: list[float] = field(default_factory=list)  # waits for target-only passes
    verify_device: float = 0.0
    plain_device: float = 0.0
    target_passes: PassLog = field(default_factory=PassLog)  # the batch each verify step ran in
    draft_passes: PassLog = field(default_factory=PassLog)  # and each proposal (its last pass)
    pass_fit: PassFit = field(default_factory=PassFit)  # (tokens, device seconds) of those target passes

    def record(self, drafted: bool, wait: float, reply: pb.VerifyReply) -> None:
        if drafted:
            self.verify_steps.append(wait)
            self.verify_device += reply.seconds
        else:
            self.plain_steps.append(wait)
            self.plain_device += reply.seconds
        self.target_passes.add(reply.pass_info)
        self.pass_fit.add(reply.pass_info.tokens, reply.seconds, reply.pass_info.sessions)


class Session:
    """A request in flight. Iterate ``run()`` for chunks as they are committed.

    With ``lookahead`` (greedy requests only), the draft worker drafts the next proposal while the
    target verifies this one, as if all of it will be accepted, one token further (its guess of the
    target's own token). When the verdict agrees, the next proposal is ready at once; when it does
    not, the draft is rewound by a length and drafts again. Greedy output does not depend on what
    was proposed, so this changes speed only.

    ``deadline`` (time.monotonic(), None: none) is the client's: waits for a replica end before it.

    Target-only (no draft, or none left), the target decodes in runs of up to ``decode_run`` tokens:
    the router keeps that many granted ahead and reads the verdicts as they come, so the session
    stays in every batched pass of its replica rather than sitting out a round trip per token.
    """

    def __init__(self, request: ValidRequest, task: ResolvedTask, route: Route, length: DraftLength,
                 tokenizer: PreTrainedTokenizerBase, directory: WorkerDirectory, timeouts: TimeoutsConfig,
                 lookahead: bool = False, deadline: float | None = None, decode_run: int = 1) -> None:
        self.request = request
        self.task = task
        self.route = route
        self.length = length  # k per step
        self.directory = directory
        self.timeouts = timeouts
        self.deadline = deadline
        self.lookahead = lookahead and request.params.sampling.greedy
        self.decode_run = decode_run
        self.owed = 0  # target-only tokens granted to the target replica and not yet received
        self.pressure = 0.0  # sessions per target replica when it was routed (the service sets it)
        self.decoding = Decoding(tokenizer, request.prompt_ids, request.params, request.params.resolved_seed())
        self.times = StepTimes()
        self.session_id = uuid.uuid4().hex[:12]
        self.target: SessionStream | None = None
        self.drafter: SessionStream | None = None
        self.mirror = DraftMirror(len(request.prompt_ids))  # the draft session's tokens, as the router knows them
        self.verdict: pb.Verdict | None = None  # the last one
        self.target_resumes = 0  # target replicas replaced mid-request
        self.draft_reopens = 0  # draft workers replaced mid-request
        self.started = time.perf_counter()
        self.first_token_seconds = 0.0
        self.first_chunk_tokens = 0

    @property
    def params(self) -> GenerationParams:
        return self.request.params

    async def run(self) -> AsyncIterator[Chunk]:
        ahead: asyncio.Task | None = None
        finished = False
        try:
            await self._open_target()
            if self.route.draft:
                await self._open_draft()
            proposal = EMPTY_PROPOSAL
            while not self.decoding.finished:
                proposal = await self._propose(proposal, ahead)
                ahead = self._draft_ahead(proposal)  # on the draft's device, while the target verifies
                verdict = await self._verify(proposal)
                chunk = self._commit(proposal, verdict)
                self._note_first(chunk)
                yield chunk  # emit
            if ahead is not None and not ahead.done():  # drafted past the end: drop it with the session
                ahead.cancel()
                if self.drafter is not None:
                    self.drafter.cancel()
            if self.owed and self.target is not None:  # decoded past the end: drop the rest of the run
                self.target.cancel()
            for stream in self._streams():
                await stream.close()
            finished = True
        finally:
            if not finished:  # cancelled or failed mid-way: free the sessions on the workers now
                if ahead is not None:
                    ahead.cancel()
                self.abandon()

    # The loop's phases: propose, verify, commit (emit is the caller's).

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

    async def _verify(self, proposal: pb.Proposal) -> pb.Verdict:
        """The target's verdict on the proposal. If its replica fails, the request moves to another
        (or the restarted one), re-prefilled from the committed tokens, and the step is asked again."""
        waited = time.perf_counter()
        reply = None
        while reply is None:
            try:
                reply = await self._target_answer(proposal)
            except WorkerFailed as exc:
                await self._resume_target(exc)
                waited = None  # this step's wait includes a prefill: no cost sample
        if self.verdict is not None and waited is not None:  # the prefill is no decode step: left out
            wait = time.perf_counter() - waited
            if self._runs(proposal):  # replies queued while the router was busy arrive at once, but
                wait = max(wait, reply.seconds)  # a token of a run costs at least its pass
            self.times.record(bool(proposal.ids), wait, reply)
        self.decoding.record_verify(len(proposal.ids), reply.verdict.num_accepted, reply.seconds)
        return reply.verdict

    async def _target_answer(self, proposal: pb.Proposal) -> pb.VerifyReply:
        """The target's answer to this step: one round trip, or target-only for good, the next token
        of a decode run, topped up to ``decode_run`` tokens ahead once half of it has arrived (never
        past the request's token budget)."""
        if not self._runs(proposal):
            return await self.target.ask(pb.VerifyRequest(step=proposal))
        ungranted = self.decoding.remaining - self.owed
        if self.owed <= self.decode_run // 2 and ungranted > 0:
            grant = min(self.decode_run - self.owed, ungranted)
            await self.target.send(pb.VerifyRequest(decode=grant))
            self.owed += grant
        reply = await self.target.receive()
        self.owed -= 1
        return reply

    def _runs(self, proposal: pb.Proposal) -> bool:
        """Is this step a token of a decode run? (Target-only for good: no draft, none to come.)"""
        return not proposal.ids and self.drafter is None and self.decode_run > 1

    def _commit(self, proposal: pb.Proposal, verdict: pb.Verdict) -> Chunk:
        """Commit the verdict everywhere the router keeps it: the output, the k schedule, and the
        draft session's mirror (the draft worker learns it with its next step)."""
        self.verdict = verdict
        self.length.update(len(proposal.ids), verdict.num_accepted)
        self.mirror.verdict(verdict.num_accepted, verdict.token)
        return self.decoding.commit(proposal.ids, verdict.num_accepted, verdict.token)

    # Drafting.

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
        k = self.decoding.draft_length(self.length.k)
        if not self.drafter or k < 1:
            return EMPTY_PROPOSAL
        if drafted is not None and self._guessed(verified, drafted):
            self.decoding.stats.lookahead_hits += 1
            self.mirror.lookahead_hit()
            self.times.draft_steps.append(time.perf_counter() - waited)
            return pb.Proposal(ids=drafted.ids[1 : k + 1], q=drafted.q[1 : k + 1])
        proposal = await self.drafter.ask(pb.DraftRequest(step=self.mirror.step(k, self.length.min_confidence)))
        self.times.draft_steps.append(time.perf_counter() - waited)
        self._count_draft(proposal)
        return proposal

    def _guessed(self, verified: pb.Proposal, drafted: pb.Proposal) -> bool:
        """Did the lookahead assume the verdict: all of ``verified`` accepted, and its first token
        the target's own? (It then holds at least one more token, the next proposal.)"""
        return (len(drafted.ids) > 1 and self.verdict.num_accepted == len(verified.ids)
                and drafted.ids[0] == self.verdict.token)

    def _draft_ahead(self, proposal: pb.Proposal) -> asyncio.Task | None:
        """Ask the draft for the proposal after this one, assuming all of this one is accepted."""
        after_all_accepted = self.decoding.remaining - len(proposal.ids) - 1
        next_k = self.length.next_k(len(proposal.ids), len(proposal.ids))
        k = min(next_k, after_all_accepted - 1) + 1  # one more: its guess of the target's token
        if not (self.lookahead and self.drafter and (proposal.ids or self.verdict is None) and k >= 2):
            return None
        self.decoding.stats.lookaheads += 1
        step = self.mirror.ahead(len(proposal.ids), k, self.length.min_confidence)
        task = asyncio.create_task(self.drafter.ask(pb.DraftRequest(step=step)))
        # A lookahead may fail unawaited (the session ends first); mark its error as seen, or asyncio
        # logs "exception never retrieved". One that is awaited raises there as usual.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    def _count_draft(self, proposal: pb.Proposal) -> None:
        self.decoding.record_draft(len(proposal.ids), proposal.seconds)
        self.times.draft_passes.add(proposal.pass_info)

    def _note_first(self, chunk: Chunk) -> None:
        if not self.first_token_seconds:
            self.first_token_seconds = time.perf_counter() - self.started
            self.first_chunk_tokens = len(chunk.token_ids)

    # Workers: opening sessions, and surviving their failures (the router holds the truth).

    def abandon(self) -> None:
        """Cancel the request's sessions on every worker now (idempotent): its client is gone."""
        for stream in self._streams():
            stream.cancel()

    def _streams(self) -> list[SessionStream]:
        return [s for s in (self.target, self.drafter) if s is not None]

    def _opening(self, model: str = "") -> pb.SessionOpen:
        """The open message of a session holding every committed token. A worker replacing a failed
        one draws from a seed of its own (fresh draws keep the target's distribution), so a replay
        with the same seed and the same faults gives the same output."""
        kind, replaced = ("draft", self.draft_reopens) if model else ("target", self.target_resumes)
        seed = replacement_seed(self.decoding.stats.seed, kind, replaced)
        return pb.SessionOpen(session_id=self.session_id, prompt_ids=self.decoding.committed_ids(), model=model,
                              sampling=sampling_message(self.params.sampling, seed),
                              max_new_tokens=self.decoding.remaining, task=self.task.task)

    async def _open_target(self, after: WorkerFailed | None = None) -> None:
        """A session on a target replica, waiting for one to be registered (a replica restarting
        after a failure) until the target wait or the client's deadline, whichever is first."""
        give_up = time.monotonic() + self.timeouts.target_wait_seconds
        if self.deadline is not None:
            give_up = min(give_up, self.deadline - DEADLINE_MARGIN_SECONDS)
        while True:
            try:
                target = await self.directory.pick("target")
                # A prefill is one step: the same timeout.
                self.target = self.directory.stream(target, self.timeouts.target_step_seconds)
                await self.target.send(pb.VerifyRequest(open=self._opening()))
                return
            except (NoWorker, WorkerFailed) as exc:
                if isinstance(exc, WorkerFailed):
                    self._drop(exc)
                if time.monotonic() + TARGET_POLL_SECONDS >= give_up:
                    last = after or exc
                    raise TargetUnavailable(f"no target replica could serve request {self.session_id} "
                                            f"within {self.timeouts.target_wait_seconds:g} s or its deadline, "
                                            f"after {len(self.decoding.committed)} tokens ({last}); retry") from None
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
            self.drafter = self.directory.stream(worker, self.timeouts.draft_step_seconds,
                                                 first_step_timeout=self.timeouts.draft_prefill_seconds)
            try:
                opening = self._opening(self.route.draft)
                await self.drafter.send(pb.DraftRequest(open=opening))
                self.mirror.reopen(len(opening.prompt_ids))
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
        drafted = self.decoding.stats.proposed > 0
        self.route = Route(self.route.draft if drafted else None, self.route.k if drafted else 0,
                           DRAFT_LOST if drafted else DRAFT_UNAVAILABLE)

    async def _resume_target(self, failure: WorkerFailed) -> None:
        self._drop(failure)
        if failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not self.decoding.committed:
            raise failure  # every replica is full: the client backs off (RESOURCE_EXHAUSTED)
        if self.target_resumes >= MAX_TARGET_RESUMES:
            raise TargetUnavailable(f"request {self.session_id} lost its target replica "
                                    f"{self.target_resumes + 1} times; giving up ({failure}); retry") from None
        self.target_resumes += 1
        self.owed = 0  # the failed replica's run is gone; the next one starts afresh
        log.warning("request %s resumes after %d tokens on another target replica: %s", self.session_id,
                    len(self.decoding.committed), failure)
        await self._open_target(after=failure)

    # What the request tells the others.

    def observation(self) -> Observation:
        """What this request tells the routing policy."""
        s, t = self.decoding.stats, self.times
        return Observation(accepted=s.accepted, rejections=s.rejections, draft_tokens=s.proposed,
                           draft_seconds=sum(t.draft_steps), verify_passes=len(t.verify_steps),
                           verify_seconds=sum(t.verify_steps), verify_device_seconds=t.verify_device,
                           plain_passes=len(t.plain_steps), plain_seconds=sum(t.plain_steps),
                           plain_device_seconds=t.plain_device, accepted_per_position=s.accepted_per_position,
                           tested_per_position=s.tested_per_position, passes=t.pass_fit,
                           tokens=len(self.decoding.committed) - self.first_chunk_tokens,
                           seconds=self.elapsed() - self.first_token_seconds, pressure=self.pressure)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started
