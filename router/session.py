"""One request through the cluster: propose, verify, commit, emit, over the workers' streams.

The router owns the truth (DESIGN.md invariant 2): the committed tokens live here, in the output
assembler; the workers' KV caches are derived from them. A proposal travels from the draft worker
to the target replica as the same protobuf message, untouched; the verdict rides back to the draft
worker on its next step request, so a step costs one round trip to each worker.
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
from specserve.proto.v1 import internal_pb2_grpc as rpc
from specserve.workers.stats import SpecStats
from specserve.workers.stopping import Chunk, OutputAssembler
from specserve.workers.wire import sampling_message

from .directory import NoWorker, WorkerDirectory
from .draft_length import DraftLength
from .policy import Observation, Route
from .tasks import ResolvedTask
from .validation import ValidRequest

EMPTY_PROPOSAL = pb.Proposal()
log = logging.getLogger("specserve.router")
# Route reasons a session sets itself when its draft is not there: none could be opened, or it
# failed mid-request. The request goes on target-only: the target alone decides every token.
DRAFT_UNAVAILABLE, DRAFT_LOST = "unavailable", "lost"


class WorkerStreamEnded(Exception):
    """A worker closed its stream mid-session."""


class SessionStream:
    """One bidirectional session stream to a worker: write a request, read its answer."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call

    async def ask(self, request):
        await self.call.write(request)
        reply = await self.call.read()
        if reply is grpc.aio.EOF:
            raise WorkerStreamEnded("a worker ended its session stream unexpectedly")
        return reply

    async def close(self) -> None:
        """Half-close: the worker's handler ends and frees the session's cache."""
        if not self.call.done():
            try:
                await self.call.done_writing()
            except grpc.aio.UsageError:  # already finished
                pass

    def cancel(self) -> None:
        self.call.cancel()  # the worker sees the cancellation and frees the session too


