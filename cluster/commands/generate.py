"""`specserve generate`: one prompt, in this process (a zoo's models or your own) or through a
running service (``--address``), streamed to stdout with its statistics on stderr."""

from __future__ import annotations

import argparse
import json
import sys

from specserve.workers.sampling import SamplingParams
from specserve.workers.request import DEFAULT_K, DEFAULT_MAX_TOKENS, GenerationParams
from specserve.workers.stats import alpha, tokens_per_pass

from ..model_args import add_model_arguments, own_models, split_choice
from .common import SECURITY_EPILOG, add_zoo_argument

SAMPLING_DEFAULTS = SamplingParams()  # the CLI's defaults are the request's, defined once there


def register(commands: argparse._SubParsersAction) -> None:
    generate = commands.add_parser("generate", help="generate text from a prompt",
                                   description="Generate text, with speculative decoding unless --speculation off.",
                                   epilog=SECURITY_EPILOG)
    where = generate.add_mutually_exclusive_group()
    where.add_argument("--address", metavar="HOST:PORT", help="send the request to a running `specserve serve`")
    where.add_argument("--local", action="store_true",
                       help="run the models in this process (the default when no --address is given)")
    add_zoo_argument(generate, "(local mode)")
    generate.add_argument("--prompt", required=True, help="the text to continue")
    generate.add_argument("--timeout", type=float, help="deadline in seconds (--address mode; default: none)")
    generate.add_argument("--no-wait", action="store_true",
                          help="--address mode: send at once, also while the service is starting (its requests then "
                               "run target-only, route 'starting'); by default wait until its health says SERVING")
    add_model_arguments(generate, choosing=True)
    generate.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens to generate at most (default: %(default)s)")
    generate.add_argument("--temperature", type=float, default=SAMPLING_DEFAULTS.temperature,
                          help="0 is greedy (default: %(default)s)")
    generate.add_argument("--top-p", type=float, default=SAMPLING_DEFAULTS.top_p,
                          help="nucleus sampling mass in (0, 1] (default: %(default)s)")
    generate.add_argument("--top-k", type=int, default=SAMPLING_DEFAULTS.top_k,
                          help="sample among the k most likely tokens; 0 = all (default: %(default)s)")
    generate.add_argument("--seed", type=int, help="seed for sampling (default: random, reported in the stats)")
    generate.add_argument("--stop", action="append", default=[], help="stop when this string is generated (repeatable)")
    generate.add_argument("--k", type=int, help=f"draft tokens proposed per target pass, fixed (default: the service's "
                                                f"policy chooses and adapts it; {DEFAULT_K} in local mode)")
    generate.add_argument("--speculation", choices=["auto", "on", "off"], default="auto",
                          help="auto: the service's policy decides, and serves target-only where drafting would not "
                               "pay; on: always draft; off: the target alone (default: %(default)s)")
    generate.add_argument("--segment", default="", help="who the request is for (a tenant, a user segment), "
                          "counted per segment in the service's metrics and stats (--address mode)")
    generate.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    generate.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    args.task, task_table = split_choice(args.task, "--task")
    args.draft, draft_sources = split_choice(args.draft, "--draft")
    models = own_models(args.target, draft_sources, task_table)
    if args.address:
        if models.given:
            raise ValueError("--target and --draft/--task NAME=... load models in this process (--local); a running "
                             "service (--address) serves its own")
        return _generate_remote(args)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    params = GenerationParams(max_tokens=args.max_tokens, sampling=sampling, seed=args.seed, stop=tuple(args.stop),
                              k=DEFAULT_K if args.k is None else args.k, speculation=args.speculation != "off")
    engine, draft = _local_engine(args, models)
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


def _local_engine(args: argparse.Namespace, models):
    """The models of a local generate and the draft it uses (None: the target alone): the zoo's, or
    your own (--target, --draft NAME=SOURCE), the draft picked by --draft NAME, else by the task's
    table (--task TASK=...), else the only or first one."""
    from specserve.workers.engine import SpecEngine
    from specserve.workers.loading import ModelSpec

    from ..local import open_zoo, zoo_engine

    if not models.target:
        if models.drafts or models.tasks:
            raise ValueError("--draft NAME=SOURCE and --task TASK=... serve your own models: give --target too")
        zoo = open_zoo(args.zoo)
        draft = args.draft or (zoo.default_draft(args.task) if args.task else "general")
        zoo.draft_dir(draft)  # validates the name before any model loads
        return zoo_engine(zoo, [draft]), draft
    draft = args.draft
    if draft is None and models.drafts:
        listed = models.tasks.get(args.task, ()) if args.task else ()
        draft = next((name for name in listed if name in models.drafts), None) or next(iter(models.drafts))
    if draft is not None and draft not in models.drafts:
        raise ValueError(f"--draft {draft!r} is not one of the drafts given: {', '.join(models.drafts) or 'none'}")
    if draft is None:
        print("specserve: no --draft given: the target alone decodes", file=sys.stderr)
    spec = {name: ModelSpec(source) for name, source in models.drafts.items() if name == draft}
    return SpecEngine.load(ModelSpec(models.target), spec), draft


def _generate_remote(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from specserve.proto.v1 import specserve_pb2 as pb

    from ..client import FINISH_NAMES, READY_TIMEOUT_SECONDS, SpecServeClient

    speculation = {"auto": pb.SPECULATION_AUTO, "on": pb.SPECULATION_ON, "off": pb.SPECULATION_OFF}[args.speculation]
    request = pb.GenerateRequest(prompt=args.prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                 top_p=args.top_p, top_k=args.top_k, stop=args.stop, task=args.task or "",
                                 draft=args.draft or "", speculation=speculation, segment=args.segment)
    for name in ("seed", "k"):
        if getattr(args, name) is not None:
            setattr(request, name, getattr(args, name))
    client = SpecServeClient(args.address)
    if not args.no_wait:
        client.wait_ready(READY_TIMEOUT_SECONDS, say=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        response = client.generate(request, timeout=args.timeout)
        print(json.dumps(MessageToDict(response, preserving_proto_field_name=True)))
        return 0
    last = None
    for chunk in client.stream(request, timeout=args.timeout):
        print(chunk.text, end="", flush=True)
        last = chunk
    print()
    s = last.stats
    print(f"[{FINISH_NAMES[last.finish_reason]}; task {s.task} ({s.task_source}); draft {s.draft or 'none'} "
          f"({s.route}, k {s.k}); alpha {alpha(s.accepted_tokens, s.rejections):.2f}; "
          f"{tokens_per_pass(s.accepted_tokens, s.target_passes):.2f} tokens per target pass; "
          f"seed {s.seed}]", file=sys.stderr)
    return 0
