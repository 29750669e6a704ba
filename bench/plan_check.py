"""The capacity planner (cluster/plan.py) against a measured run: what it predicts for the load
section of a `specserve bench` report, beside what the embedded cluster measured.

For each load level (N closed-loop clients sharing the level's requests, mixed tasks) and path
(OFF: target-only; AUTO: the policy's choices), the planner simulates one target replica and its
draft devices with costs measured as follows:
- the target's pass-time curve, timed here on the zoo's target the way the replica runs it (pinned to
  its core, one thread, passes of 1-32 sessions adding 1 or k + 1 tokens each), with the service
  stopped;
- from the run's OFF levels: what a pass costs the serving replica beyond the model (fitted so the
  simulated throughput at the fewest clients is the measured one), and what each session in a pass
  adds (fitted likewise at the most clients);
- from the run's one-client AUTO level: a speculating step's round trip through the router (its
  draft-free steps' time less their pass);
- from the run's AUTO level at the most clients: the CPU a speculating step costs the router and the
  client, which on this host comes out of the devices' cores (``Costs.host_cores``: the machine's);
- from the run's draft-worker counters at every level (the draft pool's own stats, as a running
  service reports them): a draft pass's time by the sessions in it, over the pool's workers;
- from the run's AUTO requests at 1-4 clients (the policy's choices where load does not shape
  them): each task and proposer's share of the requests, its k and its acceptance per step; the
  planner's own load pricing decides what speculates at more clients;
- the prompts' mean length, and the requests' output lengths (each simulated request draws one).

So the OFF and AUTO rows at the fewest and the most clients are fits (the costs come from them); the
others are predictions: OFF and AUTO in between.

    python -m specserve.bench.plan_check [RUN_DIR]     # default: the newest run with a load section

It writes ``bench/results/<time>-plan-check/`` (report.md, results.json). The issue's bar: predicted
throughput and p99 time per output token within 15% of measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from specserve.cluster.demo import ensure_zoo
from specserve.cluster.plan import DRAFT_FREE, Costs, TaskLoad, Workload, served_arm, simulate_fleet
from specserve.workers.config import DraftPoolConfig
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.loading import ModelSpec, gemv_layout, load_model, load_tokenizer
from specserve.workers.prompt import encode_prompt
from specserve.workers.ragged_pass import Segment, run_pass, use_pooled_attention
from specserve.workers.stats import alpha
from specserve.cluster.zoo.zoo import Zoo

from .prompts import load_prompts
from .settings import REPLICA_CORE

SESSIONS = (1, 2, 4, 8, 16, 32)
BAR = 0.15


def pass_curve(zoo: Zoo, k: int, cached: int = 64) -> tuple[tuple[int, float], ...]:
    """(tokens, ms) of the target's passes of S sessions adding 1 or k + 1 tokens each: the median
    of 9 at each shape, averaged where shapes share a width."""
    os.sched_setaffinity(0, {REPLICA_CORE})
    torch.set_num_threads(1)
    model = use_pooled_attention(gemv_layout(load_model(ModelSpec(str(zoo.target_dir)))))
    pool = KVPool(KVShape.of(model), Budget(2**30))
    regions = [pool.take(cached + k + 2) for _ in range(max(SESSIONS))]
    run_pass(model, pool, [Segment(r, 0, [5] * cached, 0) for r in regions])
    by_width: dict[int, list[float]] = {}
    for q in (1, k + 1):
        for count in SESSIONS:
            times = []
            for _ in range(9):
                started = time.perf_counter()
                run_pass(model, pool, [Segment(r, cached, [7] * q, q) for r in regions[:count]])
                times.append(time.perf_counter() - started)
            by_width.setdefault(count * q, []).append(statistics.median(times) * 1000)
    return tuple((width, statistics.mean(ms)) for width, ms in sorted(by_width.items()))


def newest_run(results: Path = Path("bench/results")) -> Path:
    for run in sorted(results.iterdir(), reverse=True):
        if (run / "results.json").exists() and "load" in json.loads((run / "results.json").read_text()).get("figures", {}):
            return run
    raise SystemExit(f"no run with a load section under {results}: run `specserve bench` first")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.plan_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", type=Path, help="a `specserve bench` run's folder (default: the newest)")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="simulations per level, their figures averaged "
                        "(default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="parent of the check's folder")
    args = parser.parse_args(argv)
    run = args.run or newest_run()
    report = check(json.loads((run / "results.json").read_text()), str(run), args.seeds)
    folder = args.out / (datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-plan-check")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(report, indent=1))
    text = format_report(report)
    (folder / "report.md").write_text(text)
    print(text + f"\nwritten to {folder}")


FIT_ROUNDS = 4  # of the two overheads' alternating fits
SEEDS = 8  # simulations per level (their figures averaged): a level is a few dozen requests
LONGEST_LEVEL = 600.0  # simulated seconds a level may take at most (it ends with its requests)


def check(measured: dict, run: str, seeds: int = SEEDS) -> dict:
    """The planner's predictions for a bench run's load levels (``measured``: its results.json, figures
    derived) beside the measured figures (the report ``format_report`` renders), its costs measured as
    the module's doc says."""
    meta, levels = measured["meta"], measured["figures"]["load"]["levels"]
    zoo = ensure_zoo(meta["zoo"]["path"])
    samples = [s for s in measured["samples"] if s["section"] == "load"]
    auto = arms([s for s in samples if s["path"] == "auto" and s["concurrency"] <= 4])
    k = max([t.k for t in auto] or [meta["k"]])
    tokenizer = load_tokenizer(str(zoo.target_dir))
    held_out = load_prompts(zoo)
    tasks = meta["tasks"]
    prompts = [len(encode_prompt(tokenizer, p)) for t in tasks for p in held_out.by_task[t][: meta["settings"]["prompts"]]]
    curve = pass_curve(zoo, k)
    outputs = tuple(s["tokens"] for s in samples if s["path"] in ("off", "auto") and s["tokens"] >= 1)

    def workload(path: str, clients: int) -> Workload:
        task_loads = tuple(TaskLoad(t, 1.0) for t in tasks) if path == "off" else auto
        requests = sum(1 for s in samples if s["path"] == path and s["concurrency"] == clients)
        return Workload(task_loads, round(statistics.mean(prompts)), round(statistics.mean(outputs)), clients=clients,
                        requests=requests, output_lengths=outputs)  # the level's requests, as the bench sent them

    def predict(path: str, clients: int, costs: Costs, seeds: int = seeds) -> tuple[float, float, float]:
        """Tokens/s, p50 and p99 TPOT, each the mean over ``seeds`` simulations."""
        fleets = [simulate_fleet(workload(path, clients), costs, replicas=1, seconds=LONGEST_LEVEL, sample_replicas=1,
                                 seed=seed) for seed in range(seeds)]
        return (statistics.mean(f.tokens_per_second for f in fleets), statistics.mean(f.p50_tpot for f in fleets),
                statistics.mean(f.p99_tpot for f in fleets))

    checked = sorted(int(c) for c, paths in levels.items() if int(c) <= 32 and {"off", "auto"} <= set(paths))
    costs, fits = calibrate(curve, samples, measured["load"]["passes"], meta, checked,
                            lambda path, c, costs: predict(path, c, costs, seeds=2)[0],
                            lambda path, c: levels[str(c)][path]["tokens_per_second"])
    rows = []
    for clients in checked:
        for path in ("off", "auto"):
            predicted_tps, predicted_p50, predicted_p99 = predict(path, clients, costs)
            got = levels[str(clients)][path]
            rows.append({"clients": clients, "path": path, "requests": workload(path, clients).requests,
                         "calibration": (path, clients) in fits,
                         "tokens_per_second": {"predicted": predicted_tps, "measured": got["tokens_per_second"]},
                         "tpot_p50": {"predicted": predicted_p50, "measured": got["tpot_p50"]},
                         "tpot_p99": {"predicted": predicted_p99, "measured": got["tpot_p99"]}})
    return {"run": run, "pass_ms": curve, "costs": asdict(costs), "k": k,
            "prompt_tokens": round(statistics.mean(prompts)), "output_tokens": round(statistics.mean(outputs)),
            "tasks": [asdict(t) for t in auto], "rows": rows}


