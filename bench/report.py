"""report.md and the printed summary, rendered from results.json's figures alone."""

from __future__ import annotations

from .plan_check import format_report as format_planner
from .samples import AUTO, OFF, OFF_UNBATCHED, PEER_BATCH, PEER_STATIC, PROPOSER_PATHS

DASH = "–"  # not measured in this run


def x(v: float | None) -> str:
    return f"{v:.2f}×" if v is not None else DASH


def num(v: float | None, digits: int = 2) -> str:
    return f"{v:.{digits}f}" if v is not None else DASH


def pct(v: float | None) -> str:
    return f"{v:.0%}" if v is not None else DASH


def ms(v: float | None) -> str:
    return f"{v * 1000:.0f} ms" if v is not None else DASH


def ms_fine(v: float | None) -> str:
    """Milliseconds with a decimal: a time per token is a few ms."""
    return f"{v * 1000:.1f} ms" if v is not None else DASH


def sx(spread: dict | None) -> str:
    """A median ratio with its interquartile range and sample count."""
    if not spread:
        return DASH
    return f"{spread['median']:.2f}× ({spread['p25']:.2f}–{spread['p75']:.2f}, n={spread['n']})"


def measured(goal: dict) -> str:
    return pct(goal["measured"]) if goal["unit"] == "%" else x(goal["measured"])


def verdict(goal: dict) -> str:
    return {True: "met", False: "**MISSED**", None: "not measured"}[goal["met"]]


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _device_line(device: dict | None) -> str:
    """The models' device as the report names it (runs before --device existed ran on the CPU)."""
    if not device:
        return "models on the CPU"
    driver = f", driver {device['driver']}" if device.get("driver") else ""
    return f"models on {device['device']} in {device['dtype']}{driver}"


def _compiled_line(meta: dict) -> str:
    """Which of the service's decode passes ran compiled: the engine's always run eagerly."""
    compiled = meta.get("compiled")
    if compiled is None:  # a run from before compiled passes
        return "Every pass ran eagerly."
    where = [who for who in ("target", "drafts") if compiled[who]]
    if not where:
        return "Every pass ran eagerly, in the service as in the engine."
    return (f"The service's {' and '.join(where)} ran their decode passes compiled (`batching.compiled`); the "
            f"engine's passes run eagerly, so part of a difference here is the compiler's.")


