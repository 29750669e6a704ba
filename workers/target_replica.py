"""A target replica: a Ray Serve deployment holding the target model on its own device.

Each Verify stream is one session with its own KV cache. A step is one proposal (possibly empty:
target-only decoding); the replica verifies it in one forward pass, commits the verdict to its cache
and answers with the verdict. Serve deploys, places and restarts replicas; the per-step traffic
goes over the stream, never through Serve handles (a handle hop costs ~4 ms).
"""

from __future__ import annotations

import uuid

import grpc

from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc

from .config import TargetConfig
from .kv_cache import kv_bytes_per_token
from .loading import ModelSpec, load_model
from .model_host import ModelHost, SessionIdle, SessionLimit, first_open, reserved_length
from .registry import Registration
from .seeds import request_generators
from .verifying import TargetSession
from .wire import proposal_from, sampling_from, verdict_message


class TargetReplica:
    """The Serve deployment class (options applied in ``cluster/app.py``)."""

    def __init__(self, config: dict, target: ModelSpec, registration: Registration) -> None:
        cfg = TargetConfig.model_validate(config)  # plain data across Serve, checked again here
        self.model = load_model(target)
        servicer = VerifierServicer(self)
        self.host = ModelHost("target", f"target-{uuid.uuid4().hex[:8]}", ("target",), cfg, registration,
                              lambda server: rpc.add_VerifierServicer_to_server(servicer, server))

    def check_health(self) -> None:
        """Serve restarts a replica whose stream server has died."""
        if not self.host.server.alive:
            raise RuntimeError(f"target replica {self.host.worker_id}: its gRPC server stopped")

    def __del__(self) -> None:
        host = getattr(self, "host", None)
        if host is not None:
            host.shutdown()


def target_session(model, opened: pb.SessionOpen) -> TargetSession:
    """The session a Verify stream's open message asks for."""
    return TargetSession(model, list(opened.prompt_ids), sampling_from(opened.sampling),
                         request_generators(opened.sampling.seed)[0], reserved_length(opened, model))


class VerifierServicer(rpc.VerifierServicer):
    def __init__(self, replica: TargetReplica) -> None:
        self.replica = replica

    async def Verify(self, requests, context: grpc.aio.ServicerContext):
        opened = await first_open(requests, context)
        host, model = self.replica.host, self.replica.model
        try:
            with host.session(reserved_length(opened, model) * kv_bytes_per_token(model), context):
                session = target_session(model, opened)
                async for request in host.steps(requests):
                    proposal = proposal_from(request.step)
                    verdict, seconds = await host.device.run_timed(session.verify, proposal)
                    yield pb.VerifyReply(verdict=verdict_message(verdict), seconds=seconds)
        except SessionLimit as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except SessionIdle as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except ValueError as exc:  # a malformed proposal: this session ends, the replica carries on
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def Inspect(self, request, context) -> pb.WorkerState:
        return self.replica.host.state()
