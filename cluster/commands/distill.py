"""`specserve distill`: a draft for one task distilled from your target and corpus, then measured."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from specserve.router.config import PolicyConfig
from specserve.router.cost_model import best_k
from specserve.workers.request import MAX_K
from specserve.workers.zoo.distill import USER_DISTILL_TOKENS, USER_DRAFT_BUDGET


def register(commands: argparse._SubParsersAction) -> None:
    distill = commands.add_parser("distill", help="distill a draft from a target on your own text",
                                  description="Distill a small draft for one task from a target model and corpus files, "
                                              "then measure it: its greedy acceptance on held-out documents of the "
                                              "corpus, its cost per token, and the speedup they predict.")
    distill.add_argument("--target", required=True, help="target model: a Hugging Face directory or a .gguf file")
    distill.add_argument("--task", required=True, help="the task the draft serves (a name of your choice)")
    distill.add_argument("--corpus", required=True, nargs="+", metavar="FILE", help="UTF-8 text files of that task")
    distill.add_argument("--out", required=True, type=Path, help="directory to write the draft to")
    distill.add_argument("--steps", type=int, default=USER_DRAFT_BUDGET.steps, help="optimiser steps (default: %(default)s)")
    distill.add_argument("--tokens", type=int, default=USER_DISTILL_TOKENS,
                         help="tokens labelled by the target (default: %(default)s)")
    distill.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    distill.add_argument("--init", choices=("target", "fresh"), default="target",
                         help="start from an early exit of the target (its embeddings, head and first layers) or "
                              "from a small fresh model (default: %(default)s)")
    distill.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from specserve.workers.zoo.distill import distill_to_directory

    if args.steps < 1 or args.tokens < 1:
        raise ValueError(f"--steps and --tokens must be >= 1, got {args.steps} and {args.tokens}")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; give a directory for the draft")
    budget = replace(USER_DRAFT_BUDGET, steps=args.steps)
    logging.getLogger("specserve").setLevel(logging.INFO)  # minutes of work: say what each stage does
    facts = distill_to_directory(args.target, args.task, args.corpus, str(args.out), budget=budget,
                                 distill_tokens=args.tokens, seed=args.seed, init=args.init)
    k, speedup = best_k(facts["held_out_alpha"], facts["cost_ratio"], 1, MAX_K)
    facts["expected_speedup"], facts["expected_k"] = round(speedup, 3), k
    print(json.dumps(facts))
    where = "held-out documents" if facts["held_out_documents"] else "its training text (one document only)"
    pays = PolicyConfig().resume_above  # what the routing policy needs before it speculates with a draft
    if speedup >= pays:
        verdict = "pays: the routing policy will serve the task with it"
    elif speedup > 1:
        verdict = (f"is about break-even (the policy speculates above {pays:g}x): expect the task to be served by the "
                   f"draft-free proposers or target-only; distill longer (--steps, --tokens) to do better")
    else:
        verdict = ("does NOT beat target-only: serve this task with the draft-free proposers (prompt lookup, suffix "
                   "decoding), or distill longer (--steps, --tokens) and measure again")
    print(f"draft {args.task}: acceptance {facts['held_out_alpha']:.2f} on {where}, cost {facts['cost_ratio']:.2f} of a "
          f"target step: expected {speedup:.2f}x at k={k} (drafting and verifying in turn); it {verdict}",
          file=sys.stderr)
    return 0
