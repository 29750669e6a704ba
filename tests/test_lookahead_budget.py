"""router/lookahead_budget.py: which requests draft ahead, by how often their arm's lookaheads hit."""

from __future__ import annotations

from specserve.router.lookahead_budget import MIN_LOOKAHEADS, PROBE_EVERY, LookaheadBudget


def test_an_arm_drafts_ahead_until_its_lookaheads_say_they_rarely_hit():
    budget = LookaheadBudget(min_hit_rate=0.1)
    assert budget.allows("code", "code", True)  # nothing seen: draft ahead
    budget.observe("code", "code", True, lookaheads=int(MIN_LOOKAHEADS) - 1, hits=0)
    assert budget.allows("code", "code", True)  # too few to judge
    budget.observe("code", "code", True, lookaheads=20, hits=0)
    allowed = [budget.allows("code", "code", True) for _ in range(2 * PROBE_EVERY)]
    assert sum(allowed) == 2 and allowed[PROBE_EVERY - 1]  # one probe in PROBE_EVERY
    assert budget.allows("code", "code", False) and budget.allows("sql", "code", True)  # other arms: their own


def test_an_arm_that_recovers_drafts_ahead_again_and_zero_turns_the_budget_off():
    budget = LookaheadBudget(min_hit_rate=0.1)
    budget.observe("prose", "prose", False, lookaheads=64, hits=1)
    assert budget.hit_rate(("prose", "prose", False)) < 0.1 and not budget.allows("prose", "prose", False)
    budget.observe("prose", "prose", False, lookaheads=256, hits=128)  # the probes hit now
    assert budget.hit_rate(("prose", "prose", False)) > 0.3 and budget.allows("prose", "prose", False)
    off = LookaheadBudget(min_hit_rate=0.0)
    off.observe("code", "code", True, lookaheads=100, hits=0)
    assert off.allows("code", "code", True)