def arms(samples: list[dict]) -> tuple[TaskLoad, ...]:
    """Each (task, proposer) the policy chose, as a task of the workload (``cluster/plan.py``
    ``served_arm``), from the run's requests: k their proposed tokens a verify step (the prompt's
    pass proposes nothing), alpha from their accepted tokens and rejections (``workers/stats.py``)."""
    by_arm: dict[tuple[str, str], list[dict]] = {}
    for s in samples:
        by_arm.setdefault((s["task"], s["draft"]), []).append(s)
    return tuple(served_arm(f"{task}/{draft or 'target-only'}", len(mine), draft,
                            sum(s["proposed"] for s in mine) / sum(max(s["target_passes"] - 1, 1) for s in mine),
                            alpha(sum(s["accepted"] for s in mine), sum(s["rejections"] for s in mine)))
                 for (task, draft), mine in sorted(by_arm.items()))


def calibrate(curve, samples: list[dict], passes: list[dict], meta: dict, levels: list[int], rate,
              measured) -> tuple[Costs, set[tuple[str, int]]]:
    """A replica's costs as the run measured them around the in-process pass curve (see the module's
    doc), and the (path, clients) rows they were fitted to. ``rate(path, clients, costs)``: the
    simulated tokens/s of a level; ``measured(path, clients)``: the run's."""
    costs = Costs(curve, max_sessions_per_pass=32, max_tokens_per_pass=512)
    # What a pass costs the serving replica beyond the model, fitted to the fewest clients' OFF
    # throughput; then what each session in a pass adds, fitted to the most clients' (both lower
    # the simulated throughput as they grow).
    fewest, most = levels[0], levels[-1]
    for _ in range(FIT_ROUNDS if most != fewest else 1):  # each fit moves the other's level too: alternate
        costs = replace(costs, pass_overhead_ms=solve(
            lambda ms: rate("off", fewest, replace(costs, pass_overhead_ms=ms)), measured("off", fewest), 20.0))
        if most != fewest:
            costs = replace(costs, session_overhead_ms=solve(
                lambda ms: rate("off", most, replace(costs, session_overhead_ms=ms)), measured("off", most), 5.0))
    # A speculating step's round trip: one client's draft-free steps, less their verify pass.
    hops = []
    for s in samples:
        if s["path"] == "auto" and s["concurrency"] == fewest and s["draft"] in DRAFT_FREE and s["target_passes"] > 1:
            steps = s["target_passes"] - 1
            step = (s["seconds"] - (s["first_token_seconds"] or 0)) / steps
            hops.append(step - costs.pass_seconds(round(s["proposed"] / steps) + 1))
    # A draft pass by the sessions in it, from the draft workers' counters at each AUTO level: the
    # sessions' device time (each counts its passes' time) over the sessions the passes held.
    points: dict[int, list[float]] = {}
    for level in passes:
        draft = level["draft"]
        if level["path"] != "auto" or not draft["passes"]:
            continue
        seconds = sum(s["draft_seconds"] for s in samples if s["path"] == "auto" and s["concurrency"] == level["clients"])
        sessions = max(1, round(draft["pass_sessions"] / draft["passes"]))
        points.setdefault(sessions, []).append(1000 * seconds / draft["pass_sessions"])
    draft_curve = tuple((n, statistics.mean(ms)) for n, ms in sorted(points.items()))
    workers = meta.get("draft_workers") or DraftPoolConfig().workers  # a run from before meta said
    costs = replace(costs, step_hop_ms=max(0.0, 1000 * statistics.median(hops)) if hops else 0.0,
                    draft_pass_ms=draft_curve, draft_devices=workers)
    fits = {("off", fewest), ("off", most), ("auto", fewest)}
    if most != fewest:
        # On this host the router and the clients share the cores with the devices: their CPU a
        # speculating step, fitted so the most clients' AUTO throughput is the measured one.
        shared = replace(costs, host_cores=os.cpu_count() or 1)
        costs = replace(shared, router_step_ms=solve(
            lambda ms: rate("auto", most, replace(shared, router_step_ms=ms)), measured("auto", most), 50.0))
        fits.add(("auto", most))
    return costs, fits


