"""The routing policy: per request, which draft and which k, or the target alone. Pure: no I/O, no clock.

Glossary
    arm         one (task, draft) pair and what the router has measured about it
    alpha       per-token acceptance; estimated as accepted / (accepted + rejections) over the arm's
                faded trials, with a Beta(1, 1) prior, so an arm without data sits at 0.5
    c           here c_wall: the draft's cost per token relative to a target-only step, as the router
                waits for it (wall time, round trips included; a lookahead hit costs nothing). It
                prices steps in the cost model's c; workers/stats.py's c (cost_ratio) is device time
                alone, what the bench, the demo and validate report
    w           what each verified token adds to a target pass, relative to a target-only step
                (request-level; superseded by the pass-time fit once there is one)
    r           what a verify step waits beyond its pass (round trip, the pass under way), relative
                to a target-only step, which comes in a decode run and waits for its passes alone
    load        N, the sessions sharing a target pass, and s(t), the fitted device time of a pass of t
                tokens (the replicas' start-up timings until real passes are timed): a step of k
                is priced as s(N (k + 1)) / s(N) + r target-only steps plus its
                drafting (router/cost_model.py), so under load k falls and speculation stops
    realized    decode tokens/s that each proposer's and target-only requests really got, by load level:
                a proposer whose requests ran slower at this load is passed over whatever the
                model expects, and where every one did, AUTO serves target-only
                (router/load_check.py; reason `measured_slower`)
    fallback    a task the policy serves target-only because no draft is expected to make it faster;
                a `probe_fraction` of its requests still speculate so a recovery is noticed
    prior       what an arm starts from: a draft's acceptance measured before serving (the zoo's
                held-out evaluation), counted as `prior_trials` trials, so a task whose drafts lose
                starts target-only rather than finding out on its first requests; a draft-free
                proposer starts at acceptance 0 and cost 0 (scoring it is free, so it earns its way
                in on the traffic: router/scoring.py)

Choices maximise the expected speedup of the cost model at the current load, not alpha. Draft
choice uses Thompson sampling: each arm's alpha is drawn from its posterior, so an unseen draft gets
tried and a poor one ever more rarely. Fallback has hysteresis: it starts below `fallback_below` and
ends above `resume_above`, judged on posterior means and re-judged whenever the load changes. Its
cause is `target_saturated` when the same arms would pay unloaded (N = 1), else `low_speedup`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, fields

from specserve.workers.proposer_kinds import ProposerKind, kind_of
from specserve.workers.stats import alpha as alpha_of

from .config import PolicyConfig
from .cost_model import MIN_WIDTH_PASSES, Load, PassFit, best_k
from .load_check import LoadCheck

SPECULATE, FALLBACK = "speculate", "fallback"
LOW_SPEEDUP, TARGET_SATURATED = "low_speedup", "target_saturated"  # why a task falls back
LOWERED_K, RAISED_K = "lowered_k", "raised_k"  # how the load changed a speculating request's k
MEASURED_SLOWER = "measured_slower"  # speculating requests ran slower at this load (router/load_check.py)


@dataclass
class Counts:
    """What an arm sums: a request's counts (Observation), faded into a (task, draft)'s (Arm)."""

    accepted: float = 0  # accepted draft tokens
    rejections: float = 0  # steps that ended on a rejected draft token
    misses: float = 0  # steps (or scored positions) its proposer had nothing to propose for
    draft_tokens: float = 0
    draft_seconds: float = 0.0  # wall
    verify_passes: float = 0  # passes that verified a proposal
    verify_seconds: float = 0.0  # wall
    verify_device_seconds: float = 0.0

    def fade_in(self, other: Counts, factor: float) -> None:
        """Fade what is here by ``factor``, then add ``other``'s counts."""
        for f in fields(Counts):
            setattr(self, f.name, getattr(self, f.name) * factor + getattr(other, f.name))


@dataclass
class Observation(Counts):
    """What one finished request tells the policy (sums over its steps). Wall times are what the
    router waited (round trips included); device times are the workers' own compute."""

    plain_passes: int = 0  # target-only passes (no proposal)
    plain_seconds: float = 0.0  # wall
    plain_device_seconds: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)  # see SpecStats
    tested_per_position: list[int] = field(default_factory=list)
    passes: PassFit = field(default_factory=PassFit)  # the target passes its decode steps ran in (unfaded)
    tokens: int = 0  # what the request got: its tokens after its first chunk over the seconds they
    seconds: float = 0.0  # took, at `pressure` sessions per target replica when it was routed
    pressure: float = 0.0


