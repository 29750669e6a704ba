"""Workers for the router's Session without Ray or gRPC: fake streams answered by the workers' own
session code (``target_session``, ``opened_drafter``) in process, each step run alone or, given a
``Scheduler``, in batched passes shared with other sessions' steps, as on a real worker."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import grpc

from specserve.proto.v1 import internal_pb2 as pb
from specserve.router.directory import NoWorker
from specserve.router.streams import WorkerFailed
from specserve.workers.batching import Scheduler, StepResult
from specserve.workers.draft_worker import opened_drafter, proposal_reply
from specserve.workers.token_bridge import TokenBridge, bridged_capacity
from specserve.workers.kv_pool import PoolFull
from specserve.workers.logprobs import TokenLogprobs
from specserve.workers.model_host import reserved_length
from specserve.workers.ragged_pass import PooledSequence
from specserve.workers.registry import Endpoint
from specserve.workers.steps import private_sequence, run_alone
from specserve.workers.grammar import no_grammars
from specserve.workers.target_replica import target_session
from specserve.workers.wire import logprobs_message, proposal_from, step_from, verdict_message

DRAFT = "echo"  # a draft that is the target model itself: it proposes the target's own greedy tokens
# Corruptions: a draft reply's token at this position is replaced by another token (``swap``: by
# the draft's runner-up there, the token becoming the runner-up, and no runner-up elsewhere: the
# target's correction is then the one a branch forked there assumes, and branches fork there. A
# lookahead's position counts from its first proposed token, after its guess).
Corrupt = Callable[[int], int | None]  # (the worker's step number) -> position to corrupt, or None


class FakeWorker:
    """One worker: it answers its sessions' steps with the workers' own code, and can fail."""

    def __init__(self, kind: str, name: str, model, corrupt: Corrupt = lambda step: None,
                 fail_at_step: int | None = None, scheduler: Scheduler | None = None,
                 fail_at_token: int | None = None, max_sessions: int | None = None, swap: bool = False,
                 grammars=no_grammars, bridge: TokenBridge | None = None) -> None:
        self.endpoint = Endpoint(kind, name, f"fake:{name}", (DRAFT,) if kind == "draft" else ("target",))
        self.model = model
        self.corrupt = corrupt
        self.swap = swap
        self.fail_at_step = fail_at_step  # its n-th step (over all its sessions) fails: UNAVAILABLE
        self.fail_at_token = fail_at_token  # so does the n-th decode-run reply the router reads
        self.tokens_read = 0
        self.steps = 0
        self.dead = False
        self.verdicts: list[int] = []  # num_accepted of every verdict it gave
        self.proposals: list[pb.Proposal] = []  # every proposal it verified
        self.opened: list[int] = []  # the length of every session it opened
        self.max_sessions = max_sessions  # beyond it (or its pool's budget) it refuses a session as full
        self.live = 0
        self.refused = 0  # sessions it refused as full
        self.streams: list[FakeStream] = []
        self.scheduler = scheduler  # steps share batched passes with other sessions' (else each runs alone)
        self.grammars = grammars  # a target's structured output (a GrammarCompiler's maker)
        self.bridge = bridge  # a draft of another tokenizer than the target's

    def open(self, opened: pb.SessionOpen):
        """The session ``opened`` asks for; WorkerFailed (RESOURCE_EXHAUSTED) when it is full, as a
        real worker's SessionLimit answers."""
        capacity, prompt = reserved_length(opened, self.model), list(opened.prompt_ids)
        if self.bridge is not None:
            encoded = self.bridge.encode(prompt)
            capacity, prompt = bridged_capacity(capacity, len(prompt), len(encoded)), encoded
        try:
            if self.max_sessions is not None and self.live >= self.max_sessions:
                raise PoolFull(f"holds its limit of {self.max_sessions} sessions")
            if self.scheduler:
                sequence = PooledSequence(self.scheduler.pool.take(capacity), prompt, self.scheduler.pool)
            else:
                self.pool, sequence = private_sequence(self.model, prompt, capacity)
        except PoolFull as exc:
            self.refused += 1
            return WorkerFailed(self.endpoint, f"refused the session: RESOURCE_EXHAUSTED: {exc}",
                                grpc.StatusCode.RESOURCE_EXHAUSTED, full=True)
        self.opened.append(len(opened.prompt_ids))
        self.live += 1
        if self.endpoint.kind == "target":
            return target_session(sequence, opened, self.grammars)
        return opened_drafter(sequence, opened, self.grammars, self.bridge)

    def close(self, session) -> None:
        self.live -= 1
        if self.scheduler and session is not None:
            self.scheduler.release(session.sequence.region if self.endpoint.kind == "target"
                                   else session.session.sequence.region)

    async def run(self, step):
        if self.scheduler:
            return (await self.scheduler.run(step)).result
        return run_alone(self.model, self.pool, step)

    async def answer(self, session, request):
        self._count_step()
        if self.endpoint.kind == "target":
            self.proposals.append(request.step)
            verdict = await self.run(session.step(proposal_from(request.step)))
            self.verdicts.append(verdict.num_accepted)
            return with_logprobs(pb.VerifyReply(verdict=verdict_message(verdict), ended=session.ended),
                                 session.take_logprobs())
        run = session.step(step_from(request.step))
        await self.run(run)
        if session.branch is not None:  # on a worker, in the same passes; here after the lookahead
            await self.run(session.branch)
        reply = proposal_reply(session, run, StepResult(run.result, 0.0, 0, 0, 0.0))
        position = self.corrupt(self.steps)
        if self.swap and position is not None and request.step.guess:
            position += 1
        if position is not None and position < len(reply.ids):
            if self.swap:
                ids, runner_up, token_p = list(reply.ids), list(reply.runner_up), list(reply.token_p)
                ids[position], runner_up[position] = runner_up[position], ids[position]
                token_p[position] = reply.runner_up_p[position]
                reply.runner_up_p[:] = [reply.token_p[position] if i == position else 0.0 for i in range(len(ids))]
                reply.ids[:], reply.runner_up[:], reply.token_p[:] = ids, runner_up, token_p
            else:
                reply.ids[position] = (reply.ids[position] + 1) % self.model.config.vocab_size
        return reply


    async def decode(self, session, n: int) -> list[pb.VerifyReply]:
        """A target-only decode run's replies (all of them once the run is done)."""
        self._count_step()
        verdicts = await self.run(session.decode(n))
        self.verdicts.extend(v.num_accepted for v in verdicts)
        logprobs = session.take_logprobs()  # one token a verdict
        last = len(verdicts) - 1  # a run ends at the verdict that ended the text, if one did
        return [with_logprobs(pb.VerifyReply(verdict=verdict_message(v), ended=session.ended if i == last else ""),
                              logprobs and TokenLogprobs(logprobs.chosen[i:i + 1], logprobs.top_ids[i:i + 1],
                                                         logprobs.top[i:i + 1]))
                for i, v in enumerate(verdicts)]

    def _count_step(self) -> None:
        self.steps += 1
        if self.dead or self.steps == self.fail_at_step:
            self.dead = True
            raise WorkerFailed(self.endpoint, "failed: UNAVAILABLE: killed by the test", grpc.StatusCode.UNAVAILABLE)


