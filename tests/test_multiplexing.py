"""Many sessions over one stream (router/multiplexing.py, workers/multiplexing.py), over a real
gRPC socket with a toy handler: each session sees exactly what a stream of its own would show it
(its replies in order, its end, its status), what is ready at one moment travels as one message,
and a stream that breaks fails every session on it."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest

from specserve.proto.v1 import internal_pb2 as pb
from specserve.router.multiplexing import Multiplexed
from specserve.router.streams import WorkerFailed, WorkerStream
from specserve.workers.multiplexing import serve_multiplexed
from specserve.workers.registry import Endpoint

METHOD = "/test.Mux/Many"
WORKER = Endpoint("target", "t-1", "localhost:0", ("target",), 0)


class Toy:
    """A session handler: each ``decode = n`` request is answered with n replies (tokens 0..n-1);
    ``decode = 0`` aborts the session with INVALID_ARGUMENT. Counts the messages it received."""

    def __init__(self) -> None:
        self.messages = 0
        self.ended: list[object] = []

    async def handler(self, requests, context):
        context.add_done_callback(self.ended.append)
        async for request in requests:
            if request.decode == 0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "decode must be positive")
            for token in range(request.decode):
                yield pb.VerifyReply(verdict=pb.Verdict(token=token))
                await asyncio.sleep(0)

    def serve(self):
        async def many(frames, context):
            async def counted():
                async for message in frames:
                    self.messages += 1
                    yield message
            async for message in serve_multiplexed(counted(), self.handler, pb.VerifyRequest.FromString):
                yield message
        return grpc.method_handlers_generic_handler("test.Mux", {"Many": grpc.stream_stream_rpc_method_handler(
            many, request_deserializer=pb.Frames.FromString, response_serializer=pb.Frames.SerializeToString)})


async def started(toy: Toy) -> tuple[grpc.aio.Server, grpc.aio.Channel, Multiplexed]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((toy.serve(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.stream_stream(METHOD, request_serializer=pb.Frames.SerializeToString,
                                 response_deserializer=pb.Frames.FromString)()
    return server, channel, Multiplexed(call, pb.VerifyReply.FromString)


async def tokens(session, count: int) -> list[int]:
    return [(await session.read()).verdict.token for _ in range(count)]


def test_sessions_keep_their_own_replies_and_share_messages():
    async def run():
        toy = Toy()
        server, channel, stream = await started(toy)
        sessions = [stream.session() for _ in range(16)]
        for n, session in enumerate(sessions):
            await session.write(pb.VerifyRequest(decode=n + 1))
        got = await asyncio.gather(*(tokens(s, n + 1) for n, s in enumerate(sessions)))
        assert got == [list(range(n + 1)) for n in range(16)]
        assert toy.messages == 1, "16 sessions' first requests, written in one turn, travel as one message"
        for session in sessions:
            await session.done_writing()
        ends = [await s.read() for s in sessions]
        assert all(end is grpc.aio.EOF for end in ends)
        assert len(toy.ended) == 16 and not stream.sessions
        stream.close()
        await channel.close()
        await server.stop(None)
    asyncio.run(run())


def test_a_session_aborted_or_cancelled_ends_alone():
    async def run():
        toy = Toy()
        server, channel, stream = await started(toy)
        bad, cancelled, good = stream.session(), stream.session(), stream.session()
        await bad.write(pb.VerifyRequest(decode=0))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await bad.read()
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "positive" in error.value.details()
        await cancelled.write(pb.VerifyRequest(decode=2))
        assert await tokens(cancelled, 1) == [0]
        cancelled.cancel()
        assert await cancelled.code() == grpc.StatusCode.CANCELLED
        with pytest.raises(asyncio.InvalidStateError):
            await cancelled.write(pb.VerifyRequest(decode=1))
        await good.write(pb.VerifyRequest(decode=3))
        assert await tokens(good, 3) == [0, 1, 2]
        for _ in range(1000):  # the cancel frame reaches the worker: its session ends there too
            if len(toy.ended) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(toy.ended) == 2
        stream.close()
        await channel.close()
        await server.stop(None)
    asyncio.run(run())


def test_a_broken_stream_fails_every_session_as_a_lost_worker():
    async def run():
        toy = Toy()
        server, channel, stream = await started(toy)
        sessions = [WorkerStream(WORKER, stream.session(), step_timeout=5.0, load=Counter())
                    for _ in range(4)]
        await asyncio.gather(*(s.send(pb.VerifyRequest(decode=1)) for s in sessions))
        await asyncio.gather(*(s.receive() for s in sessions))
        await server.stop(None)  # the worker goes away
        for session in sessions:
            with pytest.raises(WorkerFailed) as failed:
                await session.ask(pb.VerifyRequest(decode=1))
            assert failed.value.broken
        assert stream.broken
        late = stream.session()  # a session opened on a broken stream fails at once, not after a timeout
        with pytest.raises(grpc.aio.AioRpcError):
            await late.read()
        await channel.close()
    asyncio.run(run())


def test_replies_already_here_are_taken_without_waiting_and_an_end_is_kept_for_the_read():
    async def run():
        toy = Toy()
        server, channel, stream = await started(toy)
        session = WorkerStream(WORKER, stream.session(), step_timeout=5.0, load=Counter())
        await session.send(pb.VerifyRequest(decode=5))
        first = await session.receive()  # waits for the first; the rest come in the same turns
        for _ in range(1000):  # up to 10 s: a loaded machine may take a while, none needs it
            if session.call.replies.qsize() == 4:
                break
            await asyncio.sleep(0.01)
        ready = [session.ready() for _ in range(5)]
        assert [first.verdict.token] + [r.verdict.token for r in ready[:4]] == [0, 1, 2, 3, 4]
        assert ready[4] is None  # nothing more is here: None, not a wait
        await session.call.done_writing()
        for _ in range(1000):  # the worker's end of the session arrives
            if session.call.done():
                break
            await asyncio.sleep(0.01)
        assert session.ready() is None  # an end is not a reply: the read says it
        assert await session.call.read() is grpc.aio.EOF
        stream.close()
        await channel.close()
        await server.stop(None)
    asyncio.run(run())