def render_report(results: dict, plots: list[str]) -> str:
    meta, f = results["meta"], results["figures"]
    settings, tasks = meta["settings"], f["tasks"]
    found = sum(meta["prompts"]["found_in_training"].values())
    lines = [
        f"# specserve benchmark, {meta['started']}",
        "",
        f"`{meta['command']}`: zoo **{meta['zoo']['preset']}** (target {meta['zoo']['target_parameters'] / 1e6:.1f}M "
        f"parameters; drafts {', '.join(meta['drafts'])}), {meta['machine']['cpus']} CPUs, {meta['machine']['platform']}; "
        f"torch {meta['machine']['torch']}, transformers {meta['machine']['transformers']}, ray {meta['machine']['ray']}; "
        f"{_device_line(meta['machine'].get('device'))}. The run took {meta['seconds']:.0f} s.",
        "",
        f"Greedy unless stated; {meta['max_tokens']} tokens per request; {settings['prompts']} held-out prompts per task "
        f"(`bench/prompts/`), {settings['repeats']} pass(es), after {settings['warm_up']} routed warm-up requests per task. "
        f"Held-out check: {meta['prompts']['checked']} prompts compared with the zoo's training text, {found} found there "
        "(and left out). Every ratio is taken per prompt between decodes that ran back to back, so machine noise "
        "hits both sides alike, and is given as a median with its interquartile range and sample count. Suffix "
        "decoding runs on each request's own text only (`router.suffix.global_tokens: 0`, unless `--set` says "
        "otherwise): every prompt is decoded on every path, and a memory of the task's recent outputs would hold "
        "the answer to the prompt being measured.",
        "",
        "## Goals",
        "",
        *table(["goal", "target", "measured", "result", "what is measured"],
               [[g["name"], g["threshold"], measured(g),
                 verdict(g), g["detail"]] for g in f["goals"]]),
        "",
        "## 1. Speedup by task, through the service",
        "",
        f"`task draft`: the task's own draft at a fixed k={meta['k']}; `adaptive`: the same draft with the policy's k "
        "and schedule; `routed`: the prompt alone, as most clients send it (classifier, policy, adaptive k, "
        "fallback). alpha = accepted / (accepted + rejections); c = a drafted token's time over a target-only "
        "pass, from the in-process engine (the models' own cost ratio); `c served`: the same on the workers, "
        "through the service, per token drafted (proposed or not); `wasted`: the share of drafted tokens no "
        "proposal used (drafted ahead for a verdict that did not come); w = what each verified draft token adds "
        "to a target pass, from the replica's device times (about 0 on a GPU, not on a CPU). bound = Leviathan et "
        "al.'s (1 − αᵏ⁺¹) / ((1 − α)(kc + 1)) from this run's alpha, c and k, which assumes w = 0; `with w` "
        "divides by (1 + kc + kw) instead, the bound for this machine. The service drafts the next proposal "
        "while the target verifies (`hits`: the share of those lookaheads whose assumed verdict came; `by branch`: "
        "of those, through the branch drafted beside the lookahead for the likeliest rejection), so it can "
        "beat either; `overlapped` is the bound with drafting wholly hidden behind verification on this machine, "
        "(1 − αᵏ⁺¹) / ((1 − α) max(1 + kw, kc)).",
        "",
        *table(["task", "draft", "alpha", "tokens/pass", "c", "c served", "wasted", "hits", "by branch", "w",
                "speedup (task draft)",
                "bound", "achieved/bound", "bound overlapped", "achieved/overlapped", "bound with w",
                "achieved/bound with w", "speedup (adaptive)", "speedup (routed)", "identical"],
               [[t, r["draft"], num(r["alpha"]), num(r["tokens_per_pass"]), num(r["c"], 3),
                 num(r.get("c_service"), 3), pct(r.get("wasted")), pct(r.get("lookahead_hits")),
                 pct(r.get("branch_hits")), num(r["w"], 3),
                 sx(r["speedup"]), x(r["bound"]), pct(r["of_bound"]), x(r.get("bound_overlapped")),
                 pct(r.get("of_bound_overlapped")), x(r["bound_with_w"]), pct(r["of_bound_with_w"]),
                 sx(r["adaptive_speedup"]), sx(r["routed"]["speedup"]), _identical(r)]
                for t, r in tasks.items()]),
        "",
        *_image(plots, "speedup_by_task.png", "speedup by task"),
        "### Each proposer alone",
        "",
        "The task's draft (`task_adaptive`), prompt lookup (`ngram`) and suffix decoding (`suffix`), the last two "
        "draft-free and run in the router, and the three as one token tree verified in one pass (`tree`), each with "
        "the policy's k; `routed`: the policy's own choice among them. alpha counts only steps that proposed "
        "something (a tree: along its deepest branch); tokens/pass counts every step.",
        "",
        *table(["task", *(f"{p} {what}" for p in PROPOSER_PATHS for what in ("alpha", "tok/pass", "speedup"))],
               [[t, *(v for p in PROPOSER_PATHS for v in (num(r["proposers"][p]["alpha"]),
                                                           num(r["proposers"][p]["tokens_per_pass"]),
                                                           sx(r["proposers"][p]["speedup"])))]
                for t, r in tasks.items()]),
        "",
        "## 2. Cost of distribution: the service against the in-process engine",
        "",
        "The in-process engine runs both models on one thread pinned to the target replica's core; the service "
        "runs the draft on its own worker. Throughput ratios, same models, prompts and k. " + _compiled_line(meta),
        "",
        *table(["task", "engine speedup", "service/engine, target-only", "service/engine, task draft"],
               [[t, sx(r["engine"]["speedup"]), sx(r["engine"]["service_over_engine_off"]),
                 sx(r["engine"]["service_over_engine_task"])] for t, r in tasks.items()]),
        "",
        "## 3. The peer: Hugging Face assisted generation",
        "",
        "`transformers` `generate(assistant_model=...)`, greedy, same target and draft, its default schedule "
        "(up to 20 draft tokens, cut by its adaptive confidence threshold), in-process on the same pinned thread as "
        "the engine. Its speedup is over our in-process target-only decode. `service over HF`: the service with the "
        "same draft and its own default schedule (`adaptive` above); `engine over HF`: our in-process engine at "
        f"k={meta['k']} on the same thread, the algorithm without the distribution.",
        "",
        *table(["task", "HF speedup", "service over HF", "engine over HF", "HF output identical"],
               [[t, sx(r["peer"]["speedup"]), sx(r["peer"]["ours_over_peer"]), sx(r["peer"]["engine_over_peer"]),
                 f"{r['peer']['identical']}/{r['peer']['runs']}"] for t, r in tasks.items()]),
        "",
        "## 4. Routing: the policy's drafts against one general draft",
        "",
        *table(["task", "classified", "served by (routed)", "alpha routed", "alpha general", "speedup routed",
                "speedup general"],
               [[t, pct(r["routed"]["classified"]), ", ".join(f"{d} {n}" for d, n in r["routed"]["served_by"].items()),
                 num(r["routed"]["alpha"]), num(r["general"]["alpha"]), sx(r["routed"]["speedup"]),
                 sx(r["general"]["speedup"])] for t, r in tasks.items()]),
        "",
        "Alpha of every draft on every task, teacher-forced on the target's greedy output of the prompts above "
        "(the fraction of positions where the draft's greedy choice is the target's token):",
        "",
        *_matrix(f["alpha_matrix"]),
        "",
        *_image(plots, "alpha_heatmap.png", "alpha heatmap"),
        "The routing policy's view after the greedy section (`GetStats`): per task its decision, per allowed "
        "draft its estimates (its c is the router's wait per draft token, which drafting ahead partly hides).",
        "",
        *_policy(results.get("policy")),
        "",
        *_load_section(meta, f["load"]),
        *_image(plots, "load.png", "throughput and p99 against concurrency"),
        "## 6. Sampling",
        "",
        f"The task's draft at k={meta['k']} against target-only, {settings['sampled_prompts']} prompts per task and "
        "temperature, the same seed on both. Sampled outputs follow the target's distribution (the lossless "
        "sampling tests check it); they are not token-identical to a target-only run, so only speed is compared. "
        "Sampled requests draft ahead too (their draft's draws are keyed by position, so a lookahead's proposal is "
        "the one drafted afresh): `hits` is the share of lookaheads used (`by branch`: through the branch beside it), "
        "`wasted` the drafted tokens no proposal used.",
        "",
        *table(["task", "temperature", "alpha", "tokens/pass", "hits", "by branch", "wasted", "speedup"],
               [[t, temp, num(m["alpha"]), num(m["tokens_per_pass"]), pct(m.get("lookahead_hits")),
                 pct(m.get("branch_hits")),
                 pct(m.get("wasted")), sx(m["speedup"])]
                for t, temps in f["sampling"].items() for temp, m in temps.items()]),
        "",
        "## 7. Resident memory",
        "",
        *table(["component", "processes", "RSS each (MiB)", "total (MiB)"],
               [[c, str(m["processes"]), ", ".join(f"{v:.0f}" for v in m["rss_mib"]), f"{m['total_mib']:.0f}"]
                for c, m in f["memory"].items()]),
        "",
        "Measured at the end of the run, by process title; Ray's own processes (GCS, raylet, Serve controller) "
        "are not counted.",
        "",
        "## 8. Where the time goes",
        "",
        "Per target pass, in ms: wall time seen by the caller, the target's device time (verify), the draft's "
        "device time (draft), and the rest (wire, Python, scheduling). The service drafts ahead while the "
        "target verifies, so its rest is a lower bound; in process the two take turns on one thread.",
        "",
        *table(["task", "path", "wall", "verify", "draft", "rest"],
               [[t, path, num(p["wall"]), num(p["verify"]), num(p["draft"]), num(p["rest"])]
                for t, r in tasks.items() for path, p in r["time_per_pass"].items() if p]),
        "",
    ]
    if "planner" in results:  # the capacity planner's model against the load section (bench/plan_check.py)
        lines += ["## 9. The capacity planner against this run", "",
                  *format_planner(results["planner"], heading="###").splitlines()[2:], ""]
    return "\n".join(lines)


