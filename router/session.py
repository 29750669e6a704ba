"""One request through the cluster: propose, verify, commit, emit, over the workers' streams.

The router owns the truth (DESIGN.md invariant 2): the committed tokens live here, in the output
assembler; the workers' KV caches are derived from them. A proposal travels from the draft worker
to the target replica as the same protobuf message, untouched; the verdict rides back to the draft
worker on its next step request, so a step costs one round trip to each worker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from transformers import PreTrainedTokenizerBase

from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc
from specserve.workers.engine import Completion
from specserve.workers.stats import SpecStats
from specserve.workers.stopping import Chunk, OutputAssembler
from specserve.workers.wire import sampling_message

from .directory import WorkerDirectory
from .validation import ValidRequest

EMPTY_PROPOSAL = pb.Proposal()


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
class Route:
    """Where one request runs."""

    task: str
    draft: str | None
    target_id: str
    draft_worker_id: str | None


class Session:
    """A request in flight. Iterate ``run()`` for chunks as they are committed."""

    def __init__(self, request: ValidRequest, tokenizer: PreTrainedTokenizerBase, directory: WorkerDirectory) -> None:
        self.request = request
        self.params = request.params
        self.directory = directory
        self.stats = SpecStats(seed=request.params.resolved_seed())
        self.output = OutputAssembler(tokenizer, request.params.max_tokens, request.params.stop)
        self.session_id = uuid.uuid4().hex[:12]
        self.target: SessionStream | None = None
        self.drafter: SessionStream | None = None
        self.route: Route | None = None
        self.last_verdict: pb.Verdict | None = None
        self.started = time.perf_counter()
        self.first_token_seconds = 0.0

    async def run(self) -> AsyncIterator[Chunk]:
        streams: list[SessionStream] = []
        finished = False
        try:
            await self._open(streams)
            while not self.output.finish_reason:
                proposal = await self._propose()
                verdict = await self._verify(proposal)
                tokens = self._commit(proposal, verdict)
                chunk = self.output.add(tokens)  # emit
                if not self.first_token_seconds:
                    self.first_token_seconds = time.perf_counter() - self.started
                yield chunk
            finished = True
            for stream in streams:
                await stream.close()
        finally:
            if not finished:  # cancelled or failed mid-way: free the sessions on the workers now
                for stream in streams:
                    stream.cancel()
            for worker_id in filter(None, (self.route.target_id, self.route.draft_worker_id) if self.route else ()):
                self.directory.load[worker_id] -= 1

    async def _open(self, streams: list[SessionStream]) -> None:
        opened = pb.SessionOpen(session_id=self.session_id, prompt_ids=self.request.prompt_ids,
                                sampling=sampling_message(self.params.sampling, self.stats.seed))
        target = await self.directory.pick("target")
        draft_worker = await self.directory.pick("draft", self.request.draft) if self.request.draft else None
        self.route = Route(self.request.task, self.request.draft, target.worker_id,
                           draft_worker.worker_id if draft_worker else None)
        self.directory.load[target.worker_id] += 1
        self.target = SessionStream(rpc.VerifierStub(self.directory.channel(target)).Verify())
        streams.append(self.target)
        await self.target.call.write(pb.VerifyRequest(open=opened))
        if draft_worker:
            self.directory.load[draft_worker.worker_id] += 1
            self.drafter = SessionStream(rpc.DrafterStub(self.directory.channel(draft_worker)).Draft())
            streams.append(self.drafter)
            opened.model = self.request.draft
            await self.drafter.call.write(pb.DraftRequest(open=opened))

    async def _propose(self) -> pb.Proposal:
        # k + 1 tokens may be committed per step; never draft past max_tokens.
        k = min(self.params.k, self.output.remaining - 1)
        if not self.drafter or k < 1:
            return EMPTY_PROPOSAL
        proposal = await self.drafter.ask(pb.DraftRequest(step=pb.DraftStep(k=k, previous=self.last_verdict)))
        self.stats.draft_seconds += proposal.seconds
        self.stats.draft_passes += k
        return proposal

    async def _verify(self, proposal: pb.Proposal) -> pb.Verdict:
        reply = await self.target.ask(pb.VerifyRequest(step=proposal))
        self.stats.verify_seconds += reply.seconds
        self.stats.record_step(len(proposal.ids), reply.verdict.num_accepted)
        return reply.verdict

    def _commit(self, proposal: pb.Proposal, verdict: pb.Verdict) -> list[int]:
        # The draft worker commits the verdict with its next step. Once k drops below 1 near
        # max_tokens the draft is not asked again, so it never misses a verdict it would need.
        self.last_verdict = verdict
        return list(proposal.ids[: verdict.num_accepted]) + [verdict.token]

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def completion(self) -> Completion:
        out = self.output
        return Completion(out.text, out.token_ids, out.finish_reason or "length", self.stats, self.request.draft)
