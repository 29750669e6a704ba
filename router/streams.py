"""A request's stream to one worker (its session there), and the one way its failures surface.

However a worker fails a step (its RPC breaks, its stream ends, or it does not answer within the
step timeout), the session sees a ``WorkerFailed`` and decides what to do: resume on another
worker, or go on target-only. A status that does not mean "gone, stuck or full" is a bug, ours or
the worker's, and is raised as it is so that it fails the request instead of hiding.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc

from specserve.workers.registry import Endpoint

# Statuses a healthy protocol never produces on its own: the worker died or is going away
# (UNAVAILABLE, CANCELLED by its server's shutdown), answered too late, or is at its session limit.
LOST_STATUSES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                           grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED})
# Statuses a live worker answers with of its own accord: at its limits, or a session it evicted as idle.
WORKER_SAID_SO = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED})
# gRPC's C core reports a connection torn down mid-stream (the peer process killed or shutting down:
# RST_STREAM with INTERNAL_ERROR) as INTERNAL with this text of its own; no handler of ours answers
# INTERNAL. Seen when test_faults killed a draft worker mid-request: a lost worker, not a bug.
TRANSPORT_TORN_DOWN = "Internal error from Core"


class WorkerFailed(Exception):
    """A worker failed this session: ``code`` is its status (None: its stream ended).

    ``broken``: the worker itself looks broken (gone, stuck), so new sessions should pass it over
    for a while; not so when it refused a session because it is full or ended one that sat idle.
    ``full``: it refused the session for want of room, as it says on the stream (a status of
    RESOURCE_EXHAUSTED may be grpc's own, say a message over its size limit).
    """

    def __init__(self, worker: Endpoint, what: str, code: grpc.StatusCode | None = None, full: bool = False) -> None:
        super().__init__(f"{worker.kind} {worker.worker_id} at {worker.address} {what}")
        self.worker = worker
        self.code = code
        self.full = full
        self.broken = code not in WORKER_SAID_SO


class WorkerStream:
    """One bidirectional session stream to a worker: write a request, read its answer (or, after
    a request for a target-only decode run, read its answers one by one).

    It counts itself in ``load`` (the router's open sessions per worker) from creation until it is
    closed or cancelled, whichever comes first.

    One write and one read at a time: grpc allows one operation of a kind in flight per call, and
    a second (a fresh step sent while a lookahead's write is still in flight) fails the call in the
    router alone, as INTERNAL "Internal error from Core" (TOO_MANY_OPERATIONS), without telling the
    worker: ``cancel`` then does nothing (the call is already done here), so the worker would hold
    the session and its KV memory until its idle time.
    """

    def __init__(self, worker: Endpoint, call: grpc.aio.StreamStreamCall, step_timeout: float,
                 load: Counter[str], first_step_timeout: float | None = None) -> None:
        self.worker = worker
        self.call = call
        # The first step prefills the whole sequence, so it may take longer than the rest.
        self.step_timeout = first_step_timeout or step_timeout
        self._later_steps_timeout = step_timeout
        self._load = load
        self._counted = True
        load[worker.worker_id] += 1
        self._writing = asyncio.Lock()
        self._reading = asyncio.Lock()

    async def send(self, request) -> None:
        await self._guard(self._write(request))

    async def ask(self, request):
        reply = await self._guard(self._exchange(request))
        self.step_timeout = self._later_steps_timeout
        return reply

    async def receive(self):
        """The next answer to a request already sent (a decode run answers once per token)."""
        reply = await self._guard(self._read())
        self.step_timeout = self._later_steps_timeout
        return reply

    def ready(self):
        """The next answer if it is already here (None: not yet, an end the next ``receive``
        raises, or a stream that cannot tell without waiting)."""
        # Only a multiplexed stream's session can tell without waiting; and never while a read waits.
        read_now = getattr(self.call, "read_now", None)
        reply = read_now() if read_now is not None and not self._reading.locked() else None
        return None if reply is None else self._checked(reply)

    async def _exchange(self, request):
        await self._write(request)
        return await self._read()

    async def _write(self, request) -> None:
        async with self._writing:
            await self.call.write(request)

    async def _read(self):
        async with self._reading:
            reply = await self.call.read()
        return self._checked(reply)

    def _checked(self, reply):
        if reply is grpc.aio.EOF:
            raise WorkerFailed(self.worker, "ended its session stream unexpectedly")
        if reply.refused:  # full: said as a reply, and the worker waits for us to end the stream
            self.cancel()
            raise WorkerFailed(self.worker, f"refused the session: RESOURCE_EXHAUSTED: {reply.refused}",
                               grpc.StatusCode.RESOURCE_EXHAUSTED, full=True)
        return reply

    async def _guard(self, step):
        try:
            async with asyncio.timeout(self.step_timeout):  # no task per step, unlike wait_for
                return await step
        except TimeoutError:
            self.cancel()  # frees the session on the worker if it ever wakes up
            raise WorkerFailed(self.worker, f"did not answer a step within {self.step_timeout:g} s") from None
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in LOST_STATUSES and not _torn_down(exc.code(), exc.details()):
                raise
            raise WorkerFailed(self.worker, f"failed: {exc.code().name}: {exc.details()}", exc.code()) from None
        except (asyncio.InvalidStateError, grpc.aio.UsageError):  # writing to a call that has finished
            raise await self._ended() from None

    async def _ended(self) -> Exception:
        """What to raise for a call the worker's side has finished: its status says why."""
        code, details = await self.call.code(), await self.call.details()
        if code == grpc.StatusCode.OK:
            return WorkerFailed(self.worker, "ended its session stream unexpectedly")
        if code in LOST_STATUSES or _torn_down(code, details):
            return WorkerFailed(self.worker, f"failed: {code.name}: {details}", code)
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), await self.call.trailing_metadata(), details)

    async def close(self) -> None:
        """Half-close: the worker's handler ends and frees the session's cache."""
        try:
            async with self._writing:
                if not self.call.done():
                    await self.call.done_writing()
        except grpc.aio.UsageError:  # already finished
            pass
        finally:
            self._uncount()

    def cancel(self) -> None:
        self.call.cancel()  # the worker sees the cancellation and frees the session too
        self._uncount()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self._load[self.worker.worker_id] -= 1


def _torn_down(code: grpc.StatusCode, details: str | None) -> bool:
    return code == grpc.StatusCode.INTERNAL and (details or "").startswith(TRANSPORT_TORN_DOWN)
