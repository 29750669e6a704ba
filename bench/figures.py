"""Every figure of the report, derived from the run's raw samples and nothing else (pure).

A ratio between two paths is taken per prompt (the two decodes ran back to back, so they saw the
same machine load) and summarised as a median with its quartiles and range; sums such as alpha
and tokens per pass pool all samples of a path. The smoke test recomputes these figures from the
saved samples and compares them with the saved report.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict

import numpy as np

from specserve.router.cost_model import expected_speedup, overlapped_bound
from specserve.workers import stats

from .load_figures import derive_load
from .samples import (ENGINE_OFF, ENGINE_TASK, GENERAL, HF_ASSISTED, OFF, PROPOSER_PATHS, ROUTED, TASK, TASK_ADAPTIVE,
                      Sample)
from .settings import Goal, Goals

MIB = 1024 * 1024


def spread(values: list[float]) -> dict | None:
    """Median, quartiles, range and count; None when nothing was measured."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    p25, p50, p75 = np.percentile(values, [25, 50, 75]).tolist()
    return {"median": p50, "p25": p25, "p75": p75, "min": min(values), "max": max(values), "n": len(values)}


def rate(sample: Sample) -> float:
    return sample.tokens / sample.seconds if sample.seconds > 0 else math.nan


def ratio(a: Sample | None, b: Sample | None) -> float:
    """Throughput of ``a`` over ``b`` (tokens per second)."""
    return rate(a) / rate(b) if a and b and rate(b) > 0 else math.nan


def by_run(samples: list[Sample]) -> list[dict[str, Sample]]:
    """The decodes of one prompt and pass, by path: the back-to-back runs a ratio compares."""
    runs: dict[tuple[int, int], dict[str, Sample]] = defaultdict(dict)
    for s in samples:
        runs[(s.prompt, s.repeat)][s.path] = s
    return list(runs.values())


def alpha(samples: list[Sample]) -> float | None:
    """workers/stats.py's alpha over the samples; None where none drafted."""
    accepted, rejections = sum(s.accepted for s in samples), sum(s.rejections for s in samples)
    return stats.alpha(accepted, rejections) if accepted + rejections else None


def tokens_per_pass(samples: list[Sample]) -> float | None:
    """workers/stats.py's tokens per target pass over the samples; None where no pass ran."""
    passes = sum(s.target_passes for s in samples)
    return stats.tokens_per_pass(sum(s.accepted for s in samples), passes) if passes else None


def hit_rate(samples: list[Sample], branch: bool = False) -> float | None:
    """The share of lookaheads whose assumed verdict came (their proposal used as drafted);
    ``branch``: of those by the branch beside the lookahead (a rejection it assumed)."""
    lookaheads = sum(s.lookaheads for s in samples)
    hits = sum(s.branch_hits if branch else s.lookahead_hits for s in samples)
    return hits / lookaheads if lookaheads else None


def cost_ratio(drafted: list[Sample], target_only: list[Sample]) -> float | None:
    """c (workers/stats.py): a drafted token's device time over a target-only pass's, the wasted
    tokens of missed lookaheads counted among the drafted ones (and apart, in ``wasted_share``)."""
    tokens, passes = sum(s.drafted for s in drafted), sum(s.target_passes for s in target_only)
    if not tokens or not passes:
        return None
    return stats.cost_ratio(sum(s.draft_seconds for s in drafted), tokens,
                            sum(s.verify_seconds for s in target_only), passes)


def wasted_share(samples: list[Sample]) -> float | None:
    """Of the tokens the draft computed, the share no proposal used (workers/stats.py)."""
    drafted = sum(s.drafted for s in samples)
    return stats.wasted_share(sum(s.wasted for s in samples), drafted) if drafted else None


def time_per_pass(samples: list[Sample]) -> dict | None:
    """Where a target pass's wall time goes, in ms: the target's device time (verify), the draft's
    (draft), and the rest (wire, Python, scheduling). Drafting ahead overlaps verification, so the
    rest is a lower bound for the service's paths."""
    passes = sum(s.target_passes for s in samples)
    if not passes:
        return None
    wall, verify, draft = (1000 * sum(getattr(s, f) for s in samples) / passes
                           for f in ("seconds", "verify_seconds", "draft_seconds"))
    return {"wall": wall, "verify": verify, "draft": draft, "rest": wall - verify - draft}


