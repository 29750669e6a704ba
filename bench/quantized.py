"""Quantized drafts in process, beside their float selves: each task's draft model as stored and with
int8 weights (workers/quantization.py), against target-only, alternating prompt by prompt on one
engine so the machine's drift falls on every path alike.

    .venv/bin/specserve quantized-drafts --zoo demo

Per draft: its weight bytes each way, alpha (accepted / (accepted + rejections)), tokens a target
pass and the speedup over target-only; every output is checked against target-only's. It writes
``quantized.json`` and ``quantized.md`` under a results folder of its own.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from specserve.cluster.local import open_zoo, zoo_engine
from specserve.workers.loading import ModelSpec
from specserve.workers.quantization import INT8, weight_bytes
from specserve.workers.request import GenerationParams

from .settings import RESULTS_DIR, provenance

PATHS = ("off", "float", INT8)


@dataclass(frozen=True)
class QuantizedSettings:
    zoo: str = "demo"
    tasks: tuple[str, ...] = ()  # empty: the zoo's
    prompts: int = 6  # held-out prompts a task
    max_tokens: int = 64
    k: int = 4
    out: Path = RESULTS_DIR


def measure(settings: QuantizedSettings, say=print) -> dict:
    """Per task's draft model, per path: weight bytes, seconds, tokens, passes, accepted, rejections,
    and whether every output was target-only's."""
    zoo = open_zoo(settings.zoo)
    tasks = settings.tasks or zoo.tasks
    drafts = sorted({zoo.default_draft(task) for task in tasks})
    engine = zoo_engine(zoo, drafts, extra={f"{d}-{INT8}": ModelSpec(str(zoo.draft_dir(d)), quantize=INT8)
                                            for d in drafts})
    rows = {}
    for task in tasks:
        draft = zoo.default_draft(task)
        served = {"off": None, "float": draft, INT8: f"{draft}-{INT8}"}
        figures = {path: {"seconds": 0.0, "tokens": 0, "passes": 0, "accepted": 0, "rejections": 0, "identical": True}
                   for path in PATHS}
        for prompt in zoo.prompts(task)[: settings.prompts]:
            reference = None
            for path in PATHS:
                params = GenerationParams(max_tokens=settings.max_tokens, k=settings.k, speculation=path != "off")
                start = time.perf_counter()
                done = engine.generate(prompt, params, draft=served[path]).complete()
                row = figures[path]
                row["seconds"] += time.perf_counter() - start
                row["tokens"] += len(done.token_ids)
                row["passes"] += done.stats.target_passes
                row["accepted"] += done.stats.accepted
                row["rejections"] += done.stats.rejections
                reference = done.token_ids if reference is None else reference
                row["identical"] &= done.token_ids == reference
        off = figures["off"]["seconds"]
        rows[task] = {"draft_model": draft}
        for path in PATHS[1:]:
            f = figures[path]
            rows[task][path] = f | {
                "weight_bytes": weight_bytes(engine.drafts[served[path]]),
                "alpha": round(f["accepted"] / max(f["accepted"] + f["rejections"], 1), 3),
                "tokens_per_pass": round(f["tokens"] / max(f["passes"], 1), 2),
                "speedup": round(off / f["seconds"], 3)}
        say(f"{task} ({draft}): " + ", ".join(f"{p} alpha {rows[task][p]['alpha']} {rows[task][p]['speedup']}x"
                                              for p in PATHS[1:]))
    return rows


def report(rows: dict) -> str:
    lines = ["| task (draft) | weights float / int8 | alpha float / int8 | tok/pass float / int8 | "
             "speedup float / int8 | identical |", "|---|---|---|---|---|---|"]
    for task, row in rows.items():
        f, q = row["float"], row[INT8]
        mib = f"{f['weight_bytes'] / 2**20:.2f} / {q['weight_bytes'] / 2**20:.2f} MiB"
        lines.append(f"| {task} ({row['draft_model']}) | {mib} "
                     f"({f['weight_bytes'] / q['weight_bytes']:.1f}x fewer) | {f['alpha']} / {q['alpha']} | "
                     f"{f['tokens_per_pass']} / {q['tokens_per_pass']} | {f['speedup']}x / {q['speedup']}x | "
                     f"{'yes' if f['identical'] and q['identical'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    d = QuantizedSettings()
    parser = argparse.ArgumentParser(prog="specserve quantized-drafts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", default=d.zoo, help="a zoo preset name or directory (default: %(default)s)")
    parser.add_argument("--tasks", type=lambda s: tuple(s.split(",")), default=d.tasks, metavar="T,T",
                        help="(default: the zoo's)")
    parser.add_argument("--prompts", type=int, default=d.prompts, help="held-out prompts a task (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="(default: %(default)s)")
    parser.add_argument("-k", type=int, default=d.k, help="draft tokens a step (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=d.out, help="results directory (default: %(default)s)")
    args = parser.parse_args(argv)
    settings = QuantizedSettings(args.zoo, args.tasks, args.prompts, args.max_tokens, args.k, args.out)
    rows = measure(settings)
    out = settings.out / f"{time.strftime('%Y%m%d-%H%M%S')}-quantized"
    out.mkdir(parents=True, exist_ok=True)
    (out / "quantized.json").write_text(json.dumps({"settings": {k: str(v) for k, v in vars(settings).items()},
                                                    "provenance": provenance(), "rows": rows}, indent=2))
    table = report(rows)
    (out / "quantized.md").write_text(table)
    print(table + f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
