"""The speculative-decoding cost model of Leviathan et al. (2023), section 3, priced with the batch a
step runs in. Pure: no I/O, no clock.

Glossary
    alpha       per-token acceptance probability
    k           draft tokens per step (the target verifies k + 1 positions: the drafts and the bonus)
    c           the cost of one draft token relative to one target-only step
    w           what each verified token adds to a verify pass, relative to a target-only step (0 in
                the paper); the router's request-level estimate, used while there is no pass data
    r           what a verify step waits beyond its pass (the round trip to the replica, the wait for
                the pass under way), relative to a target-only step; target-only tokens come in
                decode runs and wait for nothing but their passes (0 in the paper)
    s(t)        a target replica's device seconds for one forward pass of t tokens over all the
                sessions batched into it, fitted online as a + b t (PassFit), and read off the faded
                mean of passes of that width where enough were seen (PassCurve): pass time is not
                linear in width (on a CPU, 2-3 rows of a GEMM cost more than 4; on an H100, one to
                16 tokens cost the same, bench/results/20261126-174539-gpu)
    N           sessions sharing a target pass (the load)
    saturated   other sessions keep the target busy, so the draft's time hides behind their
                verification and the draft's cost k c drops out of a step's price
    coverage    the share of steps a proposer has something to propose for (1 for a draft model;
                a lookup proposes only where the context's ending occurred before): a step without a
                proposal is a one-token pass, costing and committing what a target-only step does

A step's cost, in target-only steps at the same load: N sessions' target-only steps are one pass of
N tokens, their speculative steps one pass of N (k + 1), so

    cost(k) = s(N (k + 1)) / s(N) + r + (k c unless saturated)

At N = 1 (and r = 0) that is 1 + k b / (a + b) + k c: the paper's k c + 1 with w = b / (a + b). Where the pass is
compute-bound (a << b N) it approaches k + 1 + k c and no alpha pays for speculation. The expected
speedup of k over target-only decoding is E(alpha, k) / cost(k).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

# The fit needs this many (faded) passes, spread over at least two sizes, before its slope counts.
MIN_FIT_PASSES = 8.0
MIN_TOKEN_SPREAD = 0.25  # variance of tokens per pass, in tokens^2: below it the slope is unknown
# A width's own mean replaces the line there once this many (faded) passes of it were seen.
MIN_WIDTH_PASSES = 3.0
EXACT_WIDTHS = 16  # widths up to this are kept apart; wider passes pool by powers of two


def width_bucket(tokens: int) -> int:
    return tokens if tokens <= EXACT_WIDTHS else 2 ** math.ceil(math.log2(tokens))


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """E[tokens committed per target pass] = (1 - alpha^(k+1)) / (1 - alpha)."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"alpha must be in [0, 1] and k >= 0, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass(frozen=True)
class PassTime:
    """s(t) = fixed + per_token t: a replica's device seconds for one pass of t tokens."""

    fixed: float  # a: weights read once per pass, launch overheads (memory-bound part)
    per_token: float  # b: compute per token in the pass

    def seconds(self, tokens: float) -> float:
        return self.fixed + self.per_token * tokens

    def verify_cost(self, k: int, sessions: float) -> float:
        """A pass of `sessions` steps of k drafts each, in target-only passes of as many sessions."""
        return self.seconds(sessions * (k + 1)) / self.seconds(sessions)


@dataclass(frozen=True)
class PassCurve:
    """s(t) read off the passes seen: the faded mean seconds at each width seen often enough,
    straight between two such widths, and the fitted line outside them."""

    line: PassTime
    points: tuple[tuple[float, float], ...]  # (mean tokens, mean seconds), by tokens

    @property
    def fixed(self) -> float:  # the line's, for reports (GetStats' load pricing)
        return self.line.fixed

    @property
    def per_token(self) -> float:
        return self.line.per_token

    def __post_init__(self) -> None:
        # The widths alone, for bisect: the router prices every arm at every k per request, and
        # scanning the points each time was a tenth of its CPU under load (the host-path bench).
        object.__setattr__(self, "_widths", tuple(t for t, _ in self.points))

    def seconds(self, tokens: float) -> float:
        below = bisect.bisect_right(self._widths, tokens) - 1  # the last point at or below tokens
        above = bisect.bisect_left(self._widths, tokens)  # the first at or above
        if below < 0 or above == len(self.points):
            return self.line.seconds(tokens)
        (t0, s0), (t1, s1) = self.points[below], self.points[above]
        return s0 if t1 == t0 else s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)

    def verify_cost(self, k: int, sessions: float) -> float:
        return self.seconds(sessions * (k + 1)) / self.seconds(sessions)


@dataclass(frozen=True)
class Load:
    """What a step's price depends on beyond alpha and c."""

    sessions: float = 1.0  # N, at least 1
    pass_time: PassTime | PassCurve | None = None  # None: no pass data, a verify pass costs 1 + k w as before
    w: float = 0.0
    saturated: bool = False
    r: float = 0.0

    def step_cost(self, k: int, c: float) -> float:
        """cost(k) in target-only steps at this load (see the module docstring)."""
        if c < 0 or self.w < 0 or self.r < 0:
            raise ValueError(f"c, w and r must be >= 0, got c={c}, w={self.w}, r={self.r}")
        verify = self.pass_time.verify_cost(k, self.sessions) if self.pass_time else 1 + k * self.w
        return verify + self.r + (0.0 if self.saturated else k * c)


