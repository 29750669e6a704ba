"""A worker's side of a multiplexed stream (proto: Frame): many sessions over one gRPC stream.

Each session runs the handler a per-session stream runs (``serve(requests, context)``: an async
generator of replies), fed from the frames addressed to it; its replies go out with those of every
other session that were ready at the same moment, as one message. So a pass that answers 64
sessions sends one message, not 64: the per-message cost of gRPC, paid per session per round on a
per-session stream, is paid once per pass.

What a per-session stream gives its handler, a session here gets the same way: its requests as an
async iterator that ends at the router's half-close, ``context.add_done_callback`` (called when the
session ends, however it ends) and ``context.abort`` (ends the session with a status, sent in its
last frame). A cancel frame, or the stream's end, cancels the session's task, as a cancelled RPC
does its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from specserve.proto.v1 import internal_pb2 as pb

log = logging.getLogger("specserve.workers")
Handler = Callable[[AsyncIterator, "SessionContext"], AsyncIterator]


class SessionAborted(Exception):
    """``SessionContext.abort``: the session ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class SessionContext:
    """What a session handler needs of a gRPC servicer context, for one session of a multiplexed stream."""

    def __init__(self) -> None:
        self._callbacks: list[Callable] = []
        self._done = False

    def add_done_callback(self, callback: Callable) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise SessionAborted(code, details)

    def done(self) -> None:
        if not self._done:
            self._done = True
            for callback in self._callbacks:
                callback(self)
            self._callbacks.clear()


class Inbox:
    """A session's requests, parsed from its frames as they come; ends at the router's half-close."""

    def __init__(self, parse: Callable[[bytes], object]) -> None:
        self.parse = parse
        self.queue: asyncio.Queue = asyncio.Queue()

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self):
        data = await self.queue.get()
        if data is None:
            raise StopAsyncIteration
        return self.parse(data)


class Outbox:
    """Frames ready to go out; the stream's writer takes all that are there at once."""

    def __init__(self, sessions: dict) -> None:
        self.sessions = sessions  # the stream's open sessions: one alone has nobody to wait for
        self.frames: list[pb.Frame] = []
        self.ready = asyncio.Event()
        self.closed = False  # the router's side ended: what is here goes, then the stream ends

    def put(self, frame: pb.Frame) -> None:
        self.frames.append(frame)
        self.ready.set()

    def close(self) -> None:
        self.closed = True
        self.ready.set()

    async def take(self) -> list[pb.Frame]:
        """What is ready (empty only once closed)."""
        await self.ready.wait()
        if len(self.sessions) > 1 and not self.closed:
            # Let every session woken by the same pass add its reply first: one message for all of them.
            await asyncio.sleep(0)
        if not self.closed:
            self.ready.clear()
        frames, self.frames = self.frames, []
        return frames


async def serve_multiplexed(frames: AsyncIterator[pb.Frames], handler: Handler,
                            parse: Callable[[bytes], object]) -> AsyncIterator[pb.Frames]:
    """The replies to a multiplexed stream's requests, each message all the frames ready at once."""
    sessions: dict[int, tuple[Inbox, asyncio.Task]] = {}
    outbox = Outbox(sessions)

    async def run(session: int, inbox: Inbox) -> None:
        context = SessionContext()
        code, details = grpc.StatusCode.OK, ""
        try:
            async for reply in handler(inbox, context):
                outbox.put(pb.Frame(session=session, message=reply.SerializeToString()))
        except SessionAborted as exc:
            code, details = exc.code, exc.details
        except asyncio.CancelledError:  # the router cancelled it, or the stream ended: nobody to tell
            return
        except Exception as exc:  # a bug in a session's handling: that session fails, not the stream
            log.exception("session %d failed", session)
            code, details = grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}"
        finally:
            context.done()
            sessions.pop(session, None)
        outbox.put(pb.Frame(session=session, end=pb.END_ENDED, code=code.value[0], details=details))

    async def read() -> None:
        try:
            async for message in frames:
                for frame in message.frames:
                    if frame.end == pb.END_NONE:
                        if frame.session not in sessions:
                            inbox = Inbox(parse)
                            sessions[frame.session] = (inbox, asyncio.ensure_future(run(frame.session, inbox)))
                        sessions[frame.session][0].queue.put_nowait(frame.message)
                    elif frame.session in sessions:
                        inbox, task = sessions[frame.session]
                        if frame.end == pb.END_DONE:
                            inbox.queue.put_nowait(None)
                        else:
                            task.cancel()
        finally:
            outbox.close()

    reader = asyncio.ensure_future(read())
    try:
        while True:  # one await a message: no task per message to race the reader's end
            if ready := await outbox.take():
                yield pb.Frames(frames=ready)
            if outbox.closed and not outbox.frames:
                break
        await reader  # the router's side failed: say so in the stream's status
    finally:
        reader.cancel()
        for _, task in list(sessions.values()):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*(task for _, task in list(sessions.values())), return_exceptions=True)
