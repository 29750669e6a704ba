"""The capacity planner (cluster/plan.py) held out: its costs calibrated on one `specserve bench`
run, its throughput predicted for the load levels of other runs and scored against what they measured.

    specserve plan-check CALIB --held-out RUN [RUN ...] [--out DIR]

Calibration, on CALIB alone (a `specserve bench` run with a load section):
- the target's pass-time curve: the one CALIB's own check recorded (results.json, planner.pass_ms:
  timed in process on the zoo's target when the run was taken); a run that recorded none has it
  timed here and now (pinned to the replica's core, one thread), and the report says so;
- what a pass costs the serving replica beyond the model, fitted so that the simulated OFF
  throughput at the fewest clients is the measured one, and what each session in a pass adds,
  fitted likewise at the most clients (of the levels up to 32);
- a speculating step's round trip through the router: one client's AUTO draft-free steps, less
  their verify pass;
- a draft pass's time by the sessions in it: the draft workers' counters at each AUTO level.
The router's CPU is not fitted: fitted to AUTO at 32 clients it came to 7.6 ms a step on
20261127-094901 and 0.9 ms on 20261127-052559, so it said nothing about another run.

Scoring, on each held-out run: every load level it measured, OFF and AUTO, with the workload an
operator would give the planner for it, and nothing of what it measured beyond that:
- a `specserve bench` run (the shape CALIB has): AUTO's proposers at 1-4 clients (each task and
  proposer's share, k and alpha: ``arms``), the prompts' mean length, the requests' output
  lengths, the level's clients and requests;
- a `specserve json-schema` run (its free-mode levels) or a `specserve shared-prefix` run (its
  cache-off levels): other load shapes, with the level's mean prompt and output lengths and CALIB's
  proposers for AUTO (these runs keep no per-request counters, nor per-request times: no p99).
CALIB's own levels are listed apart, not scored: the rows the costs were fitted to are no
predictions, and the rest share the run the costs came from.

It writes DIR/report.md and DIR/results.json (default bench/results/<time>-plan-check). `specserve
bench` runs it on its own run alone (section 9 of its report): CALIB's rows, nothing held out.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from specserve.cluster.demo import ensure_zoo
from specserve.cluster.plan import (DRAFT_FREE, VALIDATED_SESSIONS, Costs, TaskLoad, Workload, served_arm,
                                    simulate_fleet)
from specserve.workers.config import DraftPoolConfig
from specserve.workers.stats import alpha

from .prompts import JSON_ASK
from .settings import REPLICA_CORE

SESSIONS = (1, 2, 4, 8, 16, 32)
BAR = 0.15  # the issue's: predicted throughput within 15% of measured
PATHS = ("off", "auto")
FIT_ROUNDS = 4  # of the two overheads' alternating fits
SEEDS = 8  # simulations per level (their figures averaged): a level is a few dozen requests
LONGEST_LEVEL = 600.0  # simulated seconds a level may take at most (it ends with its requests)
BENCH = "bench"  # the shape of a `specserve bench` run's load section


@dataclass(frozen=True)
class Level:
    """One path at one load level of a measured run, as the planner is asked about it."""

    run: str
    shape: str  # BENCH, or the other workload's ("json-schema free", "shared-prefix cache off")
    path: str  # "off" or "auto"
    workload: Workload  # closed loop: the level's clients sharing its requests
    tokens_per_second: float  # measured
    tpot_p50: float | None = None  # measured; None: the run kept no per-request times
    tpot_p99: float | None = None

    @property
    def clients(self) -> int:
        return self.workload.clients


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="specserve plan-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("calib", type=Path, metavar="CALIB", help="the `specserve bench` run to calibrate on")
    parser.add_argument("--held-out", type=Path, nargs="+", default=[], metavar="RUN",
                        help="runs to score on (`specserve bench`, `json-schema` or `shared-prefix` folders)")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="simulations per level, their figures averaged "
                        "(default: %(default)s)")
    parser.add_argument("--out", type=Path, help="the folder to write (default: bench/results/<time>-plan-check)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = check(_results(args.calib), str(args.calib), args.seeds,
                   {str(run): _results(run) for run in args.held_out})
    folder = args.out or Path("bench/results") / (datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-plan-check")
    folder.mkdir(parents=True, exist_ok=True)
    report["command"] = "specserve plan-check " + " ".join(sys.argv[1:] if argv is None else argv)
    (folder / "results.json").write_text(json.dumps(report, indent=1))
    text = format_report(report)
    (folder / "report.md").write_text(text)
    print(text + f"\nwritten to {folder} ({time.perf_counter() - started:.0f} s)")


def _results(run: Path) -> dict:
    path = run / "results.json"
    if not path.exists():
        raise SystemExit(f"plan_check: no results.json in {run}: give a run's folder under bench/results")
    return json.loads(path.read_text())


def check(calib: dict, run: str, seeds: int = SEEDS, held_out: dict[str, dict] | None = None) -> dict:
    """The planner calibrated on ``calib`` (a `specserve bench` run's results.json, figures derived;
    ``run`` its name) and its predictions for its own load levels and each ``held_out`` run's (name:
    results.json), beside what they measured (the report ``format_report`` renders)."""
    meta = calib["meta"]
    if "load" not in calib.get("figures", {}):
        raise SystemExit(f"plan_check: {run} has no load section to calibrate on: run `specserve bench` with it")
    auto = auto_arms(calib)
    k = max([t.k for t in auto] or [meta["k"]])
    recorded = calib.get("planner", {}).get("pass_ms")
    if recorded:
        curve, curve_from = tuple((int(w), float(ms)) for w, ms in recorded), f"recorded by {run}'s own check"
    else:
        curve, curve_from = pass_curve(meta, k), "timed here now: the run recorded none"
    own = bench_levels(run, calib)

    def rate(level: Level, costs: Costs) -> float:  # a fit's guess: two simulations
        return statistics.mean(simulate_fleet(level.workload, costs, replicas=1, seconds=LONGEST_LEVEL,
                                              sample_replicas=1, seed=seed).tokens_per_second for seed in range(2))

    costs, fits = calibrate(curve, [lv for lv in own if lv.clients <= 32], calib, rate)
    rows = [row(lv, costs, seeds, fit=(lv.path, lv.clients) in fits, held_out=False) for lv in own]
    for name, results in (held_out or {}).items():
        rows += [row(lv, costs, seeds, fit=False, held_out=True) for lv in read_levels(name, results, auto, meta)]
    return {"run": run, "pass_ms": curve, "pass_ms_from": curve_from, "costs": asdict(costs),
            "machine_cpus": meta.get("machine", {}).get("cpus"), "k": k,
            "prompt_tokens": own[0].workload.prompt_tokens, "output_tokens": own[0].workload.output_tokens,
            "tasks": [asdict(t) for t in auto], "validated_sessions": VALIDATED_SESSIONS, "rows": rows,
            "slices": slices(rows)}


def row(level: Level, costs: Costs, seeds: int, fit: bool, held_out: bool) -> dict:
    """The planner's throughput and TPOT for a level (each the mean over ``seeds`` simulations) beside the measured."""
    fleets = [simulate_fleet(level.workload, costs, replicas=1, seconds=LONGEST_LEVEL, sample_replicas=1, seed=seed)
              for seed in range(seeds)]
    return {"run": level.run, "shape": level.shape, "clients": level.clients, "path": level.path,
            "requests": level.workload.requests, "prompt_tokens": level.workload.prompt_tokens,
            "output_tokens": level.workload.output_tokens, "fit": fit, "held_out": held_out,
            "tokens_per_second": {"predicted": statistics.mean(f.tokens_per_second for f in fleets),
                                  "measured": level.tokens_per_second},
            "tpot_p50": {"predicted": statistics.mean(f.p50_tpot for f in fleets), "measured": level.tpot_p50},
            "tpot_p99": {"predicted": statistics.mean(f.p99_tpot for f in fleets), "measured": level.tpot_p99}}