LOAD_LABELS = {OFF: "OFF", AUTO: "AUTO", OFF_UNBATCHED: "OFF, batching off", PEER_STATIC: "HF static batch",
               PEER_BATCH: "HF generate_batch"}


def _load_section(meta: dict, load: dict) -> list[str]:
    settings, machine = meta["settings"], meta["machine"]
    levels = sorted(load["levels"], key=int)
    return [
        "## 5. Load: concurrent clients, mixed tasks",
        "",
        f"Streamed greedy requests, the prompt alone, tasks interleaved, cycling over the same "
        f"{settings['load_requests']} prompts at every level ({settings['load_requests']} requests per level and path, "
        "or two per client where that is more); OFF and AUTO run one after the other on the same requests (which goes "
        "first alternates). Throughput is the tokens of all requests over the level's wall time; latency is per "
        "request, request to last token (p99 of so few requests is close to their maximum); TTFT, to its first "
        "chunk; TPOT, after its first chunk, seconds per further token (workers/stats.py, as the router's metric).",
        "",
        f"Beside them, on the same prompts: **OFF, batching off**, the same service brought up again with "
        f"`max_sessions_per_pass: 1` on the target and the drafts ({load['unbatched'] or 'not run'}); and the peers, "
        f"transformers on the target alone in one process pinned like the target replica (cores "
        f"{machine.get('target_cpus', '?')}, {machine.get('target_threads', '?')} thread(s)) while the service was "
        "stopped: **HF static batch**, `generate` over left-padded batches of as many prompts as the level has "
        "clients, one batch after another (a request's latency is its batch's); **HF generate_batch**, continuous "
        "batching with at most that many requests per pass, all submitted at once (latency from submission, the "
        "call's cache set-up not counted). Identical: outputs equal to the target-only output of the same prompt "
        "(the batching-off service's at its fewest clients, else OFF's at its fewest).",
        "",
        *_peer_errors(load["peer_errors"]),
        *table(["clients", "path", "tokens/s", "p50", "p99", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
                "identical", "target sessions/pass", "target tokens/pass", "draft sessions/pass"],
               [[lvl, LOAD_LABELS.get(path, path), num(m["tokens_per_second"], 1), ms(m["p50"]), ms(m["p99"]),
                 ms(m["ttft_p50"]), ms(m["ttft_p99"]), ms_fine(m.get("tpot_p50")), ms_fine(m.get("tpot_p99")),
                 f"{m['identical']}/{m['compared']}",
                 *_batch_sizes(load["passes"].get(lvl, {}).get(path))]
                for lvl in levels for path, m in load["levels"][lvl].items()]),
        "",
        "Sessions and tokens per pass: the workers' own counters (`Inspect`: passes, pass_sessions, pass_tokens), "
        "their growth over the run of that level and path; – where the workers counted no pass.",
        "",
        *table(["clients", "AUTO/OFF tokens/s", "AUTO/OFF p99", "OFF/batching off tokens/s", "OFF/batching off p50",
                "OFF/HF static batch", "OFF/HF generate_batch", "OFF/OFF at 1 client"],
               [[lvl, x(r["auto_over_off"]), x(r["auto_p99_over_off"]), x(r["off_over_unbatched"]),
                 x(r["off_p50_over_unbatched"]), x(r["off_over_peer_static"]), x(r["off_over_peer_batch"]),
                 x(r["off_over_one_client"])] for lvl, r in load["ratios"].items()]),
        "",
        *_load_memory(load["rss"]),
    ]


