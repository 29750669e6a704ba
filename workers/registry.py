"""Where the workers' gRPC endpoints are: a named Ray actor that workers register with.

Ray knows where actors run but not the ports of the gRPC servers inside them, and Serve hides its
replicas behind handles; per-step traffic bypasses both, so each worker registers its endpoint here
and renews it on a heartbeat. An entry not renewed within its TTL is dropped: a dead worker
disappears from the router's view without anyone having to report it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import ray

log = logging.getLogger("specserve.registry")
REGISTRY_NAME = "registry"
TTL_HEARTBEATS = 3  # an entry lives this many heartbeats without renewal


@dataclass(frozen=True)
class Registration:
    """Where a process registers its endpoint (the Ray namespace of the registry) and how often."""

    namespace: str
    heartbeat_seconds: float

    @property
    def ttl(self) -> float:
        """How long an entry lives without renewal."""
        return self.heartbeat_seconds * TTL_HEARTBEATS


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "target", "draft" or "router"
    worker_id: str
    address: str  # host:port
    models: tuple[str, ...] = ()
    live_sessions: int = 0
    node_id: str = ""  # the Ray node it runs on
    pass_sessions: int = 0  # the most sessions one of its batched passes holds (0: not said)
    pass_times: tuple[tuple[int, float], ...] = ()  # a target's (tokens, seconds) per pass, timed at start-up
    prefix_tokens: tuple[int, int] = (0, 0)  # its prefix cache's prompt tokens and, of those, reused ones
    renewed: float = field(default=0.0, compare=False)


class Registry:
    """The table of live endpoints. Runs as a Ray actor; entries expire after ``ttl`` seconds."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.entries: dict[str, Endpoint] = {}

    def register(self, endpoint: Endpoint) -> None:
        if endpoint.worker_id not in self.entries:
            log.info("registered %s %s at %s", endpoint.kind, endpoint.worker_id, endpoint.address)
        self.entries[endpoint.worker_id] = replace(endpoint, renewed=time.monotonic())

    def unregister(self, worker_id: str) -> None:
        self.entries.pop(worker_id, None)

    def endpoints(self, kind: str | None = None) -> list[Endpoint]:
        now = time.monotonic()
        self.entries = {k: e for k, e in self.entries.items() if now - e.renewed <= self.ttl}
        return [e for e in self.entries.values() if kind is None or e.kind == kind]


def start_registry(registration: Registration, resources: dict[str, float]) -> ray.actor.ActorHandle:
    """Create the registry beside the router (``resources``: the router node's; soft affinity to
    this node where there are none), or find the one already running in ``namespace``. Left to Ray
    it can land on a draft node (seen: it did, with soft affinity alone), and losing that node
    would take the table of endpoints with it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    actor = ray.remote(num_cpus=0, max_restarts=-1)(Registry)
    return actor.options(name=REGISTRY_NAME, namespace=registration.namespace, get_if_exists=True,
                         resources=resources, scheduling_strategy=here).remote(registration.ttl)


class Heartbeat:
    """Keeps one endpoint registered: renews it every ``period`` seconds from a daemon thread.

    The registry may not exist yet (workers and the router start concurrently) or may have been
    restarted; each beat looks it up again when the last one failed.
    """

    def __init__(self, registration: Registration, describe: Callable[[], Endpoint]) -> None:
        self.namespace = registration.namespace
        self.period = registration.heartbeat_seconds
        self.describe = describe
        self._registry = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.beat()
            self._stopped.wait(self.period)

    def beat(self) -> None:
        try:
            if self._registry is None:
                self._registry = ray.get_actor(REGISTRY_NAME, namespace=self.namespace)
            ray.get(self._registry.register.remote(self.describe()), timeout=self.period * TTL_HEARTBEATS)
        except Exception as exc:  # not there yet, or restarting: try again next beat
            log.debug("heartbeat not delivered: %s", exc)
            self._registry = None

    def stop(self) -> None:
        self._stopped.set()
        try:
            if self._registry is not None:
                self._registry.unregister.remote(self.describe().worker_id)
        except Exception:  # the registry is gone too: nothing to unregister from
            pass
