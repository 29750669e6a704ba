"""How a worker's failures surface on a session stream, without a network: a fake call raising
what grpc.aio raises."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest

from specserve.router.streams import SessionStream, WorkerFailed
from specserve.workers.registry import Endpoint

WORKER = Endpoint("draft", "d0", "fake:d0", ("d",))


class FailingCall:
    """A stream-stream call whose reads fail with ``code`` and ``details``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
        self.cancelled = False

    async def write(self, request) -> None:
        pass

    async def read(self):
        raise self.error

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def ask(code: grpc.StatusCode, details: str):
    load = Counter()
    stream = SessionStream(WORKER, FailingCall(code, details), step_timeout=1.0, load=load)
    return asyncio.run(stream.ask(object()))


@pytest.mark.parametrize("code,details", [(grpc.StatusCode.UNAVAILABLE, "Socket closed"),
                                          (grpc.StatusCode.INTERNAL, "Internal error from Core"),
                                          (grpc.StatusCode.RESOURCE_EXHAUSTED, "full")])
def test_a_worker_gone_or_full_is_a_worker_failure(code, details):
    with pytest.raises(WorkerFailed) as failed:
        ask(code, details)
    assert failed.value.code == code and failed.value.broken == (code != grpc.StatusCode.RESOURCE_EXHAUSTED)


@pytest.mark.parametrize("code,details", [(grpc.StatusCode.INTERNAL, "a handler's own INTERNAL"),
                                          (grpc.StatusCode.INVALID_ARGUMENT, "bad proposal")])
def test_any_other_status_is_a_bug_raised_as_it_is(code, details):
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        ask(code, details)
    assert raised.value.code() == code
