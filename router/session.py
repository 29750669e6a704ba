"""One request through the cluster: propose, verify, commit, emit, over the workers' streams.

The router owns the truth (DESIGN.md invariant 2): the committed tokens live here, in the output
assembler; the workers' KV caches are derived from them. Proposals come from the request's
proposer (router/proposers.py: a draft model on a draft worker, or a draft-free one in the router)
and travel to the target replica as protobuf messages, untouched. Target-only, a request asks its
replica for a run of tokens and reads them as they come (no round trip each).

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
from .passes import PassLog
from .policy import Observation, Route
from .proposers import EMPTY_PROPOSAL, DraftFree, Proposer, ProposerGone
from .streams import SessionStream, WorkerFailed
from .tasks import ResolvedTask
from .token_tree import Proposers, accepted_ids, proposal_depth
from .validation import ValidRequest

log = logging.getLogger("specserve.router")
# Route reasons a session sets itself when its draft is not there: none could be opened, or it
# failed mid-request. The request goes on target-only: the target alone decides every token.
DRAFT_UNAVAILABLE, DRAFT_LOST = "unavailable", "lost"
# Per request. A request that keeps killing replicas (say, one whose prefill exhausts memory) must
# not take the whole fleet down with it, one resume at a time.
MAX_TARGET_RESUMES = 2
TARGET_POLL_SECONDS = 0.25  # while waiting for a target replica to resume on
# While every target replica is full: how often to try them again. A refusal costs the replica a
# microsecond (it checks its slots and pool before reading anything), the router one round trip.
FULL_POLL_SECONDS = 0.5
# The router gives up waiting this long before the client's deadline, so the client hears why
# (UNAVAILABLE, with the reason) rather than a bare DEADLINE_EXCEEDED.
DEADLINE_MARGIN_SECONDS = 0.25


class TargetUnavailable(NoWorker):
    """No target replica could take (or take back) the request in time: the client gets UNAVAILABLE."""


class TargetsFull(Exception):
    """Every target replica refused the request as full for the whole full wait: the client gets
    RESOURCE_EXHAUSTED, to back off and retry."""


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

    ``route.draft`` names its proposer (``proposers`` makes it): a draft model (drafting ahead with
    ``lookahead``, greedy requests only: router/model_draft.py), a draft-free one, or a token tree of
    several; None: target-only.

    ``deadline`` (time.monotonic(), None: none) is the client's: waits for a replica end before it.

    Target-only (no draft, or none left), the target decodes in runs of up to ``decode_run`` tokens:
    the router keeps that many granted ahead and reads the verdicts as they come, so the session
    stays in every batched pass of its replica rather than sitting out a round trip per token.
    """

    def __init__(self, request: ValidRequest, task: ResolvedTask, route: Route, length: DraftLength,
                 tokenizer: PreTrainedTokenizerBase, directory: WorkerDirectory, timeouts: TimeoutsConfig,
                 lookahead: bool = False, deadline: float | None = None, decode_run: int = 1,
                 proposers: Proposers | None = None) -> None:
        self.request = request
        self.task = task
        self.route = route
        self.length = length  # k per step
        self.directory = directory
        self.timeouts = timeouts
        self.deadline = deadline
        self.lookahead = lookahead and request.params.sampling.greedy
        self.decode_run = decode_run
        self.proposers = proposers or Proposers(DraftFree(), {})
        self.owed = 0  # target-only tokens granted to the target replica and not yet received
        self.pressure = 0.0  # sessions per target replica when it was routed (the service sets it)
        self.decoding = Decoding(tokenizer, request.prompt_ids, request.params, request.params.resolved_seed())
        self.times = StepTimes()
        self.session_id = uuid.uuid4().hex[:12]
        self.target: SessionStream | None = None
        self.proposer: Proposer | None = None  # None: target-only (from the start, or once it is gone)
        self.proposed_by: Proposer | None = None  # the proposer it had, for its counts after it is gone
        self.verdict: pb.Verdict | None = None  # the last one
        self.target_resumes = 0  # target replicas replaced mid-request
        # Target replicas that refused this request as full since it last had one, and since when
        # every registered one has (None: one has room, as far as the request knows).
        self.refused_by: set[str] = set()
        self.all_full_since: float | None = None
        self.full_refusals = 0  # over the whole request
        # Time spent recovering from failed workers: no measure of what speculation costs, so left
        # out of what the policy learns (its step costs, and the request's realized speed).
        self.recovery_seconds = 0.0
        self.started = time.perf_counter()
        self.first_token_seconds = 0.0
        self.first_chunk_tokens = 0

    @property
    def params(self) -> GenerationParams:
        return self.request.params

    @property
    def draft_reopens(self) -> int:
        """Draft workers replaced mid-request."""
        return getattr(self.proposed_by, "reopens", 0)

    async def run(self) -> AsyncIterator[Chunk]:
        finished = False
        try:
            await self._open_target()
            if self.route.draft:
                await self._open_proposer()
            while not self.decoding.finished:
                proposal = await self._propose()
                if self.proposer is not None:  # on the draft's device, while the target verifies
                    self.proposer.draft_ahead(proposal)
                verdict = await self._verify(proposal)
                chunk = self._commit(proposal, verdict)
                self._note_first(chunk)
                yield chunk  # emit
            if self.owed and self.target is not None:  # decoded past the end: drop the rest of the run
                self.target.cancel()
            if self.proposer is not None:
                await self.proposer.close()
            if self.target is not None:
                await self.target.close()
            finished = True
        finally:
            if not finished:  # cancelled or failed mid-way: free the sessions on the workers now
                self.abandon()

    # The loop's phases: propose, verify, commit (emit is the caller's).

    async def _propose(self) -> pb.Proposal:
        """The proposer's next proposal, or none (a target-only step): once it is gone, for good."""
        k = self.decoding.draft_length(self.length.k)
        if self.proposer is None:
            return EMPTY_PROPOSAL
        try:
            return await self.proposer.propose(k)
        except ProposerGone as exc:
            self._lose_draft(str(exc))
            return EMPTY_PROPOSAL

    async def _verify(self, proposal: pb.Proposal) -> pb.Verdict:
        """The target's verdict on the proposal. If its replica fails, the request moves to another
        (or the restarted one), re-prefilled from the committed tokens, and the step is asked again."""
        started = waited = time.perf_counter()
        reply = None
        while reply is None:
            try:
                reply = await self._target_answer(proposal)
            except WorkerFailed as exc:
                await self._resume_target(exc)
                waited = None  # this step's wait includes a prefill: no cost sample
        if waited is None:  # the whole step was a recovery: detecting the failure, waiting, re-prefilling
            self.count_recovery(started)
            self._room_again()  # a replica took it
        if self.verdict is not None and waited is not None:  # the prefill is no decode step: left out
            wait = time.perf_counter() - waited
            if self._runs(proposal):  # replies queued while the router was busy arrive at once, but
                wait = max(wait, reply.seconds)  # a token of a run costs at least its pass
            self.times.record(bool(proposal.ids), wait, reply)
        # A token tree counts as a proposal of its depth: what its accepted path could have reached.
        self.decoding.record_verify(proposal_depth(proposal), reply.verdict.num_accepted, reply.seconds)
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
        return not proposal.ids and self.proposer is None and self.decode_run > 1

    def _commit(self, proposal: pb.Proposal, verdict: pb.Verdict) -> Chunk:
        """Commit the verdict everywhere the router keeps it: the output, the k schedule, and the
        proposer (a draft worker learns it with its next step)."""
        self.verdict = verdict
        self.length.update(proposal_depth(proposal), verdict.num_accepted)
        if self.proposer is not None:
            self.proposer.commit(proposal, verdict)
        return self.decoding.commit(accepted_ids(proposal, verdict), verdict.num_accepted, verdict.token)

    def count_draft(self, proposal: pb.Proposal) -> None:
        """A proposal the proposer drafted (used or not: a lookahead that missed cost its time too)."""
        self.decoding.record_draft(len(proposal.ids), proposal.seconds)
        self.times.draft_passes.add(proposal.pass_info)

    def _note_first(self, chunk: Chunk) -> None:
        if not self.first_token_seconds:
            self.first_token_seconds = time.perf_counter() - self.started
            self.first_chunk_tokens = len(chunk.token_ids)

    # Workers: opening sessions, and surviving their failures (the router holds the truth).

    def abandon(self) -> None:
        """Cancel the request's sessions on every worker now (idempotent): its client is gone."""
        if self.target is not None:
            self.target.cancel()
        if self.proposer is not None:
            self.proposer.abandon()

    def opening(self, model: str = "", replaced: int = 0) -> pb.SessionOpen:
        """The open message of a session holding every committed token: the target's, or the draft
        ``model``'s. A worker replacing ``replaced`` failed ones draws from a seed of its own (fresh
        draws keep the target's distribution), so a replay with the same seed and the same faults
        gives the same output."""
        kind, replaced = ("draft", replaced) if model else ("target", self.target_resumes)
        seed = replacement_seed(self.decoding.stats.seed, kind, replaced)
        return pb.SessionOpen(session_id=self.session_id, prompt_ids=self.decoding.committed_ids(), model=model,
                              sampling=sampling_message(self.params.sampling, seed),
                              max_new_tokens=self.decoding.remaining, task=self.task.task)

    def count_recovery(self, started: float) -> None:
        """The time since ``started`` (perf_counter) went to recovering from a failed worker: left
        out of what the policy learns. Before the first token it is in first_token_seconds already."""
        if self.verdict is not None:
            self.recovery_seconds += time.perf_counter() - started

    def _before_deadline(self, give_up: float) -> float:
        """When to stop waiting: at ``give_up``, or just before the client's deadline if sooner."""
        return give_up if self.deadline is None else min(give_up, self.deadline - DEADLINE_MARGIN_SECONDS)

    async def _open_target(self, after: WorkerFailed | None = None) -> None:
        """A session on a target replica (the least loaded that has not refused this request as
        full), waiting for one to be registered (a replica restarting after a failure) until the
        target wait or the client's deadline, whichever is first."""
        give_up = self._before_deadline(time.monotonic() + self.timeouts.target_wait_seconds)
        while True:
            try:
                target = await self.directory.pick("target", avoid=self.refused_by)
                # A prefill is one step: the same timeout.
                self.target = self.directory.stream(target, self.timeouts.target_step_seconds)
                await self.target.send(pb.VerifyRequest(open=self.opening()))
                return
            except (NoWorker, WorkerFailed) as exc:
                if isinstance(exc, WorkerFailed):
                    self._drop(exc)
                self.refused_by.clear()  # waiting for a replica: those that were full may have room by then
                if time.monotonic() + TARGET_POLL_SECONDS >= give_up:
                    last = after or exc
                    raise TargetUnavailable(f"no target replica could serve request {self.session_id} "
                                            f"within {self.timeouts.target_wait_seconds:g} s or its deadline, "
                                            f"after {len(self.decoding.committed)} tokens ({last}); retry") from None
                await asyncio.sleep(TARGET_POLL_SECONDS)
                await self.directory.refresh(force=True)  # a restarted replica registers anew

    async def _open_proposer(self) -> None:
        """The route's proposer, ready to propose; none (target-only) when it cannot open."""
        try:
            self.proposer = self.proposed_by = self.proposers.make(self.route.draft, self)
            await self.proposer.open()
        except ProposerGone as exc:
            self._lose_draft(str(exc))

    def _drop(self, failure: WorkerFailed) -> None:
        """End the session on a failed target replica; new requests pass it over for a while."""
        if self.target is not None and self.target.worker.worker_id == failure.worker.worker_id:
            self.target.cancel()
            self.target = None
        if failure.broken:
            self.directory.mark_failed(failure.worker)

    def _lose_draft(self, why: str) -> None:
        """Go on target-only: the output does not depend on the draft, only the speed does."""
        log.warning("request %s continues target-only: draft %s: %s", self.session_id, self.route.draft, why)
        if self.proposer is not None:
            self.proposer.abandon()
            self.proposer = None
        drafted = self.decoding.stats.proposed > 0
        self.route = Route(self.route.draft if drafted else None, self.route.k if drafted else 0,
                           DRAFT_LOST if drafted else DRAFT_UNAVAILABLE)

    async def _resume_target(self, failure: WorkerFailed) -> None:
        self._drop(failure)
        self.owed = 0  # the failed replica's run is gone; the next one starts afresh
        if failure.full:  # refused at open: full, not failed
            await self._pass_on(failure)
            return
        self._room_again()  # it had a replica: the full wait, if it comes again, starts afresh
        if self.target_resumes >= MAX_TARGET_RESUMES:
            raise TargetUnavailable(f"request {self.session_id} lost its target replica "
                                    f"{self.target_resumes + 1} times; giving up ({failure}); retry") from None
        self.target_resumes += 1
        log.warning("request %s resumes after %d tokens on another target replica: %s", self.session_id,
                    len(self.decoding.committed), failure)
        await self._open_target(after=failure)

    async def _pass_on(self, refusal: WorkerFailed) -> None:
        """A replica refused the session as full (its session or KV cache limit): open it on one
        that has not refused it. Once every registered replica has, wait for room, trying them all
        again every FULL_POLL_SECONDS, up to the full wait or the client's deadline."""
        self.refused_by.add(refusal.worker.worker_id)
        self.full_refusals += 1
        replicas = {e.worker_id for e in await self.directory.available("target")}
        if replicas and replicas <= self.refused_by:  # (none at all: _open_target waits for one)
            now = time.monotonic()
            self.all_full_since = self.all_full_since or now
            give_up = self._before_deadline(self.all_full_since + self.timeouts.target_full_wait_seconds)
            if now >= give_up:
                raise TargetsFull(
                    f"every target replica is full (at its session or KV cache limit) and none freed room for "
                    f"request {self.session_id} within {self.timeouts.target_full_wait_seconds:g} s or its "
                    f"deadline ({refusal}); retry later, or add replicas (target.replicas) or raise "
                    f"target.kv_cache_mib / target.max_sessions") from None
            await asyncio.sleep(min(FULL_POLL_SECONDS, give_up - now))  # the last try at the end of the wait
            self.refused_by.clear()
        await self._open_target(after=refusal)

    def _room_again(self) -> None:
        """Forget the refusals: every replica may have room for this request again."""
        self.refused_by.clear()
        self.all_full_since = None

    # What the request tells the others.

    def observation(self) -> Observation:
        """What this request tells the routing policy."""
        s, t = self.decoding.stats, self.times
        return Observation(accepted=s.accepted, rejections=s.rejections,
                           misses=self.proposed_by.misses if self.proposed_by else 0, draft_tokens=s.proposed,
                           draft_seconds=sum(t.draft_steps), verify_passes=len(t.verify_steps),
                           verify_seconds=sum(t.verify_steps), verify_device_seconds=t.verify_device,
                           plain_passes=len(t.plain_steps), plain_seconds=sum(t.plain_steps),
                           plain_device_seconds=t.plain_device, accepted_per_position=s.accepted_per_position,
                           tested_per_position=s.tested_per_position, passes=t.pass_fit,
                           tokens=len(self.decoding.committed) - self.first_chunk_tokens,
                           seconds=max(self.elapsed() - self.first_token_seconds - self.recovery_seconds, 0.0),
                           pressure=self.pressure)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started
