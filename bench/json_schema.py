"""`specserve json-schema`: structured output's cost to speculation, through the service.

One service on a zoo. At each level of clients and each path (OFF: target-only; AUTO: the routing
policy's choice; or a named draft), the zoo's held-out prompts, asking for JSON, go twice: free,
and constrained to a JSON schema (workers/grammar.py). Measured: throughput, tokens per target
pass, and, constrained, the share of outputs that parse and follow the schema. The speedup of a
path is its throughput over OFF's at the same level and mode, so the goal compares speculation's
speedup constrained with its speedup free on the same prompts. Greedy outputs of every path are
checked against OFF's, token for token (the constrained target's, whichever proposer drafted).

    specserve json-schema [--zoo demo] [--clients 1,16] [--paths off,auto] [--requests 32]
"""

from __future__ import annotations

import argparse
import copy
import asyncio
import json
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
from transformers import AutoTokenizer

from specserve.cluster.bringup import merge_into, start_service
from specserve.cluster.demo import ensure_zoo
from specserve.cluster.zoo.zoo import Zoo
from specserve.proto.v1 import specserve_pb2 as pb

from .cli import known_paths, module_main, workload_arguments, workload_overrides
from .commands import JSON_SCHEMA
from .prompts import JSON_ASK
from .settings import RESULTS_DIR, provenance
from .shared_prefix import Throughput, run_level, summary_lines