# --- reading runs -----------------------------------------------------------------------------------

def read_levels(name: str, results: dict, calib_arms: tuple[TaskLoad, ...], calib_meta: dict) -> list[Level]:
    """A run's OFF and AUTO levels, whichever bench took it."""
    if "load" in results.get("figures", {}):
        return bench_levels(name, results)
    levels = results.get("levels") or []
    if levels and "mode" in levels[0]:
        return json_schema_levels(name, results, calib_arms, calib_meta["tasks"])
    if levels and "cache" in levels[0]:
        return shared_prefix_levels(name, results, calib_arms, calib_meta["tasks"])
    raise SystemExit(f"plan_check: {name} is no `specserve bench` run with a load section, nor a json-schema or "
                     "shared-prefix run")


def load_samples(results: dict) -> list[dict]:
    return [s for s in results["samples"] if s["section"] == "load"]


def auto_arms(results: dict) -> tuple[TaskLoad, ...]:
    """AUTO's proposers where load does not shape the policy's choices (1-4 clients)."""
    return arms([s for s in load_samples(results) if s["path"] == "auto" and s["concurrency"] <= 4])


def bench_levels(name: str, results: dict) -> list[Level]:
    """A `specserve bench` run's load levels, each with the workload its requests make."""
    meta, samples = results["meta"], load_samples(results)
    auto = auto_arms(results)
    prompt = bench_prompt_tokens(meta["zoo"]["path"], tuple(meta["tasks"]), meta["settings"]["prompts"])
    outputs = tuple(s["tokens"] for s in samples if s["path"] in PATHS and s["tokens"] >= 1)
    found = []
    for clients, paths in sorted(results["figures"]["load"]["levels"].items(), key=lambda item: int(item[0])):
        for path in PATHS:
            if path not in paths:
                continue
            tasks = tuple(TaskLoad(t, 1.0) for t in meta["tasks"]) if path == "off" else auto
            if not tasks:  # AUTO's arms come from its 1-4 client levels: a run without them has none to price
                continue
            requests = sum(1 for s in samples if s["path"] == path and s["concurrency"] == int(clients))
            workload = Workload(tasks, prompt, round(statistics.mean(outputs)), clients=int(clients), requests=requests,
                                output_lengths=outputs)  # the level's requests, as the bench sent them
            got = paths[path]
            found.append(Level(name, BENCH, path, workload, got["tokens_per_second"], got.get("tpot_p50"),
                               got.get("tpot_p99")))
    return found


