"""`specserve validate`: the command of ``cluster/validate.py``'s check, in this process or through a
running service (``--address``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from specserve.workers.request import DEFAULT_K, GenerationParams
from specserve.cluster.zoo.zoo import Zoo

from ..model_args import add_model_arguments, own_models, split_choice
from ..validate import validate
from ..validate_report import MIN_SAMPLES, Report, Settings
from ..validate_runs import ZOO_PROMPTS_PER_TASK, Prompt, engine_decoder, read_prompts, service_decoder
from .common import DEFAULT_ZOO, comma_floats

DESCRIPTION = """\
Prove on your own prompts that speculation changes nothing, and measure what it buys. Greedy: every
prompt decoded by the target alone and with speculation (each proposer its task may use: its drafts
and, unless you wrote the task table, prompt lookup `ngram` and suffix decoding `suffix`; or the one
--draft NAME picks, `tree` included) must give identical token ids. Sampled: at each temperature,
--samples outputs per prompt with speculation and as many without, each with its own seed, are
compared on their first --positions tokens: one permutation test of Pearson's chi-square per task,
draft and temperature (the task's prompts as strata; exact at any sample size), at a family-wise
alpha of --alpha (Bonferroni over the tests), so a lossless path fails at most that often. Also per
task and draft: acceptance, the cost ratio c, the expected (cost model) and the measured speedup.
Runs the models in this process (the zoo's, or --target with --draft NAME=SOURCE), or goes through a
running service (--address). Writes a JSON report (stdout, or --out) and a summary on stderr. Exit
status: 0 equivalent, 1 not equivalent (a greedy mismatch, or a sampled test that rejects), 2 bad
input."""

PROMPTS_HELP = ('the prompts: JSON lines, one {"prompt": ..., "task": ...} per line ("task" optional), or plain text, '
                "one prompt per line (a file whose first line starts with { is read as JSON lines). A prompt without "
                "a task takes --task TASK, else, in process, the default task (the zoo's general, or the first of "
                "--task TASK=... or --draft NAME=...); through a service it is classified. Default: "
                f"{ZOO_PROMPTS_PER_TASK} held-out prompts per task of the zoo")


def register(commands: argparse._SubParsersAction) -> None:
    d = Settings()
    parser = commands.add_parser("validate", help="prove on your prompts that speculation changes nothing; "
                                                  "measure acceptance and speedup", description=DESCRIPTION)
    parser.add_argument("--zoo", metavar="NAME_OR_DIR",
                        help=f"a zoo preset name or a zoo directory (default: {DEFAULT_ZOO}, unless --target)")
    add_model_arguments(parser, choosing=True)
    parser.add_argument("--address", metavar="HOST:PORT",
                        help="validate a running `specserve serve` (its own models) instead of models in this process")
    parser.add_argument("--prompts", type=Path, metavar="FILE", help=PROMPTS_HELP)
    parser.add_argument("--temperatures", type=comma_floats, default=d.temperatures, metavar="T,T",
                        help=f"sampling temperatures (default: {','.join(map(str, d.temperatures))})")
    parser.add_argument("--samples", type=int, default=d.samples,
                        help=f"samples per prompt, side (speculation on / off), draft and temperature; >= "
                             f"{MIN_SAMPLES} (default: %(default)s: about 4 minutes on the demo zoo's 8 prompts, "
                             f"each with 4 proposers)")
    parser.add_argument("--positions", type=int,
                        help="output tokens compared per sample (default: k + 2, a whole verify step and the next "
                             "token)")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens,
                        help="greedy output length per prompt (default: %(default)s)")
    parser.add_argument("--k", type=int, help=f"draft tokens per target pass (default: {DEFAULT_K} in process; "
                                              f"through a service, its policy's)")
    parser.add_argument("--alpha", type=float, default=d.family_alpha,
                        help="family-wise tolerance: a lossless path fails the sampled tests with at most this "
                             "probability (default: %(default)s)")
    parser.add_argument("--seed", type=int,
                        help="every request's seed derives from it, so a run in process is repeatable (default: a "
                             "fresh one, given in the report)")
    parser.add_argument("--threads", type=int, help="torch threads in this process (default: torch's)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the JSON report here (default: stdout)")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="when equivalent, write {task: {draft: greedy acceptance}} here: the routing policy's "
                             "starting point (`specserve serve --priors FILE`, or models.priors in the config)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    task, task_table = split_choice(args.task, "--task")
    draft, draft_sources = split_choice(args.draft, "--draft")
    own = own_models(args.target, draft_sources, task_table)
    k = DEFAULT_K if args.k is None and not args.address else args.k
    settings = Settings(temperatures=args.temperatures, samples=args.samples,
                        positions=(k or DEFAULT_K) + 2 if args.positions is None else args.positions,
                        max_tokens=args.max_tokens, seed=args.seed, family_alpha=args.alpha)
    if args.k is not None:
        GenerationParams(k=args.k)  # refuses what a request would refuse, with its message
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    for path in (args.out, args.profile):
        if path is not None and (path.is_dir() or not path.parent.is_dir()):
            raise ValueError(f"{path} must be a file in an existing directory")
    say = lambda line: print(f"validate: {line}", file=sys.stderr, flush=True)  # noqa: E731
    if args.address:
        report = _through_service(args, own, task, draft, k, settings, say)
    else:
        report = _in_process(args, own, task, draft, k, settings, say)
    doc = json.dumps(report.as_dict(), indent=2)
    if args.out:
        args.out.write_text(doc + "\n")
    else:
        print(doc)
    print(report.summary(), file=sys.stderr)
    if args.profile:
        if report.equivalent:
            args.profile.write_text(json.dumps(report.profile, indent=2) + "\n")
            print(f"profile written to {args.profile}: serve with --priors {args.profile}", file=sys.stderr)
        else:
            print(f"no profile written to {args.profile}: the pair is not equivalent", file=sys.stderr)
    return 0 if report.equivalent else 1


def _in_process(args, own, task, draft, k, settings, say) -> Report:
    from specserve.workers.engine import SpecEngine
    from specserve.workers.loading import ModelSpec

    from ..validate_models import local_arms, local_models

    models = local_models(args.zoo, own, task)
    prompts = _prompts(args.prompts, models.zoo)
    prompts, arms = local_arms(models, prompts, draft)
    proposers = {name for names in arms for name in names}
    used = sorted(models.models_for(prompts, arms))
    say(f"loading the target and drafts {', '.join(used) or '(none)'} in this process; proposers: "
        f"{', '.join(sorted(proposers))}")
    engine = SpecEngine.load(ModelSpec(models.target, threads=args.threads),
                             {name: ModelSpec(models.drafts[name], threads=args.threads) for name in used})
    return validate(engine_decoder(engine, k, models.members), prompts, arms, settings, say)


def _through_service(args, own, task, draft, k, settings, say) -> Report:
    from ..client import READY_TIMEOUT_SECONDS, SpecServeClient
    from ..local import open_zoo

    if own.given or args.threads:
        raise ValueError("--target, --draft/--task NAME=... and --threads load models in this process; a running "
                         "service (--address) serves its own")
    prompts = _prompts(args.prompts, open_zoo(args.zoo) if args.zoo else None)
    prompts = [p if p.task else replace(p, task=task) for p in prompts]
    client = SpecServeClient(args.address)
    try:
        client.wait_ready(READY_TIMEOUT_SECONDS, say)  # a starting service would measure target-only
        say(f"through the service at {args.address}")
        return validate(service_decoder(client, k), prompts, [[draft] for _ in prompts], settings, say)
    finally:
        client.close()


def _prompts(path: Path | None, zoo: Zoo | None) -> list[Prompt]:
    if path is not None:
        return read_prompts(path)
    if zoo is None:
        raise ValueError("give --prompts FILE (the zoo's held-out prompts are the default only for a zoo's models)")
    from ..validate_models import zoo_prompts

    return zoo_prompts(zoo)
