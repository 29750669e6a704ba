"""What a draft worker and a target replica share: models on a device, a gRPC endpoint, a registration."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc
import torch
from transformers import PreTrainedModel

from specserve.proto.v1 import internal_pb2 as pb

from .batching import Scheduler
from .calibration import time_pass_widths
from .sim_device import DRAFT, TARGET
from .config import WorkerConfig
from .grpc_host import BackgroundServer, Device, advertised_host
from .kv_cache import session_capacity
from .kv_pool import ARENA_POSITIONS, KVPool, KVShape, PoolFull, arena_positions, device_budget
from .loading import gemv_layout
from .ragged_pass import PooledSequence, use_pooled_attention
from .wire import sampling_from
from .registry import Endpoint, Heartbeat, Registration
from .security import SecuritySettings
from .token_bridge import TokenBridge, bridged_capacity

log = logging.getLogger("specserve.workers")
DRAIN_POLL_SECONDS = 0.1
# How long a process being removed (scaled down, updated) lets its live sessions end before what is
# left resumes elsewhere; Serve waits a little longer for a target replica (graceful_shutdown_timeout_s,
# cluster/app.py) before stopping it regardless.
DRAIN_SECONDS = 30.0
T = TypeVar("T")


@dataclass(frozen=True)
class HostLoad:
    """What a process's autoscaler reads of it: its live sessions, and totals (since it started) of
    the steps that reached a pass and of their waits for it (so two readings give the mean wait between them)."""

    sessions: int
    steps: int
    queue_seconds: float


class SessionLimit(Exception):
    """This process holds its configured maximum of sessions, or of KV cache memory."""


class SessionIdle(Exception):
    """A session's router sent nothing for the configured idle time: the session is evicted."""


class SessionSlots:
    """The sessions a process holds, bounded, each with what it took from the KV pool.

    A session takes its KV memory when it opens (a pool region for its longest possible sequence),
    so the bound holds however sessions grow. Touched only on the server's event loop: no lock.
    """

    def __init__(self, owner: str, max_sessions: int) -> None:
        self.owner = owner
        self.max_sessions = max_sessions
        self.live = 0

    @contextlib.contextmanager
    def hold(self, take: Callable[[], T] = lambda: None, give: Callable[[T], None] = lambda held: None,
             on_done: Callable[[Callable], None] = lambda release: None) -> Iterator[T]:
        """A slot and what ``take()`` returns, until ``give(held)`` at the end. ``on_done(release)``
        is given the release, for a caller that may learn of the session's end first (an RPC's
        done callback: grpc does not always close a cancelled handler's generator)."""
        if self.live >= self.max_sessions:
            raise SessionLimit(f"{self.owner} holds its limit of {self.max_sessions} sessions")
        try:
            held = take()
        except PoolFull as exc:
            raise SessionLimit(f"{self.owner}: {exc}") from None
        self.live += 1
        released = False

        def release(*_) -> None:
            nonlocal released
            if not released:
                released = True
                self.live -= 1
                give(held)

        on_done(release)
        try:
            yield held
        finally:
            release()