@dataclass(frozen=True)
class Placement:
    """The workers one request runs on."""

    target_id: str
    draft_worker_id: str | None


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
    """

    def __init__(self, request: ValidRequest, task: ResolvedTask, route: Route, length: DraftLength,
                 tokenizer: PreTrainedTokenizerBase, directory: WorkerDirectory, lookahead: bool = False) -> None:
        self.request = request
        self.task = task
        self.route = route
        self.length = length  # k per step
        self.params = request.params
        self.directory = directory
        self.lookahead = lookahead and request.params.sampling.greedy
        self.stats = SpecStats(seed=request.params.resolved_seed())
        self.times = StepTimes()
        self.output = OutputAssembler(tokenizer, request.params.max_tokens, request.params.stop)
        self.session_id = uuid.uuid4().hex[:12]
        self.target: SessionStream | None = None
        self.drafter: SessionStream | None = None
        self.placement: Placement | None = None
        # The router's mirror of the draft session, in absolute lengths (see DraftStep): the tokens
        # it has committed, and where the proposal under verification starts in its last proposal.
        self.draft_committed = len(request.prompt_ids)
        self.draft_offset = 0
        self.verdict: pb.Verdict | None = None
        self.started = time.perf_counter()
        self.first_token_seconds = 0.0
        self.first_chunk_tokens = 0

    async def run(self) -> AsyncIterator[Chunk]:
        streams: list[SessionStream] = []
        ahead: asyncio.Task | None = None
        finished = False
        try:
            await self._open(streams)
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
            finished = True
            if ahead is not None and not ahead.done():  # drafted past the end: drop it with the session
                ahead.cancel()
                if self.drafter is not None:
                    self.drafter.cancel()
            for stream in streams:
                await stream.close()
        finally:
            if not finished:  # cancelled or failed mid-way: free the sessions on the workers now
                if ahead is not None:
                    ahead.cancel()
                for stream in streams:
                    stream.cancel()
            placed = (self.placement.target_id, self.placement.draft_worker_id) if self.placement else ()
            for worker_id in filter(None, placed):
                self.directory.load[worker_id] -= 1

    async def _open(self, streams: list[SessionStream]) -> None:
        opened = pb.SessionOpen(session_id=self.session_id, prompt_ids=self.request.prompt_ids,
                                sampling=sampling_message(self.params.sampling, self.stats.seed))
        target = await self.directory.pick("target")
        self.placement = Placement(target.worker_id, None)
        self.directory.load[target.worker_id] += 1
        self.target = SessionStream(rpc.VerifierStub(self.directory.channel(target)).Verify())
        streams.append(self.target)
        await self.target.call.write(pb.VerifyRequest(open=opened))
        if self.route.draft:
            await self._open_draft(opened, streams)

    async def _open_draft(self, opened: pb.SessionOpen, streams: list[SessionStream]) -> None:
        """A draft session on a worker serving the route's draft: a second worker if the first has
        failed, else none (target-only)."""
        opened.model = self.route.draft
        why = ""
        for _ in range(OPEN_ATTEMPTS):
            try:
                worker = await self.directory.pick("draft", self.route.draft)
            except NoWorker as exc:
                why = str(exc)
                break
            self.placement = Placement(self.placement.target_id, worker.worker_id)
            self.directory.load[worker.worker_id] += 1
            self.drafter = SessionStream(rpc.DrafterStub(self.directory.channel(worker)).Draft())
            streams.append(self.drafter)
            try:
                await self.drafter.call.write(pb.DraftRequest(open=opened))
                return
            except DRAFT_FAILURES as exc:
                if not _draft_lost(exc):
                    raise
                why = f"{worker.worker_id} at {worker.address} failed: {_describe(exc)}"
                self._drop_drafter()
        self._lose_draft(why)

    def _lose_draft(self, why: str) -> None:
        """Go on target-only: the output does not depend on the draft, only the speed does."""
        log.warning("request %s continues target-only: draft %s %s", self.session_id, self.route.draft, why)
        self._drop_drafter()
        drafted = self.stats.proposed > 0
        self.route = Route(self.route.draft if drafted else None, self.route.k if drafted else 0,
                           DRAFT_LOST if drafted else DRAFT_UNAVAILABLE)

    def _drop_drafter(self) -> None:
        """End the draft session; its worker is passed over by new requests for a while."""
        if self.drafter is not None:
            self.drafter.cancel()
            self.drafter = None
        if self.placement and self.placement.draft_worker_id:
            self.directory.load[self.placement.draft_worker_id] -= 1
            self.directory.mark_failed(self.placement.draft_worker_id)
            self.placement = Placement(self.placement.target_id, None)

    async def _propose(self, verified: pb.Proposal, ahead: asyncio.Task | None) -> pb.Proposal:
        """The next proposal, or none (a target-only step) once the draft worker has failed."""
        try:
            return await self._draft(verified, ahead)
        except DRAFT_FAILURES as exc:
            if not _draft_lost(exc):
                raise
            self._lose_draft(f"failed mid-request: {_describe(exc)}")
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
        if self.verdict is not None:  # keep what the verdict accepted, then the target's token
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
        self.draft_committed, self.draft_offset = keep + len(append), 0
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
        waited = time.perf_counter()
        reply = await self.target.ask(pb.VerifyRequest(step=proposal))
        if self.verdict is not None:  # the prefill is no decode step: the cost model leaves it out
            self.times.record(bool(proposal.ids), time.perf_counter() - waited, reply.seconds)
        self.stats.verify_seconds += reply.seconds
        self.stats.record_step(len(proposal.ids), reply.verdict.num_accepted)
        return reply.verdict

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


OPEN_ATTEMPTS = 2  # draft workers tried before a request goes target-only
# How a draft worker's failure surfaces on its stream: an RPC error or the stream ended. Only those
# below mean the worker is gone, stuck or full; any other status is a bug and fails the request.
DRAFT_FAILURES = (grpc.aio.AioRpcError, WorkerStreamEnded)
LOST_STATUSES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                           grpc.StatusCode.RESOURCE_EXHAUSTED})


def _draft_lost(exc: Exception) -> bool:
    return not isinstance(exc, grpc.aio.AioRpcError) or exc.code() in LOST_STATUSES


def _describe(exc: Exception) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__
