"""What a draft worker and a target replica share: models on a device, a gRPC endpoint, a registration."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import grpc

from specserve.cluster.config import WorkerConfig
from specserve.cluster.registry import Endpoint, Heartbeat
from specserve.proto.v1 import internal_pb2 as pb

from .grpc_host import BackgroundServer, Device, advertised_host

log = logging.getLogger("specserve.workers")


class SessionLimit(Exception):
    """This process already holds its configured maximum of sessions."""


class ModelHost:
    """Runs ``add_servicer``'s service on a background gRPC server and keeps it registered."""

    def __init__(self, kind: str, worker_id: str, models: tuple[str, ...], config: WorkerConfig,
                 namespace: str, heartbeat_seconds: float,
                 add_servicer: Callable[[grpc.aio.Server], None]) -> None:
        self.kind = kind
        self.worker_id = worker_id
        self.models = models
        self.max_sessions = config.max_sessions
        self.live_sessions = 0  # touched only on the server's event loop
        self.device = Device(config.threads, config.cpus)
        self.server = BackgroundServer(add_servicer, name=f"{kind}-grpc")
        self.address = f"{advertised_host()}:{self.server.port}"
        self.resources = _assigned_resources()
        self.node_id = _node_id()
        self.heartbeat = Heartbeat(namespace, heartbeat_seconds, self.endpoint)
        log.info("%s %s serving %s at %s (cores %s)", kind, worker_id, ", ".join(models), self.address,
                 sorted(self.device.cpus) or "unpinned")

    def endpoint(self) -> Endpoint:
        return Endpoint(self.kind, self.worker_id, self.address, self.models, self.live_sessions, self.node_id)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Counts a session for its lifetime; refuses one beyond ``max_sessions``."""
        if self.live_sessions >= self.max_sessions:
            raise SessionLimit(f"{self.kind} {self.worker_id} holds its limit of {self.max_sessions} sessions")
        self.live_sessions += 1
        try:
            yield
        finally:
            self.live_sessions -= 1

    def state(self) -> pb.WorkerState:
        return pb.WorkerState(worker_id=self.worker_id, models=self.models, live_sessions=self.live_sessions,
                              resources=self.resources)

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


async def first_open(requests, context: grpc.aio.ServicerContext) -> pb.SessionOpen:
    """A session stream's first message must open it."""
    first = await anext(aiter(requests), None)
    if first is None or first.WhichOneof("kind") != "open":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a session stream must start with an open message")
    return first.open