def json_schema_levels(name: str, results: dict, calib_arms, tasks: list[str]) -> list[Level]:
    """`specserve json-schema`'s free-mode levels (no grammar: the planner models none)."""
    prompt = json_schema_prompt_tokens(results["settings"]["zoo"], results["settings"]["requests"])
    return [_other_level(name, "json-schema free", lv, prompt, calib_arms, tasks)
            for lv in results["levels"] if lv["mode"] == "free" and lv["path"] in PATHS]


def shared_prefix_levels(name: str, results: dict, calib_arms, tasks: list[str]) -> list[Level]:
    """`specserve shared-prefix`'s cache-off levels (the planner models no prefix cache); a prompt's
    length from its cache-on levels' counter of the prompt tokens the target took (the same prompts)."""
    counted = next((lv for lv in results["levels"] if lv["cache"] == "on" and lv["path"] == "off"), None)
    if counted is None:
        raise SystemExit(f"plan_check: {name} has no cache-on OFF level to read its prompts' length from")
    prompt = round(counted["prompt_tokens"]["target"] / len(counted["ttft"]))
    return [_other_level(name, "shared-prefix cache off", lv, prompt, calib_arms, tasks)
            for lv in results["levels"] if lv["cache"] == "off" and lv["path"] in PATHS]


def _other_level(name: str, shape: str, level: dict, prompt: int, calib_arms, tasks: list[str]) -> Level:
    requests = len(level["ttft"])
    workload = Workload(tuple(TaskLoad(t, 1.0) for t in tasks) if level["path"] == "off" else calib_arms, prompt,
                        round(level["tokens"] / requests), clients=level["clients"], requests=requests)
    return Level(name, shape, level["path"], workload, level["tokens_per_second"])


