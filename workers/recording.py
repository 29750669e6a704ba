"""What a request's steps cost, as its loop and its proposer report it (the ``StepRecorder``).

The counts go into the request's ``SpecStats`` (workers/stats.py, where every derived figure is
defined); the router's recorder adds the waits and batches it prices steps with (router/recording.py).
"""

from __future__ import annotations

import time

from .stats import SpecStats


class StatsRecorder:
    """A request's statistics, and the time it spent recovering from failed workers."""

    def __init__(self, stats: SpecStats) -> None:
        self.stats = stats
        # No measure of what speculation costs, so left out of what the policy learns (its step
        # costs, and the request's realized speed).
        self.recovery_seconds = 0.0
        self.misses = 0  # steps its proposer had nothing for: the proposer's coverage (router/policy.py)
        self.reopens = 0  # draft workers replaced mid-request

    def drafted(self, tokens: int, seconds: float, batch: object = None) -> None:
        self.stats.drafted += tokens
        self.stats.draft_seconds += seconds

    def waited(self, seconds: float) -> None:
        pass

    def looked_ahead(self) -> None:
        self.stats.lookaheads += 1

    def lookahead_hit(self, branch: bool = False) -> None:
        self.stats.lookahead_hits += 1
        self.stats.branch_hits += branch

    def lookahead_unjudged(self) -> None:
        self.stats.lookaheads -= 1  # no verdict came to judge it: not counted (a hit rate's denominator)

    def lookahead_missed(self, tokens: int) -> None:
        self.stats.wasted += tokens

    def recovered(self, started: float) -> None:
        """Before the first verdict, recovery is part of the time to the first token already."""
        if self.stats.target_passes:
            self.recovery_seconds += time.perf_counter() - started

    def verified(self, proposed: int, accepted: int, seconds: float) -> None:
        self.stats.verify_seconds += seconds
        self.stats.record_step(proposed, accepted)

    def missed(self) -> None:
        self.misses += 1

    def reopened(self) -> None:
        self.reopens += 1
