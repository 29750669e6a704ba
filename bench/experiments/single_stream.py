"""One target-only stream on a real model, as a target replica decodes it, against llama.cpp.

Issue 30's goal: a replica's single stream at >= 0.8x llama.cpp on the same float32 weights, core
and thread count. Per round, on one pinned core with one thread, greedy, ``--tokens`` tokens after
the prompt (the prompt's pass is not timed, as ``llama-bench -p 0`` times generation alone):

    as loaded   the replica's scheduler (pooled passes), eager PyTorch, the weights as transformers loads them
    eager       the same with the weights stored as a model process serves them (``gemv_layout``)
    compiled    that with ``batching.compiled``: the decode pass under torch.compile
    llama.cpp   ``llama-bench -t 1 -n TOKENS -p 0`` on the model's GGUF requantised to F32 (with
                ``--llama-bench``; ``--llama-quantize`` makes the F32 file when it is missing)

Rounds alternate the three so that machine noise hits them alike; the report gives each one's
median tokens/s and the ratios. ``--profile`` adds the operators one step spends its time in,
eager and compiled (torch.profiler, self CPU time): where the gap to llama.cpp is.

    python -m specserve.bench.experiments.single_stream --target SmolLM2-135M-Instruct.Q4_1.gguf \\
        --llama-bench llama.cpp/build/bin/llama-bench --llama-quantize llama.cpp/build/bin/llama-quantize
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from specserve.bench.settings import REPLICA_CORE
from specserve.workers.sampling import SamplingParams
from specserve.workers.batching import Scheduler
from specserve.workers.config import BatchingConfig
from specserve.workers.graphs import WARM_UP_BUCKETS
from specserve.workers.grpc_host import Device
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.loading import ModelSpec, gemv_layout, load_model, load_tokenizer
from specserve.workers.prompt import encode_prompt
from specserve.workers.ragged_pass import PooledSequence, Segment, run_pass, use_pooled_attention
from specserve.workers.verifying import TargetSession

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test."
GOAL = 0.8  # of llama.cpp's tokens/s (issue 30)


class Stream:
    """A replica's scheduler over one model, eager or compiled, decoding one session at a time."""

    def __init__(self, model, prompt: list[int], tokens: int, compiled: bool) -> None:
        shape = KVShape.of(model)
        # Room for the stream and for the compiled passes' warm-up (else they compile in a timed round).
        room = max(len(prompt) + tokens + 2, max(keys for _, _, keys in WARM_UP_BUCKETS))
        self.pool = KVPool(shape, Budget(4 * room * shape.bytes_per_position))
        self.scheduler = Scheduler(model, self.pool, Device(1, (REPLICA_CORE,)), BatchingConfig(compiled=compiled))
        self.prompt, self.tokens = prompt, tokens
        self.compile_seconds = self.scheduler.graphs.warm_up() if compiled else 0.0

    def run(self) -> tuple[float, list[int]]:
        """Tokens/s of the decode after the prompt's pass, and the tokens."""
        async def decode() -> tuple[float, list[int]]:
            region = self.pool.take(len(self.prompt) + self.tokens + 2)
            session = TargetSession(PooledSequence(region, self.prompt), SamplingParams(), torch.Generator())
            first = (await self.scheduler.run(session.decode(1))).result  # the prompt's pass, untimed
            started = time.perf_counter()
            rest = (await self.scheduler.run(session.decode(self.tokens))).result
            seconds = time.perf_counter() - started
            self.pool.give_back(region)
            return self.tokens / seconds, [v.token for v in first + rest]
        return asyncio.run(decode())


