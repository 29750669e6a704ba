"""A target replica: a Ray Serve deployment holding the target model on its own device.

Each Verify stream is one session with its own region of the replica's KV pool. A step is one
proposal (possibly empty: target-only decoding); the replica's scheduler verifies it in a forward
pass shared with the steps of other sessions pending at that moment (continuous batching), commits
the verdict to the session's cache and answers with the verdict. Serve deploys, places and restarts replicas; the per-step traffic
goes over the stream, never through Serve handles (a handle hop costs ~4 ms).
"""

from __future__ import annotations

import uuid

import grpc

from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc

from .config import TargetConfig
from .loading import ModelSpec, load_model
from .model_host import ModelHost, SessionIdle, SessionLimit, first_open
from .ragged_pass import PooledSequence
from .registry import Registration
from .seeds import request_generators
from .verifying import TargetSession
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
                    done = await scheduler.run(session.step(proposal_from(request.step)), opened.task)
                    yield pb.VerifyReply(verdict=verdict_message(done.result), seconds=done.device_seconds,
                                         pass_info=pass_info(done))
        except SessionLimit as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except SessionIdle as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except ValueError as exc:  # a malformed proposal: this session ends, the replica carries on
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def Inspect(self, request, context) -> pb.WorkerState:
        return self.replica.host.state()