def verify_cost(drafted: list[Sample], target_only: list[Sample], k: int) -> float | None:
    """w: what each verified draft token adds to a target pass, in target-only passes. Near 0 on a
    GPU, where a pass over k+1 tokens costs about one over 1; on a CPU it grows with the tokens."""
    if not sum(s.target_passes for s in drafted) or not sum(s.target_passes for s in target_only):
        return None
    per_pass = [sum(s.verify_seconds for s in group) / sum(s.target_passes for s in group) for group in (drafted, target_only)]
    return max(0.0, (per_pass[0] / per_pass[1] - 1) / k) if per_pass[1] else None


def derive(meta: dict, samples: list[Sample], memory: list[dict], load: dict | None = None) -> dict:
    """Every figure; ``load``: what the load section measured beside its samples (run.py's load_info)."""
    by_section: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_section[s.section].append(s)
    figures = {
        "tasks": {task: _greedy_task(task, [s for s in by_section["greedy"] if s.task == task], meta["k"])
                  for task in meta["tasks"]},
        "alpha_matrix": _alpha_matrix(by_section["score"]),
        "sampling": _sampling(by_section["sampling"], meta["tasks"]),
        "load": derive_load(by_section["load"], load),
        "memory": _memory(memory),
    }
    figures["goals"] = [asdict(g) for g in evaluate_goals(figures, Goals())]
    return figures


def _greedy_task(task: str, samples: list[Sample], k: int) -> dict:
    paths: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        paths[s.path].append(s)
    per_run = by_run(samples)

    def ratios(a: str, b: str) -> dict | None:
        return spread([ratio(r.get(a), r.get(b)) for r in per_run])

    a, c, w = alpha(paths[TASK]), cost_ratio(paths[ENGINE_TASK], paths[ENGINE_OFF]), verify_cost(paths[TASK], paths[OFF], k)
    speedup = ratios(TASK, OFF)
    bound = expected_speedup(a, c, k) if a is not None and c is not None else None
    bound_w = expected_speedup(a, c, k, w) if bound is not None and w is not None else None
    overlapped = overlapped_bound(a, c, k, w or 0.0) if bound is not None else None  # with this machine's w
    routed = paths[ROUTED]
    peer = paths[HF_ASSISTED]
    return {
        "runs": len(per_run),
        "draft": next((s.draft for s in paths[TASK] if s.draft), ""),
        "k": k,
        "alpha": a,
        "tokens_per_pass": tokens_per_pass(paths[TASK]),
        "c": c,
        "c_service": cost_ratio(paths[TASK], paths[OFF]),  # the same, on the workers through the service
        "wasted": wasted_share(paths[TASK]),
        "lookahead_hits": hit_rate(paths[TASK]),
        "branch_hits": hit_rate(paths[TASK], branch=True),
        "speedup": speedup,
        "w": w,
        "bound": bound,
        "of_bound": speedup["median"] / bound if speedup and bound else None,
        "bound_overlapped": overlapped,
        "of_bound_overlapped": speedup["median"] / overlapped if speedup and overlapped else None,
        "bound_with_w": bound_w,
        "of_bound_with_w": speedup["median"] / bound_w if speedup and bound_w else None,
        "adaptive_speedup": ratios(TASK_ADAPTIVE, OFF),
        "identical": {path: sum(bool(s.identical) for s in group) for path, group in paths.items() if path != OFF},
        # Prompts whose target-only output was empty: every path "matches" it, which shows nothing.
        "empty": sum(1 for s in paths[OFF] if not s.tokens),
        "routed": {
            "alpha": alpha(routed),
            "speedup": ratios(ROUTED, OFF),
            "served_by": dict(Counter(s.draft or "target-only" for s in routed).most_common()),
            "classified": sum(s.resolved_task == task for s in routed) / len(routed) if routed else None,
            "mean_k": (sum(s.k for s in routed if s.k) / sum(1 for s in routed if s.k)) if any(s.k for s in routed) else None,
        },
        "general": {"alpha": alpha(paths[GENERAL]), "speedup": ratios(GENERAL, OFF)},
        # Each proposer alone (the task's draft, prompt lookup, suffix decoding; the policy's k) and
        # the policy's choice among them: what a target pass commits, and the speedup.
        "proposers": {path: {"alpha": alpha(paths[path]), "tokens_per_pass": tokens_per_pass(paths[path]),
                             "speedup": ratios(path, OFF)} for path in PROPOSER_PATHS},
        "time_per_pass": {path: time_per_pass(paths[path]) for path in (OFF, TASK, ENGINE_OFF, ENGINE_TASK)},
        "engine": {
            "speedup": ratios(ENGINE_TASK, ENGINE_OFF),
            "service_over_engine_off": ratios(OFF, ENGINE_OFF),
            "service_over_engine_task": ratios(TASK, ENGINE_TASK),
        },
        "peer": {
            "speedup": ratios(HF_ASSISTED, ENGINE_OFF),
            "ours_over_peer": ratios(TASK_ADAPTIVE, HF_ASSISTED),
            "engine_over_peer": ratios(ENGINE_TASK, HF_ASSISTED),
            "identical": sum(bool(s.identical) for s in peer),
            "runs": len(peer),
        },
    }


