"""Faults injected into a running service whose processes run on this machine.

Workers are killed with Ray's own API (``ray.kill``), as a crash or an operator would; a stuck
worker, or a machine that vanished without closing its connections, is a process frozen with
SIGSTOP. The soak script and the fault tests share these.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import grpc
import ray

from specserve.cluster.app import TARGET_DEPLOYMENT
from specserve.cluster.config import NAMESPACE
from specserve.workers.security import SecuritySettings, internal_channel
from specserve.proto.v1 import internal_pb2, internal_pb2_grpc

SERVE_NAMESPACE = "serve"  # where Ray Serve names its replica actors


@dataclass(frozen=True)
class Worker:
    kind: str  # "target" or "draft"
    worker_id: str
    address: str
    pid: int


def workers(client, kind: str) -> list[Worker]:
    """The registered workers of a kind that answer, with their processes."""
    found = []
    for w in client.stats().workers:
        if w.kind == kind:
            try:
                found.append(Worker(kind, w.worker_id, w.address, inspect(kind, w.address).pid))
            except grpc.RpcError:  # a dead one's entry, until the registry drops it
                pass
    return found


def inspect(kind: str, address: str) -> internal_pb2.WorkerState:
    """A worker's own view of itself, over its Inspect RPC (with the cluster's internal credential)."""
    stub = internal_pb2_grpc.VerifierStub if kind == "target" else internal_pb2_grpc.DrafterStub
    with internal_channel(address, SecuritySettings.from_env()) as channel:
        return stub(channel).Inspect(internal_pb2.InspectRequest(), timeout=5)


def holding_a_session(candidates: list[Worker]) -> Worker | None:
    """The worker holding a session now (the first, if several), asked straight: a millisecond apiece."""
    return next((w for w in candidates if inspect(w.kind, w.address).live_sessions), None)


def target_replica_actor(pid: int | None = None):
    """The target deployment's replica actor (the one in process ``pid`` if given)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == SERVE_NAMESPACE and f"#{TARGET_DEPLOYMENT}#" in a["name"]]
    actors = [ray.get_actor(name, namespace=SERVE_NAMESPACE) for name in names]
    if pid is not None and len(actors) > 1:
        actors = [a for a in actors if ray.get(a.__ray_call__.remote(lambda self: os.getpid()), timeout=10) == pid]
    if not actors:
        raise LookupError("no target replica actor is running")
    return actors[0]


def kill(worker: Worker, restart: bool = True) -> None:
    """Kill a worker with Ray's API mid-whatever-it-does. The process is frozen while the kill is
    sent and thawed to take it, so the kill lands where the caller chose, not a few steps later.
    A draft worker killed with ``restart`` is restarted by Ray; a target replica is replaced by Serve."""
    actor = (target_replica_actor(worker.pid) if worker.kind == "target"
             else ray.get_actor(worker.worker_id, namespace=NAMESPACE))
    freeze(worker.pid)
    ray.kill(actor, no_restart=not restart or worker.kind == "target")
    thaw(worker.pid)


def freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:  # killed meanwhile
        pass
