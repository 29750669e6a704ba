"""How many target replicas and draft workers a workload needs: a simulation of the cluster's passes.

A target replica runs passes back to back while it holds sessions (continuous batching): every
session ready for the target adds its next tokens to the pass (a prompt chunk, a verify step of
k + 1 tokens, or one token target-only), up to ``max_sessions_per_pass`` sessions and
``max_tokens_per_pass`` tokens, and the pass takes what the replica's measured pass-time curve says
for its width, plus the replica's overhead a pass. A speculating session commits 1 + a tokens a
step, a drawn from the truncated geometric law of its task's acceptance alpha (each of k draft
tokens accepted with probability alpha until the first rejection).

Between its verify steps a speculating session is in no target pass: its verdict goes to the router
and the next proposal comes back (``step_hop_ms``), and a proposal from a draft worker takes the k
passes of its draft device, shared with the other sessions drafting there (``draft_pass_ms`` by
sessions in a pass, over ``draft_devices`` devices a replica; or a fixed ``draft_token_ms``). The
draft drafts the next proposal while the target verifies (the router's lookahead): after a verdict
that takes the whole proposal and the draft's guess of the target's next token, that proposal is
ready; after any other, the draft drafts afresh. A step of the router's draft-free proposers
(n-gram, suffix) waits for the round trip alone. Target-only decoding runs on the replica (a run of
tokens, no round trip). A step speculates only where ``router/cost_model.py`` prices it above a
target-only token at the replica's load, as the policy does (``speedup_at`` with a ``Load``: the
replica's sessions, its pass curve, the round trip as r, a drafted token's time as c).

Requests are spread evenly over replicas, so each replica sees an equal share of the arrivals
(open loop: Poisson at ``rate`` / replicas) or of the clients (closed loop: each client sends its
next request when the last one ends). The replicas are then alike and independent, so the planner
simulates ``sample_replicas`` of them, whatever the fleet's size: 1,000 replicas cost what 4 do.

Everything here is arithmetic on given numbers: the costs come from a bench report or a running
service's stats (``specserve plan --costs``; ``bench/plan_check.py`` measures them from a bench
run), the workload from the operator.

What it has been shown to predict (``bench/plan_check.py``: costs calibrated on one bench run,
scored on runs it was not fitted on): throughput within 15% up to ``VALIDATED_SESSIONS`` sessions a
replica, on the load shape it was calibrated on. Past that, on other shapes, and for the p99 time
per output token, it has not been (docs/pages/deployment.md has the held-out table).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from specserve.router.cost_model import Load, PassCurve, PassTime, speedup_at
from specserve.workers.proposer_kinds import DRAFT_FREE  # the router's proposers: no draft worker
from specserve.workers.stats import percentile

# Sessions a replica (requests in flight on it) up to which runs the costs were not fitted on put
# the predicted throughput within 15% of the measured (bench/plan_check.py: calibrated on
# 20261127-094901, scored on three other bench runs: OFF 12 of 12 rows, AUTO 10 of 12). At 16-64
# sessions, 6 of 18 rows were (19% off on average): not validated there.
VALIDATED_SESSIONS = 8


@dataclass(frozen=True)
class TaskLoad:
    """One task's part of the workload and how speculation does on it."""

    name: str
    share: float  # of the requests
    alpha: float = 0.0  # acceptance per drafted token (its proposer's, measured)
    k: int = 0  # draft tokens a step; 0: target-only
    # Its proposals come from the router's draft-free proposers (n-gram, suffix): no draft worker,
    # no draft device time; a step still makes the round trip through the router.
    draft_free: bool = False

    def __post_init__(self) -> None:
        if self.share < 0 or not 0 <= self.alpha <= 1 or self.k < 0:
            raise ValueError(f"task {self.name!r}: share >= 0, alpha in [0, 1] and k >= 0, got "
                             f"{self.share}, {self.alpha}, {self.k}")