UNLOADED = Load()


def speedup_at(alpha: float, c: float, k: int, load: Load = UNLOADED, coverage: float = 1.0) -> float:
    """Expected speedup of k over target-only decoding: E(alpha, k) / cost(k) on the steps with a
    proposal (a share ``coverage`` of them), one token for cost(0) on the others."""
    if not 0.0 <= coverage <= 1.0:
        raise ValueError(f"coverage must be in [0, 1], got {coverage}")
    tokens = coverage * expected_tokens_per_pass(alpha, k) + (1 - coverage)
    cost = coverage * load.step_cost(k, c) + (1 - coverage) * load.step_cost(0, c)
    return tokens / cost


def expected_speedup(alpha: float, c: float, k: int, w: float = 0.0, saturated: bool = False) -> float:
    """The request-level model: a step costs k c + 1 + k w, or 1 + k w with the target saturated."""
    return speedup_at(alpha, c, k, Load(w=w, saturated=saturated))


def overlapped_bound(alpha: float, c: float, k: int, w: float = 0.0) -> float:
    """The bound with drafting hidden behind verification (the draft on its own device, every
    lookahead a hit, nothing on the wire): a step costs the longer of its verify pass (1 + k w) and
    its drafting (k c), not their sum; E / max(1, k c) where w = 0."""
    return expected_tokens_per_pass(alpha, k) / max(1 + k * w, k * c)


def best_k(alpha: float, c: float, k_min: int, k_max: int, load: Load = UNLOADED,
           coverage: float = 1.0) -> tuple[int, float]:
    """The k in [k_min, k_max] with the highest expected speedup at `load`, and that speedup (ties:
    smaller k). Speculation pays only where that speedup beats 1; below, k = 0 (target-only) wins,
    a choice the policy makes with hysteresis."""
    return max(((k, speedup_at(alpha, c, k, load, coverage)) for k in range(k_min, k_max + 1)),
               key=lambda pair: (pair[1], -pair[0]))


@dataclass
class PassFit:
    """Faded statistics of the target passes that steps ran in: the least-squares line of pass
    seconds s on tokens per pass t, s(t) ~ a + b t.

    Holds sums only, so a request's passes are summed on their own and folded in at
    its end (`fold`), the old ones fading by a factor the caller derives from a half-life. One
    sample per step: a pass of n sessions is seen n times.
    """

    weight: float = 0.0  # sum of w (passes seen, faded)
    tokens: float = 0.0  # sum of w t
    seconds: float = 0.0  # sum of w s
    tokens_sq: float = 0.0  # sum of w t^2
    tokens_seconds: float = 0.0  # sum of w t s
    widths: dict[int, list[float]] = field(default_factory=dict)  # width bucket: [sum of w, of w t, of w s]

    def add(self, tokens: int, seconds: float, sessions: int) -> None:
        if tokens > 0 and seconds > 0 and sessions > 0:  # a worker that reports no pass teaches nothing
            self.weight += 1
            self.tokens += tokens
            self.seconds += seconds
            self.tokens_sq += tokens * tokens
            self.tokens_seconds += tokens * seconds
            sums = self.widths.setdefault(width_bucket(tokens), [0.0, 0.0, 0.0])
            sums[0], sums[1], sums[2] = sums[0] + 1, sums[1] + tokens, sums[2] + seconds

    def fold(self, other: PassFit, factor: float) -> None:
        """Fade these statistics by `factor`, then add `other`'s."""
        for name in ("weight", "tokens", "seconds", "tokens_sq", "tokens_seconds"):
            setattr(self, name, getattr(self, name) * factor + getattr(other, name))
        for width in self.widths.keys() | other.widths.keys():
            mine, theirs = self.widths.get(width, [0.0, 0.0, 0.0]), other.widths.get(width, [0.0, 0.0, 0.0])
            self.widths[width] = [a * factor + b for a, b in zip(mine, theirs, strict=True)]

    def curve(self) -> PassCurve | None:
        """s(t) by width where the passes say it (PassCurve), or None while the line is unknown.
        Kept until the sums change: the policy reads it for every arm it prices."""
        key = (self.weight, self.tokens, self.seconds, self.tokens_sq, len(self.widths))
        cached = self.__dict__.get("_curve")
        if cached is not None and cached[0] == key:
            return cached[1]
        line = self.line()
        points = sorted((t / w, s / w) for w, t, s in self.widths.values() if w >= MIN_WIDTH_PASSES)
        curve = None if line is None else PassCurve(line, tuple(points))
        self.__dict__["_curve"] = (key, curve)
        return curve

    def line(self) -> PassTime | None:
        """The fitted s(t), or None until enough passes of different sizes were seen. The slope and
        intercept are kept >= 0: a pass never gets cheaper with more tokens, nor costs less than nothing."""
        if self.weight < MIN_FIT_PASSES:
            return None
        mean_t, mean_s = self.tokens / self.weight, self.seconds / self.weight
        spread = self.tokens_sq / self.weight - mean_t * mean_t
        if spread < MIN_TOKEN_SPREAD:
            return None
        slope = max(0.0, (self.tokens_seconds / self.weight - mean_t * mean_s) / spread)
        fixed = mean_s - slope * mean_t
        if fixed < 0:  # the line would cross zero: fit it through the origin instead
            fixed, slope = 0.0, self.tokens_seconds / self.tokens_sq
        return PassTime(fixed, slope) if fixed + slope > 0 else None
