"""The `specserve` command line.

Every command validates its input through the same typed configs the service uses, so a bad flag
is answered with the same one-line message a gRPC client would get, and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from transformers.utils import logging as hf_logging

from specserve.workers.acceptance import SamplingParams
from specserve.workers.loading import ModelLoadError
from specserve.workers.request import DEFAULT_K, DEFAULT_MAX_TOKENS
from specserve.workers.zoo.distill import USER_DISTILL_TOKENS, USER_DRAFT_BUDGET

EXIT_USAGE = 2  # what argparse uses for bad arguments; ours match it
EXIT_INTERRUPTED = 130
SAMPLING_DEFAULTS = SamplingParams()  # the CLI's defaults are the request's, defined once there


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    hf_logging.disable_progress_bar()  # per-file "Loading weights" bars: noise next to our own output
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return args.run(args) or 0
    except BrokenPipeError:  # `specserve generate ... | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except (ValueError, OSError, ModelLoadError) as exc:  # input the user can fix (paths included)
        print(f"specserve: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("specserve: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specserve", description="Distributed speculative decoding on Ray: task-aligned drafts, target replicas, a gRPC router.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens (INFO level)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    generate = commands.add_parser("generate", help="generate text from a prompt",
                                   description="Generate text, with speculative decoding unless --speculation off.")
    generate.add_argument("--local", action="store_true",
                          help="run the models in this process (the only mode until the service lands)")
    _add_zoo_argument(generate)
    generate.add_argument("--prompt", required=True, help="the text to continue")
    generate.add_argument("--task", help="the prompt's task (code, sql, math, prose); picks the draft. Default: the general draft")
    generate.add_argument("--draft", help="use this draft instead of the task's")
    generate.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens to generate at most (default: %(default)s)")
    generate.add_argument("--temperature", type=float, default=SAMPLING_DEFAULTS.temperature,
                          help="0 is greedy (default: %(default)s)")
    generate.add_argument("--top-p", type=float, default=SAMPLING_DEFAULTS.top_p,
                          help="nucleus sampling mass in (0, 1] (default: %(default)s)")
    generate.add_argument("--top-k", type=int, default=SAMPLING_DEFAULTS.top_k,
                          help="sample among the k most likely tokens; 0 = all (default: %(default)s)")
    generate.add_argument("--seed", type=int, help="seed for sampling (default: random, reported in the stats)")
    generate.add_argument("--stop", action="append", default=[], help="stop when this string is generated (repeatable)")
    generate.add_argument("--k", type=int, default=DEFAULT_K, help="draft tokens proposed per target pass (default: %(default)s)")
    generate.add_argument("--speculation", choices=["on", "off"], default="on", help="off decodes with the target alone")
    generate.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    generate.set_defaults(run=_run_generate)

    zoo = commands.add_parser("zoo", help="the built-in model zoo").add_subparsers(dest="zoo_command", required=True, metavar="ACTION")
    build = zoo.add_parser("build", help="build (or reuse) a zoo of a target and its distilled drafts",
                           description="Train a tokenizer and a target on text every machine has, distill one draft per task "
                                       "and a general one, and write a manifest with held-out perplexity and acceptance rates.")
    build.add_argument("--preset", default="demo", help="tiny (seconds), demo (~5 min) or bench (~45 min) (default: %(default)s)")
    build.add_argument("--out", type=Path, help="directory (default: $SPECSERVE_HOME/zoo/PRESET, SPECSERVE_HOME defaulting to ~/.cache/specserve)")
    build.set_defaults(run=_run_zoo_build)

    distill = commands.add_parser("distill", help="distill a draft from a target on your own text",
                                  description="Distill a small draft for one task from a target model and corpus files.")
    distill.add_argument("--target", required=True, help="target model directory (Hugging Face format)")
    distill.add_argument("--task", required=True, help="the task the draft serves (a name of your choice)")
    distill.add_argument("--corpus", required=True, nargs="+", metavar="FILE", help="UTF-8 text files of that task")
    distill.add_argument("--out", required=True, type=Path, help="directory to write the draft to")
    distill.add_argument("--steps", type=int, default=USER_DRAFT_BUDGET.steps, help="optimiser steps (default: %(default)s)")
    distill.add_argument("--tokens", type=int, default=USER_DISTILL_TOKENS,
                         help="tokens labelled by the target (default: %(default)s)")
    distill.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    distill.set_defaults(run=_run_distill)

    demo = commands.add_parser("demo", help="build the demo zoo and show speculative decoding per task",
                               description="Build or reuse the demo zoo, decode held-out prompts of every task with and "
                                           "without speculation in this process, and print what each draft achieved.")
    _add_zoo_argument(demo)
    demo.add_argument("--prompts", type=int, default=4, help="held-out prompts per task (default: %(default)s)")
    demo.add_argument("--max-tokens", type=int, default=64, help="(default: %(default)s)")
    demo.add_argument("--k", type=int, default=DEFAULT_K, help="(default: %(default)s)")
    demo.set_defaults(run=_run_demo)
    return parser


def _add_zoo_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zoo", default="demo", help="a zoo preset name or a zoo directory (default: %(default)s)")


def _run_generate(args: argparse.Namespace) -> int:
    from specserve.workers.request import GenerationParams

    from .local import open_zoo, zoo_engine

    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    params = GenerationParams(max_tokens=args.max_tokens, sampling=sampling, seed=args.seed, stop=tuple(args.stop),
                              k=args.k, speculation=args.speculation == "on")
    zoo = open_zoo(args.zoo)
    draft = args.draft or (zoo.default_draft(args.task) if args.task else "general")
    zoo.draft_dir(draft)  # validates the name before any model loads
    engine = zoo_engine(zoo, [draft])
    generation = engine.generate(args.prompt, params, draft=draft)
    if args.json:
        done = generation.complete()
        print(json.dumps({"text": done.text, "token_ids": done.token_ids, "finish_reason": done.finish_reason,
                          "task": args.task, "draft": done.draft, "stats": done.stats.as_dict()}))
        return 0
    for chunk in generation:
        print(chunk.text, end="", flush=True)
    print()
    stats = generation.stats
    print(f"[{generation.output.finish_reason}; draft {generation.draft}; acceptance {stats.acceptance_rate:.2f}; "
          f"{stats.tokens_per_pass:.2f} tokens per target pass; seed {stats.seed}]", file=sys.stderr)
    return 0


def _run_zoo_build(args: argparse.Namespace) -> int:
    from specserve.workers.zoo.build import build_zoo
    from specserve.workers.zoo.presets import get_preset
    from specserve.workers.zoo.zoo import default_zoo_dir

    preset = get_preset(args.preset)
    out = args.out or default_zoo_dir(preset.name)
    logging.getLogger("specserve").setLevel(logging.INFO)  # a build is long: say what each stage did
    zoo = build_zoo(preset, out)
    print(f"zoo {preset.name} ready at {zoo.root}")
    return 0


def _run_distill(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from specserve.workers.zoo.distill import distill_to_directory

    if args.steps < 1 or args.tokens < 1:
        raise ValueError(f"--steps and --tokens must be >= 1, got {args.steps} and {args.tokens}")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; give a directory for the draft")
    budget = replace(USER_DRAFT_BUDGET, steps=args.steps)
    facts = distill_to_directory(args.target, args.task, args.corpus, str(args.out), budget=budget,
                                 distill_tokens=args.tokens, seed=args.seed)
    print(json.dumps(facts))
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.prompts < 1 or args.max_tokens < 1:
        raise ValueError(f"--prompts and --max-tokens must be >= 1, got {args.prompts} and {args.max_tokens}")

    run_demo(args.zoo, prompts_per_task=args.prompts, max_tokens=args.max_tokens, k=args.k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
