"""What the router learns from finished requests, held to a share of one core.

Scoring the draft-free proposers on a finished greedy request (full information: would prompt
lookup or suffix decoding have proposed the target's tokens?) and adding its output to its task's
suffix trie cost the router per output token as much as serving it: on random text over 200 token
ids, with the task's trie full (32k tokens), adding an output ~70 us a token (depth 24: a dict step
per token and depth, and as many to take the oldest out), scoring suffix decoding ~340 (a proposal
a position, from wide nodes), prompt lookup ~7; on the host-path zoo's repetitive outputs, far
less. At a few requests a second that is nothing; at thousands of tokens a second it was a fifth
of the router's CPU (py-spy, 64 sessions). Learning is statistics: a sample
of the requests teaches the policy the same alphas and the trie the same recent outputs. So it runs
while it stays within ``share`` of a core on average: credit accrues at ``share`` seconds a second
of the clock, up to ``BURST_SECONDS``, and each job spends what it took. At low traffic every
request is learned from; under load, the fraction the share affords.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BURST_SECONDS = 0.05  # credit saved up while idle: a burst's first requests are all learned from


class LearningBudget:
    def __init__(self, share: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.share = share
        self.clock = clock
        self.credit = BURST_SECONDS if share > 0 else 0.0
        self.last = clock()
        self.ran = self.skipped = 0  # jobs, for the router's log and tests

    def run(self, job: Callable[[], None]) -> bool:
        """Run ``job`` if the share allows it now (True), else skip it (False)."""
        now = self.clock()
        self.credit = min(BURST_SECONDS, self.credit + (now - self.last) * self.share)
        self.last = now
        if self.credit <= 0:
            self.skipped += 1
            return False
        job()
        self.last = self.clock()  # the job's own time earns no credit...
        self.credit -= self.last - now  # ...and costs what it took (the event loop's one thread: CPU)
        self.ran += 1
        return True