def llama_tokens_per_second(binary: Path, gguf: Path, tokens: int) -> float:
    out = subprocess.run(["taskset", "-c", str(REPLICA_CORE), str(binary), "-m", str(gguf), "-t", "1", "-n", str(tokens),
                          "-p", "0", "-r", "2", "-o", "json"], capture_output=True, text=True, timeout=600, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def f32_gguf(source: Path, quantize: Path | None) -> Path:
    """The model's GGUF requantised to F32 beside it (llama.cpp then reads the weights we run)."""
    target = source.with_name(source.stem.split(".")[0] + ".F32.gguf")
    if not target.exists():
        if quantize is None:
            raise SystemExit(f"{target} is missing: pass --llama-quantize to make it from {source}")
        subprocess.run([str(quantize), "--allow-requantize", str(source), str(target), "F32"], check=True,
                       capture_output=True, timeout=600)
    return target


def profile(stream: Stream, steps: int = 16) -> list[dict]:
    """The operators ``steps`` decode passes spend their time in, by self CPU time (top 12): the
    passes the scheduler's device thread runs (``PassGraphs.run`` where compiled, else ``run_pass``),
    run here on this pinned thread, where the profiler sees them."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model, pool, graphs = stream.scheduler.model, stream.pool, stream.scheduler.graphs
    region = pool.take(len(stream.prompt) + steps + 2)
    run_pass(model, pool, [Segment(region, 0, stream.prompt, 1)])
    segments = [[Segment(region, len(stream.prompt) + i, [stream.prompt[-1]], 1)] for i in range(steps)]
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for segment in segments:
            if graphs is None or graphs.run(segment) is None:
                run_pass(model, pool, segment)
    pool.give_back(region)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return [{"op": e.key, "calls_per_step": e.count / steps, "share": e.self_cpu_time_total / total,
             "ms_per_step": e.self_cpu_time_total / 1000 / steps} for e in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.experiments.single_stream", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="the model: a GGUF file or a transformers directory")
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    parser.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench (leave out: no llama.cpp column)")
    parser.add_argument("--llama-quantize", type=Path, help="llama.cpp's llama-quantize, to make the F32 GGUF")
    parser.add_argument("--profile", action="store_true", help="add where one step's time goes, eager and compiled")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="parent of the run's folder")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {REPLICA_CORE})  # the start-up thread too: the compiler's processes inherit it

    target = Path(args.target)
    spec = ModelSpec(str(target), dtype="float32", device="cpu")
    loaded, model = (use_pooled_attention(load_model(spec)) for _ in range(2))
    model = gemv_layout(model)
    prompt = encode_prompt(load_tokenizer(str(target)), PROMPT)
    print("compiling the decode pass (minutes cold, seconds from inductor's cache) ...", flush=True)
    streams = {"as loaded": Stream(loaded, prompt, args.tokens, compiled=False),
               "eager": Stream(model, prompt, args.tokens, compiled=False),
               "compiled": Stream(model, prompt, args.tokens, compiled=True)}
    gguf = f32_gguf(target, args.llama_quantize) if args.llama_bench else None
    rates: dict[str, list[float]] = {name: [] for name in (*streams, *(["llama.cpp"] * bool(gguf)))}
    outputs = {}
    for round_ in range(args.rounds):
        for name, stream in streams.items():
            rate, outputs[name] = stream.run()
            rates[name].append(rate)
        if gguf:
            rates["llama.cpp"].append(llama_tokens_per_second(args.llama_bench, gguf, args.tokens))
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {r[-1]:.1f} tok/s" for n, r in rates.items()), flush=True)

    medians = {name: statistics.median(r) for name, r in rates.items()}
    report = {"target": str(target), "tokens": args.tokens, "rounds": args.rounds, "core": REPLICA_CORE, "threads": 1,
              "torch": torch.__version__, "tokens_per_second": rates, "median": medians,
              "compile_seconds": streams["compiled"].compile_seconds,
              "identical": outputs["as loaded"] == outputs["eager"] == outputs["compiled"]}
    if "llama.cpp" in medians:
        report["of_llama_cpp"] = {n: medians[n] / medians["llama.cpp"] for n in streams}
    if args.profile:
        report["profile"] = {name: profile(streams[name]) for name in ("eager", "compiled")}
    folder = args.out / (datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-single-stream")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(report, indent=1))
    text = format_report(report)
    (folder / "report.md").write_text(text)
    print(text + f"\nwritten to {folder}", flush=True)


def format_report(report: dict) -> str:
    lines = [f"# One target-only stream: {report['target']}", "",
             f"float32, core {report['core']}, {report['threads']} thread, greedy, {report['tokens']} tokens after "
             f"the prompt, {report['rounds']} alternating rounds; torch {report['torch']}; compiled in "
             f"{report['compile_seconds']:.0f} s; every path's tokens identical: {report['identical']}", "",
             "| path | tokens/s (median) | rounds | of llama.cpp |", "|---|---|---|---|"]
    for name, median in report["median"].items():
        share = report.get("of_llama_cpp", {}).get(name)
        lines.append(f"| {name} | {median:.1f} | {', '.join(f'{r:.1f}' for r in report['tokens_per_second'][name])} | "
                     + (f"{share:.2f}x (goal {GOAL}x)" if share is not None else "-") + " |")
    for name, rows in report.get("profile", {}).items():
        lines += ["", f"## where a {name} step goes (self CPU time)", "", "| operator | calls a step | ms a step | share |",
                  "|---|---|---|---|"]
        lines += [f"| `{r['op']}` | {r['calls_per_step']:.0f} | {r['ms_per_step']:.2f} | {r['share']:.0%} |" for r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
