"""The router's view of the workers: endpoints from the registry, channels to them, their load.

Each request's sessions are sticky: one target replica and one draft worker for its whole life. A
new session goes to the worker likeliest to hold the longest prefix of its prompt in its prefix
cache, among those within ``prefix_affinity`` sessions of the least loaded (by this router's open
sessions on each), else to the least loaded (router/prefix_routing.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Collection, Sequence

import grpc

from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc
from specserve.workers.grpc_host import CHANNEL_OPTIONS
from specserve.workers.registry import Endpoint
from specserve.workers.security import SecuritySettings, internal_aio_channel

from .multiplexing import Multiplexed
from .prefix_routing import PrefixMemory, choose, prompt_blocks
from .streams import WorkerStream

log = logging.getLogger("specserve.router")
REFRESH_SECONDS = 1.0  # how stale the router's copy of the registry may get
REGISTRY_TIMEOUT_SECONDS = 5.0


class NoWorker(Exception):
    """No registered worker can serve this request now (the service answers UNAVAILABLE)."""


class WorkerDirectory:
    def __init__(self, registry, failed_cooldown: float, security: SecuritySettings = SecuritySettings(),
                 prefix_affinity: int = 4) -> None:
        self.registry = registry  # the Registry actor's handle
        self.security = security  # how channels to workers authenticate (mTLS, the internal token)
        self.endpoints: list[Endpoint] = []
        self.refreshed = 0.0
        self.load: Counter[str] = Counter()  # worker_id -> this router's open sessions on it
        # A worker that failed a session is passed over this long (the registry's TTL, by which a
        # dead one is gone); without it, least-loaded picking would prefer the dead, idle worker.
        self.failed_cooldown = failed_cooldown
        # worker_id -> (its address then, when it failed). A worker back at another address is a
        # restarted process, not the failed one, and is not passed over.
        self.failed: dict[str, tuple[str, float]] = {}
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.multiplexed: dict[str, Multiplexed] = {}  # worker_id -> the stream all sessions there share
        self._lock = asyncio.Lock()
        self.prefixes = PrefixMemory()  # the prompt blocks sent to each worker lately
        self.prefix_affinity = prefix_affinity  # router.prefix_affinity_sessions

    async def refresh(self, force: bool = False) -> list[Endpoint]:
        async with self._lock:
            if force or time.monotonic() - self.refreshed > REFRESH_SECONDS:
                try:
                    async with asyncio.timeout(REGISTRY_TIMEOUT_SECONDS):  # no task per call, unlike wait_for
                        self.endpoints = await asyncio.wrap_future(self.registry.endpoints.remote().future())
                except TimeoutError:  # restarting, or its node is gone: go on with what we know
                    log.warning("the registry did not answer within %g s; using endpoints %.0f s old",
                                REGISTRY_TIMEOUT_SECONDS, time.monotonic() - self.refreshed)
                self.refreshed = time.monotonic()
        return self.endpoints

    def serves(self, model: str) -> bool:
        """Some registered worker serves ``model``, as of the last refresh (no wait)."""
        return any(model in e.models for e in self.endpoints)

    async def available(self, kind: str, model: str | None = None) -> list[Endpoint]:
        """The registered workers of ``kind`` (serving ``model``) that have not failed lately."""
        return [e for e in await self.refresh() if e.kind == kind and (model is None or model in e.models)
                and not self._passed_over(e)]

    async def pick(self, kind: str, model: str | None = None, avoid: Collection[str] = ()) -> Endpoint:
        """The least-loaded available worker of ``kind`` (serving ``model``), except those in
        ``avoid`` (worker ids: those that refused this request as full)."""
        return (await self.pick_for(kind, model, avoid))[0]

    async def pick_for(self, kind: str, model: str | None = None, avoid: Collection[str] = (),
                       prompt: Sequence[int] = ()) -> tuple[Endpoint, str]:
        """As ``pick``, for a session opening with ``prompt``: the worker and why (prefix_routing's
        PREFIX or LOAD). The prompt's blocks are remembered as sent there."""
        candidates = [e for e in await self.available(kind, model) if e.worker_id not in avoid]
        if not candidates:
            what = f"{kind} worker serving {model!r}" if model else f"{kind} replica"
            raise NoWorker(f"no {what} is registered yet; retry shortly")
        blocks = prompt_blocks(prompt)
        matched = {e.worker_id: self.prefixes.matched(e.worker_id, blocks) for e in candidates} if blocks else {}
        worker, why = choose(candidates, self.load, matched, self.prefix_affinity)
        if blocks:
            self.prefixes.remember(worker.worker_id, blocks)
        return worker, why

    def mark_failed(self, worker: Endpoint) -> None:
        now = time.monotonic()
        self.failed = {k: v for k, v in self.failed.items() if now - v[1] < self.failed_cooldown}  # forget old ones
        self.failed[worker.worker_id] = (worker.address, now)
        self.prefixes.forget(worker.worker_id)  # its cache went with it, or will be cold when it is back

    def _passed_over(self, worker: Endpoint) -> bool:
        address, when = self.failed.get(worker.worker_id, ("", -self.failed_cooldown))
        return address == worker.address and time.monotonic() - when < self.failed_cooldown

    def target_pressure(self) -> float:
        """This router's sessions per registered target replica: how busy the targets are."""
        targets = [e.worker_id for e in self.endpoints if e.kind == "target"]
        return sum(self.load[t] for t in targets) / len(targets) if targets else 0.0

    def target_pass_cap(self) -> int:
        """The most sessions a target replica's pass holds (the least over the replicas that say;
        0: none says)."""
        caps = [e.pass_sessions for e in self.endpoints if e.kind == "target" and e.pass_sessions]
        return min(caps, default=0)

    def target_pass_times(self) -> tuple[tuple[int, float], ...]:
        """(tokens, seconds) of a pass per width as the target replicas timed them at start-up (the
        slowest replica's at each width: a step waits for the replica it is on); () if none said."""
        slowest: dict[int, float] = {}
        for e in self.endpoints:
            if e.kind == "target":
                for tokens, seconds in e.pass_times:
                    slowest[tokens] = max(seconds, slowest.get(tokens, 0.0))
        return tuple(sorted(slowest.items()))

    def channel(self, endpoint: Endpoint) -> grpc.aio.Channel:
        """One persistent channel (HTTP/2 connection) per worker; each session is a stream on it."""
        if endpoint.address not in self.channels:
            self.channels[endpoint.address] = internal_aio_channel(
                endpoint.address, self.security, options=CHANNEL_OPTIONS)
        return self.channels[endpoint.address]

    def stream(self, worker: Endpoint, step_timeout: float, first_step_timeout: float | None = None) -> WorkerStream:
        """A new session stream to ``worker``: a session of this router's one multiplexed stream
        there (VerifyMany on a target replica, DraftMany on a draft worker)."""
        call = self._multiplexed(worker).session()
        return WorkerStream(worker, call, step_timeout, self.load, first_step_timeout)

    def _multiplexed(self, worker: Endpoint) -> Multiplexed:
        """This router's stream to ``worker`` for all its sessions there (a new one once it failed)."""
        stream = self.multiplexed.get(worker.worker_id)
        if stream is None or stream.broken:
            channel = self.channel(worker)
            if worker.kind == "target":
                call, parse = rpc.VerifierStub(channel).VerifyMany(), pb.VerifyReply.FromString
            else:
                call, parse = rpc.DrafterStub(channel).DraftMany(), pb.Proposal.FromString
            stream = self.multiplexed[worker.worker_id] = Multiplexed(call, parse)
        return stream
