"""Which requests draft ahead: a lookahead whose verdict rarely comes is draft work thrown away.

Drafting the next proposal while the target verifies (router/remote_draft.py) costs nothing but
draft-device time when it hits, and that time when it misses. On a draft that rarely guesses the
verdict (the demo zoo's code and prose drafts: 0% of lookaheads hit, 54% of their drafted tokens
wasted) that time is all waste, and where the draft device is shared (a worker's other sessions, or
on a small machine the router's own core) other requests' steps wait for it. So the router keeps,
per (task, draft, greedy or sampled), the faded share of lookaheads that hit, and a request of an
arm below ``router.lookahead_min_hit_rate`` drafts in turn instead; one request in ``PROBE_EVERY``
of such an arm still drafts ahead, so a recovery is seen. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

MIN_LOOKAHEADS = 32.0  # an arm drafts ahead until this many (faded) lookaheads say how often they hit
HALF_LIFE_LOOKAHEADS = 256.0  # what an arm's hit rate remembers
PROBE_EVERY = 8  # of an arm's requests that would draft in turn, every this many-th drafts ahead

Arm = tuple[str, str, bool]  # (task, draft, greedy)


@dataclass
class LookaheadBudget:
    min_hit_rate: float  # 0: every request drafts ahead
    seen: dict[Arm, list[float]] = field(default_factory=dict)  # arm -> [lookaheads, hits], faded
    held_back: Counter = field(default_factory=Counter)  # arm -> requests it kept from drafting ahead

    def hit_rate(self, arm: Arm) -> float | None:
        """The arm's faded share of lookaheads that hit, once it has MIN_LOOKAHEADS of them (None before)."""
        lookaheads, hits = self.seen.get(arm, (0.0, 0.0))
        return hits / lookaheads if lookaheads >= MIN_LOOKAHEADS else None

    def allows(self, task: str, draft: str | None, greedy: bool) -> bool:
        """Should a request of this arm draft ahead?"""
        arm = (task, draft or "", greedy)
        rate = self.hit_rate(arm)
        if not self.min_hit_rate or rate is None or rate >= self.min_hit_rate:
            return True
        self.held_back[arm] += 1
        return self.held_back[arm] % PROBE_EVERY == 0

    def observe(self, task: str, draft: str | None, greedy: bool, lookaheads: int, hits: int) -> None:
        """A finished request's lookaheads and how many of them hit."""
        if lookaheads:
            fade = 0.5 ** (lookaheads / HALF_LIFE_LOOKAHEADS)
            sums = self.seen.setdefault((task, draft or "", greedy), [0.0, 0.0])
            sums[0], sums[1] = sums[0] * fade + lookaheads, sums[1] * fade + hits