@functools.lru_cache(maxsize=8)
def bench_prompt_tokens(zoo_path: str, tasks: tuple[str, ...], prompts: int) -> int:
    """The mean length of the load section's prompts (each task's first ``prompts`` held-out ones)."""
    from .prompts import load_prompts
    zoo = ensure_zoo(zoo_path)
    held_out = load_prompts(zoo)
    return _mean_tokens(zoo, [p for t in tasks for p in held_out.by_task[t][:prompts]])


@functools.lru_cache(maxsize=8)
def json_schema_prompt_tokens(zoo_name: str, requests: int) -> int:
    """The mean length of json-schema's requests: the zoo's first 8 prompts of each task, asked for
    JSON, taken in turn (bench/json_schema.py)."""
    zoo = ensure_zoo(zoo_name)
    asked = [p + JSON_ASK for t in zoo.tasks for p in zoo.prompts(t)[:8]]
    return _mean_tokens(zoo, [asked[n % len(asked)] for n in range(requests)])


def _mean_tokens(zoo, prompts: list[str]) -> int:
    from specserve.workers.loading import load_tokenizer
    from specserve.workers.prompt import encode_prompt
    tokenizer = load_tokenizer(str(zoo.target_dir))
    return round(statistics.mean(len(encode_prompt(tokenizer, p)) for p in prompts))


def pass_curve(meta: dict, k: int, cached: int = 64) -> tuple[tuple[int, float], ...]:
    """(tokens, ms) of the target's passes of S sessions adding 1 or k + 1 tokens each, timed here on
    the zoo's target as the replica runs it: the median of 9 at each shape, averaged where shapes
    share a width."""
    import torch

    from specserve.workers.kv_pool import Budget, KVPool, KVShape
    from specserve.workers.loading import ModelSpec, gemv_layout, load_model
    from specserve.workers.ragged_pass import Segment, run_pass, use_pooled_attention
    os.sched_setaffinity(0, {REPLICA_CORE})
    torch.set_num_threads(1)
    model = use_pooled_attention(gemv_layout(load_model(ModelSpec(str(ensure_zoo(meta["zoo"]["path"]).target_dir)))))
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


# --- calibration ------------------------------------------------------------------------------------

def calibrate(curve, levels: list[Level], results: dict, rate: Callable[[Level, Costs], float]
              ) -> tuple[Costs, set[tuple[str, int]]]:
    """A replica's costs around the pass curve from one run (see the module's doc), and the (path,
    clients) rows they were fitted to. ``levels``: the run's levels to fit on; ``rate(level, costs)``:
    a level's simulated tokens/s."""
    off = {lv.clients: lv for lv in levels if lv.path == "off"}
    fewest, most = off[min(off)], off[max(off)]
    costs = Costs(curve, max_sessions_per_pass=32, max_tokens_per_pass=512)
    # What a pass costs the serving replica beyond the model, fitted to the fewest clients' OFF
    # throughput; then what each session in a pass adds, fitted to the most clients' (both lower
    # the simulated throughput as they grow).
    for _ in range(FIT_ROUNDS if most is not fewest else 1):  # each fit moves the other's level too: alternate
        costs = replace(costs, pass_overhead_ms=solve(
            lambda ms: rate(fewest, replace(costs, pass_overhead_ms=ms)), fewest.tokens_per_second, 20.0))
        if most is not fewest:
            costs = replace(costs, session_overhead_ms=solve(
                lambda ms: rate(most, replace(costs, session_overhead_ms=ms)), most.tokens_per_second, 5.0))
    samples = load_samples(results)
    # A speculating step's round trip: one client's draft-free steps, less their verify pass.
    hops = []
    for s in samples:
        if (s["path"] == "auto" and s["concurrency"] == fewest.clients and s["draft"] in DRAFT_FREE
                and s["target_passes"] > 1):
            steps = s["target_passes"] - 1
            step = (s["seconds"] - (s["first_token_seconds"] or 0)) / steps
            hops.append(step - costs.pass_seconds(round(s["proposed"] / steps) + 1))
    # A draft pass by the sessions in it, from the draft workers' counters at each AUTO level: the
    # sessions' device time (each counts its passes' time) over the sessions the passes held.
    points: dict[int, list[float]] = {}
    for level in results["load"]["passes"]:
        draft = level["draft"]
        if level["path"] != "auto" or not draft["passes"]:
            continue
        seconds = sum(s["draft_seconds"] for s in samples
                      if s["path"] == "auto" and s["concurrency"] == level["clients"])
        sessions = max(1, round(draft["pass_sessions"] / draft["passes"]))
        points.setdefault(sessions, []).append(1000 * seconds / draft["pass_sessions"])
    workers = results["meta"].get("draft_workers") or DraftPoolConfig().workers  # a run from before meta said
    costs = replace(costs, step_hop_ms=max(0.0, 1000 * statistics.median(hops)) if hops else 0.0,
                    draft_pass_ms=tuple((n, statistics.mean(ms)) for n, ms in sorted(points.items())),
                    draft_devices=workers)
    return costs, {("off", fewest.clients), ("off", most.clients), ("auto", fewest.clients)}


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


