"""Per-request speculation statistics, and the batches steps ran in: the definitions the demo, the
service, `specserve stats` and the policy rely on."""

import pytest

from specserve.proto.v1 import internal_pb2 as pb
from specserve.router.passes import PassLog, PassWindow
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


def test_a_request_logs_the_pass_each_step_ran_in():
    log = PassLog()
    log.add(pb.PassInfo(tokens=20, sessions=4, queue_seconds=0.002))
    log.add(pb.PassInfo())  # a worker that does not batch reports no pass: no entry
    log.add(pb.Proposal(ids=[1, 2]).pass_info)  # nor does a proposal without one
    assert (log.tokens, log.sessions, log.queue_seconds) == ([20], [4], [0.002])


def test_the_window_keeps_the_latest_steps_and_summarises_them():
    window = PassWindow(size=4)
    assert window.summary().steps == 0 and window.summary().mean_sessions == 0.0
    window.add(PassLog(tokens=[100] * 4, sessions=[16] * 4, queue_seconds=[1.0] * 4))  # pushed out below
    window.add(PassLog(tokens=[5, 10, 10, 30], sessions=[1, 2, 2, 6], queue_seconds=[0.0, 0.001, 0.001, 0.006]))
    s = window.summary()
    assert s.steps == 4
    assert (s.mean_sessions, s.p50_sessions) == (2.75, 2)
    assert (s.mean_tokens, s.p50_tokens) == (13.75, 10)
    assert s.mean_queue_seconds == pytest.approx(0.002) and s.p50_queue_seconds == pytest.approx(0.001)


def test_each_derived_figure_is_pinned():
    """The one definition of each figure (workers/stats.py), on numbers worked by hand."""
    from specserve.workers import stats

    assert stats.alpha(accepted=6, rejections=2) == 0.75  # 6 / (6 + 2)
    assert stats.acceptance_rate(accepted=6, proposed=12) == 0.5
    assert stats.tokens_per_pass(accepted=6, target_passes=4) == 2.5  # (6 + 4) / 4
    # c per drafted token: 10 tokens in 20 ms (2 ms each) against 4 target-only passes in 40 ms (10 ms each).
    assert stats.cost_ratio(draft_seconds=0.020, drafted=10, target_seconds=0.040, target_passes=4) == pytest.approx(0.2)
    assert stats.alpha(0, 0) == stats.acceptance_rate(0, 0) == stats.tokens_per_pass(0, 0) == 0.0
    assert stats.cost_ratio(0.02, 0, 0.04, 4) == stats.cost_ratio(0.02, 10, 0.04, 0) == 0.0
    assert stats.wasted_share(wasted=3, drafted=12) == 0.25 and stats.wasted_share(0, 0) == 0.0
    # TPOT: 1.0 s to the last of 11 tokens, the first chunk (1 token) at 0.2 s: 0.8 s / 10 later tokens.
    assert stats.time_per_output_token(1.0, 0.2, tokens=11, first_chunk_tokens=1) == pytest.approx(0.08)
    assert stats.time_per_output_token(1.0, 0.2, tokens=3, first_chunk_tokens=3) is None  # all in one chunk


def test_spec_stats_use_the_same_definitions():
    on = SpecStats(proposed=8, accepted=6, rejections=2, target_passes=4, drafted=10, wasted=2, draft_seconds=0.02)
    off = SpecStats(target_passes=4, verify_seconds=0.04)
    assert (on.alpha, on.acceptance_rate, on.tokens_per_pass, on.wasted_share) == (0.75, 0.75, 2.5, 0.2)
    # Per drafted token (10, the wasted ones included), not per proposed one (8): the demo's c through
    # the service once charged every drafted token's time to the proposed ones (0.67-0.82 for 0.39).
    assert on.cost_ratio(off) == pytest.approx(0.2)
