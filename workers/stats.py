"""Speculation statistics: the counters of a request (names after vLLM's spec-decode metrics), and
every figure derived from them, defined once here.

    alpha            per-token acceptance probability (Leviathan et al.): accepted / (accepted + rejections)
    acceptance_rate  vLLM's: accepted / proposed draft tokens (falls with k even at a fixed alpha)
    tokens_per_pass  tokens committed per target pass: its accepted drafts plus the target's own
                     (vLLM's mean acceptance length). Not a batch's width: the tokens one batched
                     pass runs for all its sessions are ``pass_width`` (router/metrics.py, the
                     bench's load section, the ``max_tokens_per_pass`` setting that caps it)
    cost_ratio (c)   a drafted token's device time over a target-only pass's. The routing policy
                     prices steps with ``c_wall`` instead (router/policy.py): what the router waits
                     per drafted token, round trips included, over a target-only step
    wasted_share     the share of drafted tokens that no proposal used (lookaheads that missed)
    time_per_output_token  after a request's first chunk, its seconds per further token (TPOT)
    percentile       a figure's p50 or p99 over requests: numpy's default (straight lines between the
                     ordered values); the bench's load figures and the capacity planner both read it
    expected tokens per pass and expected speedup: router/cost_model.py (they need the load)

The CLI, the demo, validate, the bench and the policy use these; router/metrics.py's PromQL
defines the same figures under the same names for Prometheus.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

def alpha(accepted: float, rejections: float) -> float:
    """Each step tests draft tokens in order until the first rejection, so accepted tests and
    rejections are the successes and failures of independent trials: alpha = a / (a + r); 0 untried."""
    trials = accepted + rejections
    return accepted / trials if trials else 0.0


def acceptance_rate(accepted: float, proposed: float) -> float:
    return accepted / proposed if proposed else 0.0


def tokens_per_pass(accepted: float, target_passes: float) -> float:
    """Every target pass commits its accepted drafts plus one token of the target's."""
    return (accepted + target_passes) / target_passes if target_passes else 0.0


def cost_ratio(draft_seconds: float, drafted: float, target_seconds: float, target_passes: float) -> float:
    """c: the device time of one drafted token over one target-only pass's. Per token drafted, not
    per token proposed: drafting ahead throws some work away, counted apart (``wasted_share``); a
    cost per proposed token that includes it reads up to twice as high as a token costs."""
    if not drafted or not target_passes or not target_seconds:
        return 0.0
    return (draft_seconds / drafted) / (target_seconds / target_passes)


def wasted_share(wasted: float, drafted: float) -> float:
    """Of the tokens a draft computed, the share no proposal used: drafted ahead of a verdict that
    did not come (the lookahead missed). Draft-device time spent for nothing, not a step's wait."""
    return wasted / drafted if drafted else 0.0


def time_per_output_token(seconds: float, first_token_seconds: float, tokens: int,
                          first_chunk_tokens: int) -> float | None:
    """TPOT: the time after the first chunk over the tokens that came after it (None: none did)."""
    later = tokens - first_chunk_tokens
    return (seconds - first_token_seconds) / later if later > 0 else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in 0..100) as ``numpy.percentile`` reads it by default: the ordered
    values at rank q / 100 (n - 1), straight between the two around it. None: no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in 0..100 (a percentile), got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


NOT_SUMMED = frozenset({"accepted_per_position", "tested_per_position", "seed"})  # merged by position / per request


@dataclass
class SpecStats:
    proposed: int = 0  # draft tokens sent for verification
    accepted: int = 0  # draft tokens the target kept
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: steps whose i-th draft was kept
    tested_per_position: list[int] = field(default_factory=list)  # [i]: steps that reached their i-th draft
    target_passes: int = 0  # verify (or plain decode) forward passes of the target
    rejections: int = 0  # steps that ended on a rejected draft token (the rest accepted all k)
    drafted: int = 0  # tokens the draft computed: one forward pass each (proposed or not)
    wasted: int = 0  # of those, drafted ahead by lookaheads that missed: no proposal used them
    draft_seconds: float = 0.0  # the draft's device time for all of them
    verify_seconds: float = 0.0
    lookaheads: int = 0  # proposals drafted while the target verified the previous one (service, greedy)
    lookahead_hits: int = 0  # of those, used: the verdict accepted everything and matched the guess...
    branch_hits: int = 0  # ...or rejected where its branch forked, with the token the branch assumed
    seed: int | None = None

    def record_step(self, k: int, num_accepted: int) -> None:
        self.target_passes += 1
        self.proposed += k
        self.accepted += num_accepted
        self.rejections += int(num_accepted < k)
        _count_first(self.accepted_per_position, num_accepted, k)
        _count_first(self.tested_per_position, min(num_accepted + 1, k), k)  # tested up to the first rejection

    def add(self, other: SpecStats) -> None:
        """Sum another request's counts into these (for per-task aggregates)."""
        for f in fields(self):  # every counter, so a counter added later is summed too
            if f.name not in NOT_SUMMED:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        for mine, theirs in ((self.accepted_per_position, other.accepted_per_position),
                             (self.tested_per_position, other.tested_per_position)):
            for i, n in enumerate(theirs):
                if i == len(mine):
                    mine.append(0)
                mine[i] += n

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted, self.proposed)

    @property
    def alpha(self) -> float:
        return alpha(self.accepted, self.rejections)

    @property
    def alpha_per_position(self) -> list[float]:
        """[i]: acceptance of the i-th draft token among steps that reached it (the cost model takes
        these to be equal; in practice the first positions are easier)."""
        return [a / t for a, t in zip(self.accepted_per_position, self.tested_per_position, strict=True) if t]

    @property
    def tokens_per_pass(self) -> float:
        return tokens_per_pass(self.accepted, self.target_passes)

    def cost_ratio(self, target_only: SpecStats) -> float:
        """c of these runs' draft against ``target_only``'s passes."""
        return cost_ratio(self.draft_seconds, self.drafted, target_only.verify_seconds, target_only.target_passes)

    @property
    def wasted_share(self) -> float:
        return wasted_share(self.wasted, self.drafted)

    def as_dict(self) -> dict:
        return asdict(self) | {"acceptance_rate": self.acceptance_rate, "alpha": self.alpha,
                               "tokens_per_pass": self.tokens_per_pass, "wasted_share": self.wasted_share}


def _count_first(counts: list[int], n: int, width: int) -> None:
    """counts[i] += 1 for i < n, growing counts to `width` positions first."""
    if len(counts) < width:
        counts.extend([0] * (width - len(counts)))
    for i in range(n):
        counts[i] += 1