@dataclass(frozen=True)
class Prior:
    """What one (task, proposer) is known to do before it serves: its acceptance, weighed as
    ``trials`` acceptance trials, and its cost c when known (None: as the other drafts measure)."""

    alpha: float
    trials: float
    c: float | None = None


@dataclass
class Arm(Counts):
    """Faded measurements of one (task, draft)."""

    scored_tokens: int = 0  # from full-information scoring (a count for display; not faded)
    accepted_at: list[float] = field(default_factory=list)  # per draft position, for display
    tested_at: list[float] = field(default_factory=list)
    prior_c: float | None = None  # c until the arm has timings of its own (None: the other drafts')

    @staticmethod
    def starting_at(prior: Prior | None) -> Arm:
        if prior is None:
            return Arm()
        return Arm(accepted=prior.alpha * prior.trials, rejections=(1 - prior.alpha) * prior.trials, prior_c=prior.c)

    @property
    def trials(self) -> float:
        return self.accepted + self.rejections

    @property
    def alpha(self) -> float:
        # workers/stats.py's alpha with one success and one failure a priori: the posterior mean under Beta(1, 1)
        return alpha_of(self.accepted + 1, self.rejections + 1)

    @property
    def coverage(self) -> float:
        """The share of steps with a proposal: 1 for a draft model, which always proposes."""
        return self.trials / (self.trials + self.misses) if self.misses else 1.0

    def sample_alpha(self, rng: random.Random) -> float:
        return rng.betavariate(self.accepted + 1, self.rejections + 1)

    def add(self, obs: Counts, factor: float) -> None:
        """Fade what is here by `factor`, then add the observation."""
        self.fade_in(obs, factor)
        per_position = (obs.accepted_per_position, obs.tested_per_position) if isinstance(obs, Observation) else ((), ())
        for mine, theirs in zip((self.accepted_at, self.tested_at), per_position, strict=True):
            mine.extend([0.0] * (len(theirs) - len(mine)))
            mine[:] = [m * factor + (theirs[i] if i < len(theirs) else 0) for i, m in enumerate(mine)]

    @property
    def alpha_per_position(self) -> tuple[float, ...]:
        """Up to the last position any step reached (a step reaches i+1 only through i)."""
        reached = [(a, t) for a, t in zip(self.accepted_at, self.tested_at, strict=True) if t > 0]
        return tuple(a / t for a, t in reached)


@dataclass(frozen=True)
class Route:
    """The policy's answer for one request."""

    draft: str | None  # None: target-only
    k: int  # draft tokens per step to start with (0 when target-only)
    reason: str  # requested, best, explore, probe, fallback, off (a canary, a session add canary, unavailable, starting, lost)
    load: str = ""  # how the target's load shaped it: lowered_k, raised_k, target_saturated ("": not)


@dataclass(frozen=True)
class ArmView:
    draft: str
    alpha: float
    c: float
    k: int  # the best k at the current load
    expected_speedup: float
    step_cost: float  # of a step of k at the current load, in target-only steps
    unloaded_k: int  # the best k with one session per pass and the target not saturated
    unloaded_speedup: float
    trials: float
    scored_tokens: int
    alpha_per_position: tuple[float, ...]  # measured while speculating (scoring has no positions)


@dataclass(frozen=True)
class TaskView:
    """The policy's current judgement of one task, for stats and metrics."""

    task: str
    decision: str  # speculate or fallback
    reason: str
    cause: str  # why it fell back, as a metric label: low_speedup or target_saturated ("" when speculating)
    best: ArmView
    arms: tuple[ArmView, ...]
    load: Load  # what the arms were priced at (w aside: that is per arm)


@dataclass
class _Task:
    arms: dict[str, Arm]
    decision: str = SPECULATE
    reason: str = "no data yet"
    cause: str = ""
    plain: Arm = field(default_factory=Arm)  # the task's target-only passes (only their timings are used)