class ModelHost:
    """Runs ``add_servicer``'s service on a background gRPC server and keeps it registered."""

    def __init__(self, kind: str, worker_id: str, models: dict[str, PreTrainedModel], config: WorkerConfig,
                 registration: Registration, add_servicer: Callable[[grpc.aio.Server], None],
                 extra: tuple[str, ...] = (), time_passes: bool = False, spare_pools: int = 0) -> None:
        """``extra``: what it also serves, outside the batch schedulers (a draft worker's EAGLE-3 heads);
        ``time_passes``: time a pass of each width before registering (a target replica: the router
        prices load with them until it has timed real passes, workers/calibration.py)."""
        self.kind = kind
        self.worker_id = worker_id
        self.models = (*models, *extra)
        self.slots = SessionSlots(f"{kind} {worker_id}", config.max_sessions)
        self.idle_seconds = config.session_idle_seconds
        self.pass_sessions = config.batching.max_sessions_per_pass
        self.device = Device(config.threads, config.cpus, config.sim if config.device == "sim" else None)
        self.role = TARGET if kind == "target" else DRAFT  # the curve its models' passes take, simulated
        device = next(iter(models.values())).device if models else torch.device("cpu")
        self.budget = device_budget(config.kv_cache_mib, config.gpu_memory_utilization, config.gpus,
                                    device)  # shared by the pools of all its models
        self.batching, self.prefix_caching = config.batching, config.prefix_caching
        # On a GPU each pool takes its whole share at its first session: ``spare_pools`` shares stay
        # free for models added while serving (a draft worker's versions).
        self.pools = len(models) + spare_pools
        self.schedulers = {name: self._scheduler(model, name) for name, model in models.items()}
        compiled = [s.graphs for s in self.schedulers.values() if s.graphs is not None and s.graphs.compiled]
        if compiled:  # before it registers, so no request meets a compile; on this thread, not the device's
            # pinned one, whose pinning the C++ compiler's processes would inherit (a minute cold).
            seconds = [graphs.warm_up() for graphs in compiled]
            kept = [name for name, s in self.schedulers.items() if s.graphs is not None and s.graphs.compiled]
            log.info("%s %s: compiled the decode passes of %s in %.1f s (%s s)", kind, worker_id, ", ".join(kept)
                     or "none (the compiler failed: eager passes)", sum(seconds), "/".join(f"{t:.1f}" for t in seconds))
        self.pass_times: tuple[tuple[int, float], ...] = ()
        if time_passes and self.schedulers:
            scheduler = next(iter(self.schedulers.values()))
            self.pass_times = self.device.executor.submit(time_pass_widths, scheduler).result()
            log.info("%s %s: a pass of %s tokens takes %s ms (timed at start-up)", kind, worker_id,
                     "/".join(str(t) for t, _ in self.pass_times),
                     "/".join(f"{s * 1e3:.1f}" for _, s in self.pass_times))
        security = SecuritySettings.from_env()  # the router is the only caller: mTLS and the internal token
        self.server = BackgroundServer(add_servicer, name=f"{kind}-grpc",
                                       credentials=security.internal_server_credentials(),
                                       interceptors=security.internal_interceptors())
        self.address = f"{advertised_host()}:{self.server.port}"
        self.resources = _assigned_resources()
        self.node_id = _node_id()
        self.heartbeat = Heartbeat(registration, self.endpoint)
        log.info("%s %s serving %s at %s (cores %s; %s)", kind, worker_id, ", ".join(self.models), self.address,
                 sorted(self.device.cpus) or "unpinned", security.describe_internal())

    def _scheduler(self, model: PreTrainedModel, name: str) -> Scheduler:
        shape = KVShape.of(model)
        pool = KVPool(shape, self.budget, arena_positions(self.budget, shape, self.pools))
        return Scheduler(use_pooled_attention(gemv_layout(model)), pool, self.device, self.batching, self.prefix_caching,
                         timing=self.device.timing(name, self.role))

    def added_scheduler(self, model: PreTrainedModel, name: str) -> Scheduler:
        """A scheduler, its pool and (compiled) warmed passes for a model loaded while serving; not
        yet serving anything (``on_loop`` puts it in ``schedulers``). It needs room in the budget for
        a pool, and on a GPU for the model's weights too (taken from the budget until it closes, as
        the budget was sized without them): ValueError otherwise."""
        scheduler = self._scheduler(model, name)
        cuda = scheduler.pool.shape.device.type == "cuda"
        weights = sum(p.numel() * p.element_size() for p in model.parameters()) if cuda else 0
        needed = min(scheduler.pool.arena_positions, ARENA_POSITIONS) * scheduler.pool.shape.bytes_per_position
        if self.budget.left_bytes < needed + weights or not self.budget.take(weights):
            room = ("keep a share free for versions (draft_pool.version_pools), or wait for the sessions of a version "
                    "replaced or retired to end" if cuda else
                    "raise kv_cache_mib (a pool's memory, once grown, stays until its model goes)")
            raise ValueError(f"{self.kind} {self.worker_id}: {self.budget.left_bytes / 2**20:.0f} MiB of its KV budget "
                             f"is free, a new model needs {(needed + weights) / 2**20:.0f} MiB: {room}")
        scheduler.weight_bytes = weights
        if scheduler.graphs is not None and scheduler.graphs.compiled:
            # On the device thread, between passes: compiling (or capturing graphs) beside a running
            # pass is not safe. Slower there (the compiler's processes inherit its pinning), but once.
            try:
                seconds = self.device.executor.submit(scheduler.graphs.warm_up).result()
            except BaseException:
                scheduler.retire()  # nothing serves it: its memory goes back now
                raise
            log.info("%s %s: compiled the decode passes of a model added in %.1f s", self.kind, self.worker_id, seconds)
        return scheduler

    def on_loop(self, change: Callable[[], T]) -> T:
        """Run ``change`` on the server's event loop, where sessions open and end, and return what it
        returns: what serves a name changes between two sessions' opening, never during one."""
        async def run() -> T:
            return change()
        return asyncio.run_coroutine_threadsafe(run(), self.server.loop).result()

    def endpoint(self) -> Endpoint:
        counts = _prefix_counts(tuple(self.schedulers.values()))  # a snapshot: versions come and go on the loop
        return Endpoint(self.kind, self.worker_id, self.address, self.models, self.slots.live, self.node_id,
                        pass_sessions=self.pass_sessions, pass_times=self.pass_times,
                        prefix_tokens=(counts["prefix_prompt_tokens"], counts["prefix_reused_tokens"]))

    @contextlib.contextmanager
    def session(self, model: str, opened: pb.SessionOpen, context: grpc.aio.ServicerContext,
                bridge: TokenBridge | None = None) -> Iterator[tuple[Scheduler, PooledSequence]]:
        """A session slot and a region of ``model``'s KV pool for the longest sequence ``opened``
        may reach, until the session's stream ends; with the scheduler its steps run on. A draft of
        another tokenizer (``bridge``) holds its own tokens of the prompt's text, in more room."""
        scheduler = self.schedulers.get(model)
        if scheduler is None:  # a version retired since the caller looked
            raise SessionLimit(f"{self.kind} {self.worker_id} no longer serves {model!r}")
        capacity = reserved_length(opened, scheduler.model)
        prompt = list(opened.prompt_ids)
        if bridge is not None:
            encoded = bridge.encode(prompt)
            capacity, prompt = bridged_capacity(capacity, len(prompt), len(encoded)), encoded
        with self.slots.hold(lambda: scheduler.take(capacity), scheduler.release,
                             context.add_done_callback) as region:
            sequence = PooledSequence(region, prompt, scheduler.pool)
            if scheduler.prefix is not None:
                # A target serving an EAGLE-3 head hands it hidden states from the end of a cached
                # prefix on (that prefix's were computed elsewhere), so the head drafts from a
                # shorter context. Greedy, that costs at most acceptance; sampled, a seeded replay
                # must draft what it drafted before whatever the cache holds: it computes it all.
                head_sampled = bool(opened.target.aux_layers) and not sampling_from(opened.sampling).greedy
                scheduler.prefix.open(sequence, reuse=not head_sampled)
            yield scheduler, sequence

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

    async def refuse(self, requests) -> None:
        """After a refusal (SessionLimit) was said on the stream: wait for the router to end it.

        A refusal is a reply, not the RPC's status, because the router may be writing its next
        request as the RPC ends, and grpc's asyncio client then reports INTERNAL ("Internal error
        from Core") in place of the status (grpc/grpc#36066): a full worker would pass for a dead
        one. So the worker never ends the stream first; the router cancels it once it has read the
        refusal (a stream the router leaves open ends at the idle time)."""
        try:
            async for _ in self.steps(requests):
                pass
        except SessionIdle:
            pass

    def state(self) -> pb.WorkerState:
        schedulers = tuple(self.schedulers.values())
        counts = [s.counts for s in schedulers]
        return pb.WorkerState(
            worker_id=self.worker_id, models=self.models, live_sessions=self.slots.live, resources=self.resources,
            pid=os.getpid(), kv_budget_bytes=self.budget.limit_bytes,
            kv_reserved_bytes=sum((s.pool.in_use - _cached(s) - _scratch(s)) * s.pool.shape.bytes_per_position
                                  for s in schedulers),
            kv_cached_bytes=sum(_cached(s) * s.pool.shape.bytes_per_position for s in schedulers),
            **_prefix_counts(schedulers),
            kv_pool_bytes=sum(s.pool.allocated_bytes for s in schedulers),
            passes=sum(c.passes for c in counts), pass_tokens=sum(c.tokens for c in counts),
            pass_sessions=sum(c.sessions for c in counts),
            max_pass_sessions=max((c.max_sessions for c in counts), default=0),
            device_busy_seconds=self.device.busy_seconds, device_simulated=self.device.stream is not None,
            device_overrun_seconds=self.device.stream.overrun_seconds if self.device.stream is not None else 0.0)

    def load(self, schedulers: Iterable[Scheduler] = ()) -> HostLoad:
        """Its load now (``schedulers``: those it runs outside ``self.schedulers``, a draft worker's heads')."""
        counts = [s.counts for s in (*tuple(self.schedulers.values()), *schedulers)]
        return HostLoad(self.slots.live, sum(c.steps for c in counts), sum(c.queue_seconds for c in counts))

    def drain(self, timeout: float = DRAIN_SECONDS) -> None:
        """Take no more sessions (unregistered, routers open none here) and let the live ones end,
        for up to ``timeout`` seconds; the server keeps serving them meanwhile. What is left then
        resumes elsewhere from the router's history, as after a failure."""
        self.heartbeat.stop()
        deadline = time.monotonic() + timeout
        while self.slots.live and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_SECONDS)
        log.info("%s %s: drained, %d sessions left to resume elsewhere", self.kind, self.worker_id, self.slots.live)

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


def _cached(scheduler: Scheduler) -> int:
    """Positions its prefix cache keeps (regions of finished sessions)."""
    return scheduler.prefix.stats.retained_positions if scheduler.prefix is not None else 0


def _scratch(scheduler: Scheduler) -> int:
    """Positions its compiled passes keep for their padded rows (workers/graphs.py): the pool's own,
    held from the first compiled pass on, so no session's reservation."""
    graphs = scheduler.graphs
    return graphs.scratch.capacity if graphs is not None and graphs.scratch is not None else 0


def _prefix_counts(schedulers: Iterable[Scheduler]) -> dict[str, int]:
    """WorkerState's prefix-cache counters, summed over ``schedulers``."""
    stats = [s.prefix.stats for s in schedulers if s.prefix is not None]
    return {"prefix_sessions": sum(p.sessions for p in stats), "prefix_hits": sum(p.hits for p in stats),
            "prefix_prompt_tokens": sum(p.prompt_tokens for p in stats),
            "prefix_reused_tokens": sum(p.reused_tokens for p in stats),
            "prefix_evictions": sum(p.evictions for p in stats)}
