"""The router's side of a multiplexed stream (proto: Frame): all its sessions on one worker, one stream.

``Multiplexed`` holds one ``*Many`` call to a worker. Each session gets a ``SessionCall``, which
behaves as the per-session stream call it replaces (write, read, done_writing, cancel, and the
status once it ended), so ``WorkerStream`` and everything above it are unchanged. What the sessions
write in one turn of the event loop goes out as one message: a pass's verdicts come back in one
message, wake every session they answer, and the next steps those sessions ask for leave together.

A failure of the stream is a failure of every session on it, with the stream's status (a lost worker:
UNAVAILABLE, CANCELLED, ...), as each of their streams would have failed; the next session opened
there starts a new stream.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

import grpc

from specserve.proto.v1 import internal_pb2 as pb

log = logging.getLogger("specserve.router")


class SessionCall:
    """One session on a multiplexed stream, as a ``grpc.aio.StreamStreamCall`` looks to its user."""

    def __init__(self, stream: Multiplexed, session: int) -> None:
        self.stream = stream
        self.session = session
        self.replies: asyncio.Queue = asyncio.Queue()
        self._held = None  # an end taken from ``replies`` by ``read_now``: ``read`` gives it next
        self._code: grpc.StatusCode | None = None  # set once it ended
        self._details = ""

    async def write(self, request) -> None:
        if self._code is not None:
            raise asyncio.InvalidStateError("the session ended")
        self.stream.send(pb.Frame(session=self.session, message=request.SerializeToString()))

    async def read(self):
        if self._held is not None:
            item, self._held = self._held, None
        else:
            item = await self.replies.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def read_now(self):
        """The next reply if it is already here, without waiting; None if none is (or the session
        ended: ``read`` says how)."""
        if self._held is not None or self.replies.empty():
            return None
        item = self.replies.get_nowait()
        if isinstance(item, BaseException) or item is grpc.aio.EOF:
            self._held = item
            return None
        return item

    async def done_writing(self) -> None:
        if self._code is None:
            self.stream.send(pb.Frame(session=self.session, end=pb.END_DONE))

    def cancel(self) -> bool:
        if self._code is not None:
            return False
        self.stream.send(pb.Frame(session=self.session, end=pb.END_CANCEL))
        self._end(grpc.StatusCode.CANCELLED, "cancelled by the router")
        return True

    def done(self) -> bool:
        return self._code is not None

    async def code(self) -> grpc.StatusCode:
        return self._code

    async def details(self) -> str:
        return self._details

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()

    # --- from the stream ---

    def deliver(self, frame: pb.Frame) -> None:
        if frame.end == pb.END_NONE:
            self.replies.put_nowait(self.stream.parse(frame.message))
            return
        code = _status(frame.code)
        self._end(code, frame.details)
        if code == grpc.StatusCode.OK:
            self.replies.put_nowait(grpc.aio.EOF)
        else:
            self.replies.put_nowait(grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), frame.details))

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        if self._code is None:
            self._end(error.code(), error.details() or "")
            self.replies.put_nowait(error)

    def _end(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details
        self.stream.sessions.pop(self.session, None)


class Multiplexed:
    """One ``*Many`` stream to a worker. ``open_call(channel)`` starts it (say, ``VerifierStub(channel).VerifyMany()``)."""

    def __init__(self, call: grpc.aio.StreamStreamCall, parse: Callable[[bytes], object]) -> None:
        self.call = call
        self.parse = parse
        self.sessions: dict[int, SessionCall] = {}
        self.ids = itertools.count(1)
        self.outbox: list[pb.Frame] = []
        self.wake = asyncio.Event()
        self.failure: grpc.aio.AioRpcError | None = None
        self.reader = asyncio.ensure_future(self._read())
        self.writer = asyncio.ensure_future(self._write())

    @property
    def broken(self) -> bool:
        return self.failure is not None or self.reader.done() or self.writer.done()

    def session(self) -> SessionCall:
        call = SessionCall(self, next(self.ids))
        if self.failure is not None:
            call.fail(self.failure)
        else:
            self.sessions[call.session] = call
        return call

    def send(self, frame: pb.Frame) -> None:
        self.outbox.append(frame)
        self.wake.set()

    async def _write(self) -> None:
        try:
            while True:
                await self.wake.wait()
                if len(self.sessions) > 1:
                    await asyncio.sleep(0)  # what the other sessions woken with this one write, goes with it
                self.wake.clear()
                frames, self.outbox = self.outbox, []
                await self.call.write(pb.Frames(frames=frames))
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            self._fail(exc)
        except Exception as exc:  # the call finished under us (InvalidStateError, UsageError): its status says why
            self._fail(await self._status(exc))

    async def _read(self) -> None:
        try:
            while (message := await self.call.read()) is not grpc.aio.EOF:
                for frame in message.frames:
                    session = self.sessions.get(frame.session)
                    if session is not None:  # else: one the router has cancelled, or closed and forgotten
                        session.deliver(frame)
            self._fail(await self._status(None))
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            self._fail(exc)

    async def _status(self, cause: Exception | None) -> grpc.aio.AioRpcError:
        code, details = await self.call.code(), await self.call.details()
        if code == grpc.StatusCode.OK:  # a worker never ends the stream first: it is going away
            code, details = grpc.StatusCode.UNAVAILABLE, f"the worker ended its sessions' stream ({cause or 'EOF'})"
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)

    def _fail(self, error: grpc.aio.AioRpcError) -> None:
        if self.failure is None:
            self.failure = error
            log.info("a multiplexed stream failed (%d sessions on it): %s: %s", len(self.sessions),
                     error.code().name, error.details())
        for session in list(self.sessions.values()):
            session.fail(error)
        self.call.cancel()

    def close(self) -> None:
        self.reader.cancel()
        self.writer.cancel()
        self.call.cancel()


def _status(code: int) -> grpc.StatusCode:
    return next((status for status in grpc.StatusCode if status.value[0] == code), grpc.StatusCode.UNKNOWN)