def _alpha_matrix(scores: list[Sample]) -> dict[str, dict[str, float]]:
    """Teacher-forced greedy agreement of every draft with the target's output, per task."""
    matched: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for s in scores:
        matched[s.task][s.draft][0] += s.accepted
        matched[s.task][s.draft][1] += s.tokens
    return {task: {draft: m / n for draft, (m, n) in sorted(drafts.items()) if n}
            for task, drafts in matched.items()}


def _sampling(samples: list[Sample], tasks: list[str]) -> dict[str, dict[str, dict]]:
    grouped: dict[tuple[str, float], list[Sample]] = defaultdict(list)
    for s in samples:
        grouped[(s.task, s.temperature)].append(s)
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for (task, temperature), group in sorted(grouped.items(), key=lambda item: (tasks.index(item[0][0]), item[0][1])):
        drafted = [s for s in group if s.path == TASK]
        out[task][f"{temperature:g}"] = {
            "alpha": alpha(drafted),
            "tokens_per_pass": tokens_per_pass(drafted),
            "lookahead_hits": hit_rate(drafted),
            "branch_hits": hit_rate(drafted, branch=True),
            "wasted": wasted_share(drafted),
            "speedup": spread([ratio(r.get(TASK), r.get(OFF)) for r in by_run(group)]),
        }
    return dict(out)


