"""`specserve shared-prefix`: many short questions behind one long system prompt, the workload
prefix caching is for, through the service with the cache on and off (workers/prefix_cache.py).

For each setting (on, then off: a service each, same zoo, same prompts), at each level of clients
and each path (OFF: target-only; AUTO: the routing policy's choice), every client sends its
requests back to back: the system prompt and one of the zoo's held-out prompts. Measured: time to
first token (p50, p90), throughput, and the cache's hit rate (prompt tokens whose keys were copied
rather than computed, from the workers' own counters: target replicas and draft workers apart).
Greedy outputs with the cache on are checked against those with it off, token for token.

    specserve shared-prefix [--zoo demo] [--clients 1,16] [--paths off,auto] [--system-tokens 320]
"""

from __future__ import annotations

import argparse
import copy
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import grpc

from specserve.cluster.bringup import merge_into, start_service
from specserve.cluster.demo import ensure_zoo
from specserve.cluster.zoo.head import HEAD
from specserve.cluster.zoo.zoo import Zoo
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.proto.v1 import specserve_pb2_grpc as rpc
from specserve.workers import stats

from .cli import known_paths, module_main, workload_arguments, workload_overrides
from .commands import SHARED_PREFIX
from .faults import inspect
from .settings import RESULTS_DIR, provenance

# off: target-only; auto: the policy's choice; eagle3: the EAGLE-3 head (its target session hands it
# hidden states from the end of the cached prefix on: the head's context is shorter with the cache).
PATHS = {"off": pb.SPECULATION_OFF, "auto": pb.SPECULATION_AUTO, HEAD: pb.SPECULATION_ON}
SETTINGS = ("on", "off")  # the prefix cache
GOAL_TTFT = 3.0  # the bar: time to first token at least this many times lower with the cache, 16 clients
GOAL_HIT_POINTS = 1.0  # ...and the hit rate with speculation at most this many points below target-only's


@dataclass(frozen=True)
class SharedPrefixSettings:
    zoo: str = "demo"
    clients: tuple[int, ...] = (1, 16)
    paths: tuple[str, ...] = ("off", "auto")
    system_tokens: int = 320  # the shared system prompt, about (the demo target's context is 512)
    requests: int = 48  # per level and path
    max_tokens: int = 32
    out: Path = RESULTS_DIR
    # Fields of the service's config over the bench's own (--sim, --set: workers/sim_device.py's
    # simulated devices, a fleet of replicas)
    service_overrides: dict = field(default_factory=dict)


@dataclass(kw_only=True)
class Throughput:
    """What ``run_level`` measures of a level's requests (a workload bench's level adds its own)."""

    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    accepted: int = 0  # draft tokens the target kept over the level's requests
    passes: int = 0  # target passes (verify steps) over the level's requests
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return stats.tokens_per_pass(self.accepted, self.passes)


