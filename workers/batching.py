"""Continuous batching: one model's pending steps, from every live session, run as shared passes.

The scheduler lives on the process's gRPC event loop. Sessions submit steps and await them; while
the device runs a pass, new steps queue, and the next pass takes what is pending then (up to the
limits of ``BatchingConfig``), so sessions join and leave between passes. Steps that need several
passes (a prompt run in chunks, a draft's k tokens) stay in the batch until they are done.

Which steps share a pass never changes a step's result: each session attends to its own positions
only and draws from its own generator; only low bits of shared matrix products can differ
(``tests/test_batching.py`` checks greedy outputs token for token).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedModel

from .config import BatchingConfig
from .graphs import PassGraphs
from .grpc_host import Device
from .kv_pool import KVPool, Region
from .prefix_cache import PrefixCache
from .ragged_pass import Segment, run_pass
from .sim_device import PassCurve, PassShape, shape_of
from .steps import Step

log = logging.getLogger("specserve.workers")
# Launches in flight at once with ``overlap`` (a simulated device): the pass on the device and the
# one queued behind it, whose math and planning ran while the first held the device (vLLM's async
# scheduling keeps one step ahead the same way).
OVERLAP_DEPTH = 2


@dataclass(eq=False)  # identity: a ticket is one submission
class Ticket:
    """A submitted step and what the scheduler learns of it on the way."""

    step: Step
    task: str
    future: asyncio.Future
    on_pass: PassCallback | None = None
    queued_at: float = field(default_factory=time.monotonic)
    queue_seconds: float | None = None  # until its first pass began
    device_seconds: float = 0.0  # of the passes it took part in
    pass_tokens: int = 0  # of its last pass
    pass_sessions: int = 0
    abandoned: bool = False  # its session no longer wants it: finished at the next pass boundary

    @property
    def dropped(self) -> bool:
        return self.future.done()  # cancelled: its session ended while the step waited


@dataclass(frozen=True)
class StepResult:
    result: object
    device_seconds: float  # of every pass the step took part in (to ``on_pass``: of that pass)
    pass_tokens: int
    pass_sessions: int
    queue_seconds: float


PassCallback = Callable[[StepResult], None]


@dataclass
class PassCounts:
    """Totals over a scheduler's passes (the worker's Inspect reports them)."""

    passes: int = 0
    tokens: int = 0
    sessions: int = 0
    max_sessions: int = 0
    steps: int = 0  # that reached their first pass
    queue_seconds: float = 0.0  # those steps' waits for it (the draft pool's autoscaling reads their mean)

    def add(self, tokens: int, sessions: int) -> None:
        self.passes += 1
        self.tokens += tokens
        self.sessions += sessions
        self.max_sessions = max(self.max_sessions, sessions)


def candidates(active: Sequence[Ticket], waiting: Sequence[Ticket], config: BatchingConfig,
               now: float) -> list[Ticket]:
    """The steps the next pass considers, in the order they get room.

    Steps already under way come first (a draft mid-proposal), then waiting ones first come first
    served, at most ``max_sessions_per_pass``. With ``same_task_wait_ms``, a waiting step of
    another task than the pass's (the oldest step's) joins only once it has waited that long.
    Steps needing the fewest tokens plan first, so decode steps are never crowded out by a prompt:
    a long prompt takes the room left and runs in chunks.
    """
    pool = list(active) + list(waiting)
    if config.same_task_wait_ms and pool:
        task, patience = pool[0].task, config.same_task_wait_ms / 1000
        pool = [t for t in pool if t in active or t.task == task or now - t.queued_at >= patience]
    return pool[: config.max_sessions_per_pass]


class Scheduler:
    """Runs the steps of one model's sessions in batched passes on the process's device."""

    def __init__(self, model: PreTrainedModel, pool: KVPool, device: Device, config: BatchingConfig,
                 prefix_caching: bool = False, timing: PassCurve | None = None) -> None:
        """``timing``: on a simulated device, the curve its passes take (workers/sim_device.py)."""
        self.model = model
        self.timing = timing
        self.pool = pool
        # Sessions' prompt prefixes, reused across sessions (workers/prefix_cache.py).
        self.prefix = PrefixCache(pool) if prefix_caching and pool is not None else None
        self.device = device
        self.config = config
        self.waiting: list[Ticket] = []
        self.active: list[Ticket] = []
        self.counts = PassCounts()
        self._driver: asyncio.Task | None = None
        self._in_flight: collections.Counter[int] = collections.Counter()  # ids of regions passes in flight touch
        self._flying: set[int] = set()  # ids of the tickets in those passes
        self._landing: set[object] = set()  # launches whose passes are not over
        self._wake = asyncio.Event()  # a pass landed, or a step arrived or was abandoned
        # On a simulated device, the next pass is planned and launched while one runs (``overlap``).
        self.overlapped = device.stream is not None and config.overlap
        # pool None: a subclass that keeps each session's cache itself (an EAGLE-3 head's): no graphs
        capture = config.cuda_graphs and pool is not None and pool.shape.device.type == "cuda"
        self.graphs = (PassGraphs(model, pool, capture=capture, compiled=config.compiled)
                       if pool is not None and (capture or config.compiled) else None)
        self._to_release: list[Region] = []
        # Set (on the event loop) when a step arrives or is abandoned: a run of passes back to back
        # on the device thread stops at the next boundary, so the pass after takes it into account.
        self._news = threading.Event()
        self._left_out = False  # the running pass left a pending step out (limits, a task's wait)
        self.sessions = 0  # sessions holding a region of its pool (``take`` to ``release``)
        self.retired = False  # its model no longer serves new sessions: its pool closes after the last
        self.weight_bytes = 0  # of the budget, its model's weights (a model added on a GPU): given back at close

    async def run(self, step: Step, task: str = "", on_pass: PassCallback | None = None) -> StepResult:
        """Run ``step`` in as many passes as it needs, sharing them with other sessions' steps.
        ``on_pass`` is called on the event loop after each pass the step ran in (a decode run
        answers each token as it is drawn), the last one included, before this returns."""
        if step.result is not None:  # nothing to compute (a draft of k = 0)
            return StepResult(step.result, 0.0, 0, 0, 0.0)
        ticket = Ticket(step, task, asyncio.get_running_loop().create_future(), on_pass)
        self.waiting.append(ticket)
        self._news.set()
        if self._driver is None or self._driver.done():
            self._wake = asyncio.Event()  # of this loop (a scheduler may outlive one: asyncio.run in turn)
            self._driver = asyncio.create_task(self._drive())
        self._wake.set()
        await ticket.future
        return StepResult(step.result, ticket.device_seconds, ticket.pass_tokens, ticket.pass_sessions,
                          ticket.queue_seconds or 0.0)

    def abandon(self, step: Step) -> None:
        """Stop running ``step`` at the next pass boundary: its ``run`` returns with the step as far
        as it got (its result may be None). A pass it is in completes first, so when ``run``
        returns, no pass touches its session's state any more."""
        for ticket in (*self.waiting, *self.active):
            if ticket.step is step:
                ticket.abandoned = True
                self._news.set()
                self._wake.set()

    @property
    def passing(self) -> bool:
        """A pass is running on the device."""
        return bool(self._in_flight)

    def take(self, capacity: int) -> Region:
        """A new session's region of the pool (PoolFull where none fits)."""
        region = self.pool.take(capacity)
        self.sessions += 1
        return region

    def release(self, region: Region) -> None:
        """A session's stream ended: its region goes back to the pool (or is kept while its prompt
        prefix may serve another session), after the running pass if that pass still writes into it."""
        self.sessions -= 1
        if id(region) in self._in_flight:
            self._to_release.append(region)
        else:
            self._give_back(region)
            self._close_if_done()

    def retire(self) -> None:
        """Its model serves no new session (a draft worker's version retired, or replaced): once the
        sessions open on it end, its pool's memory goes back to the process's budget. On the
        server's loop, where sessions open and end."""
        self.retired = True
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self.retired and not self.sessions and not self._in_flight and not self._to_release:
            if self.prefix is not None:
                self.prefix.clear()
            self.graphs = None  # its buckets and scratch slot point into the arenas
            self.pool.close()
            self.pool.budget.give(self.weight_bytes)
            self.weight_bytes = 0

    def _give_back(self, region: Region) -> None:
        if self.prefix is None or not self.prefix.release(region):
            self.pool.give_back(region)

    async def _drive(self) -> None:
        """Plan a pass from the steps not in one, run its math on the device thread, then settle it:
        at once on a real device (its math is the pass); on a simulated one with ``overlap``, when
        the device would end it, while the next pass is planned and launched meanwhile."""
        while self.waiting or self.active or self._landing:
            for ticket in [t for t in (*self.waiting, *self.active) if t.abandoned and id(t) not in self._flying]:
                self._finish(ticket)
            self.waiting = [t for t in self.waiting if not t.dropped or id(t) in self._flying]
            self.active = [t for t in self.active if not t.dropped or id(t) in self._flying]
            # a step in a pass still on the device is in no other (on a real device none is, here)
            free = (lambda queue: [t for t in queue if id(t) not in self._flying]) if self._flying else list  # noqa: E731
            members = (self._plan(candidates(free(self.active), free(self.waiting), self.config, time.monotonic()))
                       if len(self._landing) < OVERLAP_DEPTH else [])
            if not members:
                if self._landing:  # wait for a pass to land (or a step to arrive), then plan again
                    self._wake.clear()
                    await self._wake.wait()
                elif self.waiting or self.active:
                    await asyncio.sleep(0.001)  # only steps of a task still inside its wait: let it pass
                continue
            regions = [id(segment.region) for _, segment in members]
            self._in_flight.update(regions)
            self._flying.update(id(ticket) for ticket, _ in members)
            started = time.monotonic()
            self._news.clear()
            in_pass = {id(ticket) for ticket, _ in members}  # a step this pass left out ends a run back to back
            self._left_out = any(id(t) not in in_pass for t in (*self.waiting, *self.active))
            landing = object()
            self._landing.add(landing)
            try:
                passes = await self.device.run(self._run_passes, members)
            except BaseException:
                self._landed(landing, [], started, regions, members)
                raise
            end = passes[-1][3] if passes else None
            if self.overlapped and end is not None:  # its results are read when the device would have them
                # partial, not a lambda: bound now, before the next launch rebinds these names
                self.device.stream.land(end, functools.partial(asyncio.get_running_loop().call_soon_threadsafe,
                                                               self._landed, landing, passes, started, regions, members))
            else:
                self._landed(landing, passes, started, regions, members)

    def _landed(self, landing: object, passes: list, started: float, regions: list[int], members: list) -> None:
        """On the event loop, a launch's passes are over: their regions and steps are free again, and
        each pass's steps are settled."""
        self._landing.discard(landing)
        self._in_flight.subtract(regions)
        self._in_flight = +self._in_flight  # drop the regions no pass touches any more
        for ticket, _ in members:
            self._flying.discard(id(ticket))
        for region in [r for r in self._to_release if id(r) not in self._in_flight]:
            self._to_release.remove(region)
            self._give_back(region)
        self._close_if_done()
        for ran, outcomes, seconds, _ in passes:
            self._settle(ran, outcomes, seconds, started)
        self._wake.set()

    def _run_passes(self, members: list[tuple[Ticket, Segment]]) -> list[tuple[list, list, float, float | None]]:
        """On the device thread: a pass, then (``back_to_back``) the next of the same steps at once,
        while every one of them needs another and nothing new has happened on the event loop. Each
        pass as (members, outcomes, device seconds, when it ends on a simulated device that overlaps,
        else None); a pass that fails fails its steps and ends the run."""
        passes = []
        while True:
            start = time.perf_counter()
            modelled = self._modelled(members)  # the shape before the pass: its advance moves the steps on
            try:
                outcomes = self._run(members)
            except Exception as exc:  # the whole pass failed: every step in it fails, the scheduler goes on
                log.exception("a batched pass of %d sessions failed", len(members))
                passes.append((members, [exc] * len(members), 0.0, None))
                return passes
            busy, end = self.device.passed(start, modelled, wait=not self.overlapped)
            passes.append((members, outcomes, busy, end))
            members = self._next_pass(members, outcomes)
            if not members:
                return passes

    def _next_pass(self, members: list[tuple[Ticket, Segment]], outcomes: list) -> list[tuple[Ticket, Segment]]:
        """The same steps' next pass, if it may follow at once: none finished or failed, none
        answers per pass (on_pass runs on the event loop), no step arrived, was abandoned or was
        left out of the pass, no other call waits for the device (another model's scheduler on
        it, a Score), and every one plans its next segment within the pass's room (bookkeeping)."""
        if (not self.config.back_to_back or self._news.is_set() or self._left_out or self.device.waiting
                or any(isinstance(outcome, Exception) or outcome for outcome in outcomes)
                or any(ticket.on_pass is not None or ticket.abandoned or ticket.dropped for ticket, _ in members)):
            return []
        room, following = self.config.max_tokens_per_pass, []
        for ticket, _ in members:
            try:
                segment = ticket.step.plan(room)
            except Exception:  # fails where the event loop plans it, alone
                return []
            if segment is None or id(segment.region) not in self._in_flight:
                return []
            following.append((ticket, segment))
            room -= len(segment.tokens)
        return following

    def _modelled(self, members: list[tuple[Ticket, Segment]]) -> float | None:
        """On a simulated device, the pass's time by its curve; None on a real one."""
        return self.timing.seconds(self._shape([segment for _, segment in members])) if self.timing else None

    def _shape(self, segments: list[Segment]) -> PassShape:
        return shape_of(segments)

    def _run(self, members: list[tuple[Ticket, Segment]]) -> list:
        """On the device thread: the pass (a graph's replay where one fits), then each step's advance."""
        segments = [segment for _, segment in members]
        logits = self.graphs.run(segments) if self.graphs is not None else None
        return advance_all(members, logits if logits is not None else run_pass(self.model, self.pool, segments))

    def _plan(self, tickets: list[Ticket]) -> list[tuple[Ticket, Segment]]:
        """Each ticket's segment within the pass's token budget; a step that cannot be planned fails alone."""
        room, members = self.config.max_tokens_per_pass, []
        for ticket in sorted(tickets, key=_pending_tokens):
            try:
                segment = ticket.step.plan(room)
            except ValueError as exc:
                self._finish(ticket, exc)
                continue
            if segment is not None:
                members.append((ticket, segment))
                room -= len(segment.tokens)
        return members

    def _settle(self, members: list[tuple[Ticket, Segment]], outcomes: list, seconds: float, started: float) -> None:
        tokens = sum(len(segment.tokens) for _, segment in members)
        self.counts.add(tokens, len(members))
        for (ticket, _), outcome in zip(members, outcomes, strict=True):
            if ticket.queue_seconds is None:
                ticket.queue_seconds = started - ticket.queued_at
                self.counts.steps += 1
                self.counts.queue_seconds += ticket.queue_seconds
            ticket.device_seconds += seconds
            ticket.pass_tokens, ticket.pass_sessions = tokens, len(members)
            if isinstance(outcome, Exception):
                self._finish(ticket, outcome)
                continue
            if ticket.on_pass is not None and not ticket.dropped:
                try:
                    ticket.on_pass(StepResult(None, seconds, tokens, len(members), ticket.queue_seconds))
                except Exception as exc:  # its session's bug: that step fails, the scheduler goes on
                    log.exception("a step's pass callback failed")
                    self._finish(ticket, exc)
                    continue
            if outcome:
                self._finish(ticket)
            elif ticket not in self.active:
                self.waiting.remove(ticket)
                self.active.append(ticket)

    def _finish(self, ticket: Ticket, error: Exception | None = None) -> None:
        for queue in (self.waiting, self.active):
            if ticket in queue:
                queue.remove(ticket)
        if not ticket.future.done():
            if error is None:
                ticket.future.set_result(None)
            else:
                ticket.future.set_exception(error)


def _pending_tokens(ticket: Ticket) -> int:
    try:
        plan = ticket.step.plan(2**31)  # planning is bookkeeping: asking costs nothing
    except ValueError:
        return 0  # planned for real next, where it fails alone
    return len(plan.tokens) if plan else 0


def advance_all(members: list[tuple[Ticket, Segment]], outputs: list) -> list:
    """Each step's advance on what the pass computed for it (its acceptance rule, its draws); a
    step whose advance fails fails alone. Then, once each, what the steps ask to run after the
    pass's advances (``after_pass``: work they share, as Medusa heads' guesses)."""
    outcomes: list = []
    try:
        for (ticket, _), rows in zip(members, outputs, strict=True):
            try:
                outcomes.append(ticket.step.advance(rows))
            except (ValueError, RuntimeError) as exc:
                outcomes.append(exc)
    finally:  # nothing owed by this pass is left for the next
        for after in {after for ticket, _ in members
                      if (after := getattr(ticket.step, "after_pass", None)) is not None}:
            after()
    return outcomes
