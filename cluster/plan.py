"""How many target replicas and draft workers a workload needs: a simulation of the cluster's passes.

A target replica runs passes back to back while it holds sessions (continuous batching): every
session it holds adds its next tokens to the pass (a prompt chunk, a verify step of k + 1 tokens,
or one token target-only), up to ``max_sessions_per_pass`` sessions and ``max_tokens_per_pass``
tokens, and the pass takes what the replica's measured pass-time curve says for its width. A
speculating session commits 1 + a tokens a pass, a drawn from the truncated geometric law of its
task's acceptance alpha (each of k draft tokens accepted with probability alpha until the first
rejection). Drafting hides behind verification (a lookahead drafts the next proposal during the
pass), so a step costs its pass, and the draft pool must have the device time to keep up: the
planner counts that time and sizes the pool from it. As the policy's load pricing does, a pass
speculates only when that is expected to give more tokens a second than the same sessions
target-only (a wide pass on a CPU costs more per token than speculation saves).

Requests are spread evenly over replicas, so each replica sees an equal share of the arrivals
(open loop: Poisson at ``rate`` / replicas) or of the clients (closed loop: each client sends its
next request when the last one ends). The replicas are then alike and independent, so the planner
simulates ``sample_replicas`` of them, whatever the fleet's size: 1,000 replicas cost what 4 do.

Everything here is arithmetic on given numbers: the costs come from a bench report or a running
service's stats (``specserve plan --costs``), the workload from the operator.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskLoad:
    """One task's part of the workload and how speculation does on it."""

    name: str
    share: float  # of the requests
    alpha: float = 0.0  # acceptance per drafted token (its draft's, measured)
    k: int = 0  # draft tokens a step; 0: target-only

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

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.clients is None):
            raise ValueError("a workload has a rate (requests/s) or a number of clients, not both")
        if not self.tasks or sum(t.share for t in self.tasks) <= 0:
            raise ValueError("a workload needs at least one task with a share above 0")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be at least 1")
        if self.requests is not None and (self.clients is None or self.requests < 1):
            raise ValueError("requests (a total) is for a closed loop of clients, and at least 1")

    def speculation_off(self) -> Workload:
        return Workload(tuple(TaskLoad(t.name, t.share) for t in self.tasks), self.prompt_tokens,
                        self.output_tokens, self.rate, self.clients, self.requests)


@dataclass(frozen=True)
class Costs:
    """A replica's measured costs. ``pass_ms``: (tokens in a pass, milliseconds) points of its
    pass-time curve, straight lines between them and past the last. ``draft_token_ms``: a draft
    worker's device time per drafted token at the load it ran at (the bench's "draft ms/token"):
    the pool's size follows from it, not the replicas'."""

    pass_ms: tuple[tuple[int, float], ...]
    draft_token_ms: float = 0.0
    max_sessions_per_pass: int = 32
    max_tokens_per_pass: int = 512
    # Time each pass spends outside the model on a serving replica (the scheduler's hop to its event
    # loop, the tokens streamed out): what a curve timed in process lacks.
    pass_overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        widths = [w for w, _ in self.pass_ms]
        if not widths or widths != sorted(set(widths)) or widths[0] < 1 or any(ms <= 0 for _, ms in self.pass_ms):
            raise ValueError("pass_ms needs (tokens, ms) points with distinct increasing widths >= 1 and times > 0")

    def pass_seconds(self, tokens: int) -> float:
        widths = [w for w, _ in self.pass_ms]
        i = bisect.bisect_left(widths, tokens)
        if i < len(widths) and widths[i] == tokens:
            return self.pass_ms[i][1] / 1000
        if len(widths) == 1:
            return self.pass_ms[0][1] / 1000
        lo, hi = (i - 1, i) if 0 < i < len(widths) else ((0, 1) if i == 0 else (len(widths) - 2, len(widths) - 1))
        (w0, t0), (w1, t1) = self.pass_ms[lo], self.pass_ms[hi]
        return max(t0 + (t1 - t0) * (tokens - w0) / (w1 - w0), 1e-6) / 1000


@dataclass
class _Session:
    task: TaskLoad
    arrived: float
    client: int = -1
    prompt_left: int = 0
    output_left: int = 0
    first_token: float | None = None
    done: float | None = None


@dataclass
class ReplicaRun:
    """What one simulated replica did."""

    seconds: float
    tokens: int
    tpot: list[float] = field(default_factory=list)  # per finished request: (done - first token) / (tokens - 1)
    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    busy: float = 0.0  # seconds in passes
    draft_seconds: float = 0.0  # draft device time the replica's sessions needed
    passes: int = 0
    session_steps: int = 0
    backlog: int = 0  # requests still waiting for a place in the passes at the end
    speculated: int = 0  # passes that speculated (AUTO can turn it off for a pass)


def accepted(alpha: float, k: int, rng: random.Random) -> int:
    """Draft tokens a verify step accepts: each in turn with probability alpha, until one is not."""
    a = 0
    while a < k and rng.random() < alpha:
        a += 1
    return a


