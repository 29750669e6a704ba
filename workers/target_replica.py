"""A target replica: a Ray Serve deployment holding the target model on its own device.

Each Verify stream is one session with its own region of the replica's KV pool. A step is one
proposal (possibly empty: target-only decoding); the replica's scheduler verifies it in a forward
pass shared with the steps of other sessions pending at that moment (continuous batching), commits
the verdict to the session's cache and answers with the verdict. A session decoding target-only
asks for a run of tokens instead, answered one reply per pass while it stays in the batch. Serve
deploys, places and restarts replicas; the per-step traffic goes over the stream, never through
Serve handles (a handle hop costs ~4 ms).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc

from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc

from .acceptance import Verdict
from .batching import Scheduler, StepResult
from .config import TargetConfig
from .loading import ModelSpec, load_model
from .model_host import ModelHost, SessionIdle, SessionLimit, first_open
from .ragged_pass import PooledSequence
from .registry import Registration
from .seeds import request_generators
from .verifying import DecodeRun, TargetSession
from .wire import pass_info, proposal_from, sampling_from, verdict_message


class TargetReplica:
    """The Serve deployment class (options applied in ``cluster/app.py``)."""

    def __init__(self, config: dict, target: ModelSpec, registration: Registration) -> None:
        cfg = TargetConfig.model_validate(config)  # plain data across Serve, checked again here
        servicer = VerifierServicer(self)
        self.host = ModelHost("target", f"target-{uuid.uuid4().hex[:8]}", {"target": load_model(target)}, cfg,
                              registration, lambda server: rpc.add_VerifierServicer_to_server(servicer, server))

    def check_health(self) -> None:
        """Serve restarts a replica whose stream server has died."""
        if not self.host.server.alive:
            raise RuntimeError(f"target replica {self.host.worker_id}: its gRPC server stopped")

    def __del__(self) -> None:
        host = getattr(self, "host", None)
        if host is not None:
            host.shutdown()


def target_session(sequence: PooledSequence, opened: pb.SessionOpen) -> TargetSession:
    """The session a Verify stream's open message asks for."""
    return TargetSession(sequence, sampling_from(opened.sampling), request_generators(opened.sampling.seed)[0])


def verify_reply(verdict: Verdict, done: StepResult) -> pb.VerifyReply:
    return pb.VerifyReply(verdict=verdict_message(verdict), seconds=done.device_seconds, pass_info=pass_info(done))


async def decoded(scheduler: Scheduler, run: DecodeRun, task: str) -> AsyncIterator[pb.VerifyReply]:
    """A decode run's replies, one per token as its pass settles, while the run stays in the
    following passes: the router reads them at its own pace and never stalls the session."""
    replies: asyncio.Queue = asyncio.Queue()
    sent = 0

    def on_pass(done: StepResult) -> None:
        nonlocal sent
        if len(run.verdicts) > sent:  # a prefill chunk draws no token
            sent += 1
            replies.put_nowait(verify_reply(run.verdicts[-1], done))

    runner = asyncio.ensure_future(scheduler.run(run, task, on_pass))
    runner.add_done_callback(replies.put_nowait)  # after the last pass's reply
    try:
        while (reply := await replies.get()) is not runner:
            yield reply
        runner.result()  # the run's error, if it failed
    finally:
        runner.cancel()  # the stream ended mid-run: the run leaves the batch


class VerifierServicer(rpc.VerifierServicer):
    def __init__(self, replica: TargetReplica) -> None:
        self.replica = replica

    async def Verify(self, requests, context: grpc.aio.ServicerContext):
        opened = await first_open(requests, context)
        host = self.replica.host
        try:
            with host.session("target", opened, context) as (scheduler, sequence):
                session = target_session(sequence, opened)
                async for request in host.steps(requests):
                    if request.WhichOneof("kind") == "decode":
                        async for reply in decoded(scheduler, session.decode(request.decode), opened.task):
                            yield reply
                        continue
                    done = await scheduler.run(session.step(proposal_from(request.step)), opened.task)
                    yield verify_reply(done.result, done)
        except SessionLimit as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except SessionIdle as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except ValueError as exc:  # a malformed proposal: this session ends, the replica carries on
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def Inspect(self, request, context) -> pb.WorkerState:
        return self.replica.host.state()
