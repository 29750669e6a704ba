"""How a worker's failures surface on a session stream: mostly without a network (a fake call
raising what grpc.aio raises), and over a real socket for what only grpc itself does."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest

from specserve.proto.v1 import internal_pb2 as pb
from specserve.router.streams import WorkerStream, WorkerFailed
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
    stream = WorkerStream(WORKER, FailingCall(code, details), step_timeout=1.0, load=load)
    return asyncio.run(stream.ask(object()))


@pytest.mark.parametrize("code,details", [(grpc.StatusCode.UNAVAILABLE, "Socket closed"),
                                          (grpc.StatusCode.INTERNAL, "Internal error from Core"),
                                          (grpc.StatusCode.RESOURCE_EXHAUSTED, "full")])
def test_a_worker_gone_or_full_is_a_worker_failure(code, details):
    with pytest.raises(WorkerFailed) as failed:
        ask(code, details)
    assert failed.value.code == code and failed.value.broken == (code != grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert not failed.value.full  # a status may be grpc's own (a message over its limit): only a refusal says full


@pytest.mark.parametrize("code,details", [(grpc.StatusCode.INTERNAL, "a handler's own INTERNAL"),
                                          (grpc.StatusCode.INVALID_ARGUMENT, "bad proposal")])
def test_any_other_status_is_a_bug_raised_as_it_is(code, details):
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        ask(code, details)
    assert raised.value.code() == code


class RefusingCall(FailingCall):
    """A call whose worker refuses the session as a reply (it has no room), as workers do."""

    def __init__(self, reply) -> None:
        super().__init__(grpc.StatusCode.OK, "")
        self.reply = reply

    async def read(self):
        return self.reply


@pytest.mark.parametrize("reply", [pb.VerifyReply(refused="holds its limit of 2 sessions"),
                                   pb.Proposal(refused="no region of 300 positions fits")])
def test_a_refusal_said_on_the_stream_is_a_full_worker_not_a_broken_one(reply):
    call = RefusingCall(reply)
    stream = WorkerStream(WORKER, call, step_timeout=1.0, load=Counter())
    with pytest.raises(WorkerFailed) as failed:
        asyncio.run(stream.ask(object()))
    assert failed.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and failed.value.full and not failed.value.broken
    assert reply.refused in str(failed.value) and call.cancelled  # the worker waits for us to end it


# Over a real socket: grpc allows one write (and one read) in flight per call. A second fails the
# call in the router alone (INTERNAL, "Internal error from Core"): the worker never hears of it and
# held the session until its idle time (seen in make test as a draft worker keeping one session).

async def _echo_server(ended: list[str]) -> tuple[grpc.aio.Server, int]:
    async def echo(requests, context):
        context.add_done_callback(lambda *_: ended.append("done"))
        async for request in requests:
            yield request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("probe.Echo", {"Echo": grpc.stream_stream_rpc_method_handler(echo)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def test_writes_racing_on_one_stream_both_arrive_and_the_worker_sees_it_end():
    async def scenario():
        ended: list[str] = []
        server, port = await _echo_server(ended)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                load = Counter()
                call = channel.stream_stream("/probe.Echo/Echo", request_serializer=pb.Proposal.SerializeToString,
                                             response_deserializer=pb.Proposal.FromString)()
                stream = WorkerStream(WORKER, call, step_timeout=5.0, load=load)
                # A lookahead's ask (write, then read) and a fresh step's send, as RemoteDraft._redraft races them.
                ahead = asyncio.create_task(stream.ask(pb.Proposal(ids=[1])))
                await asyncio.sleep(0)  # the lookahead's write is in flight
                await stream.send(pb.Proposal(ids=[2]))
                replies = [await ahead, await stream.receive()]
                await stream.close()
                for _ in range(1000):  # up to 10 s, for a loaded machine
                    if ended:
                        break
                    await asyncio.sleep(0.01)
                return replies, ended, load
        finally:
            await server.stop(0)

    replies, ended, load = asyncio.run(scenario())
    assert [list(reply.ids) for reply in replies] == [[1], [2]]
    assert ended == ["done"] and load["d0"] == 0  # the worker's side of the session ended with the router's