@dataclass(frozen=True)
class Workload:
    tasks: tuple[TaskLoad, ...]
    prompt_tokens: int
    output_tokens: int
    rate: float | None = None  # requests/s over the fleet (open loop) ...
    clients: int | None = None  # ... or this many clients, each waiting for its last answer (closed loop)
    # Closed loop only: the clients share this many requests in all, then stop (a bench's load level);
    # None: they go on for the whole simulated time.
    requests: int | None = None
    # Output lengths to draw each request's from (a measured run's: requests end at their stop token,
    # and a short one's time per token carries its fixed costs); empty: every request output_tokens.
    output_lengths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.clients is None):
            raise ValueError("a workload has a rate (requests/s) or a number of clients, not both")
        if not self.tasks or sum(t.share for t in self.tasks) <= 0:
            raise ValueError("a workload needs at least one task with a share above 0")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be at least 1")
        if any(n < 1 for n in self.output_lengths):
            raise ValueError("output_lengths must be at least 1 each")
        if self.requests is not None and (self.clients is None or self.requests < 1):
            raise ValueError("requests (a total) is for a closed loop of clients, and at least 1")

    def speculation_off(self) -> Workload:
        return Workload(tuple(TaskLoad(t.name, t.share) for t in self.tasks), self.prompt_tokens,
                        self.output_tokens, self.rate, self.clients, self.requests, self.output_lengths)


Curve = tuple[tuple[int, float], ...]


@functools.lru_cache(maxsize=65536)
def _interpolate(points: Curve, x: int) -> float:
    """``points`` (x, y) with straight lines between them and past the last (at least a millionth)."""
    xs = [w for w, _ in points]
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return points[i][1]
    if len(xs) == 1:
        return points[0][1]
    lo, hi = (i - 1, i) if 0 < i < len(xs) else ((0, 1) if i == 0 else (len(xs) - 2, len(xs) - 1))
    (x0, y0), (x1, y1) = points[lo], points[hi]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 1e-3)


def _check_curve(name: str, points: Curve) -> None:
    xs = [w for w, _ in points]
    if not xs or xs != sorted(set(xs)) or xs[0] < 1 or any(ms <= 0 for _, ms in points):
        raise ValueError(f"{name} needs (width, ms) points with distinct increasing widths >= 1 and times > 0")


@dataclass(frozen=True)
class Costs:
    """A replica's measured costs, and its draft devices'.

    ``pass_ms``: (tokens in a pass, ms) points of the target's pass-time curve. ``draft_pass_ms``:
    (sessions in a pass, ms) of a draft worker's pass, one token a session (a draft drafts its k
    tokens in k passes); left out, each drafted token costs ``draft_token_ms`` whatever the load.
    ``draft_devices``: the draft devices serving one replica's sessions (its share of the pool),
    each running its own passes; 0: one for each session (no contention: the pool is sized from the
    device time the sessions need)."""

    pass_ms: Curve
    draft_token_ms: float = 0.0
    max_sessions_per_pass: int = 32
    max_tokens_per_pass: int = 512
    # Time each pass spends outside the model on a serving replica (the scheduler's hop to its event
    # loop, the tokens streamed out): what a curve timed in process lacks.
    pass_overhead_ms: float = 0.0
    # ... and for each session in the pass (its reply built and streamed, its next step read): on a
    # small model with many sessions this is what the pass-time curve misses most.
    session_overhead_ms: float = 0.0
    draft_pass_ms: Curve = ()
    draft_devices: int = 0
    # A speculating step's round trip through the router (the verdict to the router, the next
    # proposal to the replica), during which its session is in no pass. Target-only decoding runs
    # on the replica (a run of tokens a request), with no round trip per token. The router's CPU is
    # not modelled: it runs on machines of its own (a fit of it on one embedded run, where it shares
    # the host, gave 7.6 ms a step on 20261127-094901 and 0.9 ms on 20261127-052559: bench/plan_check.py).
    step_hop_ms: float = 0.0
    # The draft drafts the next proposal while the target verifies (router.lookahead, on by default):
    # after a verdict that accepts the whole proposal and the draft's guess of the target's next
    # token, the next proposal is (or soon will be) ready.
    lookahead: bool = True

    def __post_init__(self) -> None:
        _check_curve("pass_ms", self.pass_ms)
        if self.draft_pass_ms:
            _check_curve("draft_pass_ms", self.draft_pass_ms)
        if min(self.draft_devices, self.step_hop_ms, self.draft_token_ms, self.pass_overhead_ms,
               self.session_overhead_ms) < 0:
            raise ValueError("draft_devices, step_hop_ms, draft_token_ms and the overheads must be at least 0")

    def pass_seconds(self, tokens: int, sessions: int = 1) -> float:
        """A target pass of ``tokens`` over ``sessions`` on the serving replica (its overheads included)."""
        return (_interpolate(self.pass_ms, tokens) + self.pass_overhead_ms + self.session_overhead_ms * sessions) / 1000

    def pass_curve(self, sessions: int) -> PassCurve:
        """s(t) of a pass of ``sessions`` sessions as router/cost_model.py reads one: the measured widths
        with the replica's overheads, and the line through the last two past them (as pass_seconds)."""
        points = tuple((w, self.pass_seconds(w, sessions)) for w, _ in self.pass_ms)
        (t0, s0), (t1, s1) = points[-2] if len(points) > 1 else points[-1], points[-1]
        slope = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
        return PassCurve(PassTime(s1 - slope * t1, slope), points)

    def draft_pass_seconds(self, sessions: int) -> float:
        if not self.draft_pass_ms:
            return self.draft_token_ms / 1000
        return _interpolate(self.draft_pass_ms, sessions) / 1000


