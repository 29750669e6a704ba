"""`specserve demo`: the demo zoo served, and what each task's draft achieves (``cluster/demo.py``)."""

from __future__ import annotations

import argparse
import logging

from specserve.workers.request import DEFAULT_K

from .common import add_zoo_argument


def register(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser("demo", help="build the demo zoo and show speculative decoding per task",
                               description="Build or reuse the demo zoo, start the service on an embedded cluster, "
                                           "decode held-out prompts of every task over gRPC with and without "
                                           "speculation, print what each draft achieved, and stop the cluster.")
    add_zoo_argument(demo)
    demo_where = demo.add_mutually_exclusive_group()
    demo_where.add_argument("--in-process", action="store_true", help="run the models in this process instead")
    demo_where.add_argument("--address", metavar="HOST:PORT", help="use a running service (serving the same zoo)")
    demo.add_argument("--prompts", type=int, default=4, help="held-out prompts per task (default: %(default)s)")
    demo.add_argument("--max-tokens", type=int, default=64, help="(default: %(default)s)")
    demo.add_argument("--k", type=int, default=DEFAULT_K, help="(default: %(default)s)")
    demo.add_argument("--variants", action="store_true",
                      help="also a row per task for Medusa heads and an MTP module of the zoo's target and a draft "
                           "of another tokenizer (distilled beside the zoo on first use: a few minutes each on the "
                           "demo zoo), and for the task's draft under prompt lookup (a cascade)")
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    if args.prompts < 1 or args.max_tokens < 1:
        raise ValueError(f"--prompts and --max-tokens must be >= 1, got {args.prompts} and {args.max_tokens}")
    if not args.verbose:  # the table is the output; Serve's progress lines are noise beside it
        logging.getLogger("ray.serve").setLevel(logging.WARNING)

    run_demo(args.zoo, prompts_per_task=args.prompts, max_tokens=args.max_tokens, k=args.k,
             in_process=args.in_process, address=args.address, variants=args.variants)
    return 0