PATHS = {"off": pb.SPECULATION_OFF, "auto": pb.SPECULATION_AUTO, "on": pb.SPECULATION_ON}
MODES = ("free", "json")
GOAL_KEPT = 0.9  # constrained, speculation keeps at least this share of its free speedup
# Every value bounded, so that an output ends well within max_tokens whatever the model writes.
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["task", "answer", "confidence", "tags"],
          "properties": {"task": {"enum": ["code", "sql", "math", "prose"]},
                         "answer": {"type": "string", "maxLength": 48},
                         "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
                         "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 12}}}}


@dataclass(frozen=True)
class JsonSchemaSettings:
    zoo: str = "demo"
    clients: tuple[int, ...] = (1, 16)
    paths: tuple[str, ...] = ("off", "auto")
    requests: int = 32  # per level, path and mode
    max_tokens: int = 192  # above the schema's longest output (about 170 tokens of single characters)
    out: Path = RESULTS_DIR
    # Fields of the service's config over the bench's own (--sim, --set: workers/sim_device.py's
    # simulated devices, a fleet of replicas)
    service_overrides: dict = field(default_factory=dict)


@dataclass
class Level(Throughput):
    mode: str
    path: str
    clients: int
    valid: int = 0  # outputs that parse and follow the schema (json mode)
    outputs: int = 0


def follows_schema(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def measure(zoo: Zoo, settings: JsonSchemaSettings, progress) -> tuple[list[Level], dict[str, list[list[int]]]]:
    room = {"max_sessions": 2 * max(settings.clients)}
    overrides = {"models": {"zoo": str(zoo.root)}, "target": dict(room), "draft_pool": dict(room),
                 "router": {"max_concurrent_requests": 2 * max(settings.clients), "http_port": None}}
    tokenizer = AutoTokenizer.from_pretrained(zoo.root / "tokenizer")
    asked = [(task, p) for task in zoo.tasks for p in zoo.prompts(task)[:8]]
    structured = pb.StructuredOutput(json_schema=json.dumps(SCHEMA))
    merge_into(overrides, copy.deepcopy(settings.service_overrides))
    service = start_service(port=0, overrides=overrides)
    levels, outputs = [], {}
    try:
        for clients in settings.clients:
            for mode in MODES:
                for path in settings.paths:
                    requests = [pb.GenerateRequest(prompt=q + JSON_ASK, task=task, max_tokens=settings.max_tokens,
                                                   speculation=PATHS[path],
                                                   structured_output=structured if mode == "json" else None)
                                for task, q in (asked[n % len(asked)] for n in range(settings.requests))]
                    level = Level(mode, path, clients)
                    got = asyncio.run(run_level(service.address, requests, clients, level))
                    level.outputs = len(got)
                    level.valid = sum(follows_schema(tokenizer.decode(ids)) for ids in got) if mode == "json" else 0
                    outputs[f"{mode} {path} {clients}"] = got
                    levels.append(level)
                    progress(level)
    finally:
        service.stop()
    return levels, outputs


def report(levels: list[Level], identical: dict[str, list[int]], settings: JsonSchemaSettings,
           command: str) -> tuple[str, list[dict]]:
    by = {(lv.mode, lv.path, lv.clients): lv for lv in levels}
    lines = [f"# JSON schema: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             f"Command: `{command}`. The zoo's held-out prompts asking for JSON, {settings.requests} requests per "
             f"level, path and mode, at most {settings.max_tokens} tokens, greedy; json: constrained to a schema "
             f"of four bounded fields (bench/json_schema.py). Speedup: tokens/s over OFF's at the same level and "
             f"mode.", "",
             "| mode | path | clients | tokens/s | tokens/pass | speedup | valid JSON |", "|---|---|---|---|---|---|---|"]
    for lv in levels:
        off = by.get((lv.mode, "off", lv.clients))
        speedup = lv.tokens_per_second / off.tokens_per_second if off and off.tokens_per_second else 0.0
        valid = f"{lv.valid}/{lv.outputs}" if lv.mode == "json" else "-"
        lines.append(f"| {lv.mode} | {lv.path} | {lv.clients} | {lv.tokens_per_second:,.0f} | "
                     f"{lv.tokens_per_pass:.2f} | {speedup:.2f}x | {valid} |")
    goals = []
    for lv in levels:
        if lv.mode == "json":
            goals.append({"name": f"{lv.path}, {lv.clients} clients: outputs that parse and follow the schema",
                          "measured": lv.valid / max(lv.outputs, 1), "met": lv.valid == lv.outputs})
    for path in (p for p in settings.paths if p != "off"):
        for clients in settings.clients:
            cells = [by.get((mode, p, clients)) for mode in MODES for p in (path, "off")]
            if None in cells or not all(c.tokens_per_second for c in cells):
                continue
            free, free_off, json_on, json_off = cells
            free_speedup = free.tokens_per_second / free_off.tokens_per_second
            json_speedup = json_on.tokens_per_second / json_off.tokens_per_second
            kept = json_speedup / free_speedup
            goals.append({"name": f"{path}, {clients} clients: constrained speedup {json_speedup:.2f}x over free "
                                  f"{free_speedup:.2f}x, kept >= {GOAL_KEPT:g}", "measured": kept,
                          "met": kept >= GOAL_KEPT})
    lines += summary_lines(goals, "Greedy outputs identical to OFF's at the same level and mode", identical)
    return "\n".join(lines) + "\n", goals


def run(settings: JsonSchemaSettings, command: str) -> Path:
    zoo = ensure_zoo(settings.zoo)
    out = settings.out / f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-json-schema"
    print(f"json schema: zoo {zoo.root}; clients {settings.clients} x modes {MODES} x paths {settings.paths}",
          flush=True)

    def progress(lv: Level) -> None:
        valid = f", valid {lv.valid}/{lv.outputs}" if lv.mode == "json" else ""
        print(f"  {lv.mode:4s} {lv.path:4s} {lv.clients:3d} clients: {lv.tokens_per_second:7,.0f} tok/s, "
              f"{lv.tokens_per_pass:.2f} tokens/pass{valid}", flush=True)

    levels, outputs = measure(zoo, settings, progress)
    identical = {}
    for key, got in outputs.items():
        mode, path, clients = key.split()
        if path != "off":
            base = outputs[f"{mode} off {clients}"]
            identical[key] = [sum(a == b for a, b in zip(got, base, strict=True)), len(got)]
    text, goals = report(levels, identical, settings, command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(json.dumps({
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
        "command": command, "provenance": provenance(), "schema": SCHEMA,
        "levels": [asdict(lv) | {"tokens_per_second": lv.tokens_per_second} for lv in levels],
        "identical": identical, "goals": goals}, indent=1))
    print(text, flush=True)
    print(f"written to {out}", flush=True)
    return out


def register(commands: argparse._SubParsersAction) -> None:
    """Adds `specserve json-schema` (the ``specserve.commands`` entry point of that name)."""
    d = JsonSchemaSettings()
    parser = commands.add_parser(
        JSON_SCHEMA.name, help=JSON_SCHEMA.help,
        description="Through the service on a zoo: the held-out prompts asking for JSON, free and constrained to a "
                    "JSON schema, at each level of clients and path. Reports throughput, tokens per pass, the "
                    "share of valid JSON, the speedup each path keeps under the schema, and greedy identity.")
    workload_arguments(parser, d, PATHS, "; off is always measured")
    parser.set_defaults(run=_run_command)


def _run_command(args: argparse.Namespace) -> int:
    paths = ("off",) + tuple(p for p in known_paths(args.paths, PATHS) if p != "off")
    settings = JsonSchemaSettings(zoo=args.zoo, clients=tuple(args.clients), paths=paths, requests=args.requests,
                                  max_tokens=args.max_tokens, out=args.out,
                                  service_overrides=workload_overrides(args))
    run(settings, "specserve json-schema " + " ".join(sys.argv[2:]))
    return 0


if __name__ == "__main__":
    module_main(register, "json-schema")