def solve(rate, target: float, high: float) -> float:
    """The x in [0, high] where the decreasing ``rate(x)`` meets ``target`` (0 if it is below at 0)."""
    low = 0.0
    if rate(low) <= target:
        return low
    for _ in range(24):
        middle = (low + high) / 2
        if rate(middle) > target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def format_report(report: dict, heading: str = "#") -> str:
    costs = report.get("costs", {})
    draft = ", ".join(f"{n}: {ms:.1f}" for n, ms in costs.get("draft_pass_ms", ())) or "none"
    lines = [f"{heading} The planner against {report['run']}", "",
             f"One replica and its draft devices, closed loop, the level's requests shared by its clients; "
             f"{report['prompt_tokens']} prompt tokens and {report['output_tokens']} output tokens a request (the "
             "run's mean).", "",
             "- target pass, tokens: ms (timed in process): " + ", ".join(f"{w}: {ms:.1f}" for w, ms in report["pass_ms"])
             + f"; plus {costs.get('pass_overhead_ms', 0):.2f} ms a pass and {costs.get('session_overhead_ms', 0):.2f} ms "
             "a session in it on the serving replica (fitted to OFF at the fewest and the most clients)",
             f"- a speculating step's round trip through the router: {costs.get('step_hop_ms', 0):.1f} ms (one client, "
             "AUTO's draft-free steps); its CPU for the router and the client: "
             f"{costs.get('router_step_ms', 0):.1f} ms, out of a host of {costs.get('host_cores', 0)} cores shared "
             "with the devices (fitted to AUTO at the most clients)",
             f"- a draft pass, sessions: ms (the draft workers' counters): {draft}; "
             f"{costs.get('draft_devices', 0)} draft workers",
             "- AUTO's proposers (1-4 clients), requests, k, alpha: "
             + ", ".join(f"{t['name']} {t['share']:g}" + (f" k {t['k']} alpha {t['alpha']:.2f}" if t["k"] else "")
                         for t in report["tasks"]), "",
             "| clients | path | requests | tokens/s predicted | measured | ratio | p99 TPOT ms predicted | measured | ratio "
             "| p50 TPOT ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    within = predicted = 0
    for r in report["rows"]:
        t, p = r["tokens_per_second"], r["tpot_p99"]
        ratios = (t["predicted"] / t["measured"], p["predicted"] / p["measured"])
        good = all(abs(x - 1) <= BAR for x in ratios)
        if not r.get("calibration"):
            within += good
            predicted += 1
        mark = " (fit)" if r.get("calibration") else ""
        lines.append(f"| {r['clients']}{mark} | {r['path']} | {r.get('requests', '')} | {t['predicted']:.0f} | "
                     f"{t['measured']:.0f} | {ratios[0]:.2f} | {p['predicted'] * 1000:.1f} | {p['measured'] * 1000:.1f} | "
                     f"{ratios[1]:.2f} | {_ratio(r.get('tpot_p50'))} |")
    lines += ["", f"{within} of {predicted} predicted rows within {BAR:.0%} on throughput and p99 TPOT (the issue's bar; "
              "the p50 column is beside it, not part of it). "
              "The rows marked fit gave the costs (the fewest and the most clients' OFF levels the replica's "
              "overheads, AUTO's the round trip and the router's CPU): they are not predictions."]
    return "\n".join(lines) + "\n"


def _ratio(figure: dict | None) -> str:
    return f"{figure['predicted'] / figure['measured']:.2f}" if figure and figure.get("measured") else "-"


if __name__ == "__main__":
    main()
