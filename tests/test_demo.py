"""`make demo`'s table, on the tiny zoo: every task, figures computed from the runs themselves, through
the service (the session's cluster) and in process."""

import pytest

from specserve.cluster.demo import TaskResult, format_table, run_demo
from specserve.workers.stats import SpecStats

K = 3


def leviathan(alpha: float, c: float, k: int) -> float:
    """Leviathan et al. (2023), written out here rather than imported from the code under test:
    E = (1 - alpha^(k+1)) / (1 - alpha) tokens per target pass, over a step's cost k c + 1."""
    tokens = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + 1)


def table_row(table: str, task: str, draft: str) -> list[str]:
    """The table's row for ``task`` and ``draft``, split into its columns (task, draft, alpha,
    alpha(zoo), acc.rate, tok/pass, c, wasted, speedup, bound, identical[, routed, routed to...])."""
    (row,) = [line.split() for line in table.splitlines() if line.split()[:2] == [task, draft]]
    return row


def test_the_table_row_on_known_counts():
    """Every column of a row from counts whose figures are worked out by hand."""
    stats = SpecStats(proposed=12, accepted=8, rejections=2, target_passes=4, drafted=30, wasted=6, draft_seconds=0.3)
    result = TaskResult("sql", "sql-d", alpha_held_out=0.5, k=K, stats=stats,
                        target_only=SpecStats(target_passes=20, verify_seconds=2.0),
                        seconds_target_only=3.0, seconds_speculative=1.2)
    # alpha = 8 / (8 + 2) = 0.8; c = (0.3 s / 30 draft passes) / (2.0 s / 20 target passes) = 0.01 / 0.1 = 0.1;
    # E = (1 - 0.8^4) / (1 - 0.8) = 0.5904 / 0.2 = 2.952 tokens per pass; bound = 2.952 / (3 * 0.1 + 1) = 2.270769...
    assert result.bound == pytest.approx(2.270769, abs=1e-6)
    # acc.rate = 8 / 12 = 0.67; tok/pass = (8 + 4) / 4 = 3.00; wasted = 6 / 30 = 0.20; speedup = 3.0 s / 1.2 s = 2.50
    assert table_row(format_table([result]), "sql", "sql-d") == ["sql", "sql-d", "0.80", "0.50", "0.67", "3.00", "0.100",
                                                         "0.20", "2.50x", "2.27x", "yes"]


@pytest.mark.parametrize("where", ["service", "in-process"])
def test_demo_prints_a_row_per_task_from_measurements(tiny_zoo, capsys, request, where):
    address = request.getfixturevalue("service").address if where == "service" else None
    results = run_demo(str(tiny_zoo.root), prompts_per_task=2, max_tokens=12, k=K, in_process=where == "in-process",
                       address=address)
    table = capsys.readouterr().out
    assert [(r.task, r.draft) for r in results] == [(task, draft) for task in tiny_zoo.tasks
                                                    for draft in (task, "eagle3")]  # its draft, the zoo's head
    for r in results:
        assert r.identical, f"speculative output differs from the target's on {r.task} with {r.draft}"
        assert r.seconds_target_only > 0 and r.seconds_speculative > 0
        assert r.stats.target_passes > 0 and r.stats.proposed > 0
        # The printed figures, recomputed here from the run's raw counts and times.
        alpha = r.stats.accepted / (r.stats.accepted + r.stats.rejections)
        c = (r.stats.draft_seconds / r.stats.drafted) / (r.target_only.verify_seconds / r.target_only.target_passes)
        assert c > 0 and r.bound == pytest.approx(leviathan(alpha, c, K))
        # Every drafted token is proposed, or is a lookahead's guess of the target's token (a hit not by
        # its branch, whose first token is assumed, not drafted), or wasted.
        assert r.stats.drafted == r.stats.proposed + r.stats.lookahead_hits - r.stats.branch_hits + r.stats.wasted
        assert where == "service" or not r.stats.wasted  # in process nothing is drafted ahead
        row = table_row(table, r.task, r.draft)
        assert row[2] == f"{alpha:.2f}" and row[6] == f"{c:.3f}" and row[7] == f"{r.stats.wasted / r.stats.drafted:.2f}"
        assert row[8] == f"{r.seconds_target_only / r.seconds_speculative:.2f}x"
        assert row[9] == f"{leviathan(alpha, c, K):.2f}x"
        if where == "service" and r.draft == r.task:  # the same prompts routed by the policy, checked too
            assert r.seconds_routed > 0 and sum(r.routed_to.values()) == 2
            assert row[11] == f"{r.seconds_target_only / r.seconds_routed:.2f}x"
        else:
            assert not r.routed_to


def test_variants_get_a_row_per_task_beside_the_zoos_drafts(tiny_zoo, medusa_heads, mtp_target, other_tokenizer_draft):
    """`demo --variants`' rows (here in process, with the session's Medusa heads and MTP target in
    place of those distilled beside a zoo): each against the same target-only runs, output identical."""
    from specserve.cluster.demo import engine_decoder, measure_task
    from specserve.cluster.local import zoo_engine
    from specserve.workers.loading import ModelSpec

    heads = {"medusa": medusa_heads[0], "mtp": mtp_target[0], "othertok": other_tokenizer_draft}
    engine = zoo_engine(tiny_zoo, ["sql", "eagle3"], extra={name: ModelSpec(str(where)) for name, where in heads.items()})
    results = measure_task(engine_decoder(engine, 12, K, {"sql": "sql"}), tiny_zoo, "sql", 2, K, heads=heads,
                           cascade=True)
    assert [r.draft for r in results] == ["sql", "eagle3", "medusa", "mtp", "othertok", "cascade"]
    assert all(r.identical and r.stats.target_passes for r in results)
    assert results[3].alpha_held_out == mtp_target[1]["held_out_alpha"]  # distill's
    table = format_table(results)
    assert table_row(table, "sql", "mtp")[-1] == "yes" and "mtp: the target carrying an MTP" in table
    assert 0 <= results[4].alpha_held_out <= 1 and "othertok: a draft of another tokenizer" in table
    assert table_row(table, "sql", "cascade")[-1] == "yes" and "cascade: the task's draft under prompt lookup" in table