@dataclass
class Policy:
    config: PolicyConfig
    tasks: dict[str, tuple[str, ...]]  # task -> drafts (and draft-free proposers) allowed to serve it
    rng: random.Random = field(default_factory=random.Random)
    pressure: float = 0.0  # sessions per target replica, as of the latest request
    pass_cap: int = 0  # the most sessions a target replica's pass holds (0: not known)
    priors: dict[str, dict[str, float]] = field(default_factory=dict)  # task -> draft -> acceptance measured before serving
    # Drafts on the target replicas (Medusa heads, heads on the replica): their proposals are made in
    # or beside the verify pass, so they have no drafting time of their own (c 0); what they cost is
    # the pass's widening, measured as any draft's.
    on_verifier: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self._tasks = {task: _Task({name: Arm.starting_at(self._prior(task, name)) for name in drafts})
                       for task, drafts in self.tasks.items()}
        self.passes = PassFit()  # faded, over every task's target passes: they share the replicas
        self.realized = LoadCheck(self.config.measured_min_requests)
        # A finished request folds in up to three times (its own arm, then each draft-free proposer
        # scored on it) and is read four (its route, the metrics' view, GetStats): each arm's price
        # is worked out once per change of what it depends on, and a task judged again once, when
        # it is next read. ``_version`` counts the changes; a task in ``_unsettled`` is judged on read.
        self._version = 0
        self._prices: dict[str, tuple[tuple, tuple[ArmView, ...], Load]] = {}
        self._unsettled = set(self._tasks)  # judged on the priors before the first request

    def _prior(self, task: str, name: str) -> Prior | None:
        if kind_of(name) is ProposerKind.DRAFT_FREE:
            return Prior(0.0, self.config.prior_trials, c=0.0)
        alpha = self.priors.get(task, {}).get(name)
        if kind_of(name, on_verifier=self.on_verifier) is ProposerKind.ON_VERIFIER:
            return Prior(alpha or 0.0, self.config.prior_trials if alpha is not None else 0.0, c=0.0)
        return None if alpha is None else Prior(alpha, self.config.prior_trials)

    # --- choosing ---------------------------------------------------------------------------------

    def route(self, task: str, mode: str = "auto", draft: str | None = None, k: int | None = None,
              pressure: float | None = None) -> Route:
        """mode: auto (the policy decides), on (speculate even in fallback, at the k the load allows)
        or off (target-only)."""
        if pressure is not None and pressure != self.pressure:
            self.pressure = pressure
            self._unsettled.add(task)  # a step's price moved with the load: judge the task again now
        if mode == "off":
            return Route(None, 0, "off")
        self._settle(task)
        state = self._tasks[task]
        if draft is not None:  # the client's choice, even a draft not allowed for the task
            return Route(draft, k, "requested") if k else _priced(self._arm_view(task, draft), "requested")
        probing = state.decision == FALLBACK and mode == "auto"
        if probing and self.rng.random() >= self.config.probe_fraction:
            return Route(None, 0, "fallback", TARGET_SATURATED if state.cause == TARGET_SATURATED else "")
        slower = self._measured_slower(task) if mode == "auto" and not probing else set()
        if slower and slower >= set(state.arms):  # every proposer ran slower at this load
            if self.rng.random() >= self.config.probe_fraction:
                return Route(None, 0, "fallback", MEASURED_SLOWER)
            probing, slower = True, set()
        best = self.view(task, slower).best
        chosen = self._thompson(task, slower) if self.config.explore else best
        reason = "probe" if probing else ("best" if chosen.draft == best.draft else "explore")
        return Route(chosen.draft, k, reason) if k else _priced(chosen, reason)

    def _measured_slower(self, task: str) -> set[str]:
        """The task's proposers whose requests, at this load, ran slower than target-only ones (on
        the wall clock, whatever the model expects)."""
        return {name for name in self._tasks[task].arms
                if (ratio := self.realized.ratio(task, name, self.pressure)) is not None
                and ratio < self.config.fallback_below}

    def _thompson(self, task: str, passed_over: set[str] = frozenset()) -> ArmView:
        """The arm with the best speedup under alphas drawn from each arm's posterior."""
        arms = self._tasks[task].arms
        return max((self._arm_view(task, name, arm.sample_alpha(self.rng)) for name, arm in arms.items()
                    if name not in passed_over), key=lambda view: view.expected_speedup)

    # --- learning ---------------------------------------------------------------------------------

    @property
    def passes_timed(self) -> bool:
        """The pass-time curve has data (seeded, or from real passes): no seeding wanted."""
        return bool(self.passes.weight)

    def seed_passes(self, timed: tuple[tuple[int, float], ...]) -> None:
        """Start the pass-time curve from the target replicas' own start-up timings ((tokens,
        seconds) per width, workers/calibration.py), once, so the first burst of requests is priced
        at its load; real passes fold in over them and, faded by ``pass_half_life_steps``, take over."""
        if self.passes_timed or not timed:
            return
        for tokens, seconds in timed:
            for _ in range(math.ceil(MIN_WIDTH_PASSES)):  # each width counts on the curve from the start
                self.passes.add(tokens, seconds, 1)
        self._version += 1

    def observe(self, task: str, draft: str | None, obs: Observation) -> None:
        """Fold in a finished request, then revisit the task's decision."""
        state = self._tasks[task]
        self.passes.fold(obs.passes, 0.5 ** (obs.passes.weight / self.config.pass_half_life_steps))
        self.realized.record(task, draft, obs.pressure, obs.tokens, obs.seconds)
        if draft in state.arms:  # a client's draft outside the task's allowed set teaches nothing here
            state.arms[draft].add(obs, self._fading(obs.draft_tokens))
        if obs.plain_passes:  # target-only steps are the unit every cost is measured in
            plain = Counts(verify_passes=obs.plain_passes, verify_seconds=obs.plain_seconds,
                           verify_device_seconds=obs.plain_device_seconds)
            state.plain.add(plain, self._fading(obs.plain_passes))
        self._changed(task)

    def observe_scored(self, task: str, draft: str, positions: int, matches: int, proposed: int | None = None) -> None:
        """Full information: along a verified greedy continuation, each position where this
        proposer would have proposed (``proposed`` of them; a draft model everywhere) is an
        acceptance trial (its first token against the target's), the rest misses; no target call."""
        arm = self._tasks[task].arms[draft]
        proposed = positions if proposed is None else proposed
        arm.add(Counts(accepted=matches, rejections=proposed - matches, misses=positions - proposed),
                self._fading(positions))
        arm.scored_tokens += positions
        self._changed(task)

    def _changed(self, task: str) -> None:
        """What prices the arms changed: the task is judged again when it is next read."""
        self._version += 1
        self._unsettled.add(task)

    def _settle(self, task: str) -> None:
        if task in self._unsettled:
            self._unsettled.discard(task)
            self._decide(task)

    def _fading(self, tokens: float) -> float:
        """What the old measurements weigh after `tokens` new ones: a half-life in tokens."""
        return 0.5 ** (tokens / self.config.half_life_tokens)

    def _decide(self, task: str) -> None:
        """Hysteresis: fall back below `fallback_below` (once the best arm has enough trials),
        resume above `resume_above`."""
        state, view = self._tasks[task], self._view(task)
        speedup = view.best.expected_speedup
        why = _why(view)
        if state.decision == SPECULATE and speedup < self.config.fallback_below:
            if view.best.trials >= self.config.min_trials:
                paid_unloaded = max(arm.unloaded_speedup for arm in view.arms) >= self.config.fallback_below
                state.cause = TARGET_SATURATED if paid_unloaded else LOW_SPEEDUP
                state.decision, state.reason = FALLBACK, f"{why} < {self.config.fallback_below}"
                if paid_unloaded:
                    state.reason = f"{TARGET_SATURATED}: {state.reason}"
            else:
                state.reason = f"{why}; waiting for {self.config.min_trials} trials before judging"
        elif state.decision == FALLBACK and speedup > self.config.resume_above:
            state.decision, state.reason = SPECULATE, f"recovered: {why} > {self.config.resume_above}"
            state.cause = ""
        elif state.decision == FALLBACK:  # the gap between the thresholds is the hysteresis
            state.reason = f"{why}; target-only until above {self.config.resume_above}"
        else:
            state.reason = f"{why}; target-only below {self.config.fallback_below}"

    # --- reading ----------------------------------------------------------------------------------

    def view(self, task: str, passed_over: set[str] = frozenset()) -> TaskView:
        """``passed_over``: arms left out of the choice of the best (measured slower at this load)."""
        self._settle(task)
        return self._view(task, passed_over)

    def _view(self, task: str, passed_over: set[str] = frozenset()) -> TaskView:
        state = self._tasks[task]
        arms, load = self._priced(task)
        best = max((arm for arm in arms if arm.draft not in passed_over), key=lambda view: view.expected_speedup)
        return TaskView(task, state.decision, state.reason, state.cause, best, arms, load)

    def _priced(self, task: str) -> tuple[tuple[ArmView, ...], Load]:
        """Every arm of the task priced at the current load, as of the latest change (memoized:
        pressure and pass_cap are set from outside, so they are part of the key)."""
        key = (self._version, self.pressure, self.pass_cap)
        cached = self._prices.get(task)
        if cached is None or cached[0] != key:
            arms = tuple(self._arm_view(task, name) for name in self._tasks[task].arms)
            cached = self._prices[task] = (key, arms, self.load())
        return cached[1], cached[2]

    def load(self, w: float = 0.0, r: float = 0.0) -> Load:
        """The load a step is priced at now. N: the pressure, this router's sessions per target
        replica, up to what one of their passes holds (``pass_cap``). It moves at once with the
        load, and it is not what passes held lately: sessions that speculate sit out passes while
        they draft, so their passes look light exactly when speculation crowds them."""
        sessions = min(self.pressure, self.pass_cap) if self.pass_cap else self.pressure
        return Load(max(1.0, sessions), self.passes.curve(), w, self._saturated(), r)

    def priced_at(self, task: str, draft: str, alpha: float) -> ArmView | None:
        """A (task, draft) priced at another alpha (a segment's): its c, coverage and load as now, the
        k best for that alpha. None where the task has no such arm."""
        if task not in self._tasks or draft not in self._tasks[task].arms:
            return None
        return self._arm_view(task, draft, alpha)

    def _arm_view(self, task: str, draft: str, alpha: float | None = None) -> ArmView:
        arm = self._tasks[task].arms.get(draft) or Arm()  # no data: the prior
        alpha = arm.alpha if alpha is None else alpha
        c, w, r = self._costs(task, arm)
        load, unloaded = self.load(w, r), Load(1.0, self.passes.curve(), w, r=r)
        k, speedup = best_k(alpha, c, self.config.k_min, self.config.k_max, load, arm.coverage)
        unloaded_k, unloaded_speedup = best_k(alpha, c, self.config.k_min, self.config.k_max, unloaded, arm.coverage)
        return ArmView(draft, alpha, c, k, speedup, load.step_cost(k, c), unloaded_k, unloaded_speedup, arm.trials,
                       arm.scored_tokens, arm.alpha_per_position)

    def _costs(self, task: str, arm: Arm) -> tuple[float, float, float]:
        """c, w and r in units of a target-only step.

        c: the router's wait per draft token over the task's target-only step (wall). w: from the
        device time of a verify pass over that of a target-only pass, per verified token. r: the
        router's wait per verify step beyond its device time, over the target-only step (wall).
        Without target-only timings a verify pass stands for one target step (w = r = 0, the
        paper's assumption); without draft timings c is the mean of the drafts that have them, else
        the configured prior.
        """
        plain = self._tasks[task].plain
        plain_wall = _per(plain.verify_seconds, plain.verify_passes)
        plain_step = plain_wall or _per(arm.verify_seconds, arm.verify_passes)
        w = r = 0.0
        plain_device = _per(plain.verify_device_seconds, plain.verify_passes)
        if plain_device and arm.verify_passes and arm.draft_tokens:
            widening = arm.verify_device_seconds / arm.verify_passes / plain_device - 1
            w = max(0.0, widening / (arm.draft_tokens / arm.verify_passes))
        if plain_wall and arm.verify_passes:
            r = max(0.0, (arm.verify_seconds - arm.verify_device_seconds) / arm.verify_passes / plain_wall)
        if arm.draft_tokens and plain_step:
            return arm.draft_seconds / arm.draft_tokens / plain_step, w, r
        return (self._typical_c() if arm.prior_c is None else arm.prior_c), w, r

    def _typical_c(self) -> float:
        """c of the drafts that have timings (draft-free proposers and drafts on the verifier, priced apart,
        left out), else the prior."""
        known = [_per(arm.draft_seconds, arm.draft_tokens) / _per(arm.verify_seconds, arm.verify_passes)
                 for state in self._tasks.values() for name, arm in state.arms.items()
                 if arm.draft_tokens and arm.verify_seconds and kind_of(name) is not ProposerKind.DRAFT_FREE
                 and kind_of(name, on_verifier=self.on_verifier) is not ProposerKind.ON_VERIFIER]
        return sum(known) / len(known) if known else self.config.prior_cost_ratio

    def _saturated(self) -> bool:
        """Sessions queue for the replica, so one's drafting hides behind the others' passes: more
        of them than a pass holds, or (a replica that does not say) ``saturated_sessions``."""
        if self.pass_cap:
            return self.pressure > self.pass_cap
        return self.pressure >= self.config.saturated_sessions


def _per(total: float, count: float) -> float:
    return total / count if count else 0.0


def _priced(arm: ArmView, reason: str) -> Route:
    """A route at the arm's k for the current load, saying whether the load moved k."""
    moved = LOWERED_K if arm.k < arm.unloaded_k else (RAISED_K if arm.k > arm.unloaded_k else "")
    return Route(arm.draft, arm.k, reason, moved)


def _why(view: TaskView) -> str:
    """The judgement in words: the best arm's speedup and what a step of its k costs at this load."""
    best, load = view.best, view.load
    where = f"at {load.sessions:.1f} sessions per pass" if load.pass_time else "with no pass timings yet"
    hidden = " (target saturated: drafting hidden)" if load.saturated else ""
    return (f"{where} a step of k={best.k} costs {best.step_cost:.2f} target steps{hidden}: expected "
            f"speedup {best.expected_speedup:.2f} with {best.draft} (alpha {best.alpha:.2f}, c_wall {best.c:.2f})")
