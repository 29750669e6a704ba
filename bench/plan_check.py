"""The capacity planner (cluster/plan.py) against a measured run: what it predicts for the load
section of a `specserve bench` report, beside what the embedded cluster measured.

For each load level (N closed-loop clients, mixed tasks) and path (OFF: target-only; AUTO: each task
with the alpha and k the run's policy ended with), the planner simulates one target replica with:
- the replica's pass-time curve, timed here on the zoo's target the way the replica runs it (pinned
  to its core, one thread, passes of 1-32 sessions adding 1 or k + 1 tokens each), with the service
  stopped;
- the run's prompts' mean length and its max_tokens;
- a pass's overhead on the serving replica (its hop to the event loop, the tokens streamed out),
  the one figure taken from the run: one client's target-only time per token less the curve's pass.

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
from datetime import datetime, timezone
from pathlib import Path

import torch

from specserve.cluster.demo import ensure_zoo
from specserve.cluster.plan import Costs, TaskLoad, Workload, simulate_fleet
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.loading import ModelSpec, gemv_layout, load_model, load_tokenizer
from specserve.workers.prompt import encode_prompt
from specserve.workers.ragged_pass import Segment, run_pass, use_pooled_attention
from specserve.workers.zoo.zoo import Zoo

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
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated seconds per level (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="parent of the check's folder")
    args = parser.parse_args(argv)
    run = args.run or newest_run()
    measured = json.loads((run / "results.json").read_text())
    meta, levels = measured["meta"], measured["figures"]["load"]["levels"]
    zoo = ensure_zoo(meta["zoo"]["path"])
    chosen = {r["task"]: r for r in measured["policy"] if r["decision"] == "best"}
    tasks = meta["tasks"]
    k = max([chosen[t]["k"] for t in tasks if t in chosen] or [meta["k"]])
    tokenizer = load_tokenizer(str(zoo.target_dir))
    held_out = load_prompts(zoo)
    lengths = [len(encode_prompt(tokenizer, p)) for t in tasks for p in held_out.by_task[t][: meta["settings"]["prompts"]]]
    curve = pass_curve(zoo, k)
    # The one figure taken from the run itself: what a pass costs the serving replica beyond the
    # model, from one client's target-only time per output token (a pass per token there).
    overhead_ms = max(0.0, levels["1"]["off"]["tpot_p50"] * 1000 - curve[0][1]) if "1" in levels else 0.0
    costs = Costs(curve, max_sessions_per_pass=32, max_tokens_per_pass=512, pass_overhead_ms=overhead_ms)
    auto = tuple(TaskLoad(t, 1.0, chosen[t]["alpha"], chosen[t]["k"]) if t in chosen else TaskLoad(t, 1.0) for t in tasks)
    off = tuple(TaskLoad(t, 1.0) for t in tasks)
    rows = []
    for clients, paths in sorted(levels.items(), key=lambda item: int(item[0])):
        for path, task_loads in (("off", off), ("auto", auto)):
            if path not in paths or int(clients) > 32:
                continue
            workload = Workload(task_loads, round(statistics.mean(lengths)), meta["max_tokens"], clients=int(clients),
                                requests=meta["settings"]["load_requests"])  # the level's requests, as the bench sent them
            fleet = simulate_fleet(workload, costs, replicas=1, seconds=args.seconds, sample_replicas=1)
            got = paths[path]
            rows.append({"clients": int(clients), "path": path,
                         "tokens_per_second": {"predicted": fleet.tokens_per_second, "measured": got["tokens_per_second"]},
                         "tpot_p99": {"predicted": fleet.p99_tpot, "measured": got["tpot_p99"]}})
    report = {"run": str(run), "pass_ms": curve, "pass_overhead_ms": overhead_ms, "k": k, "prompt_tokens": round(statistics.mean(lengths)),
              "output_tokens": meta["max_tokens"], "tasks": [vars(t) for t in auto], "rows": rows}
    folder = args.out / (datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-plan-check")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(report, indent=1))
    text = format_report(report)
    (folder / "report.md").write_text(text)
    print(text + f"\nwritten to {folder}")


def format_report(report: dict) -> str:
    lines = [f"# The planner against {report['run']}", "",
             f"One replica, closed loop, the level's requests shared by its clients; {report['prompt_tokens']} prompt and {report['output_tokens']} output tokens; "
             "pass curve (tokens: ms) " + ", ".join(f"{w}: {ms:.1f}" for w, ms in report["pass_ms"])
             + f", plus {report.get('pass_overhead_ms', 0):.1f} ms a pass on the serving replica (from one client's "
             "OFF time per token); AUTO's tasks "
             + ", ".join(f"{t['name']} alpha {t['alpha']:.2f} k {t['k']}" for t in report["tasks"]), "",
             "| clients | path | tokens/s predicted | measured | ratio | p99 TPOT ms predicted | measured | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    within = 0
    for r in report["rows"]:
        t, p = r["tokens_per_second"], r["tpot_p99"]
        ratios = (t["predicted"] / t["measured"], p["predicted"] / p["measured"])
        within += all(abs(x - 1) <= BAR for x in ratios)
        lines.append(f"| {r['clients']} | {r['path']} | {t['predicted']:.0f} | {t['measured']:.0f} | {ratios[0]:.2f} | "
                     f"{p['predicted'] * 1000:.1f} | {p['measured'] * 1000:.1f} | {ratios[1]:.2f} |")
    lines += ["", f"{within} of {len(report['rows'])} rows within {BAR:.0%} on both figures (the issue's bar)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