def _peer_errors(errors: dict[str, str]) -> list[str]:
    return [line for path, error in errors.items()
            for line in (f"**{LOAD_LABELS.get(path, path)} did not run here**: `{error}`", "")]


def _batch_sizes(passes: dict | None) -> list[str]:
    if not passes:
        return [DASH] * 3
    target, draft = passes["target"], passes["draft"]
    width = target.get("pass_width", target.get("tokens_per_pass"))  # runs saved before 2026-11-28 named it so
    return [num(target["sessions_per_pass"]), num(width, 1), num(draft["sessions_per_pass"])]


def _load_memory(rss: dict | None) -> list[str]:
    if not rss:
        return ["Resident memory around the most-clients level: not measured in this run.", ""]
    return [f"Resident memory of each component process before and after the {rss['clients']}-client level "
            "(both modes), and what its KV pools allocated meanwhile (arenas, taken as sessions first need "
            "them and kept, within the pool's budget); the goal is the growth beyond that:", "",
            *table(["component", "pid", "before (MiB)", "after (MiB)", "after/before", "KV pool allocated (MiB)",
                    "after less pool / before"],
                   [[p["component"], str(p["pid"]), f"{p['before_mib']:.0f}", f"{p['after_mib']:.0f}", x(p["growth"]),
                     f"{p.get('kv_pool_mib', 0):.0f}", x(p.get("growth_beyond_pool", p["growth"]))]
                    for p in rss["processes"]]),
            ""]


