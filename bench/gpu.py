"""What a GPU says about the design: in-process timings on a CUDA device, written as one report.

Runs without Ray (a lent GPU machine may have none): the zoo's target, drafts and EAGLE-3 head in
this process, timed with the device synchronised (every pass copies its logits to the host, as the
engine does). Sections, each with the device, dtype and driver in the report's header:

    attention       one query's attention per SDPA backend, at new and at repeated key lengths
    pass width      one verify pass over 1..16 tokens, and B sessions' rows in one ragged pass
    graphs          one token's forward, eager against a captured CUDA graph's replay (the
                    per-operation overhead graphs remove), on the zoo's target and a SmolLM2-135M shape
    bucketed        the scheduler's passes as it runs them (workers/graphs.py): B sessions adding
                    1 token (decode) or K + 1 (verify), eager against the bucket's graph, and the
                    c a graphed draft step gives against a graphed verify pass
    speculation     per task: target alone against its draft, the EAGLE-3 head and prompt lookup
                    (greedy, k = 4): speedup, acceptance, tokens per pass, c (a draft step over a
                    target step)
    concurrency     target-only decoding of N sessions through the scheduler (continuous batching)
                    against transformers' static batch of N, tokens per second

    specserve gpu-bench --zoo DIR --out DIR [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from specserve.cluster.zoo.head import HEAD
from specserve.cluster.zoo.zoo import Zoo
from specserve.workers import stats as figures
from specserve.workers.sampling import SamplingParams
from specserve.workers.batching import Scheduler
from specserve.workers.config import BatchingConfig
from specserve.workers.engine import SpecEngine
from specserve.workers.graphs import PassGraphs
from specserve.workers.grpc_host import Device
from specserve.workers.heads.format import is_head
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.loading import ModelSpec
from specserve.workers.proposer_kinds import NGRAM
from specserve.workers.prompt import encode_prompt
from specserve.workers.ragged_pass import PooledSequence, Segment, run_pass, use_pooled_attention
from specserve.workers.request import GenerationParams
from specserve.workers.verifying import TargetSession

from .device import facts

# SmolLM2-135M-Instruct's shape (the project's real model), random weights: timing only.
SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True)
GREEDY = SamplingParams()
K = 4


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1000


def load_engine(zoo: Zoo, dtype: str, device: str) -> SpecEngine:
    drafts = {name: ModelSpec(str(zoo.root / zoo.manifest["drafts"][name]["path"]), dtype=dtype, device=device)
              for name in zoo.draft_names}
    engine = SpecEngine.load(ModelSpec(str(zoo.target_dir), dtype=dtype, device=device), drafts)
    assert all(is_head(spec.source) == (name in engine.heads) for name, spec in drafts.items())
    return engine


def pass_widths(model: PreTrainedModel, widths=(1, 2, 3, 4, 5, 8, 16), sessions=(1, 4, 16, 64), cached: int = 160
                ) -> dict:
    """Milliseconds of one ragged pass: one session adding ``width`` tokens, and B sessions adding
    1 (a decode step) or K + 1 (a verify step) each, over ``cached`` positions apiece."""
    pool = KVPool(KVShape.of(model), Budget(2**34))
    regions = [pool.take(cached + 32) for _ in range(max(sessions))]
    run_pass(model, pool, [Segment(r, 0, list(range(3, 3 + cached)), 0) for r in regions])

    def one_pass(count: int, q: int):
        return lambda: run_pass(model, pool, [Segment(r, cached, list(range(5, 5 + q)), q) for r in regions[:count]])
    return {"width_ms": {w: median_ms(one_pass(1, w)) for w in widths},
            "sessions_ms": {f"{b}x{q}": median_ms(one_pass(b, q)) for q in (1, K + 1) for b in sessions}}


@torch.inference_mode()
def graph_replay(model: PreTrainedModel) -> dict:
    """One token's forward (no cache: the same kernels but attention's), eager against the replay
    of a CUDA graph captured from it: what graph capture removes of a step's per-operation cost."""
    ids = torch.tensor([[5]], device=model.device)
    eager = median_ms(lambda: model(input_ids=ids, use_cache=False).logits, repeats=50)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(input_ids=ids, use_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(input_ids=ids, use_cache=False)
        replay = median_ms(graph.replay, repeats=50)
    except Exception as exc:  # a report, not a crash: say what stopped the capture
        return {"eager_ms": eager, "graph_error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"eager_ms": eager, "graph_ms": replay, "speedup": eager / replay}


def bucketed_passes(target: PreTrainedModel, draft: PreTrainedModel, sessions=(1, 4, 16, 64), cached: int = 160
                    ) -> dict:
    """Milliseconds of one pass of B sessions adding q tokens each, as ``run_pass`` runs it (eager)
    and as the scheduler's PassGraphs does (a graph's replay where captured; the same buffers run
    eagerly on a CPU), for decode passes (q = 1) and verify passes (q = K + 1)."""
    rows = {}
    for name, model in (("target", target), ("draft", draft)):
        positions = max(sessions) * (cached + 32) + 1  # one arena, as a CUDA pool has (graphs need it)
        shape = KVShape.of(model)
        pool = KVPool(shape, Budget(positions * shape.bytes_per_position), arena_positions=positions)
        graphs = PassGraphs(model, pool)
        regions = [pool.take(cached + 32) for _ in range(max(sessions))]
        run_pass(model, pool, [Segment(r, 0, list(range(3, 3 + cached)), 0) for r in regions])
        for q in (1, K + 1):
            for count in sessions:
                segments = [Segment(r, cached, list(range(5, 5 + q)), q) for r in regions[:count]]
                eager = median_ms(lambda: run_pass(model, pool, segments))
                ran = graphs.run(segments) is not None  # captures on first use; None: left to the eager pass
                bucketed = median_ms(lambda: graphs.run(segments)) if ran else None
                rows[f"{name} {count}x{q}"] = {"eager_ms": eager, "bucketed_ms": bucketed}
        rows[f"{name} disabled"] = graphs.disabled
    one = rows["target 1x1"]["bucketed_ms"], rows["target 1x5"]["bucketed_ms"], rows["draft 1x1"]["bucketed_ms"]
    if None not in one:  # a draft step (one decode pass) over a verify pass, both from graphs
        rows["c, graphed draft step over graphed verify pass"] = one[2] / one[1]
        rows["verify pass over decode pass, graphed"] = one[1] / one[0]
    return rows


def attention_shapes(model: PreTrainedModel, calls: int = 40, start: int = 100) -> dict:
    """One query's attention over a pool-like view of ``L`` keys, per SDPA backend: milliseconds a
    call when every call has a new ``L`` (as decode steps do) and when ``L`` repeats. A backend
    that plans per shape (cuDNN's) shows it as the gap between the two."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config = model.config.get_text_config()
    heads, dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    arena = torch.randn(2, heads, start + 2 * calls, dim, device=model.device, dtype=model.dtype)
    query = torch.randn(1, heads, 1, dim, device=model.device, dtype=model.dtype)

    def call(length: int) -> None:
        torch.nn.functional.scaled_dot_product_attention(query, arena[0, None, :, :length], arena[1, None, :, :length])

    rows = {}
    for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
        try:
            with sdpa_kernel([getattr(SDPBackend, name)]):
                call(start - 1)
                sync()
                began = time.perf_counter()
                for length in range(start, start + calls):  # each length new to this backend
                    call(length)
                    sync()
                fresh = (time.perf_counter() - began) / calls * 1000
                rows[name] = {"fresh_ms": fresh, "repeated_ms": median_ms(lambda: call(start), repeats=calls)}
        except RuntimeError as exc:  # not available for this dtype or shape
            rows[name] = {"error": str(exc).splitlines()[0][:200]}
    return rows


def speculation(engine: SpecEngine, zoo: Zoo, prompts: int, max_tokens: int) -> list[dict]:
    """Per task and proposer, against target-only runs of the same prompts (greedy, k = K)."""
    rows = []
    for task in zoo.tasks:
        ids = [encode_prompt(engine.tokenizer, p) for p in zoo.prompts(task)[:prompts]]
        # Each proposer once, untimed, first: whatever a device pays for shapes it has not seen yet
        # (kernel choice, plans, allocations) must not fall on whichever row happens to run first.
        for proposer in (None, zoo.default_draft(task), *([HEAD] * (HEAD in engine.heads)), NGRAM):
            _decode(engine, ids, GenerationParams(max_tokens=max_tokens, k=K, speculation=proposer is not None),
                    proposer)
        off = _decode(engine, ids, GenerationParams(max_tokens=max_tokens, speculation=False), None)
        for proposer in (zoo.default_draft(task), HEAD, NGRAM):
            if proposer == HEAD and HEAD not in engine.heads:
                continue
            on = _decode(engine, ids, GenerationParams(max_tokens=max_tokens, k=K), proposer)
            stats, alone = on["stats"], off["stats"]
            target_step = alone.verify_seconds / max(alone.target_passes, 1)
            # Each figure as workers/stats.py defines it (c: device time; alpha: per token, not per proposal).
            rows.append({"task": task, "proposer": proposer, "speedup": off["seconds"] / on["seconds"],
                         "identical": on["tokens"] == off["tokens"],
                         "alpha": figures.alpha(stats.accepted, stats.rejections),
                         "acceptance_rate": figures.acceptance_rate(stats.accepted, stats.proposed),
                         "tokens_per_pass": figures.tokens_per_pass(stats.accepted, stats.target_passes),
                         "c": figures.cost_ratio(stats.draft_seconds, stats.drafted, alone.verify_seconds,
                                                 alone.target_passes) if stats.drafted else None,
                         "target_ms": target_step * 1000, "tok_s_off": off["tok_s"], "tok_s_on": on["tok_s"]})
    return rows


def _decode(engine: SpecEngine, prompts: list[list[int]], params: GenerationParams, draft: str | None) -> dict:
    from specserve.workers.stats import SpecStats

    stats, tokens = SpecStats(), []
    sync()
    start = time.perf_counter()
    for prompt in prompts:
        done = engine.generate(prompt, params, draft=draft).complete()
        tokens.append(done.token_ids)
        stats.add(done.stats)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens, "stats": stats, "tok_s": sum(map(len, tokens)) / seconds}


def concurrency(model: PreTrainedModel, tokenizer, prompts: list[str], levels=(1, 4, 16, 64), new_tokens: int = 64
                ) -> list[dict]:
    """Target-only tokens per second at N sessions: the scheduler's continuous batching against
    transformers' static batch (``generate`` on N left-padded prompts), greedy, ``new_tokens`` each.
    Like against like: the scheduler with graphs against transformers with its static cache (which
    ``generate`` compiles, CUDA graphs and all, on CUDA), and each run eagerly against the other run
    eagerly, in the same call."""
    rows = []
    for n in levels:
        batch = [encode_prompt(tokenizer, prompts[i % len(prompts)]) for i in range(n)]
        ours = _scheduled(model, batch, new_tokens)
        eager = _scheduled(model, batch, new_tokens, graphs=False)
        theirs = _static_batch(model, tokenizer, batch, new_tokens)
        compiled = _static_batch(model, tokenizer, batch, new_tokens, static_cache=True)
        rows.append({"sessions": n, "scheduler_tok_s": ours, "scheduler_eager_tok_s": eager,
                     "static_batch_tok_s": theirs, "static_batch_compiled_tok_s": compiled,
                     "ratio": ours / compiled, "eager_ratio": eager / theirs})
    return rows


def _scheduled(model: PreTrainedModel, batch: list[list[int]], new_tokens: int, graphs: bool = True) -> float:
    positions = sum(len(p) + new_tokens + 1 for p in batch) + 1  # one arena (graphs need it), the scratch slot
    shape = KVShape.of(model)
    pool = KVPool(shape, Budget(positions * shape.bytes_per_position), arena_positions=positions)
    config = BatchingConfig(max_sessions_per_pass=len(batch), cuda_graphs=graphs)
    scheduler = Scheduler(model, pool, Device(1), config)  # one for both runs: the graphs stay captured

    async def run() -> None:
        sessions = [TargetSession(PooledSequence(pool.take(len(p) + new_tokens + 1), p), GREEDY,
                                  torch.Generator().manual_seed(i)) for i, p in enumerate(batch)]
        await asyncio.gather(*(scheduler.run(s.decode(new_tokens)) for s in sessions))
        for session in sessions:
            pool.give_back(session.sequence.region)
    asyncio.run(run())  # warm: the first passes allocate (and, on CUDA, capture the graphs)
    sync()
    start = time.perf_counter()
    asyncio.run(run())
    return len(batch) * new_tokens / (time.perf_counter() - start)


@torch.inference_mode()
def _static_batch(model: PreTrainedModel, tokenizer, batch: list[list[int]], new_tokens: int,
                  static_cache: bool = False) -> float:
    """``static_cache``: transformers' StaticCache, with which ``generate`` compiles the forward pass
    (torch.compile, mode reduce-overhead: CUDA graphs) on CUDA; the first, untimed call compiles."""
    width = max(map(len, batch))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)

    def generate():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, pad_token_id=pad, cache_implementation="static" if static_cache else None)
    generate()
    sync()
    start = time.perf_counter()
    generate()
    sync()
    return len(batch) * new_tokens / (time.perf_counter() - start)


def _looping(model: PreTrainedModel) -> PreTrainedModel:
    """The same model attending session by session (the CPU default), beside the gathered default."""
    import copy

    return use_pooled_attention(copy.deepcopy(model), gathered=False)


def smollm2_shaped(dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
    torch.manual_seed(0)
    return use_pooled_attention(LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE)).to(device, dtype).eval())


def run(zoo: Zoo, dtype: str, device: str, prompts: int, max_tokens: int, levels: tuple[int, ...],
        save: Callable[[dict], None] = lambda report: None) -> dict:
    """Every section in turn, ``save``d after each: a lease that ends mid-run still returns what ran
    (and ``report["seconds"]`` says what each section took, for sizing the next lease)."""
    engine = load_engine(zoo, dtype, device)
    target = engine.target
    some_draft = engine.drafts[zoo.default_draft(zoo.tasks[0])]
    report = {"facts": facts(target.device.type, dtype) | {"zoo": zoo.manifest["preset"]}, "seconds": {}}
    all_prompts = [p for task in zoo.tasks for p in zoo.prompts(task)]
    sections: list[tuple[str, Callable[[], object]]] = [
        ("pass_width", lambda: {"target": pass_widths(target), "draft": pass_widths(some_draft),
                                "target, attention loop": pass_widths(_looping(target), widths=(1, 5))}),
        ("speculation", lambda: speculation(engine, zoo, prompts, max_tokens)),
        ("concurrency", lambda: concurrency(target, engine.tokenizer, all_prompts, levels))]
    if target.device.type == "cuda":  # graphs last: a capture that fails must not spoil the sections above
        sections.insert(0, ("attention", lambda: attention_shapes(target)))
        sections.insert(1, ("bucketed", lambda: bucketed_passes(target, some_draft)))
        sections.append(("graphs", lambda: _graphs_and_smollm2(report, target, some_draft)))
    for name, section in sections:
        began = time.perf_counter()
        report[name] = section()
        report["seconds"][name] = round(time.perf_counter() - began, 1)
        save(report)
    return report


def _graphs_and_smollm2(report: dict, target: PreTrainedModel, draft: PreTrainedModel) -> dict:
    smol = smollm2_shaped(target.dtype, target.device)
    report["pass_width"]["SmolLM2-135M shape"] = pass_widths(smol, sessions=(1, 16))
    return {"zoo target": graph_replay(target), "zoo draft": graph_replay(draft), "SmolLM2-135M shape": graph_replay(smol)}


def format_report(report: dict) -> str:
    facts = report["facts"]
    lines = [f"# GPU report: {facts['device']}, {facts['dtype']}", "",
             ", ".join(f"{k} {v}" for k, v in facts.items()), ""]
    if "attention" in report:
        lines.append("## one query's attention per SDPA backend, ms a call: new key length each call / repeated")
        for name, row in report["attention"].items():
            lines.append(f"- {name}: " + (f"{row['fresh_ms']:.3f} / {row['repeated_ms']:.3f}" if "fresh_ms" in row
                                          else row["error"]))
        lines.append("")
    lines.append("seconds per section: " + ", ".join(f"{k} {v}" for k, v in report.get("seconds", {}).items()))
    lines.append("")
    for model, widths in report.get("pass_width", {}).items():
        lines.append(f"## one pass, ms: {model}")
        lines.append("tokens in one session's pass: " + ", ".join(f"{w}: {ms:.2f}" for w, ms in widths["width_ms"].items()))
        lines.append("sessions x tokens each: " + ", ".join(f"{s}: {ms:.2f}" for s, ms in widths["sessions_ms"].items()))
        lines.append("")
    if "bucketed" in report:
        lines.append("## the scheduler's passes, B sessions x q tokens each, ms: eager / bucketed (a graph's replay)")
        for key, row in report["bucketed"].items():
            if isinstance(row, dict):
                graphed = f"{row['bucketed_ms']:.3f}" if row["bucketed_ms"] is not None else "-"
                lines.append(f"- {key}: {row['eager_ms']:.3f} / {graphed}")
            elif row is not None:
                lines.append(f"- {key}: {row:.3f}" if isinstance(row, float) else f"- {key}: {row}")
        lines.append("")
    if "graphs" in report:
        lines.append("## one token's forward: eager against a CUDA graph's replay, ms")
        for model, row in report["graphs"].items():
            tail = f"graph {row['graph_ms']:.3f} ({row['speedup']:.1f}x)" if "graph_ms" in row else row["graph_error"]
            lines.append(f"- {model}: eager {row['eager_ms']:.3f}, {tail}")
        lines.append("")
    if "speculation" in report:
        lines += _speculation_table(report["speculation"])
    if "concurrency" in report:
        lines += _concurrency_table(report["concurrency"])
    return "\n".join(lines) + "\n"


def _speculation_table(rows: list[dict]) -> list[str]:
    lines = ["## speculation in one process (greedy, k = 4)",
              f"{'task':<6} {'proposer':<8} {'speedup':>7} {'alpha':>6} {'acc.rate':>8} {'tok/pass':>8} {'c':>6} "
              f"{'target ms':>9} {'tok/s off':>9} {'tok/s on':>8} identical"]
    for r in rows:
        c = f"{r['c']:.2f}" if r["c"] is not None else "-"
        lines.append(f"{r['task']:<6} {r['proposer']:<8} {r['speedup']:>6.2f}x {r['alpha']:>6.2f} "
                     f"{r['acceptance_rate']:>8.2f} {r['tokens_per_pass']:>8.2f} {c:>6} {r['target_ms']:>9.2f} {r['tok_s_off']:>9.0f} "
                     f"{r['tok_s_on']:>8.0f} {r['identical']}")
    return lines + [""]


def _concurrency_table(rows: list[dict]) -> list[str]:
    lines = ["## target-only throughput against concurrency, tokens/s: the scheduler (graphs where CUDA has them) "
             "against transformers' static batch with its static cache (compiled on CUDA); eager against eager",
             f"{'sessions':>8} {'scheduler':>10} {'static+compiled':>15} {'ratio':>6} {'eager':>8} {'static batch':>12} "
             f"{'eager ratio':>11}"]
    for r in rows:
        compiled = r.get("static_batch_compiled_tok_s")  # reports written before it was measured lack it
        lines.append(f"{r['sessions']:>8} {r['scheduler_tok_s']:>10.0f} "
                     f"{'-' if compiled is None else round(compiled):>15} "
                     f"{r['scheduler_tok_s'] / compiled if compiled else float('nan'):>5.2f}x "
                     f"{r['scheduler_eager_tok_s']:>8.0f} {r['static_batch_tok_s']:>12.0f} "
                     f"{r['scheduler_eager_tok_s'] / r['static_batch_tok_s']:>10.2f}x")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="specserve gpu-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", required=True, help="a built zoo's directory (e.g. ~/.cache/specserve/zoo/demo)")
    parser.add_argument("--out", required=True, help="folder for report.md and gpu.json")
    parser.add_argument("--dtype", default="bfloat16", help="the models' dtype (default: %(default)s)")
    parser.add_argument("--device", default="auto", help="auto (cuda when present), cuda or cpu (a dry run)")
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts per task (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default: %(default)s)")
    parser.add_argument("--sessions", default="1,4,16,64", help="concurrency levels (default: %(default)s)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(report: dict) -> None:
        (out / "gpu.json").write_text(json.dumps(report, indent=1, default=str))
        (out / "report.md").write_text(format_report(report))
    report = run(Zoo.open(Path(args.zoo).expanduser()), args.dtype, args.device, args.prompts, args.max_tokens,
                 tuple(map(int, args.sessions.split(","))), save)
    print(format_report(report), flush=True)


if __name__ == "__main__":
    main()