def simulate_replica(workload: Workload, costs: Costs, replicas: int, seconds: float, seed: int = 0,
                     warmup: float = 0.1) -> ReplicaRun:
    """One replica of ``replicas`` for ``seconds`` of simulated time; requests that end in the first
    ``warmup`` share of it are left out of the latencies (the queue is filling)."""
    rng = random.Random(seed)
    tasks = workload.tasks
    weights = [t.share for t in tasks]
    arrivals: list[tuple[float, int]] = []  # (time, client) heap
    if workload.rate is not None:
        rate = workload.rate / replicas
        t = rng.expovariate(rate)
        while t < seconds:
            arrivals.append((t, -1))
            t += rng.expovariate(rate)
    else:
        share = workload.clients // replicas + (1 if seed % replicas < workload.clients % replicas else 0)
        arrivals = [(0.0, c) for c in range(share)]
    # A closed loop's total (its replica's share of it): each request issued takes one.
    left = None if workload.requests is None else max(0, round(workload.requests / replicas) - len(arrivals))
    heapq.heapify(arrivals)
    waiting: list[_Session] = []
    active: list[_Session] = []
    run = ReplicaRun(seconds, 0)
    now, counted_from = 0.0, warmup * seconds
    while now < seconds:
        while arrivals and arrivals[0][0] <= now:
            arrived, client = heapq.heappop(arrivals)
            waiting.append(_Session(rng.choices(tasks, weights)[0], arrived, client, workload.prompt_tokens,
                                    workload.output_tokens))
        while waiting and len(active) < costs.max_sessions_per_pass:
            active.append(waiting.pop(0))
        if not active:
            if not arrivals:
                break
            now = arrivals[0][0]
            continue
        planned = _plan_pass(active, costs, speculate=True)
        if any(k for _, _, k in planned):  # AUTO: speculate in this pass only where it yields more
            plain = _plan_pass(active, costs, speculate=False)
            if _expected_rate(plain, costs) > _expected_rate(planned, costs):
                planned = plain
            else:
                run.speculated += 1
        width = sum(n for _, n, _ in planned)
        step = costs.pass_seconds(max(width, 1)) + costs.pass_overhead_ms / 1000
        now += step
        run.busy += step
        run.passes += 1
        for session, n, k in planned:
            run.session_steps += 1
            if session.prompt_left:
                session.prompt_left -= n
                if session.prompt_left == 0:  # the prompt's last chunk gives the first token
                    session.output_left -= 1
                    session.first_token = now
                    run.tokens += 1
            else:
                made = min(accepted(session.task.alpha, k, rng) + 1, session.output_left) if k else 1
                run.draft_seconds += k * costs.draft_token_ms / 1000
                session.output_left -= made
                run.tokens += made
            if session.output_left <= 0 and session.done is None:
                session.done = now
        for session in [s for s in active if s.done is not None]:
            active.remove(session)
            if session.done >= counted_from:
                run.latency.append(session.done - session.arrived)
                run.ttft.append(session.first_token - session.arrived)
                if workload.output_tokens > 1:
                    run.tpot.append((session.done - session.first_token) / (workload.output_tokens - 1))
            if session.client >= 0 and left != 0:  # the client sends its next request at once
                heapq.heappush(arrivals, (now, session.client))
                left = None if left is None else left - 1
    run.seconds = now
    run.backlog = len(waiting) + sum(1 for t, _ in arrivals if t <= now)
    return run


def _plan_pass(active: list[_Session], costs: Costs, speculate: bool) -> list[tuple[_Session, int, int]]:
    """Each session's part of the pass: (session, tokens, draft tokens verified). Prompts are cut
    into what is left of the pass; steps go in whole or wait."""
    room, planned = costs.max_tokens_per_pass, []
    for session in active:
        if session.prompt_left:
            if take := min(session.prompt_left, room):
                planned.append((session, take, 0))
                room -= take
        else:
            k = min(session.task.k, session.output_left - 1) if speculate else 0
            if k + 1 <= room:
                planned.append((session, k + 1, k))
                room -= k + 1
    return planned


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify step of k draft tokens commits on average: 1 + alpha + ... + alpha^k."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def _expected_rate(planned: list[tuple[_Session, int, int]], costs: Costs) -> float:
    """Output tokens a second the pass is expected to give (the policy's load pricing)."""
    tokens = sum(expected_tokens(s.task.alpha, k) if not s.prompt_left else 0 for s, _, k in planned)
    return tokens / (costs.pass_seconds(max(sum(n for _, n, _ in planned), 1)) + costs.pass_overhead_ms / 1000)


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
    speculated: float  # share of passes that speculated (the rest: AUTO found target-only faster)
    draft_workers: float  # draft device time needed, in workers (each busy all the time)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.inf
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# Requests each simulated replica should see at least, for its tails to mean something: a replica's
# share of a low rate is simulated for longer (up to LONGEST times ``seconds``).
MIN_REQUESTS, LONGEST = 200, 10


def simulate_fleet(workload: Workload, costs: Costs, replicas: int, seconds: float = 60.0,
                   sample_replicas: int = 4, seed: int = 0) -> Fleet:
    if workload.rate is not None:
        seconds = min(max(seconds, MIN_REQUESTS * replicas / workload.rate), LONGEST * seconds)
    warmup = 0.0 if workload.requests is not None else 0.1  # a finite closed loop is measured whole, as a bench level
    runs = [simulate_replica(workload, costs, replicas, seconds, seed + i, warmup)
            for i in range(min(sample_replicas, replicas))]
    scale = replicas / len(runs)
    elapsed = max(sum(r.seconds for r in runs) / len(runs), 1e-9)
    tpot = [x for r in runs for x in r.tpot]
    tokens_per_second = scale * sum(r.tokens for r in runs) / elapsed
    return Fleet(replicas, tokens_per_second, tokens_per_second / workload.output_tokens,
                 percentile(tpot, 0.5), percentile(tpot, 0.99), percentile([x for r in runs for x in r.latency], 0.99),
                 percentile([x for r in runs for x in r.ttft], 0.99),
                 all(r.backlog <= costs.max_sessions_per_pass for r in runs),
                 sum(r.speculated for r in runs) / max(sum(r.passes for r in runs), 1),
                 scale * sum(r.draft_seconds for r in runs) / elapsed)


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
