"""A draft of another tokenizer, two ways, side by side in one process: the token-level intersection
specserve serves (workers/token_bridge.py: the draft draws among the tokens the two share, q exact)
and conversion through text (the draft drafts its own tokens unmasked, and the text they decode to,
after the last committed target tokens, is encoded with the target's tokenizer and proposed with a
one-hot q: greedy only, as q of a target token is not computable exactly that way). Alternated
prompt by prompt against target-only on one engine; every output is checked against target-only's.

    .venv/bin/specserve bridge-modes --zoo demo --k 2,4

It writes ``bridge-modes.json`` and ``bridge-modes.md`` under a results folder of its own.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specserve.cluster.commands.common import comma_ints
from specserve.cluster.local import open_zoo
from specserve.cluster.zoo.other_tokenizer import OTHER_TOKENIZER, ensure_other_tokenizer_draft
from specserve.workers.drafting import DraftTokens
from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec
from specserve.workers.request import MAX_K, GenerationParams
from specserve.workers.token_bridge import TokenBridge

from .settings import RESULTS_DIR, provenance

# Committed target tokens the drafted text is encoded after: a BPE merges across a boundary by a
# token or two, so the proposal starts where the encoding of this tail and the text still agrees.
TAIL = 4
MODES = ("intersection", "text")


@dataclass(frozen=True)
class TextBridge(TokenBridge):
    """Conversion through text: the draft unmasked, its tokens' text re-encoded as the target's."""

    def proposal(self, drafted: DraftTokens, committed: Sequence[int] = ()) -> DraftTokens:
        if not drafted.ids:
            return drafted
        tail = list(committed[-TAIL:])
        ids = self.target.encode(self.target.decode(tail) + self.draft.decode(drafted.ids), add_special_tokens=False)
        if ids[: len(tail)] != tail:  # the text re-merged with a committed token: nothing to propose after it
            return DraftTokens.empty()
        # Every target token of the text, its last perhaps cut short (then the target rejects it).
        return DraftTokens.of_ids(ids[len(tail) :][: MAX_K - 1])


def text_bridge(bridge: TokenBridge) -> TextBridge:
    return TextBridge(bridge.target, bridge.draft, bridge.to_target, torch.zeros_like(bridge.mask), bridge.shared)


def measure(zoo_name: str, ks: tuple[int, ...], prompts: int, max_tokens: int, say=print,
            draft: Path | None = None, tasks: tuple[str, ...] = ()) -> dict:
    """Per task (``tasks``; empty: the zoo's), per path: speedup, tokens a target pass, acceptance,
    and whether every output was target-only's. ``draft``: the draft of another tokenizer (default:
    the zoo's, trained beside it on first use)."""
    zoo = open_zoo(zoo_name)
    draft = draft or ensure_other_tokenizer_draft(zoo)
    engine = SpecEngine.load(ModelSpec(str(zoo.target_dir)), {OTHER_TOKENIZER: ModelSpec(str(draft))})
    bridges = {"intersection": engine.bridges[OTHER_TOKENIZER], "text": text_bridge(engine.bridges[OTHER_TOKENIZER])}
    paths = ["off", *(f"{mode},k={k}" for k in ks for mode in MODES)]
    rows = {}
    for task in tasks or zoo.tasks:
        figures = {p: {"seconds": 0.0, "tokens": 0, "passes": 0, "proposed": 0, "accepted": 0, "identical": True}
                   for p in paths}
        for prompt in zoo.prompts(task)[:prompts]:
            reference = None
            for path in paths:
                mode, _, k = path.partition(",k=")
                params = GenerationParams(max_tokens=max_tokens, k=int(k or 1), speculation=path != "off")
                if path != "off":
                    engine.bridges[OTHER_TOKENIZER] = bridges[mode]
                start = time.perf_counter()
                done = engine.generate(prompt, params, draft=None if path == "off" else OTHER_TOKENIZER).complete()
                row = figures[path]
                row["seconds"] += time.perf_counter() - start
                row["tokens"] += len(done.token_ids)
                row["passes"] += done.stats.target_passes
                row["proposed"] += done.stats.proposed
                row["accepted"] += done.stats.accepted
                reference = done.token_ids if reference is None else reference
                row["identical"] &= done.token_ids == reference
        off = figures["off"]["seconds"]
        rows[task] = {p: f | {"speedup": round(off / f["seconds"], 3),
                              "tokens_per_pass": round(f["tokens"] / max(f["passes"], 1), 2),
                              "acceptance": round(f["accepted"] / max(f["proposed"], 1), 3)}
                      for p, f in figures.items()}
        say(f"{task}: " + ", ".join(f"{p} {rows[task][p]['speedup']}x (acc {rows[task][p]['acceptance']})"
                                    for p in paths[1:]))
    return rows


def report(rows: dict) -> str:
    paths = [p for p in next(iter(rows.values())) if p != "off"]
    lines = ["| task | " + " | ".join(paths) + " |", "|---|" + "---|" * len(paths)]
    for task, row in rows.items():
        lines.append(f"| {task} | " + " | ".join(
            f"{row[p]['speedup']}x ({row[p]['tokens_per_pass']}/pass, acc. {row[p]['acceptance']}"
            f"{'' if row[p]['identical'] else ', DIFFERS'})" for p in paths) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specserve bridge-modes", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--zoo", default="demo", help="a zoo preset name or directory (its draft of another "
                                                      "tokenizer is trained beside it on first use)")
    parser.add_argument("--k", type=comma_ints, default=(2, 4), metavar="K,K", help="draft tokens a step, each compared")
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts a task")
    parser.add_argument("--tasks", type=lambda s: tuple(s.split(",")), default=(), metavar="T,T",
                        help="(default: the zoo's)")
    parser.add_argument("--draft", type=Path, help="a draft of another tokenizer than the target's (default: the "
                                                   "zoo's, trained beside it on first use)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results directory")
    args = parser.parse_args(argv)
    rows = measure(args.zoo, tuple(args.k), args.prompts, args.max_tokens, draft=args.draft, tasks=args.tasks)
    out = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}-bridge-modes"
    out.mkdir(parents=True, exist_ok=True)
    (out / "bridge-modes.json").write_text(json.dumps({"settings": vars(args), "provenance": provenance(), "rows": rows},
                                                      indent=2, default=str))
    table = report(rows)
    (out / "bridge-modes.md").write_text(table)
    print(table + f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