@dataclass
class Level(Throughput):
    cache: str
    path: str
    clients: int
    # Prompt tokens and reused tokens over the level, by worker kind (target, draft).
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    reused_tokens: dict[str, int] = field(default_factory=dict)

    def ttft_ms(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def hit_rate(self, kind: str) -> float:
        prompt = self.prompt_tokens.get(kind, 0)
        return self.reused_tokens.get(kind, 0) / prompt if prompt else 0.0


def system_prompt(zoo: Zoo, tokens: int) -> str:
    """About ``tokens`` tokens of the zoo's own held-out text, every task's, as one preamble."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(zoo.root / "tokenizer")
    text = ""
    for prompt in (p for task in zoo.tasks for p in zoo.prompts(task)[8:]):
        text += prompt + "\n"
        if len(tokenizer(text)["input_ids"]) >= tokens:
            break
    ids = tokenizer(text)["input_ids"][:tokens]
    return tokenizer.decode(ids) + "\n"


def questions(zoo: Zoo) -> list[tuple[str, str]]:
    return [(task, p) for task in zoo.tasks for p in zoo.prompts(task)[:8]]


def worker_counters(stub: rpc.SpecServeStub) -> dict[str, tuple[int, int]]:
    """kind -> (prompt tokens, reused tokens) summed over the service's workers, from each one's Inspect."""
    totals: dict[str, tuple[int, int]] = {}
    for worker in stub.GetStats(pb.GetStatsRequest()).workers:
        state = inspect(worker.kind, worker.address)
        prompt, reused = totals.get(worker.kind, (0, 0))
        totals[worker.kind] = (prompt + state.prefix_prompt_tokens, reused + state.prefix_reused_tokens)
    return totals


async def run_level(address: str, requests: list[pb.GenerateRequest], clients: int,
                    level: Throughput) -> list[list[int]]:
    outputs: list[list[int]] = [[] for _ in requests]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rpc.SpecServeStub(channel)

        async def client(i: int) -> None:
            for n in range(i, len(requests), clients):
                start = time.perf_counter()
                async for chunk in stub.GenerateStream(requests[n]):
                    if not outputs[n]:
                        level.ttft.append(time.perf_counter() - start)
                    outputs[n].extend(chunk.token_ids)
                    if chunk.finish_reason:
                        level.passes += chunk.stats.target_passes
                        level.accepted += chunk.stats.accepted_tokens
                level.tokens += len(outputs[n])

        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        level.seconds = time.perf_counter() - start
    return outputs


def measure(zoo: Zoo, settings: SharedPrefixSettings, cache: str, system: str, progress) -> tuple[list[Level], dict]:
    room = {"prefix_caching": cache == "on", "max_sessions": 2 * max(settings.clients)}
    overrides = {"models": {"zoo": str(zoo.root)}, "target": dict(room), "draft_pool": dict(room),
                 "router": {"max_concurrent_requests": 2 * max(settings.clients), "http_port": None}}
    merge_into(overrides, copy.deepcopy(settings.service_overrides))
    service = start_service(port=0, overrides=overrides)
    levels, outputs = [], {}
    asked = questions(zoo)
    try:
        with grpc.insecure_channel(service.address) as channel:
            stub = rpc.SpecServeStub(channel)
            for clients in settings.clients:
                for path in settings.paths:
                    requests = [pb.GenerateRequest(prompt=system + q, task=task, max_tokens=settings.max_tokens,
                                                   speculation=PATHS[path], draft=HEAD if path == HEAD else "")
                                for task, q in (asked[n % len(asked)] for n in range(settings.requests))]
                    level = Level(cache, path, clients)
                    before = worker_counters(stub)
                    got = asyncio.run(run_level(service.address, requests, clients, level))
                    after = worker_counters(stub)
                    for kind in after:
                        was = before.get(kind, (0, 0))
                        level.prompt_tokens[kind] = after[kind][0] - was[0]
                        level.reused_tokens[kind] = after[kind][1] - was[1]
                    outputs[f"{path} {clients}"] = got
                    levels.append(level)
                    progress(level)
    finally:
        service.stop()
    return levels, outputs


def report(levels: list[Level], identical: dict[str, list[int]], settings: SharedPrefixSettings, command: str,
           system_tokens: int) -> tuple[str, list[dict]]:
    by = {(lv.cache, lv.path, lv.clients): lv for lv in levels}
    lines = [f"# Shared prefix: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             f"Command: `{command}`. A system prompt of {system_tokens} tokens before each of the zoo's held-out "
             f"prompts, {settings.requests} requests per level and path, {settings.max_tokens} tokens each, greedy. "
             f"Hit rate: of the prompt tokens the workers took, those copied from the cache rather than computed.", "",
             "| cache | path | clients | TTFT p50 ms | TTFT p90 ms | tokens/s | tokens/pass | target hit rate | draft hit rate |",
             "|---|---|---|---|---|---|---|---|---|"]
    for lv in levels:
        lines.append(f"| {lv.cache} | {lv.path} | {lv.clients} | {lv.ttft_ms(0.5):.1f} | {lv.ttft_ms(0.9):.1f} | "
                     f"{lv.tokens_per_second:,.0f} | {lv.tokens_per_pass:.2f} | {100 * lv.hit_rate('target'):.1f}% | "
                     f"{100 * lv.hit_rate('draft'):.1f}% |")
    lines += ["", "## Cache on over off", "", "| path | clients | TTFT p50 off / on | tokens/s on / off |", "|---|---|---|---|"]
    goals = []
    for path in settings.paths:
        for clients in settings.clients:
            on, off = by.get(("on", path, clients)), by.get(("off", path, clients))
            if on is None or off is None:
                continue
            ttft = off.ttft_ms(0.5) / max(on.ttft_ms(0.5), 1e-9)
            speed = on.tokens_per_second / max(off.tokens_per_second, 1e-9)
            lines.append(f"| {path} | {clients} | {ttft:.2f}x | {speed:.2f}x |")
            if clients == 16:
                goals.append({"name": f"{path}, 16 clients: TTFT off / on >= {GOAL_TTFT:g}x", "measured": ttft,
                              "met": ttft >= GOAL_TTFT})
                goals.append({"name": f"{path}, 16 clients: throughput on / off > 1", "measured": speed,
                              "met": speed > 1})
    for clients in settings.clients:
        on_off, on_auto = by.get(("on", "off", clients)), by.get(("on", "auto", clients))
        if on_off and on_auto:
            points = 100 * (on_off.hit_rate("target") - on_auto.hit_rate("target"))
            goals.append({"name": f"{clients} clients: target hit rate AUTO at most {GOAL_HIT_POINTS:g} point below "
                                  f"OFF (points below)", "measured": points, "met": points <= GOAL_HIT_POINTS})
    lines += summary_lines(goals, "Greedy outputs with the cache on identical to those with it off", identical)
    return "\n".join(lines) + "\n", goals


def summary_lines(goals: list[dict], compared: str, identical: dict[str, list[int]]) -> list[str]:
    """A workload report's end: each goal met or missed, then how many greedy outputs matched."""
    return (["", "## Goals", ""] + [f"- {g['name']}: {g['measured']:.2f}, {'met' if g['met'] else 'missed'}"
                                    for g in goals]
            + ["", f"{compared}: " + ", ".join(f"{key} {same}/{total}" for key, (same, total) in identical.items())
               + "."])


def run(settings: SharedPrefixSettings, command: str) -> Path:
    zoo = ensure_zoo(settings.zoo)
    system = system_prompt(zoo, settings.system_tokens)
    when = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = settings.out / f"{when}-shared-prefix"
    print(f"shared prefix: zoo {zoo.root}; clients {settings.clients} x paths {settings.paths}, cache on then off",
          flush=True)

    def progress(lv: Level) -> None:
        print(f"  cache {lv.cache:3s} {lv.path:4s} {lv.clients:3d} clients: TTFT p50 {lv.ttft_ms(0.5):7.1f} ms, "
              f"{lv.tokens_per_second:7,.0f} tok/s, hit rate target {100 * lv.hit_rate('target'):5.1f}% "
              f"draft {100 * lv.hit_rate('draft'):5.1f}%", flush=True)

    levels, outputs = [], {}
    for cache in SETTINGS:
        got, outputs[cache] = measure(zoo, settings, cache, system, progress)
        levels += got
    identical = {key: [sum(a == b for a, b in zip(on, outputs["off"][key], strict=True)), len(on)]
                 for key, on in outputs["on"].items()}  # greedy: the target's tokens, whichever drafted them
    write(out, levels, identical, settings, command)
    return out


def write(out: Path, levels: list[Level], identical: dict[str, list[int]], settings: SharedPrefixSettings,
          command: str, origin: dict | None = None) -> None:
    """The run's report and results (``origin``: a past run's provenance, when written again)."""
    text, goals = report(levels, identical, settings, command, settings.system_tokens)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(json.dumps({
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
        "command": command, "provenance": origin or provenance(), "levels": [asdict(lv) | {"ttft_p50_ms": lv.ttft_ms(0.5), "ttft_p90_ms": lv.ttft_ms(0.9),
                                                     "tokens_per_second": lv.tokens_per_second,
                                                     "mean_ttft_ms": 1000 * statistics.fmean(lv.ttft or [0])}
                                       for lv in levels],
        "identical": identical, "goals": goals}, indent=1))
    print(text, flush=True)
    print(f"written to {out}", flush=True)


def rerender(out: Path) -> None:
    """A past run's report again from its results.json (measuring nothing)."""
    saved = json.loads((out / "results.json").read_text())
    fields = set(Level.__dataclass_fields__)
    levels = [Level(**{k: v for k, v in lv.items() if k in fields}) for lv in saved["levels"]]
    s = saved["settings"]
    settings = SharedPrefixSettings(**(s | {"clients": tuple(s["clients"]), "paths": tuple(s["paths"]),
                                            "out": Path(s["out"])}))
    write(out, levels, saved["identical"], settings, saved["command"], saved.get("provenance"))


def register(commands: argparse._SubParsersAction) -> None:
    """Adds `specserve shared-prefix` (the ``specserve.commands`` entry point of that name)."""
    d = SharedPrefixSettings()
    parser = commands.add_parser(
        SHARED_PREFIX.name, help=SHARED_PREFIX.help,
        description="Through the service on a zoo, with the prefix cache on and then off: a system prompt of about "
                    "--system-tokens tokens before each held-out prompt, at each level of clients, target-only "
                    "(off) and routed (auto). Reports time to first token, throughput, the cache's hit rate on "
                    "target replicas and draft workers, and whether greedy outputs match with and without it.")
    workload_arguments(parser, d, PATHS)
    parser.add_argument("--system-tokens", type=int, default=d.system_tokens,
                        help="the shared system prompt's length in tokens, about (default: %(default)s)")
    parser.add_argument("--rerender", type=Path, metavar="RUN_DIR",
                        help="measure nothing: write a past run's report again from its results.json")
    parser.set_defaults(run=_run_command)


def _run_command(args: argparse.Namespace) -> int:
    if args.rerender:
        rerender(args.rerender)
        return 0
    settings = SharedPrefixSettings(zoo=args.zoo, clients=tuple(args.clients), paths=known_paths(args.paths, PATHS),
                                    system_tokens=args.system_tokens, requests=args.requests,
                                    max_tokens=args.max_tokens, out=args.out,
                                    service_overrides=workload_overrides(args))
    run(settings, "specserve shared-prefix " + " ".join(sys.argv[2:]))
    return 0


if __name__ == "__main__":
    module_main(register, "shared-prefix")