# --- scoring ----------------------------------------------------------------------------------------

def error(figure: dict | None) -> float | None:
    """predicted / measured - 1 (None: nothing measured)."""
    return figure["predicted"] / figure["measured"] - 1 if figure and figure.get("measured") else None


def slices(rows: list[dict]) -> list[dict]:
    """The held-out rows' throughput error by slice: path x sessions a replica on CALIB's shape, then
    each other shape; and CALIB's own predicted rows apart (not held out)."""
    held = [r for r in rows if r.get("held_out")]
    same = [r for r in held if r["shape"] == BENCH]
    others = [r for r in held if r["shape"] != BENCH]
    groups = [(f"{path.upper()}, {label}", [r for r in same if r["path"] == path and within(r["clients"])])
              for path in PATHS
              for label, within in ((f"<= {VALIDATED_SESSIONS} clients", lambda c: c <= VALIDATED_SESSIONS),
                                    (f"> {VALIDATED_SESSIONS} clients", lambda c: c > VALIDATED_SESSIONS))]
    groups += [(f"other shape: {shape}, {path.upper()}",
                [r for r in others if r["shape"] == shape and r["path"] == path])
               for shape in sorted({r["shape"] for r in others}) for path in PATHS]
    groups += [("all held-out", held), ("calibration run's own predicted rows (not held out)",
                                        [r for r in rows if not r.get("held_out") and not _fit(r)])]
    found = []
    for name, group in groups:
        errors = [abs(error(r["tokens_per_second"])) for r in group]
        tails = [abs(e) for r in group if (e := error(r.get("tpot_p99"))) is not None]
        if errors:
            found.append({"slice": name, "rows": len(errors), "within": sum(e <= BAR for e in errors),
                          "mean_error": statistics.mean(errors), "max_error": max(errors),
                          "tpot_p99_mean_error": statistics.mean(tails) if tails else None})
    return found


