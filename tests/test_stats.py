"""Per-request speculation statistics: the definitions the demo, the service and the policy rely on."""

import pytest

from specserve.workers.stats import SpecStats


def test_counts_rates_and_alpha():
    s = SpecStats()
    s.record_step(k=4, num_accepted=4)  # all accepted: no rejection
    s.record_step(k=4, num_accepted=1)  # rejected at position 1
    s.record_step(k=2, num_accepted=0)  # rejected at position 0
    assert (s.proposed, s.accepted, s.rejections, s.target_passes) == (10, 5, 2, 3)
    assert s.accepted_per_position == [2, 1, 1, 1]
    assert s.tested_per_position == [3, 2, 1, 1]  # the third step stopped at position 0
    assert s.alpha_per_position == pytest.approx([2 / 3, 1 / 2, 1, 1])
    assert s.acceptance_rate == pytest.approx(0.5)
    assert s.alpha == pytest.approx(5 / 7)  # accepted tests over all tests decided
    assert s.tokens_per_pass == pytest.approx((5 + 3) / 3)  # each pass also commits one target token


def test_target_only_steps_and_empty_stats():
    s = SpecStats()
    assert s.alpha == s.acceptance_rate == s.tokens_per_pass == 0.0
    s.record_step(k=0, num_accepted=0)
    assert (s.proposed, s.rejections, s.tokens_per_pass) == (0, 0, 1.0)


def test_add_sums_requests():
    a, b = SpecStats(), SpecStats()
    a.record_step(k=2, num_accepted=2)
    b.record_step(k=4, num_accepted=3)
    b.draft_seconds = 0.5
    a.add(b)
    assert (a.proposed, a.accepted, a.rejections, a.target_passes) == (6, 5, 1, 2)
    assert a.accepted_per_position == [2, 2, 1, 0] and a.draft_seconds == 0.5
    assert a.tested_per_position == [2, 2, 1, 1]
