"""Cascades in process, side by side: each task's draft alone, prompt lookup alone, and the draft
under prompt lookup (``cascade``, workers/drafting.py) at each ``--min-p``, against target-only,
alternating prompt by prompt on one engine so the machine's drift falls on every path alike.

    .venv/bin/specserve cascades --zoo demo --min-p 1.0,0.3,0.1

``--min-p`` is the probability from which the draft proposes a guess as it is (1: the draft's own
tokens only, the guesses saving its passes). Every output is checked against target-only's. It
writes ``cascade.json`` and ``cascade.md`` under a results folder of its own.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from specserve.cluster.commands.common import comma_floats, comma_ints
from specserve.cluster.local import open_zoo, zoo_engine
from specserve.workers.drafting import Cascade
from specserve.workers.proposer_kinds import CASCADE, NGRAM
from specserve.workers.request import CASCADE_GUESSES, GenerationParams

from .settings import RESULTS_DIR, provenance


@dataclass(frozen=True)
class CascadeSettings:
    zoo: str = "demo"
    tasks: tuple[str, ...] = ()  # empty: the zoo's
    prompts: int = 6  # held-out prompts a task
    max_tokens: int = 64
    k: int = 4
    cascade_k: tuple[int, ...] = ()  # the cascade's k, each compared (empty: k)
    guesses: int = CASCADE_GUESSES
    min_p: tuple[float, ...] = (1.0, 0.3, 0.1)
    out: Path = RESULTS_DIR


def paths(settings: CascadeSettings) -> list[str]:
    """off, draft, ngram, then ``cascade@MIN_P,k=K`` for each setting compared."""
    return ["off", "draft", NGRAM, *(f"{CASCADE}@{p:g},k={k}" for k in settings.cascade_k or (settings.k,)
                                     for p in settings.min_p)]


def measure(settings: CascadeSettings, say=print) -> dict:
    """Per task, per path: seconds, tokens, target passes and whether every output was target-only's."""
    zoo = open_zoo(settings.zoo)
    engine = zoo_engine(zoo, zoo.draft_names)
    rows = {}
    for task in settings.tasks or zoo.tasks:
        draft = zoo.default_draft(task)
        figures = {path: {"seconds": 0.0, "tokens": 0, "passes": 0, "accepted": 0, "identical": True}
                   for path in paths(settings)}
        for prompt in zoo.prompts(task)[: settings.prompts]:
            reference = None
            for path in paths(settings):
                name, _, how = path.partition("@")
                min_p, _, k = how.partition(",k=")
                engine.proposers.cascade = Cascade(settings.guesses, float(min_p or 1.0))
                params = GenerationParams(max_tokens=settings.max_tokens, k=int(k or settings.k),
                                          speculation=path != "off")
                start = time.perf_counter()
                done = engine.generate(prompt, params, draft=None if path == "off" else draft if path == "draft"
                                       else name, members=(draft,) if name == CASCADE else ()).complete()
                row = figures[path]
                row["seconds"] += time.perf_counter() - start
                row["tokens"] += len(done.token_ids)
                row["passes"] += done.stats.target_passes
                row["accepted"] += done.stats.accepted
                reference = done.token_ids if reference is None else reference
                row["identical"] &= done.token_ids == reference
        off = figures["off"]["seconds"]
        rows[task] = {"draft_model": draft} | {path: f | {"speedup": round(off / f["seconds"], 3),
                                                    "tokens_per_pass": round(f["tokens"] / max(f["passes"], 1), 2)}
                                         for path, f in figures.items()}
        say(f"{task} ({draft}): " + ", ".join(f"{path} {rows[task][path]['speedup']}x" for path in paths(settings)))
    return rows


def report(rows: dict, settings: CascadeSettings) -> str:
    shown = [p for p in paths(settings) if p != "off"]
    lines = ["| task (draft) | " + " | ".join(shown) + " |", "|---|" + "---|" * len(shown)]
    for task, row in rows.items():
        lines.append(f"| {task} ({row['draft_model']}) | " + " | ".join(
            f"{row[p]['speedup']}x ({row[p]['tokens_per_pass']}/pass{'' if row[p]['identical'] else ', DIFFERS'})"
            for p in shown) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    d = CascadeSettings()
    parser = argparse.ArgumentParser(prog="specserve cascades", description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", default=d.zoo, help="a zoo preset name or directory (default: %(default)s)")
    parser.add_argument("--tasks", type=lambda s: tuple(s.split(",")), default=d.tasks, metavar="T,T",
                        help="(default: the zoo's)")
    parser.add_argument("--prompts", type=int, default=d.prompts, help="held-out prompts a task (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="(default: %(default)s)")
    parser.add_argument("-k", type=int, default=d.k, help="draft tokens a step (default: %(default)s)")
    parser.add_argument("--cascade-k", type=comma_ints, default=d.cascade_k, metavar="K,K",
                        help="the cascade's k, each compared (default: -k)")
    parser.add_argument("--guesses", type=int, default=d.guesses,
                        help="prompt lookup's guesses a cascade verifies, at most (default: %(default)s)")
    parser.add_argument("--min-p", type=comma_floats, default=d.min_p, metavar="P,P",
                        help="the cascade's settings to compare (default: 1.0,0.3,0.1)")
    parser.add_argument("--out", type=Path, default=d.out, help="results directory (default: %(default)s)")
    args = parser.parse_args(argv)
    settings = CascadeSettings(args.zoo, args.tasks, args.prompts, args.max_tokens, args.k, tuple(args.cascade_k),
                               args.guesses, tuple(args.min_p), args.out)
    rows = measure(settings)
    out = settings.out / f"{time.strftime('%Y%m%d-%H%M%S')}-cascade"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cascade.json").write_text(json.dumps({"settings": {k: str(v) for k, v in vars(settings).items()},
                                                  "provenance": provenance(), "rows": rows}, indent=2))
    table = report(rows, settings)
    (out / "cascade.md").write_text(table)
    print(table + f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