def with_logprobs(reply: pb.VerifyReply, logprobs: TokenLogprobs | None) -> pb.VerifyReply:
    """The reply with its tokens' logprobs, as a replica sends them (target_replica.verify_reply)."""
    if logprobs is not None:
        reply.logprobs.CopyFrom(logprobs_message(logprobs))
    return reply


class FakeStream:
    """A session stream as ``WorkerStream`` offers it: send the open or a decode run, ask a step,
    receive a decode run's replies, close, cancel."""

    def __init__(self, worker: FakeWorker) -> None:
        self.worker = worker.endpoint
        self.owner = worker
        self.session = None
        self.closed = self.cancelled = False
        self.unread: list = []  # replies to requests sent without waiting (a decode run's, a step's), not yet received
        self.decode_runs: list[int] = []  # the tokens each decode request asked for
        self.written = self.answered = 0  # requests are answered in the order they were written, as on the wire

    async def send(self, request) -> None:
        async with self._in_order():
            if self.owner.dead:
                raise WorkerFailed(self.worker, "failed: UNAVAILABLE: gone", grpc.StatusCode.UNAVAILABLE)
            kind = request.WhichOneof("kind")
            if kind == "decode":
                self.decode_runs.append(request.decode)
                if not isinstance(self.session, WorkerFailed):  # else written to a refused stream: the read says so
                    self.unread += await self.owner.decode(self.session, request.decode)
            elif kind == "step":  # its answer is read later, after the stale lookahead's it follows
                if not isinstance(self.session, WorkerFailed):
                    self.unread.append(await self.owner.answer(self.session, request))
            else:
                self.session = self.owner.open(request.open)

    async def ask(self, request):
        async with self._in_order():
            self._refused()
            return await self.owner.answer(self.session, request)

    @contextlib.asynccontextmanager
    async def _in_order(self):
        turn, self.written = self.written, self.written + 1
        await asyncio.sleep(0)  # let a lookahead interleave with the verify step, as on the wire
        while self.answered < turn:
            await asyncio.sleep(0)
        try:
            yield
        finally:
            self.answered += 1

    async def receive(self):
        await asyncio.sleep(0)
        self._refused()
        self.owner.tokens_read += 1
        if self.owner.dead or self.owner.tokens_read == self.owner.fail_at_token:
            self.owner.dead = True
            raise WorkerFailed(self.worker, "failed: UNAVAILABLE: killed mid-run by the test", grpc.StatusCode.UNAVAILABLE)
        return self.unread.pop(0)

    def ready(self):
        """As ``WorkerStream.ready``: a reply already here, taken without waiting (None: none yet,
        or a failure the next ``receive`` raises)."""
        owner = self.owner
        if (not self.unread or isinstance(self.session, WorkerFailed) or owner.dead
                or owner.tokens_read + 1 == owner.fail_at_token):
            return None
        owner.tokens_read += 1
        return self.unread.pop(0)

    async def close(self) -> None:
        self.closed = True
        self._end()

    def cancel(self) -> None:
        self.cancelled = True
        self._end()

    def _refused(self) -> None:
        """A refused open surfaces at the stream's first read, as on the wire."""
        if isinstance(self.session, WorkerFailed):
            refusal, self.session = self.session, None
            raise refusal

    def _end(self) -> None:
        if self.session is not None and not isinstance(self.session, WorkerFailed):  # the session's memory goes back once, however the stream ends
            self.owner.close(self.session)
            self.session = None