@dataclass(eq=False)
class _Session:
    task: TaskLoad
    arrived: float
    client: int = -1
    prompt_left: int = 0
    output_left: int = 0
    first_token: float | None = None
    output: int = 0  # tokens it gives in all
    k: int = 0  # draft tokens of its step under way (0: a target-only token)
    waiting_for_draft: bool = False  # its next verify waits for its draft device
    draft_left: int = 0  # tokens its draft device still drafts for it (a proposal, or a lookahead)
    device: int = -1  # its draft device, where they are shared (Costs.draft_devices)
    draft_until: float = 0.0  # on a device of its own: when its draft under way ends ...
    draft_runs: int = 0  # ... and which one that is (an event of a dropped one is ignored)


@dataclass
class ReplicaRun:
    """What one simulated replica did."""

    seconds: float
    tokens: int
    tpot: list[float] = field(default_factory=list)  # per finished request: (done - first token) / (tokens - 1)
    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    draft_seconds: float = 0.0  # draft device time the replica's sessions needed
    session_seconds: float = 0.0  # sessions in flight (joined or waiting to) integrated over time
    passes: int = 0
    backlog: int = 0  # requests still waiting for a place in the passes at the end
    decode_steps: int = 0  # steps after the prompt's
    speculated: int = 0  # of those, the ones that speculated (AUTO serves a step target-only where that is faster)


def accepted(alpha: float, k: int, rng: random.Random) -> int:
    """Draft tokens a verify step accepts: each in turn with probability alpha, until one is not."""
    a = 0
    while a < k and rng.random() < alpha:
        a += 1
    return a


