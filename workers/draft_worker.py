"""A draft worker: a Ray actor holding one or more draft models on its own device.

Each Draft stream is one session. Per step the router says what stands, in absolute lengths (keep
this many tokens of what the session holds, append these: a verdict, or a whole proposal for a
lookahead), and how many tokens to propose; the worker moves its cache length accordingly (rollback
is bookkeeping) and drafts from there.
"""

from __future__ import annotations

import grpc

from specserve.cluster.config import DraftPoolConfig
from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc

from .drafting import DRAFT_MAX_SUPPORT, DraftSession, Proposal, score_continuation
from .engine import request_generators
from .loading import ModelSpec, load_model
from .kv_cache import kv_bytes_per_token
from .model_host import ModelHost, SessionIdle, SessionLimit, first_open, reserved_length
from .wire import proposal_message, sampling_from


class DraftWorker:
    """Runs as a Ray actor (see ``cluster/pool.py``); its stream endpoint is in the registry."""

    def __init__(self, worker_id: str, drafts: dict[str, ModelSpec], config: DraftPoolConfig, namespace: str,
                 heartbeat_seconds: float) -> None:
        self.models = {name: load_model(spec) for name, spec in drafts.items()}
        servicer = DrafterServicer(self)
        self.host = ModelHost("draft", worker_id, tuple(drafts), config, namespace, heartbeat_seconds,
                              lambda server: rpc.add_DrafterServicer_to_server(servicer, server))

    def ping(self) -> str:
        """The pool's liveness check (a Ray call, not the stream server)."""
        return self.host.worker_id

    def shutdown(self) -> None:
        self.host.shutdown()


class DrafterServicer(rpc.DrafterServicer):
    def __init__(self, worker: DraftWorker) -> None:
        self.worker = worker

    async def Draft(self, requests, context: grpc.aio.ServicerContext):
        opened = await first_open(requests, context)
        model = self.worker.models.get(opened.model)
        if model is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"this worker has no draft {opened.model!r}; it has {', '.join(self.worker.models)}")
        sampling = sampling_from(opened.sampling)
        host = self.worker.host
        length = reserved_length(opened, model)
        try:
            with host.session(length * kv_bytes_per_token(model), context):
                draft_gen = request_generators(opened.sampling.seed)[1]
                session = DraftSession(model, list(opened.prompt_ids), sampling, draft_gen, DRAFT_MAX_SUPPORT, length)
                last: Proposal | None = None
                async for request in host.steps(requests):
                    step = request.step
                    session.resync(last, step.keep, list(step.append))
                    last, seconds = await host.device.run_timed(session.propose, step.k, step.min_confidence,
                                                                max(step.min_tokens, 1))
                    yield proposal_message(last, sampling.greedy, seconds)
        except SessionLimit as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except SessionIdle as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except ValueError as exc:  # a step that does not fit this session: it ends, the worker carries on
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreReply:
        model = self.worker.models.get(request.model)
        if model is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"this worker has no draft {request.model!r}; it has {', '.join(self.worker.models)}")
        try:
            (positions, matches), seconds = await self.worker.host.device.run_timed(
                score_continuation, model, list(request.ids), request.start)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.ScoreReply(positions=positions, matches=matches, seconds=seconds)

    async def Inspect(self, request, context) -> pb.WorkerState:
        return self.worker.host.state()