class FakeDirectory:
    """The router's view of the workers (``WorkerDirectory``'s interface) over fake workers."""

    def __init__(self, *workers: FakeWorker) -> None:
        self.workers = {w.endpoint.worker_id: w for w in workers}
        self.failed: list[str] = []

    async def refresh(self, force: bool = False) -> list[Endpoint]:
        """Every worker, dead ones too: the registry lists a dead worker until its entry expires."""
        return [w.endpoint for w in self.workers.values()]

    async def available(self, kind: str, model: str | None = None) -> list[Endpoint]:
        return [e for e in await self.refresh() if e.kind == kind and (model is None or model in e.models)
                and e.worker_id not in self.failed]

    def serves(self, model: str) -> bool:
        return any(model in w.endpoint.models for w in self.workers.values())

    async def pick(self, kind: str, model: str | None = None, avoid=()) -> Endpoint:
        """The first available worker not in ``avoid`` (the fakes keep no load)."""
        for endpoint in await self.available(kind, model):
            if endpoint.worker_id not in avoid:
                return endpoint
        raise NoWorker(f"no {kind} worker")

    async def pick_for(self, kind: str, model: str | None = None, avoid=(), prompt=()) -> tuple[Endpoint, str]:
        return await self.pick(kind, model, avoid), "load"

    def mark_failed(self, worker: Endpoint) -> None:
        self.failed.append(worker.worker_id)

    def target_pressure(self) -> float:
        return 0.0

    def target_pass_cap(self) -> int:
        return 0

    def target_pass_times(self) -> tuple[tuple[int, float], ...]:
        return ()  # fake replicas time no pass at start-up

    def stream(self, worker: Endpoint, step_timeout: float, first_step_timeout: float | None = None) -> FakeStream:
        stream = FakeStream(self.workers[worker.worker_id])
        self.workers[worker.worker_id].streams.append(stream)
        return stream
