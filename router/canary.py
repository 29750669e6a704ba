"""A canary: a new version of a draft served beside the one serving now, on a share of its tasks'
traffic, and the test that promotes or rolls it back. Pure: no Ray, no gRPC, no clock.

Glossary
    base        the version of the draft serving now, under the draft's own name (``eagle3``)
    canary      the new version, served beside it as ``eagle3@<version>`` (workers/lookup.py)
    share       the share of the canary's requests (its tasks', routed to its draft) that go to the
                canary, drawn at random per request: both arms see one mix of tasks, prompts and load
    arm         the requests of one side, base or canary, with six running sums (``ArmSums``)
    alpha       an arm's per-token acceptance, accepted / (accepted + rejections) (workers/stats.py):
                a verify step tests draft tokens until its first rejection, so each accepted token
                and each rejection is a trial
    look        a test of the arms so far, at every ``min_requests`` requests on each arm

Requests are the units, not tokens: one request's tokens are not independent (a hard prompt
rejects many), so alpha's variance is the ratio estimator's over requests (the delta method),

    var(alpha) = m / (m - 1) * sum_i (a_i - alpha t_i)^2 / (sum_i t_i)^2

for m requests with a_i accepted of t_i trials; the sums of a, t, a^2, t^2 and a t carry it, and
the sums of every router add up to the service's.

Why alpha decides, not a wall clock: a version of a head reads the target layers its draft reads
(checked as it loads) and is one decoder layer of the target's width, so a step costs about the
same on both arms (their output vocabularies may differ: distill sizes one to its text, a few
percent of a step), and at a given load the expected speedup (router/cost_model.py) rises with
alpha: the arm with the higher alpha is the faster one. The speedups the two alphas are worth are
shown beside them, priced by the policy at the draft's c.

The decision, at look j of at most L = max_requests // min_requests: z = (alpha_canary -
alpha_base) / sqrt(var_canary + var_base); promote where z >= z*, roll back where z <= -z*, with z*
the normal quantile of 1 - (1 - confidence) / L (Bonferroni over the looks), so the chance that
some look promotes a version no better than the base is at most 1 - confidence, and so is the
chance that a look rolls back one no worse as shown worse. A version not shown better by the last
look is rolled back too: the old one stays unless the new one proves itself.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from specserve.workers.stats import alpha

from .policy import Route

# A canary's lifecycle: its version loading on the workers, serving its share, then one way out.
LOADING, RUNNING, PROMOTING, PROMOTED, ROLLING_BACK, ROLLED_BACK, FAILED = (
    "loading", "running", "promoting", "promoted", "rolling back", "rolled back", "failed")
FINISHED = (PROMOTED, ROLLED_BACK, FAILED)
STATES = (LOADING, RUNNING, PROMOTING, PROMOTED, ROLLING_BACK, ROLLED_BACK, FAILED)
PROMOTE, ROLL_BACK = "promote", "roll back"
MIN_REQUESTS = 5  # per arm at a look


@dataclass(frozen=True)
class CanaryConfig:
    """How a canary is served and judged (``specserve canary``'s flags default to these)."""

    share: float = 0.2  # of the canary's requests, to the new version
    confidence: float = 0.95  # that a promoted version is better, over all looks
    min_requests: int = 30  # per arm, between looks
    max_requests: int = 600  # per arm: the last look; undecided there, it is rolled back

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"share must be in (0, 1), got {self.share}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if not MIN_REQUESTS <= self.min_requests <= self.max_requests:  # below, z is far from normal
            raise ValueError(f"min_requests must be in {MIN_REQUESTS}..max_requests ({self.max_requests}), got "
                             f"{self.min_requests}")

    @property
    def looks(self) -> int:
        return self.max_requests // self.min_requests

    @property
    def z_needed(self) -> float:
        return NormalDist().inv_cdf(1 - (1 - self.confidence) / self.looks)


@dataclass
class ArmSums:
    """One arm's requests, as the sums its alpha and alpha's variance need."""

    requests: int = 0
    accepted: float = 0.0
    trials: float = 0.0  # accepted + rejections
    accepted_sq: float = 0.0
    trials_sq: float = 0.0
    cross: float = 0.0  # sum of accepted * trials

    def add(self, accepted: int, rejections: int) -> None:
        trials = accepted + rejections
        self.requests += 1
        self.accepted += accepted
        self.trials += trials
        self.accepted_sq += accepted * accepted
        self.trials_sq += trials * trials
        self.cross += accepted * trials

    def __add__(self, other: ArmSums) -> ArmSums:
        return ArmSums(self.requests + other.requests, self.accepted + other.accepted, self.trials + other.trials,
                       self.accepted_sq + other.accepted_sq, self.trials_sq + other.trials_sq, self.cross + other.cross)

    @property
    def alpha(self) -> float:
        return alpha(self.accepted, self.trials - self.accepted)

    @property
    def variance(self) -> float:
        """Of alpha, over requests (the module's docstring); inf with fewer than two."""
        if self.requests < 2 or not self.trials:
            return math.inf
        a = self.alpha
        spread = max(0.0, self.accepted_sq - 2 * a * self.cross + a * a * self.trials_sq)
        return self.requests / (self.requests - 1) * spread / (self.trials * self.trials)


def z_score(base: ArmSums, canary: ArmSums) -> float:
    """How many standard errors the canary's alpha is above the base's."""
    spread = base.variance + canary.variance
    difference = canary.alpha - base.alpha
    if spread == 0.0:  # no variance on either arm (every draft token accepted, say)
        return math.copysign(math.inf, difference) if difference else 0.0
    return difference / math.sqrt(spread)


def decide(base: ArmSums, canary: ArmSums, config: CanaryConfig, looks_done: int) -> tuple[str, int]:
    """At the arms' counts now: (the decision, "" for none yet; the looks done). A look is taken
    each time both arms pass the next multiple of ``min_requests``."""
    due = min(base.requests, canary.requests) // config.min_requests
    if due <= looks_done:
        return "", looks_done
    looks = min(due, config.looks)
    z = z_score(base, canary)
    if z >= config.z_needed:
        return PROMOTE, looks
    if z <= -config.z_needed or looks >= config.looks:
        return ROLL_BACK, looks
    return "", looks


@dataclass(frozen=True)
class CanaryStatus:
    """What the control says of one canary: what the routers route by, and what ``stats`` shows."""

    canary_id: str
    draft: str  # the base's name
    version: str  # the name it is served under (draft@version)
    source: str  # its head directory
    tasks: tuple[str, ...]
    config: CanaryConfig
    state: str = LOADING
    base: ArmSums = field(default_factory=ArmSums)
    canary: ArmSums = field(default_factory=ArmSums)
    looks: int = 0
    reason: str = ""  # what the state came from (the look that decided, an operator, an error)
    started: float = 0.0  # unix seconds
    finished: float = 0.0

    @property
    def z(self) -> float:
        return z_score(self.base, self.canary)


class CanaryRoutes:
    """A router's part: which requests go to a running canary, and the arms' sums since it began
    (``counts``: what the router reports to the control)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()
        self.statuses: tuple[CanaryStatus, ...] = ()
        self._sums: dict[str, tuple[ArmSums, ArmSums]] = {}  # canary id -> (base, canary)

    def update(self, statuses: tuple[CanaryStatus, ...]) -> None:
        self.statuses = statuses
        for status in statuses:
            if status.state == RUNNING:
                self._sums.setdefault(status.canary_id, (ArmSums(), ArmSums()))
        # A finished canary's sums stay reported (the control keeps the last it got), then go.
        live = {s.canary_id for s in statuses if s.state not in FINISHED}
        self._sums = {i: sums for i, sums in self._sums.items() if i in live}

    def assign(self, task: str, route: Route, served: Callable[[str], bool]) -> Route:
        """The route with its draft's canary in place of the draft for a ``share`` of requests, once
        ``served`` says a worker has registered it."""
        for status in self.statuses:
            if status.state == RUNNING and route.draft == status.draft and task in status.tasks \
                    and served(status.version):
                if self.rng.random() < status.config.share:
                    return replace(route, draft=status.version, reason="canary")
                break
        return route

    def record(self, task: str, draft: str | None, accepted: int, rejections: int) -> None:
        """A finished request, on whichever arm of a running canary it ran (none: not counted).
        One that tested no draft token tells nothing of either version."""
        if not accepted + rejections:
            return
        for status in self.statuses:
            sums = self._sums.get(status.canary_id)
            if sums is not None and status.state == RUNNING and task in status.tasks:
                if draft == status.draft:
                    sums[0].add(accepted, rejections)
                elif draft == status.version:
                    sums[1].add(accepted, rejections)

    def counts(self) -> dict[str, tuple[ArmSums, ArmSums]]:
        return {i: (ArmSums() + base, ArmSums() + canary) for i, (base, canary) in self._sums.items()}
