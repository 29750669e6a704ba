"""The planner's model (cluster/plan.py) on cases small enough to check by hand, and its search."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specserve.cluster.plan import (Costs, TaskLoad, Workload, accepted, plan, simulate_fleet,
                                    simulate_replica, smallest_fleet)
from specserve.router.cost_model import expected_tokens_per_pass as expected_tokens  # what the planner uses

FLAT = Costs(((1, 10.0),))  # every pass 10 ms, whatever its width


def one_client(alpha: float = 0.0, k: int = 0) -> Workload:
    return Workload((TaskLoad("t", 1.0, alpha, k),), prompt_tokens=1, output_tokens=11, clients=1)


def test_one_client_target_only_takes_a_pass_per_token():
    run = simulate_replica(one_client(), FLAT, replicas=1, seconds=1.0, warmup=0)
    # the prompt's pass gives the first token at 10 ms, then ten passes of one token: 110 ms a request
    assert run.latency[0] == pytest.approx(0.110) and run.ttft[0] == pytest.approx(0.010)
    assert run.tpot[0] == pytest.approx(0.010) and run.tokens / run.seconds == pytest.approx(100, rel=0.02)


def test_a_draft_always_right_commits_k_plus_one_tokens_a_pass():
    run = simulate_replica(one_client(alpha=1.0, k=4), FLAT, replicas=1, seconds=1.0, warmup=0)
    # first token at 10 ms; then 5 + 5 tokens in two passes (the last step's k cut to what is left)
    assert run.latency[0] == pytest.approx(0.030) and run.tpot[0] == pytest.approx(0.002)


def test_acceptance_follows_the_truncated_geometric_law():
    import random

    rng = random.Random(0)
    draws = [accepted(0.6, 4, rng) for _ in range(40_000)]
    assert sum(draws) / len(draws) + 1 == pytest.approx(expected_tokens(0.6, 4), rel=0.01)
    assert expected_tokens(0.5, 2) == pytest.approx(1.75) and expected_tokens(1.0, 3) == 4
    assert draws.count(4) / len(draws) == pytest.approx(0.6 ** 4, abs=0.01)


def test_pass_time_runs_straight_between_and_past_the_measured_widths():
    costs = Costs(((1, 10.0), (5, 14.0), (9, 30.0)))
    assert [costs.pass_seconds(w) * 1000 for w in (1, 3, 5, 7, 13)] == pytest.approx([10, 12, 14, 22, 46])
    with pytest.raises(ValueError):
        Costs(((5, 1.0), (1, 2.0)))


def test_a_pass_speculates_only_where_it_yields_more_tokens_a_second():
    steep = Costs(((1, 10.0), (5, 50.0)))  # verifying 5 tokens costs 5 passes: never worth it at alpha 0.5
    run = simulate_replica(one_client(alpha=0.5, k=4), steep, replicas=1, seconds=2.0, warmup=0)
    assert run.speculated == 0 and run.draft_seconds == 0
    flat = Costs(((1, 10.0),), draft_token_ms=1.0, lookahead=False)
    run = simulate_replica(one_client(alpha=0.5, k=4), flat, replicas=1, seconds=2.0, warmup=0)
    # a flat curve: every step with a draft token to verify speculates (not a prompt's, nor a last
    # token's), and its draft tokens cost 1 ms each: k of them, or fewer near the request's end
    assert run.passes * 0.6 < run.speculated and 0.001 * run.speculated <= run.draft_seconds <= 0.004 * run.speculated
    ahead = simulate_replica(one_client(alpha=0.5, k=4), replace(flat, lookahead=True), replicas=1, seconds=2.0,
                             warmup=0)
    # drafting ahead while the target verifies: a miss (most steps at alpha 0.5) drafts again
    assert run.draft_seconds / run.speculated < ahead.draft_seconds / ahead.speculated <= 0.008


def test_closed_loop_clients_spread_over_replicas():
    costs = Costs(((1, 10.0), (64, 20.0)))
    workload = Workload((TaskLoad("t", 1.0),), prompt_tokens=1, output_tokens=11, clients=8)
    one, two = (simulate_fleet(workload, costs, replicas, seconds=5.0) for replicas in (1, 2))
    # every pass gives each of its sessions a token: 8 sessions in one replica's passes of width 8,
    # or 4 in each of two replicas' passes of width 4 (a closed loop: the clients set the load)
    assert one.tokens_per_second == pytest.approx(8 / costs.pass_seconds(8), rel=0.02)
    assert two.tokens_per_second == pytest.approx(2 * 4 / costs.pass_seconds(4), rel=0.02)
    assert two.p50_tpot == pytest.approx(costs.pass_seconds(4), rel=0.02)


def test_an_overloaded_fleet_does_not_keep_up_and_the_search_finds_the_fleet_that_does():
    costs = Costs(((1, 10.0), (512, 200.0)), max_sessions_per_pass=8)
    workload = Workload((TaskLoad("t", 1.0),), prompt_tokens=16, output_tokens=32, rate=200.0)
    # a replica's 8 sessions a pass give at most ~800 tokens/s (25 requests/s): 200 requests/s need 8+
    assert not simulate_fleet(workload, costs, 4, seconds=20.0).keeps_up
    fleet = smallest_fleet(workload, costs, budget_tpot=0.05, max_replicas=64, seconds=20.0)
    assert fleet is not None and fleet.keeps_up and 8 <= fleet.replicas <= 16
    assert smallest_fleet(workload, costs, budget_tpot=0.001, max_replicas=64, seconds=5.0) is None  # < one pass


def test_speculation_that_pays_saves_replicas():
    gpu_like = Costs(((1, 5.0), (64, 5.5), (512, 12.0)), draft_token_ms=0.5)
    workload = Workload((TaskLoad("code", 1.0, alpha=0.7, k=4),), prompt_tokens=32, output_tokens=64, rate=400.0)
    found = plan(workload, gpu_like, budget_tpot=0.006, max_replicas=256, seconds=10.0)
    assert found.speculating is not None and found.target_only is not None
    assert found.speculating.replicas < found.target_only.replicas and found.replicas_saved > 0
    assert found.speculating.draft_workers > 0 and found.target_only.draft_workers == 0


def test_the_command_prints_a_plan_and_writes_it(tmp_path, capsys):
    from specserve.cluster.cli import main

    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps({"rate": 50, "prompt_tokens": 32, "output_tokens": 64,
                                    "tasks": {"code": {"share": 0.5, "alpha": 0.7, "k": 4}, "chat": {"share": 0.5}}}))
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"pass_ms": [[1, 5.0], [64, 6.0], [512, 12.0]], "draft_token_ms": 0.5}))
    out = tmp_path / "plan.json"
    main(["plan", "--workload", str(workload), "--costs", str(costs), "--budget-tpot-ms", "8", "--seconds", "5",
          "--out", str(out)])
    printed = capsys.readouterr().out
    assert "target replicas" in printed and "speculation" in printed
    written = json.loads(out.read_text())
    assert written["speculating"]["replicas"] >= 1 and written["target_only"]["replicas"] >= 1
    with pytest.raises(SystemExit) as bad:
        main(["plan", "--workload", str(costs), "--costs", str(costs), "--budget-tpot-ms", "8"])
    assert bad.value.code == 2 and "workload" in capsys.readouterr().err


def check_row(run, clients, path, predicted, measured, shape="bench", held_out=True, fit=False):
    return {"run": run, "shape": shape, "clients": clients, "path": path, "requests": 16, "fit": fit,
            "held_out": held_out, "tokens_per_second": {"predicted": predicted, "measured": measured},
            "tpot_p99": {"predicted": 0.010, "measured": 0.0125 if shape == "bench" else None}}


def test_the_check_scores_only_held_out_rows_by_slice():
    from specserve.bench.plan_check import slices

    rows = [check_row("calib", 1, "off", 100, 100, held_out=False, fit=True),  # a fit: no prediction
            check_row("calib", 2, "off", 200, 100, held_out=False),  # the calibration run's: apart
            check_row("a", 1, "off", 110, 100), check_row("a", 8, "off", 80, 100),
            check_row("a", 16, "off", 130, 100), check_row("a", 4, "auto", 95, 100),
            check_row("b", 16, "off", 100, 125, shape="json-schema free")]
    found = {s["slice"]: s for s in slices(rows)}
    low = found["OFF, <= 8 clients"]  # errors +10% and -20%: one within 15%
    assert (low["rows"], low["within"]) == (2, 1) and low["mean_error"] == pytest.approx(0.15)
    assert low["max_error"] == pytest.approx(0.2) and low["tpot_p99_mean_error"] == pytest.approx(0.2)  # 10 / 12.5 ms
    assert (found["OFF, > 8 clients"]["rows"], found["OFF, > 8 clients"]["within"]) == (1, 0)
    other = found["other shape: json-schema free, OFF"]  # 100 / 125 - 1: -20%, no p99 measured
    assert other["mean_error"] == pytest.approx(0.2) and other["tpot_p99_mean_error"] is None
    assert found["all held-out"]["rows"] == 5
    assert found["calibration run's own predicted rows (not held out)"]["rows"] == 1


def test_the_checks_report_shows_held_out_rows_apart_from_the_calibration_runs():
    from specserve.bench.plan_check import format_report, slices

    rows = [check_row("bench/results/calib", 1, "off", 100, 100, held_out=False, fit=True),
            check_row("bench/results/a", 2, "auto", 110, 100),
            check_row("bench/results/b", 1, "auto", 90, 100, shape="shared-prefix cache off")]
    text = format_report({"run": "bench/results/calib", "pass_ms": [[1, 5.0]], "pass_ms_from": "recorded",
                          "prompt_tokens": 30, "output_tokens": 96,
                          "costs": {"pass_overhead_ms": 1.0, "step_hop_ms": 0.5, "draft_pass_ms": [[1, 2.0]],
                                    "draft_devices": 2},
                          "tasks": [{"name": "code/code", "share": 4, "alpha": 0.8, "k": 4}],
                          "rows": rows, "slices": slices(rows)})
    held, own = text.split("## Held out")[1].split("itself (the calibration run")
    assert "| a | bench | auto | 2 | 16 | 100 | 110 | +10% | 12.5 | 10.0 | -20% |" in held
    assert "| b | shared-prefix cache off | auto* | 1 | 16 | 100 | 90 | -10% | - | - | - |" in held  # CALIB's proposers
    assert "| calib | bench | off | 1 (fit) |" in own and "calib |" not in held
    assert "| AUTO, <= 8 clients | 1 | 1 | 10% | 10% | 20% |" in text


def test_the_check_takes_each_proposers_k_and_alpha_from_the_runs_requests():
    from specserve.bench.plan_check import arms

    def sample(task, draft, proposed, accepted, rejections, passes=11):
        return {"task": task, "draft": draft, "proposed": proposed, "accepted": accepted, "rejections": rejections,
                "target_passes": passes}
    found = {t.name: t for t in arms([sample("sql", "sql", 40, 20, 5), sample("sql", "sql", 40, 30, 5),
                                      sample("code", "ngram", 30, 10, 8), sample("prose", "", 0, 0, 0)])}
    sql = found["sql/sql"]  # 80 proposed over 20 verify steps: k 4; alpha = 50 / (50 + 10), as workers/stats.py defines it
    assert sql.share == 2 and sql.k == 4 and not sql.draft_free and sql.alpha == pytest.approx(50 / 60)
    assert found["code/ngram"].draft_free and found["code/ngram"].k == 3
    assert found["prose/target-only"].k == 0 and found["prose/target-only"].share == 1


def test_a_bench_level_is_a_finite_closed_loop_and_a_pass_pays_the_replicas_overhead():
    # two clients share four requests (two waves of two, 11 passes each) in 10 ms passes, plus 2 ms a pass
    costs = Costs(((1, 10.0),), pass_overhead_ms=2.0)
    workload = Workload((TaskLoad("t", 1.0),), prompt_tokens=1, output_tokens=11, clients=2, requests=4)
    fleet = simulate_fleet(workload, costs, replicas=1, seconds=60.0, sample_replicas=1)
    assert fleet.tokens_per_second == pytest.approx(4 * 11 / (2 * 11 * 0.012))
    assert fleet.p99_tpot == pytest.approx(0.012)
    with pytest.raises(ValueError):
        Workload((TaskLoad("t", 1.0),), prompt_tokens=1, output_tokens=11, rate=5.0, requests=4)


def test_a_step_waits_for_its_draft_device_and_the_routers_round_trip():
    # a prompt pass (10 ms: the first token), then steps of k = 2: the draft's 2 passes of 2 ms and
    # the router's 1 ms hop before each 10 ms verify pass, 3 tokens a step at alpha 1
    costs = Costs(((1, 10.0),), draft_pass_ms=((1, 2.0),), step_hop_ms=1.0, lookahead=False)
    workload = Workload((TaskLoad("t", 1.0, alpha=1.0, k=2),), prompt_tokens=1, output_tokens=7, clients=1)
    run = simulate_replica(workload, costs, replicas=1, seconds=1.0, warmup=0)
    assert run.latency[0] == pytest.approx(0.010 + 2 * (0.004 + 0.001 + 0.010))
    assert run.tpot[0] == pytest.approx(0.030 / 6) and run.draft_seconds / len(run.latency) == pytest.approx(0.008, rel=0.05)
    # drafting ahead: the second step's proposal is drafted during the first verify, and the verdict
    # (all accepted, the draft's guess right) finds it ready: that step waits for the hop alone
    ahead = simulate_replica(workload, replace(costs, lookahead=True), replicas=1, seconds=1.0, warmup=0)
    assert ahead.latency[0] == pytest.approx(0.010 + (0.004 + 0.001 + 0.010) + (0.001 + 0.010))
    # a draft-free proposer (the router's n-gram) has no draft device to wait for
    free = Workload((TaskLoad("t", 1.0, alpha=1.0, k=2, draft_free=True),), prompt_tokens=1, output_tokens=7, clients=1)
    run = simulate_replica(free, costs, replicas=1, seconds=1.0, warmup=0)
    assert run.latency[0] == pytest.approx(0.010 + 2 * (0.001 + 0.010)) and run.draft_seconds == 0


def test_sessions_sharing_a_draft_device_wait_for_each_others_passes():
    # a draft pass costs 2 ms a session (no gain from batching): two sessions on one device draft
    # their 2 tokens in 2 passes of 4 ms, on a device each in 2 passes of 2 ms
    workload = Workload((TaskLoad("t", 1.0, alpha=1.0, k=2),), prompt_tokens=1, output_tokens=7, clients=2)
    shared = Costs(((1, 10.0),), draft_pass_ms=((1, 2.0), (2, 4.0)), draft_devices=1, lookahead=False)
    one = simulate_replica(workload, shared, replicas=1, seconds=1.0, warmup=0)
    two = simulate_replica(workload, replace(shared, draft_devices=2), replicas=1, seconds=1.0, warmup=0)
    assert two.latency[:2] == pytest.approx([0.010 + 2 * (0.004 + 0.010)] * 2)
    assert one.latency[:2] == pytest.approx([0.010 + 2 * (0.008 + 0.010)] * 2)


def test_the_shipped_examples_are_a_workload_and_costs_the_command_reads():
    from pathlib import Path

    from specserve.cluster.commands.plan import read_costs, read_workload

    examples = Path(__file__).parents[1] / "deploy" / "plan"
    workload, costs = read_workload(examples / "workload.example.yaml"), read_costs(examples / "costs.example.json")
    assert workload.rate and len(workload.tasks) >= 2 and costs.draft_pass_ms and costs.pass_seconds(1) > 0


def test_a_running_services_stats_give_the_costs_and_the_tasks_it_served():
    from specserve.cluster.commands.plan import service_costs, service_tasks
    from specserve.proto.v1 import specserve_pb2 as pb

    stats = pb.ServiceStats(
        workers=[pb.WorkerInfo(kind="target", pass_widths=[1, 16], pass_seconds=[0.004, 0.010]),
                 pb.WorkerInfo(kind="target", pass_widths=[1, 16], pass_seconds=[0.005, 0.009]),
                 pb.WorkerInfo(kind="draft")],
        tasks=[pb.TaskStats(task="sql", draft="sql", requests=2, proposed_tokens=80, accepted_tokens=50,
                            target_passes=22, drafted_tokens=100, cost_ratio=0.2, alpha=0.8),
               pb.TaskStats(task="code", draft="ngram", requests=1, proposed_tokens=30, accepted_tokens=10,
                            target_passes=11, drafted_tokens=0, cost_ratio=0.0, alpha=0.5),
               pb.TaskStats(task="chat", draft="", requests=3, target_passes=90),
               pb.TaskStats(task="math", draft="math", requests=0)])
    costs = service_costs(stats)
    assert costs.pass_ms == ((1, 5.0), (16, 10.0))  # the slowest replica at each width
    assert costs.draft_token_ms == pytest.approx(0.2 * 5.0)  # c times a one-token pass
    tasks = {t.name: t for t in service_tasks(stats)}
    assert set(tasks) == {"sql/sql", "code/ngram", "chat/target-only"}  # math served nothing
    sql = tasks["sql/sql"]  # 80 proposed over 20 verify steps (22 passes less 2 prompts): k 4; the policy's alpha
    assert sql.share == 2 and sql.k == 4 and sql.alpha == pytest.approx(0.8)
    assert tasks["code/ngram"].draft_free and tasks["chat/target-only"].k == 0
    # no timings and no fitted line: the command says what to do instead
    with pytest.raises(SystemExit):
        service_costs(pb.ServiceStats(workers=[pb.WorkerInfo(kind="target")]))


def test_the_command_plans_from_a_running_service(client, service, tmp_path, capsys):
    from specserve.cluster.cli import main
    from specserve.proto.v1 import specserve_pb2 as pb

    client.generate(pb.GenerateRequest(prompt="SELECT name FROM", task="sql", max_tokens=12))
    workload = tmp_path / "workload.yaml"
    workload.write_text("rate: 5\nprompt_tokens: 8\noutput_tokens: 12\n")  # tasks: the service's
    main(["plan", "--workload", str(workload), "--address", service.address, "--budget-tpot-ms", "1000",
          "--seconds", "2", "--max-replicas", "4"])
    printed = capsys.readouterr().out
    assert f"costs from {service.address}: a pass of 1:" in printed and "target replicas" in printed


def test_a_step_is_priced_through_the_cost_model_as_the_policy_prices_it():
    from specserve.cluster.plan import speedup

    costs = Costs(((1, 10.0), (16, 20.0)), draft_pass_ms=((1, 2.0),), step_hop_ms=1.0)
    task = TaskLoad("t", 1.0, alpha=0.6, k=3)
    # one session: a verify pass of 4 tokens 12 ms (straight between 1 and 16) over a 10 ms target-only
    # pass, the 1 ms round trip 0.1 of it, each drafted token 2 ms (c = 0.2): 1.2 + 0.1 + 3 x 0.2 = 1.9
    assert speedup(task, 3, 1, costs) == pytest.approx(expected_tokens(0.6, 3) / 1.9)  # 1.15: it speculates
    # 40 in flight, 32 a pass: N = 32 (30.67 ms) and a pass of 128 (94.67 ms, past the curve); the
    # target saturated, so the draft's time drops out: 3.087 + 1 / 30.67, and 2.18 tokens for it (0.70)
    plain, verify = 10 + 10 * 31 / 15, 10 + 10 * 127 / 15
    assert speedup(task, 3, 40, costs) == pytest.approx(expected_tokens(0.6, 3) / (verify / plain + 1 / plain))
    workload = Workload((task,), prompt_tokens=1, output_tokens=20, clients=40)
    run = simulate_replica(workload, costs, replicas=1, seconds=2.0, warmup=0)
    assert run.speculated == 0 and run.tokens > 0  # nor do steps of k 1 or 2 pay at that load: all target-only
    one = simulate_replica(replace(workload, clients=1), costs, replicas=1, seconds=2.0, warmup=0)
    assert one.speculated > 0.5 * one.decode_steps


def test_the_planners_percentiles_are_the_benchs():
    import numpy as np

    from specserve.cluster.plan import tail
    from specserve.workers.stats import percentile

    values = [float(v) for v in np.random.default_rng(0).exponential(size=37)]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert percentile([], 99) is None and tail([], 99) == float("inf")  # no request finished: no budget is met
    with pytest.raises(ValueError):
        percentile(values, 0.99 * 200)


def test_a_fleet_says_how_many_sessions_a_replica_holds_and_whether_that_was_checked():
    from specserve.cluster.plan import VALIDATED_SESSIONS

    costs = Costs(((1, 10.0), (64, 20.0)))
    workload = Workload((TaskLoad("t", 1.0),), prompt_tokens=1, output_tokens=11, clients=32)
    spread = simulate_fleet(workload, costs, replicas=8, seconds=2.0)
    assert spread.sessions_per_replica == pytest.approx(4, rel=0.02) and spread.validated
    crowded = simulate_fleet(workload, costs, replicas=1, seconds=2.0)
    assert crowded.sessions_per_replica == pytest.approx(32, rel=0.02) and 32 > VALIDATED_SESSIONS
    assert not crowded.validated


def test_the_command_warns_where_a_plan_goes_past_what_was_checked(tmp_path, capsys):
    from specserve.cluster.cli import main

    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps({"clients": 32, "prompt_tokens": 8, "output_tokens": 16,
                                    "tasks": {"chat": {"share": 1}}}))
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"pass_ms": [[1, 5.0], [64, 68.0]]}))  # 1 ms more a token in the pass
    # a budget that one replica of 32 sessions keeps (passes of 36 ms): past the 8 a replica checked
    main(["plan", "--workload", str(workload), "--costs", str(costs), "--budget-tpot-ms", "50", "--seconds", "2"])
    printed = capsys.readouterr().out
    assert "not checked: GPU costs or a running service's (--address), the p99 time per output token" in printed
    assert "warning: the target-only plan puts 32 sessions on a replica, past the 8" in printed
    main(["plan", "--workload", str(workload), "--costs", str(costs), "--budget-tpot-ms", "9", "--seconds", "2",
          "--max-replicas", "64"])  # passes within 9 ms: 4 sessions a replica at most
    assert "warning" not in capsys.readouterr().out


def test_a_plan_checks_results_are_costs_the_command_reads(tmp_path):
    from dataclasses import asdict

    from specserve.cluster.commands.plan import read_costs

    costs = Costs(((1, 5.0), (16, 9.0)), pass_overhead_ms=1.0, session_overhead_ms=0.5, draft_pass_ms=((1, 2.0),),
                  draft_devices=2, step_hop_ms=0.3, lookahead=False)
    report = tmp_path / "results.json"
    report.write_text(json.dumps({"rows": [], "costs": asdict(costs)}))
    assert read_costs(report) == costs  # every field, as the check wrote it


def test_an_older_checks_router_cpu_is_read_past_and_said_so(tmp_path, capsys):
    from specserve.cluster.commands.plan import read_costs

    report = tmp_path / "results.json"  # bench/results/20261127-094901's check fitted the router's CPU
    report.write_text(json.dumps({"costs": {"pass_ms": [[1, 5.0]], "router_step_ms": 7.6, "host_cores": 2}}))
    assert read_costs(report) == Costs(((1, 5.0),))
    assert "router_step_ms and host_cores are ignored" in capsys.readouterr().err


def test_a_bench_run_without_auto_levels_of_1_to_4_clients_is_checked_on_off_alone(tiny_zoo):
    """AUTO's proposers come from its 1-4 client levels; a run at 8 clients and more (the load
    section alone, as issue 44's grouping runs were) has none: its AUTO levels are left out, not
    priced as an empty workload (it raised)."""
    from specserve.bench.plan_check import bench_levels

    def sample(path):
        return {"section": "load", "path": path, "concurrency": 8, "tokens": 32, "task": "sql", "draft": "",
                "proposed": 0, "accepted": 0, "rejections": 0, "target_passes": 32}

    level = {"tokens_per_second": 100.0, "tpot_p50": 0.01, "tpot_p99": 0.02}
    results = {"meta": {"zoo": {"path": str(tiny_zoo.root)}, "tasks": ["sql"], "settings": {"prompts": 2}},
               "samples": [sample("off"), sample("auto")],
               "figures": {"load": {"levels": {"8": {"off": level, "auto": level}}}}}
    assert [(lv.path, lv.clients) for lv in bench_levels("run", results)] == [("off", 8)]
