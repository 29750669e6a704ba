"""The load section's figures, derived from its samples and the workers' counters alone (pure).

Per level (concurrent clients, or a peer's batch size) and path: throughput is the tokens of all its
requests over the level's wall time (first start to last finish); latency is per request, request
to last token; its p50 and p99 are ``workers/stats.py``'s percentile, which the capacity planner
reads its simulated requests with too. The ratios the goals need are taken between paths at the
same level.
"""

from __future__ import annotations

from collections import defaultdict

from specserve.workers.stats import percentile, time_per_output_token

from .samples import AUTO, LOAD_PATHS, OFF, OFF_UNBATCHED, PEER_BATCH, PEER_STATIC, Sample

MIB = 1024 * 1024


def derive_load(samples: list[Sample], info: dict | None) -> dict:
    info = info or {}
    levels = _levels(samples)
    return {
        "levels": levels,
        "ratios": {level: _ratios(paths, levels.get("1", {})) for level, paths in levels.items()},
        "passes": _passes(info.get("passes", [])),
        "rss": _rss(info.get("rss")),
        "peer_errors": info.get("peer_errors", {}),
        "unbatched": info.get("unbatched"),
    }


def _levels(samples: list[Sample]) -> dict[str, dict[str, dict]]:
    grouped: dict[tuple[int, str], list[Sample]] = defaultdict(list)
    for s in samples:
        grouped[(s.concurrency, s.path)].append(s)
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for (level, path), group in sorted(grouped.items(), key=lambda item: (item[0][0], _order(item[0][1]))):
        out[str(level)][path] = path_figures(group)
    return dict(out)


def _order(path: str) -> int:
    return LOAD_PATHS.index(path) if path in LOAD_PATHS else len(LOAD_PATHS)


def path_figures(group: list[Sample]) -> dict:
    """Throughput, latency, time to first token and output identity of one path at one level."""
    wall = max(s.started + s.seconds for s in group) - min(s.started for s in group)
    latencies = [s.seconds for s in group]
    first = [s.first_token_seconds for s in group if s.first_token_seconds is not None]
    tpot = [t for s in group if s.first_token_seconds is not None and (t := time_per_output_token(
        s.seconds, s.first_token_seconds, s.tokens, s.first_chunk_tokens)) is not None]
    return {
        "requests": len(group),
        "tokens_per_second": sum(s.tokens for s in group) / wall if wall > 0 else None,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "ttft_p50": percentile(first, 50),  # None where no request streamed its first token
        "ttft_p99": percentile(first, 99),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p99": percentile(tpot, 99),
        "identical": sum(s.identical is True for s in group),
        "compared": sum(s.identical is not None for s in group),  # requests whose prompt has a reference output
    }


def _over(a: dict | None, b: dict | None, key: str) -> float | None:
    return a[key] / b[key] if a and b and a.get(key) and b.get(key) else None


def _ratios(paths: dict[str, dict], one_client: dict[str, dict]) -> dict[str, float | None]:
    """At one level: AUTO against OFF, OFF against batching off and the peers, OFF against 1 client."""
    off = paths.get(OFF)
    return {
        "auto_over_off": _over(paths.get(AUTO), off, "tokens_per_second"),
        "auto_p99_over_off": _over(paths.get(AUTO), off, "p99"),
        "off_over_unbatched": _over(off, paths.get(OFF_UNBATCHED), "tokens_per_second"),
        "off_p50_over_unbatched": _over(off, paths.get(OFF_UNBATCHED), "p50"),
        "off_over_peer_static": _over(off, paths.get(PEER_STATIC), "tokens_per_second"),
        "off_over_peer_batch": _over(off, paths.get(PEER_BATCH), "tokens_per_second"),
        "off_over_one_client": _over(off, one_client.get(OFF), "tokens_per_second"),
    }


def _passes(records: list[dict]) -> dict[str, dict[str, dict]]:
    """Per level and path, per worker kind: mean sessions and tokens per forward pass over the
    run (None where the workers counted no pass), and the most sessions any pass has held."""
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in records:
        out[str(r["clients"])][r["path"]] = {kind: _per_pass(r[kind]) for kind in ("target", "draft")}
    return dict(out)


def _per_pass(counts: dict) -> dict:
    passes = counts["passes"]
    return {"passes": passes,
            "sessions_per_pass": counts["pass_sessions"] / passes if passes else None,
            "pass_width": counts["pass_tokens"] / passes if passes else None,  # tokens a pass ran, all its sessions
            "max_pass_sessions": counts["max_pass_sessions"] or None,
            "kv_pool_of_budget": counts["kv_pool_of_budget"] or None}


def _rss(rss: dict | None) -> dict | None:
    """Each component process's resident memory before and after the most-clients level, and its
    growth beside what its KV pools allocated meanwhile (bounded by their budget, checked apart):
    a leak is growth the pools do not account for."""
    if not rss:
        return None
    before = {row["pid"]: row for row in rss["before"]}
    pools = {int(pid): grown for pid, grown in rss.get("kv_pool_growth", {}).items()}  # JSON keys are strings
    rows = []
    for row in rss["after"]:
        if row["pid"] not in before:
            continue
        start, pool = before[row["pid"]]["rss_bytes"], pools.get(row["pid"], 0)
        rows.append({"component": row["component"], "pid": row["pid"], "before_mib": start / MIB,
                     "after_mib": row["rss_bytes"] / MIB, "kv_pool_mib": pool / MIB,
                     "growth": row["rss_bytes"] / start, "growth_beyond_pool": (row["rss_bytes"] - pool) / start})
    return {"clients": rss["clients"], "processes": rows}