class _Replica:
    """One replica's discrete-event simulation: the target's passes and its draft devices' passes,
    each device running back to back while it has work, and sessions moving between them."""

    def __init__(self, workload: Workload, costs: Costs, replicas: int, seconds: float, seed: int,
                 warmup: float) -> None:
        self.workload, self.costs, self.seconds = workload, costs, seconds
        self.rng = random.Random(seed)
        self.counted_from = warmup * seconds
        self.run = ReplicaRun(seconds, 0)
        self.events: list[tuple[float, int, str, object]] = []  # (time, order, kind, what)
        self.order = 0
        self.waiting: list[_Session] = []  # arrived, not yet among the active
        self.active: list[_Session] = []
        self.ready: list[_Session] = []  # active sessions waiting for a target pass, first come first served
        self.passing = False  # a target pass is running
        self.devices: dict[int, list[_Session]] = {}  # device -> its sessions with tokens to draft
        self.device_busy: set[int] = set()
        self.priced: dict[tuple[int, int, int], int] = {}  # (id(task), k, sessions in flight) -> the k taken
        arrivals: list[tuple[float, int]] = []
        if workload.rate is not None:
            rate, t = workload.rate / replicas, 0.0
            while (t := t + self.rng.expovariate(rate)) < seconds:
                arrivals.append((t, -1))
        else:
            share = workload.clients // replicas + (1 if seed % replicas < workload.clients % replicas else 0)
            arrivals = [(0.0, c) for c in range(share)]
        # A closed loop's total (its replica's share of it): each request issued takes one.
        self.left = None if workload.requests is None else max(0, round(workload.requests / replicas) - len(arrivals))
        for t, client in arrivals:
            self._at(t, "arrive", client)

    def _at(self, when: float, kind: str, what: object = None) -> None:
        heapq.heappush(self.events, (when, self.order, kind, what))
        self.order += 1

    def simulate(self) -> ReplicaRun:
        now = 0.0
        while self.events and self.events[0][0] < self.seconds:
            self.run.session_seconds += (self.events[0][0] - now) * (len(self.active) + len(self.waiting))
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:  # everything due now, before any pass starts
                _, _, kind, what = heapq.heappop(self.events)
                if kind == "arrive":
                    self._arrive(now, what)
                elif kind == "target":
                    self._target_done(now, what)
                elif kind == "draft":
                    self._draft_done(now, what)
                elif kind == "drafted" and what[1] == what[0].draft_runs:  # not a draft dropped since
                    self._drafted(now, what[0])
                elif kind == "ready":
                    self.ready.append(what)
            self._admit()
            self._start_passes(now)
        self.run.seconds = now
        self.run.backlog = len(self.waiting) + sum(1 for t, _, kind, _ in self.events if kind == "arrive" and t <= now)
        return self.run

    def _arrive(self, now: float, client: int) -> None:
        task = self.rng.choices(self.workload.tasks, [t.share for t in self.workload.tasks])[0]
        lengths = self.workload.output_lengths
        output = self.rng.choice(lengths) if lengths else self.workload.output_tokens
        self.waiting.append(_Session(task, now, client, self.workload.prompt_tokens, output, output=output))

    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.costs.max_sessions_per_pass:
            session = self.waiting.pop(0)
            self.active.append(session)
            self.ready.append(session)

    def _start_passes(self, now: float) -> None:
        if not self.passing and self.ready:
            room, members = self.costs.max_tokens_per_pass, []
            for session in list(self.ready):
                tokens = min(session.prompt_left, room) if session.prompt_left else session.k + 1
                if tokens and tokens <= room:
                    members.append((session, tokens))
                    room -= tokens
                    self.ready.remove(session)
            if members:
                width = sum(n for _, n in members)
                step = self.costs.pass_seconds(width, len(members))
                self.run.passes += 1
                for session, _ in members:
                    if session.k and self.costs.lookahead and not session.task.draft_free:
                        self._draft(now, session, session.k)  # the next proposal, drafted while this one is verified
                self.passing = True
                self._at(now + step, "target", members)
        for device, sessions in self.devices.items():
            if device not in self.device_busy and sessions:
                batch = sessions[:self.costs.max_sessions_per_pass]
                step = self.costs.draft_pass_seconds(len(batch))
                self.run.draft_seconds += step
                self.device_busy.add(device)
                self._at(now + step, "draft", (device, batch))

    def _draft(self, now: float, session: _Session, tokens: int) -> None:
        """Its draft device drafts ``tokens`` for it from now (a stale lookahead is dropped)."""
        session.draft_left = tokens
        if not self.costs.draft_devices:  # a device of its own: its k passes back to back, one event
            per_token = self.costs.draft_pass_seconds(1)
            if session.draft_until > now:  # the stale lookahead stops: its device time not spent
                self.run.draft_seconds -= session.draft_until - now
            session.draft_until = now + tokens * per_token
            session.draft_runs += 1
            self.run.draft_seconds += tokens * per_token
            self._at(session.draft_until, "drafted", (session, session.draft_runs))
            return
        if session.device < 0:  # the device with the fewest sessions drafting
            session.device = min(range(self.costs.draft_devices), key=lambda d: len(self.devices.get(d, ())))
        queue = self.devices.setdefault(session.device, [])
        if session not in queue:
            queue.append(session)

    def _drafted(self, now: float, session: _Session) -> None:
        session.draft_left = 0
        if session.waiting_for_draft:
            session.waiting_for_draft = False
            self._at(now + self.costs.step_hop_ms / 1000, "ready", session)

    def _draft_done(self, now: float, what: tuple[int, list[_Session]]) -> None:
        device, batch = what
        self.device_busy.discard(device)
        queue = self.devices[device]
        for session in batch:
            session.draft_left -= 1
            if session.draft_left <= 0 and session in queue:
                queue.remove(session)
                self._drafted(now, session)

    def _target_done(self, now: float, members: list[tuple[_Session, int]]) -> None:
        self.passing = False
        for session, tokens in members:
            hit = False
            if session.prompt_left:
                session.prompt_left -= tokens
                if session.prompt_left:
                    self.ready.append(session)
                    continue
                session.first_token = now  # the prompt's last chunk gives the first token
                made = 1
            elif session.k:
                self.run.decode_steps += 1
                a = accepted(session.task.alpha, session.k, self.rng)
                # A lookahead is ready if the verdict took the whole proposal and the draft's guess of the
                # target's next token (its likeliest) was right.
                hit = self.costs.lookahead and a == session.k and self.rng.random() < session.task.alpha
                made = a + 1
                self.run.speculated += 1
            else:
                self.run.decode_steps += 1
                made = 1
            made = min(made, session.output_left)
            session.output_left -= made
            self.run.tokens += made
            if session.output_left <= 0:
                self._finish(now, session)
            else:
                self._next_step(now, session, hit)

    def _next_step(self, now: float, session: _Session, lookahead_hit: bool) -> None:
        was = session.k
        session.k = self._k(session)
        if not session.k:  # target-only: the replica's decode run, no round trip
            self.ready.append(session)
            return
        hop = self.costs.step_hop_ms / 1000
        if session.task.draft_free:
            self._at(now + hop, "ready", session)
            return
        if not (lookahead_hit and was == session.k):  # a fresh proposal: the lookahead guessed wrong
            self._draft(now, session, session.k)
        if session.draft_left > 0:
            session.waiting_for_draft = True
        else:
            self._at(now + hop, "ready", session)

    def _k(self, session: _Session) -> int:
        """The policy's k for a session's next step: its task's, where router/cost_model.py expects a
        step of it to beat a target-only token at the replica's load (``speedup``), else 0."""
        task = session.task
        k = min(task.k, session.output_left - 1)
        if k < 1:
            return 0
        in_flight = len(self.active) + len(self.waiting)
        key = (id(task), k, in_flight)
        if key not in self.priced:
            self.priced[key] = k if speedup(task, k, in_flight, self.costs) > 1 else 0
        return self.priced[key]

    def _finish(self, now: float, session: _Session) -> None:
        self.active.remove(session)
        if session in self.devices.get(session.device, ()):  # its lookahead stops with it
            self.devices[session.device].remove(session)
        if session.draft_until > now:
            self.run.draft_seconds -= session.draft_until - now
            session.draft_runs += 1
        if now >= self.counted_from:
            self.run.latency.append(now - session.arrived)
            self.run.ttft.append(session.first_token - session.arrived)
            if session.output > 1:
                self.run.tpot.append((now - session.first_token) / (session.output - 1))
        if session.client >= 0 and self.left != 0:  # the client sends its next request at once: the next pass has it
            self._arrive(now, session.client)
            self.left = None if self.left is None else self.left - 1