def format_report(report: dict, heading: str = "#") -> str:
    costs = report.get("costs", {})
    draft = ", ".join(f"{n}: {ms:.1f}" for n, ms in costs.get("draft_pass_ms", ())) or "none"
    rows = report["rows"]
    held = [r for r in rows if r.get("held_out")]
    lines = [f"{heading} The planner calibrated on {report['run']}" + (", scored on runs it was not fitted on"
                                                                       if held else ""), ""]
    if report.get("command"):
        lines += [f"`{report['command']}`", ""]
    lines += [
        f"One replica and its draft devices, closed loop, each level's requests shared by its clients. Costs, from "
        f"{report['run']} alone:", "",
        "- target pass, tokens: ms (timed in process, "
        + report.get("pass_ms_from", "timed for this check") + "): "
        + ", ".join(f"{w}: {ms:.1f}" for w, ms in report["pass_ms"])
        + f"; plus {costs.get('pass_overhead_ms', 0):.2f} ms a pass and {costs.get('session_overhead_ms', 0):.2f} ms a "
        "session in it on the serving replica (fitted to OFF at the fewest and the most clients)",
        f"- a speculating step's round trip through the router: {costs.get('step_hop_ms', 0):.1f} ms (one client, "
        "AUTO's draft-free steps); "
        + (f"the router's CPU a step, fitted to AUTO at the most clients: {costs['router_step_ms']:.1f} ms (modelled "
           "then, no longer)" if costs.get("router_step_ms") else "the router's CPU is not modelled")
        + (f" (the run's host: {report['machine_cpus']} cores, shared with the devices)"
           if report.get("machine_cpus") else ""),
        f"- a draft pass, sessions: ms (the draft workers' counters): {draft}; {costs.get('draft_devices', 0)} draft "
        "workers",
        "- AUTO's proposers (1-4 clients), requests, k, alpha: "
        + ", ".join(f"{t['name']} {t['share']:g}" + (f" k {t['k']} alpha {t['alpha']:.2f}" if t["k"] else "")
                    for t in report["tasks"]), ""]
    if held:
        lines += [f"{heading}# Held out", "",
                  "Each run's workload as an operator would give it (its own proposers, prompt and output "
                  "lengths, clients and requests; for other shapes, CALIB's proposers, marked auto*); its "
                  "throughput is read only to score. Error: predicted / measured - 1.", "",
                  *_table(held, ""), "", f"{heading}# By slice", "", *_slice_table(report), ""]
    own = [r for r in rows if not r.get("held_out")]
    lines += [f"{heading}# {report['run']} itself (the calibration run: not held out)", "",
              "The rows marked fit gave the costs (OFF at the fewest and the most clients the replica's overheads, "
              "AUTO at the fewest the round trip): they are no predictions.", "", *_table(own, report["run"]), ""]
    if not held:
        lines += [*_slice_table(report), ""]
    lines += [f"The bar: throughput within {BAR:.0%} of measured. The planner is claimed for what the held-out rows "
              f"show (`specserve plan`: up to {report.get('validated_sessions', VALIDATED_SESSIONS)} sessions a "
              "replica, CALIB's shape); p99 TPOT is listed, not claimed."]
    return "\n".join(lines) + "\n"


def _table(rows: list[dict], run: str) -> list[str]:
    """``run``: the rows' run where a row does not say (a report from before held-out runs)."""
    lines = ["| run | shape | path | clients | requests | tok/s measured | predicted | error | p99 TPOT ms measured "
             "| predicted | error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t, p = r["tokens_per_second"], r.get("tpot_p99") or {}
        tail = error(p)
        path = r["path"] + ("*" if r.get("shape", BENCH) != BENCH and r["path"] == "auto" else "")
        lines.append(
            f"| {Path(r.get('run') or run).name} | {r.get('shape', BENCH)} | {path} | {r['clients']}"
            f"{' (fit)' if _fit(r) else ''} | {r.get('requests', '')} | {t['measured']:.0f} | "
            f"{t['predicted']:.0f} | {error(t):+.0%} | "
            + (f"{p['measured'] * 1000:.1f} | {p['predicted'] * 1000:.1f} | {tail:+.0%} |" if tail is not None
               else "- | - | - |"))
    return lines


def _fit(row: dict) -> bool:
    return bool(row.get("fit", row.get("calibration")))  # "calibration": a report from before held-out runs


def _slice_table(report: dict) -> list[str]:
    found = report.get("slices") or slices(report["rows"])
    return ["| slice | rows | within 15% | mean abs error | max abs error | p99 TPOT mean abs error |",
            "|---|---|---|---|---|---|",
            *(f"| {s['slice']} | {s['rows']} | {s['within']} | {s['mean_error']:.0%} | {s['max_error']:.0%} | "
              + (f"{s['tpot_p99_mean_error']:.0%} |" if s["tpot_p99_mean_error"] is not None else "- |")
              for s in found)]


if __name__ == "__main__":
    main()
