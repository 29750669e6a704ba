"""What a draft worker and a target replica share: models on a device, a gRPC endpoint, a registration."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator

import grpc

from specserve.proto.v1 import internal_pb2 as pb

from .config import WorkerConfig
from .grpc_host import BackgroundServer, Device, advertised_host
from .kv_cache import session_capacity
from .registry import Endpoint, Heartbeat, Registration
from .security import SecuritySettings

log = logging.getLogger("specserve.workers")


class SessionLimit(Exception):
    """This process holds its configured maximum of sessions, or of KV cache memory."""


class SessionIdle(Exception):
    """A session's router sent nothing for the configured idle time: the session is evicted."""


class SessionSlots:
    """The sessions a process holds and the KV cache memory they may grow to, each bounded.

    A session reserves its KV memory when it opens (what its longest possible sequence needs), so
    the bound holds however sessions grow. Touched only on the server's event loop: no lock.
    """

    def __init__(self, owner: str, max_sessions: int, budget_bytes: int) -> None:
        self.owner = owner
        self.max_sessions = max_sessions
        self.budget_bytes = budget_bytes
        self.live = 0
        self.reserved_bytes = 0

    @contextlib.contextmanager
    def hold(self, kv_bytes: int, on_done: Callable[[Callable], None] = lambda release: None) -> Iterator[None]:
        """``on_done(release)`` is given the release, for a caller that may learn of the session's end
        first (an RPC's done callback: grpc does not always close a cancelled handler's generator)."""
        if self.live >= self.max_sessions:
            raise SessionLimit(f"{self.owner} holds its limit of {self.max_sessions} sessions")
        if self.reserved_bytes + kv_bytes > self.budget_bytes:
            raise SessionLimit(f"{self.owner}: the session needs {kv_bytes / 2**20:.1f} MiB of KV cache and "
                               f"{self.reserved_bytes / 2**20:.1f} of its {self.budget_bytes / 2**20:.1f} MiB are "
                               f"taken (kv_cache_mib)")
        self.live += 1
        self.reserved_bytes += kv_bytes
        released = False

        def release(*_) -> None:
            nonlocal released
            if not released:
                released = True
                self.live -= 1
                self.reserved_bytes -= kv_bytes

        on_done(release)
        try:
            yield
        finally:
            release()


class ModelHost:
    """Runs ``add_servicer``'s service on a background gRPC server and keeps it registered."""

    def __init__(self, kind: str, worker_id: str, models: tuple[str, ...], config: WorkerConfig,
                 registration: Registration, add_servicer: Callable[[grpc.aio.Server], None]) -> None:
        self.kind = kind
        self.worker_id = worker_id
        self.models = models
        self.slots = SessionSlots(f"{kind} {worker_id}", config.max_sessions, int(config.kv_cache_mib * 2**20))
        self.idle_seconds = config.session_idle_seconds
        self.device = Device(config.threads, config.cpus)
        security = SecuritySettings.from_env()  # the router is the only caller: mTLS and the internal token
        self.server = BackgroundServer(add_servicer, name=f"{kind}-grpc",
                                       credentials=security.internal_server_credentials(),
                                       interceptors=security.internal_interceptors())
        self.address = f"{advertised_host()}:{self.server.port}"
        self.resources = _assigned_resources()
        self.node_id = _node_id()
        self.heartbeat = Heartbeat(registration, self.endpoint)
        log.info("%s %s serving %s at %s (cores %s; %s)", kind, worker_id, ", ".join(models), self.address,
                 sorted(self.device.cpus) or "unpinned", security.describe_internal())

    def endpoint(self) -> Endpoint:
        return Endpoint(self.kind, self.worker_id, self.address, self.models, self.slots.live, self.node_id)

    def session(self, kv_bytes: int, context: grpc.aio.ServicerContext) -> contextlib.AbstractContextManager[None]:
        """Holds a session slot and ``kv_bytes`` of the KV budget until the session's stream ends."""
        return self.slots.hold(kv_bytes, context.add_done_callback)

    async def steps(self, requests) -> AsyncIterator:
        """A session's step requests, until its router closes the stream; SessionIdle when the
        router sends nothing for ``idle_seconds`` (it died without closing, or hangs): an abandoned
        session must not hold its cache forever."""
        pending = aiter(requests)
        while True:
            try:
                async with asyncio.timeout(self.idle_seconds):  # no task per step, unlike wait_for
                    request = await anext(pending)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise SessionIdle(f"{self.kind} {self.worker_id}: no step for {self.idle_seconds:g} s; "
                                  f"session evicted") from None
            yield request

    def state(self) -> pb.WorkerState:
        return pb.WorkerState(worker_id=self.worker_id, models=self.models, live_sessions=self.slots.live,
                              resources=self.resources, pid=os.getpid(), kv_reserved_bytes=self.slots.reserved_bytes,
                              kv_budget_bytes=self.slots.budget_bytes)

    def shutdown(self) -> None:
        self.heartbeat.stop()
        self.server.stop()


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def _assigned_resources() -> dict[str, float]:
    import ray

    if not ray.is_initialized():
        return {}
    return {name: float(amount) for name, amount in ray.get_runtime_context().get_assigned_resources().items()}


def reserved_length(opened: pb.SessionOpen, model) -> int:
    """Positions a session opened with ``opened`` may fill in ``model``'s cache."""
    return session_capacity(len(opened.prompt_ids), opened.max_new_tokens, model.config.max_position_embeddings)


async def first_open(requests, context: grpc.aio.ServicerContext) -> pb.SessionOpen:
    """A session stream's first message must open it."""
    first = await anext(aiter(requests), None)
    if first is None or first.WhichOneof("kind") != "open":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a session stream must start with an open message")
    return first.open
