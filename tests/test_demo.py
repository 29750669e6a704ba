"""`make demo`'s table, on the tiny zoo: every task, figures computed from the runs themselves, through
the service (the session's cluster) and in process."""

import pytest

from specserve.cluster.demo import run_demo
from specserve.router.cost_model import expected_speedup


@pytest.mark.parametrize("where", ["service", "in-process"])
def test_demo_prints_a_row_per_task_from_measurements(tiny_zoo, capsys, request, where):
    address = request.getfixturevalue("service").address if where == "service" else None
    results = run_demo(str(tiny_zoo.root), prompts_per_task=2, max_tokens=12, k=3, in_process=where == "in-process",
                       address=address)
    table = capsys.readouterr().out
    assert [r.task for r in results] == tiny_zoo.tasks
    for r in results:
        assert r.identical, f"speculative output differs from the target's on {r.task}"
        assert r.seconds_target_only > 0 and r.seconds_speculative > 0
        assert r.stats.target_passes > 0 and r.stats.proposed > 0
        assert r.draft == r.task
        assert f"{r.speedup:>7.2f}x" in table and f"{r.stats.alpha:>6.2f}" in table
        assert r.cost_ratio > 0 and r.bound == expected_speedup(r.stats.alpha, r.cost_ratio, 3)
        if where == "service":  # the same prompts routed by the policy, checked against target-only too
            assert r.seconds_routed > 0 and sum(r.routed_to.values()) == 2
            assert f"{r.routed_speedup:>6.2f}x" in table
        else:
            assert not r.routed_to