def speedup(task: TaskLoad, k: int, in_flight: int, costs: Costs) -> float:
    """A step of k's expected speedup over a target-only token with ``in_flight`` sessions on the
    replica, priced as the policy prices it (``router/policy.py`` ``load``, ``router/cost_model.py``):
    N the sessions, up to what a pass holds; the verify pass of N (k + 1) tokens against the
    target-only pass of N on the replica's curve; r the round trip and c a drafted token's time, over
    that target-only pass; the draft's time hidden (saturated) once more sessions wait than a pass holds."""
    sessions = max(1, min(in_flight, costs.max_sessions_per_pass))
    plain = costs.pass_seconds(sessions, sessions)
    per_device = max(1, sessions // costs.draft_devices) if costs.draft_devices else 1
    drafted = 0.0 if task.draft_free else costs.draft_pass_seconds(per_device)
    load = Load(sessions, costs.pass_curve(sessions), r=costs.step_hop_ms / 1000 / plain,
                saturated=in_flight > costs.max_sessions_per_pass)
    return speedup_at(task.alpha, drafted / plain, k, load)


def simulate_replica(workload: Workload, costs: Costs, replicas: int, seconds: float, seed: int = 0,
                     warmup: float = 0.1) -> ReplicaRun:
    """One replica of ``replicas`` for ``seconds`` of simulated time; requests that end in the first
    ``warmup`` share of it are left out of the latencies (the queue is filling)."""
    return _Replica(workload, costs, replicas, seconds, seed, warmup).simulate()


def served_arm(name: str, requests: float, draft: str, k: float, alpha: float) -> TaskLoad:
    """A (task, proposer) as it was served, as a task of the workload: ``requests`` its share, k its
    mean proposed tokens a verify step (rounded), alpha its acceptance (``workers/stats.py``); no
    draft (or k below one): target-only."""
    if not draft or round(k) < 1:
        return TaskLoad(name, requests)
    return TaskLoad(name, requests, alpha, round(k), draft_free=draft in DRAFT_FREE)


@dataclass(frozen=True)
class Fleet:
    """A fleet's simulated behaviour: throughput and latencies over its sampled replicas."""

    replicas: int
    tokens_per_second: float  # the whole fleet's
    requests_per_second: float  # its tokens/s over the tokens a request has
    p50_tpot: float
    p99_tpot: float
    p99_latency: float
    p99_ttft: float
    keeps_up: bool  # no replica's queue of requests waiting to join its passes grew past one pass's worth
    speculated: float  # share of decode steps that speculated (the rest: AUTO found target-only faster)
    draft_workers: float  # draft device time needed, in workers (each busy all the time)
    sessions_per_replica: float  # mean sessions in flight on a replica (VALIDATED_SESSIONS: how far it was checked)

    @property
    def validated(self) -> bool:
        """Within the load its throughput was checked at against runs it was not fitted on."""
        return self.sessions_per_replica <= VALIDATED_SESSIONS


def tail(values: Sequence[float], q: float) -> float:
    """The q-th percentile as the bench reads it (``workers/stats.py``); inf where no request
    finished, so that no budget is met."""
    found = percentile(values, q)
    return math.inf if found is None else found


# Requests each simulated replica should see at least, for its tails to mean something: a replica's
# share of a low rate is simulated for longer (up to LONGEST times ``seconds``); of a high rate, for
# no longer than MAX_REQUESTS take to arrive (a simulation's cost is its tokens), but for at least
# LIFETIMES requests' time at one pass a token, so its queue settles.
MIN_REQUESTS, MAX_REQUESTS, LONGEST, LIFETIMES = 200, 1000, 10, 20


def simulate_fleet(workload: Workload, costs: Costs, replicas: int, seconds: float = 60.0,
                   sample_replicas: int = 4, seed: int = 0) -> Fleet:
    if workload.rate is not None:
        per_replica = workload.rate / replicas
        settled = LIFETIMES * workload.output_tokens * costs.pass_seconds(1)
        seconds = min(max(seconds, MIN_REQUESTS / per_replica), LONGEST * seconds,
                      max(MAX_REQUESTS / per_replica, settled))
    warmup = 0.0 if workload.requests is not None else 0.1  # a finite closed loop is measured whole, as a bench level
    runs = [simulate_replica(workload, costs, replicas, seconds, seed + i, warmup)
            for i in range(min(sample_replicas, replicas))]
    scale = replicas / len(runs)
    elapsed = max(sum(r.seconds for r in runs) / len(runs), 1e-9)
    tpot = [x for r in runs for x in r.tpot]
    tokens_per_second = scale * sum(r.tokens for r in runs) / elapsed
    return Fleet(replicas, tokens_per_second, tokens_per_second / workload.output_tokens,
                 tail(tpot, 50), tail(tpot, 99), tail([x for r in runs for x in r.latency], 99),
                 tail([x for r in runs for x in r.ttft], 99),
                 all(r.backlog <= costs.max_sessions_per_pass for r in runs),
                 sum(r.speculated for r in runs) / max(sum(r.decode_steps for r in runs), 1),
                 scale * sum(r.draft_seconds for r in runs) / elapsed,
                 sum(r.session_seconds for r in runs) / max(sum(r.seconds for r in runs), 1e-9))


@dataclass(frozen=True)
class Plan:
    budget_tpot: float
    speculating: Fleet | None
    target_only: Fleet | None

    @property
    def replicas_saved(self) -> int | None:
        if self.speculating is None or self.target_only is None:
            return None
        return self.target_only.replicas - self.speculating.replicas


def smallest_fleet(workload: Workload, costs: Costs, budget_tpot: float, max_replicas: int = 100_000,
                   seconds: float = 60.0, sample_replicas: int = 4) -> Fleet | None:
    """The fewest replicas whose simulated p99 time per output token is within ``budget_tpot``
    seconds and which keep up with the arrivals, or None when even ``max_replicas`` miss it."""
    def fits(replicas: int) -> Fleet | None:
        fleet = simulate_fleet(workload, costs, replicas, seconds, sample_replicas)
        return fleet if fleet.p99_tpot <= budget_tpot and fleet.keeps_up else None

    # Doubling, then halving the gap: more replicas never make a replica's share of the load heavier.
    low, high, best = 1, 1, fits(1)
    while best is None:
        if high >= max_replicas:
            return None
        low, high = high + 1, min(2 * high, max_replicas)
        best = fits(high)
    while low < high:
        middle = (low + high) // 2
        if (found := fits(middle)) is not None:
            high, best = middle, found
        else:
            low = middle + 1
    return best


def plan(workload: Workload, costs: Costs, budget_tpot: float, **kwargs) -> Plan:
    return Plan(budget_tpot, smallest_fleet(workload, costs, budget_tpot, **kwargs),
                smallest_fleet(workload.speculation_off(), costs, budget_tpot, **kwargs))