def _identical(row: dict) -> str:
    """Outputs equal to target-only's, over the service and engine paths (the peer has its own column)."""
    counts = {p: n for p, n in row["identical"].items() if p != "hf_assisted"}
    if not counts:
        return DASH
    empty = row.get("empty", 0)  # (runs before it was counted: none said)
    return f"{min(counts.values())}/{row['runs']}" + (f" ({empty} of 0 tokens)" if empty else "")


def _matrix(matrix: dict[str, dict[str, float]]) -> list[str]:
    if not matrix:
        return ["(not measured)"]
    drafts = sorted({d for row in matrix.values() for d in row})
    return table(["task", *drafts], [[t, *(num(row.get(d)) for d in drafts)] for t, row in matrix.items()])


def _policy(rows: list[dict] | None) -> list[str]:
    if not rows:
        return ["(not recorded in this run)"]
    return table(["task", "draft", "alpha", "c", "k", "expected speedup", "decision", "reason"],
                 [[r["task"], r["draft"], num(r["alpha"]), num(r["c"], 3), str(r["k"]), x(r["expected_speedup"]),
                   r["decision"], r["reason"]] for r in rows])


def _image(plots: list[str], name: str, alt: str) -> list[str]:
    return [f"![{alt}]({name})", ""] if name in plots else []


def summary(results: dict) -> str:
    """What the command prints: per task the headline figures, then the goals."""
    f = results["figures"]
    lines = [f"{'task':<6} {'alpha':>6} {'tok/pass':>8} {'speedup':>8} {'bound':>6} {'of bound':>8} {'routed':>7} "
             f"{'vs HF':>6} {'identical':>9}"]
    for t, r in f["tasks"].items():
        med = lambda s: x(s["median"] if s else None)  # noqa: E731
        lines.append(f"{t:<6} {num(r['alpha']):>6} {num(r['tokens_per_pass']):>8} {med(r['speedup']):>8} "
                     f"{x(r['bound']):>6} {pct(r['of_bound']):>8} {med(r['routed']['speedup']):>7} "
                     f"{med(r['peer']['ours_over_peer']):>6} {_identical(r):>9}")
    lines.append("\ngoals:")
    for g in f["goals"]:
        lines.append(f"  {g['name']:<38} {g['threshold']:>9}  {measured(g):>7}  {verdict(g).strip('*')}")
    return "\n".join(lines)
