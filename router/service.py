"""The client-facing SpecServe gRPC service: validate at the edge, admit, run the session, answer.

Handlers take the request's raw bytes and decode them here, so a malformed request (invalid UTF-8
included) is the client's INVALID_ARGUMENT rather than the server's INTERNAL. Errors map to
status codes once, in ``_status_of``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import AsyncIterator

import grpc
from transformers import PreTrainedTokenizerBase

from specserve.proto.v1 import specserve_pb2 as pb
from specserve.workers.stats import SpecStats

from .directory import NoWorker, WorkerDirectory
from .session import Session, WorkerStreamEnded
from .validation import InvalidRequest, Limits, parse_request, validate

log = logging.getLogger("specserve.router")
SERVICE_NAME = "specserve.v1.SpecServe"
FINISH_REASONS = {"eos": pb.FINISH_REASON_EOS, "stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}


class Overloaded(Exception):
    """The router holds its configured maximum of requests."""


class TaskTotals:
    """Counts per (task, draft) since the router started, for GetStats."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.output_tokens: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.stats: defaultdict[tuple[str, str], SpecStats] = defaultdict(SpecStats)

    def add(self, session: Session) -> None:
        key = (session.request.task, session.request.draft or "")
        self.requests[key] += 1
        self.output_tokens[key] += len(session.output.token_ids)
        self.stats[key].add(session.stats)

    def messages(self) -> list[pb.TaskStats]:
        return [pb.TaskStats(task=task, draft=draft, requests=self.requests[task, draft], proposed_tokens=s.proposed,
                             accepted_tokens=s.accepted, target_passes=s.target_passes,
                             output_tokens=self.output_tokens[task, draft], acceptance_rate=s.acceptance_rate,
                             tokens_per_pass=s.tokens_per_pass)
                for (task, draft), s in sorted(self.stats.items())]


class SpecServeService:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, limits: Limits, directory: WorkerDirectory,
                 max_concurrent_requests: int, lookahead: bool) -> None:
        self.lookahead = lookahead
        self.tokenizer = tokenizer
        self.limits = limits
        self.directory = directory
        self.max_concurrent = max_concurrent_requests
        self.in_flight = 0
        self.rejected = 0
        self.totals = TaskTotals()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Generate": grpc.unary_unary_rpc_method_handler(
                self.Generate, response_serializer=pb.GenerateResponse.SerializeToString),
            "GenerateStream": grpc.unary_stream_rpc_method_handler(
                self.GenerateStream, response_serializer=pb.GenerateChunk.SerializeToString),
            "GetStats": grpc.unary_unary_rpc_method_handler(
                self.GetStats, request_deserializer=pb.GetStatsRequest.FromString,
                response_serializer=pb.ServiceStats.SerializeToString),
        })

    async def Generate(self, data: bytes, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        chunks = [chunk async for chunk in self.GenerateStream(data, context)]
        # Joined once at the end: appending to a protobuf string field copies it on every step.
        return pb.GenerateResponse(text="".join(c.text for c in chunks),
                                   token_ids=[t for c in chunks for t in c.token_ids],
                                   finish_reason=chunks[-1].finish_reason, stats=chunks[-1].stats)

    async def GenerateStream(self, data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateChunk]:
        try:
            session = Session(validate(parse_request(data), self.tokenizer, self.limits), self.tokenizer, self.directory,
                              self.lookahead)
            self._admit()
        except (InvalidRequest, Overloaded) as exc:
            await _abort(context, exc)
        try:
            async for chunk in session.run():
                message = pb.GenerateChunk(text=chunk.text, token_ids=chunk.token_ids)
                if chunk.finish_reason:
                    message.finish_reason = FINISH_REASONS[chunk.finish_reason]
                    message.stats.CopyFrom(_stats_message(session))
                yield message
            self.totals.add(session)
        except (NoWorker, WorkerStreamEnded, grpc.aio.AioRpcError) as exc:
            log.warning("request %s failed: %s", session.session_id, exc)
            await _abort(context, exc)
        finally:
            self.in_flight -= 1

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.ServiceStats:
        workers = [pb.WorkerInfo(kind=e.kind, worker_id=e.worker_id, address=e.address, models=e.models,
                                 live_sessions=e.live_sessions)
                   for e in await self.directory.refresh(force=True) if e.kind != "router"]
        return pb.ServiceStats(tasks=self.totals.messages(), workers=workers, requests_in_flight=self.in_flight,
                               requests_rejected=self.rejected)

    def _admit(self) -> None:
        if self.in_flight >= self.max_concurrent:
            self.rejected += 1
            raise Overloaded(f"the router is serving its limit of {self.max_concurrent} concurrent requests; "
                             f"retry with backoff")
        self.in_flight += 1


def _stats_message(session: Session) -> pb.GenerateStats:
    s = session.stats
    return pb.GenerateStats(task=session.request.task, draft=session.request.draft or "", proposed_tokens=s.proposed,
                            accepted_tokens=s.accepted, target_passes=s.target_passes, seed=s.seed, rejections=s.rejections,
                            draft_seconds=s.draft_seconds, verify_seconds=s.verify_seconds,
                            total_seconds=session.elapsed(), first_token_seconds=session.first_token_seconds,
                            lookaheads=s.lookaheads, lookahead_hits=s.lookahead_hits)


def _status_of(exc: Exception) -> grpc.StatusCode:
    if isinstance(exc, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return grpc.StatusCode.RESOURCE_EXHAUSTED  # a worker at its session limit
    return grpc.StatusCode.UNAVAILABLE  # no worker, or a worker failed mid-request: retryable


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    await context.abort(_status_of(exc), details)