def _memory(rows: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for row in rows:
        entry = out.setdefault(row["component"], {"processes": 0, "rss_mib": []})
        entry["processes"] += 1
        entry["rss_mib"].append(row["rss_bytes"] / MIB)
    for entry in out.values():
        entry["total_mib"] = sum(entry["rss_mib"])
    return out


def evaluate_goals(figures: dict, goals: Goals) -> list[Goal]:
    """The issue's goals against this run's figures; a goal without a measurement is not met or missed."""
    result = []
    tasks = figures["tasks"]
    for task, row in tasks.items():
        routed = (row["routed"]["speedup"] or {}).get("median")
        if task in goals.speedup:
            result.append(_goal(f"speedup {task}", f">= {goals.speedup[task]:.2f}x", routed,
                                lambda v, t=goals.speedup[task]: v >= t, "routed (the service's default) over target-only"))
    floor = [r["routed"]["speedup"]["median"] for r in tasks.values() if r["routed"]["speedup"]]
    result.append(_goal("speedup, every task", f">= {goals.speedup_floor:.2f}x", min(floor) if floor else None,
                        lambda v: v >= goals.speedup_floor, "the lowest routed median over the tasks"))
    for task, row in tasks.items():
        result.append(_goal(f"of Leviathan bound {task}", f">= {goals.of_bound:.0%}", row["of_bound"],
                            lambda v: v >= goals.of_bound, f"task draft, k={row['k']}", "%"))
    pays = [task for task, row in tasks.items() if ((row["engine"]["speedup"] or {}).get("median") or 0) > 1]
    for task in pays:
        over = (tasks[task]["peer"]["ours_over_peer"] or {}).get("median")
        result.append(_goal(f"over HF assisted {task}", f">= {goals.over_peer:.2f}x", over,
                            lambda v: v >= goals.over_peer,
                            "service, same draft, default schedules both sides (tasks whose draft pays in process)"))
    for task in pays:
        result.append(_goal(f"of overlapped bound {task}", f">= {goals.of_overlapped:.0%}",
                            tasks[task].get("of_bound_overlapped"), lambda v: v >= goals.of_overlapped,
                            f"task draft, k={tasks[task]['k']}: drafting hidden behind verification", "%"))
    for task in pays:
        steps = tasks[task]["time_per_pass"]
        service, engine = (steps.get(TASK) or {}).get("wall"), (steps.get(ENGINE_TASK) or {}).get("wall")
        result.append(_goal(f"speculative step {task}, service / in process", f"<= {goals.step_over_engine:.2f}x",
                            service / engine if service and engine else None, lambda v: v <= goals.step_over_engine,
                            "wall time per target pass, task draft, k the same"))
    for task in goals.sampled_tasks:
        greedy = ((tasks.get(task) or {}).get("speedup") or {}).get("median")
        sampled = ((figures["sampling"].get(task, {}).get(f"{goals.sampled_temperature:g}") or {}).get("speedup")
                   or {}).get("median")
        result.append(_goal(f"sampled {goals.sampled_temperature:g} over greedy {task}",
                            f">= {goals.sampled_of_greedy:.2f}x", sampled / greedy if sampled and greedy else None,
                            lambda v: v >= goals.sampled_of_greedy, "task draft's speedup, sampled over greedy"))
    result += load_goals(figures["load"], goals)
    return result


def load_goals(load: dict, goals: Goals) -> list[Goal]:
    """Issue 16's goals for throughput under load, from the load section's figures."""
    level, ratios = str(goals.load_level), load["ratios"]
    at_level = ratios.get(level, {})
    every = {key: [r[key] for r in ratios.values() if r[key] is not None] for key in ("auto_over_off", "auto_p99_over_off")}
    rss = [p.get("growth_beyond_pool", p["growth"]) for p in (load["rss"] or {}).get("processes", [])]
    pools = [kind["kv_pool_of_budget"] for paths in load["passes"].values() for kinds in paths.values()
             for kind in kinds.values() if kind["kv_pool_of_budget"] is not None]
    return [
        _goal(f"{level} clients: OFF over static-batch peer", f">= {goals.off_over_peer:.2f}x",
              at_level.get("off_over_peer_static"), lambda v: v >= goals.off_over_peer,
              f"tokens/s; transformers generate, batch {level}, same target, cores and threads"),
        _goal(f"{level} clients: OFF over 1 client", f">= {goals.off_scaling:.2f}x", at_level.get("off_over_one_client"),
              lambda v: v >= goals.off_scaling, "tokens/s"),
        _goal("AUTO over OFF throughput, every level", f">= {goals.auto_over_off:.2f}x",
              min(every["auto_over_off"], default=None), lambda v: v >= goals.auto_over_off, "the lowest level"),
        _goal("AUTO p99 over OFF, every level", f"<= {goals.auto_p99_over_off:.2f}x",
              max(every["auto_p99_over_off"], default=None), lambda v: v <= goals.auto_p99_over_off, "the highest level"),
        _goal("1 client: OFF p50, batching on / off", f"<= {goals.unbatched_latency:.2f}x",
              ratios.get("1", {}).get("off_p50_over_unbatched"), lambda v: v <= goals.unbatched_latency,
              "p50, request to last token"),
        _goal(f"{(load['rss'] or {}).get('clients', 'most')} clients: RSS after (less KV pool) over before", f"<= {goals.rss_growth:.2f}x",
              max(rss, default=None), lambda v: v <= goals.rss_growth,
              "the most grown process (target, drafts, router), less what its KV pools allocated"),
        _goal("KV pool over its budget", f"<= {goals.kv_pool_of_budget:.0%}", max(pools, default=None),
              lambda v: v <= goals.kv_pool_of_budget, "the fullest worker after any level (Inspect)", "%"),
    ]


def _goal(name: str, threshold: str, measured: float | None, test, detail: str = "", unit: str = "x") -> Goal:
    return Goal(name, threshold, measured, None if measured is None else bool(test(measured)), detail, unit)
