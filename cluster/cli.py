"""The `specserve` command line.

Every command validates its input through the same typed configs the service uses, so a bad flag
is answered with the same one-line message a gRPC client would get, and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

import grpc
from transformers.utils import logging as hf_logging

from specserve.cluster import validate
from specserve.cluster.config import DEFAULT_METRICS_PORT
from specserve.cluster.model_args import add_model_arguments, own_models, split_choice
from specserve.workers.security import (API_TOKEN_ENV, API_TOKEN_FILE_ENV, INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_FILE_ENV,
                                        TLS_DIR_ENV)
from specserve.workers.acceptance import SamplingParams
from specserve.workers.loading import ModelLoadError
from specserve.workers.request import DEFAULT_K, DEFAULT_MAX_TOKENS, MAX_K
from specserve.router.config import DEFAULT_HTTP_PORT, PolicyConfig
from specserve.router.cost_model import best_k
from specserve.workers.zoo.distill import USER_DISTILL_TOKENS, USER_DRAFT_BUDGET
from specserve.workers.zoo.zoo import specserve_home

EXIT_USAGE = 2  # what argparse uses for bad arguments; ours match it
EXIT_FAILURE = 1  # the service failed or is unreachable
EXIT_INTERRUPTED = 130
SAMPLING_DEFAULTS = SamplingParams()  # the CLI's defaults are the request's, defined once there
DEFAULT_ZOO = "demo"  # what --zoo means when not given
SECURITY_EPILOG = (  # argparse rewraps it
    f"Security comes from the environment, never from flags or the Serve config: {API_TOKEN_ENV} (or "
    f"{API_TOKEN_FILE_ENV}, a file holding it) is the client API's bearer token, required by `serve` and sent by "
    f"the commands that call a service; {INTERNAL_TOKEN_ENV} (or {INTERNAL_TOKEN_FILE_ENV}) is the token the "
    f"router presents to the workers; {TLS_DIR_ENV} is a directory with tls.crt, tls.key and ca.crt, turning on "
    f"TLS for the client API and mutual TLS between router and workers (a client needs only ca.crt). "
    f"README, \"Security\".")


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
        print(f"specserve: error: {what_to_fix(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except grpc.RpcError as exc:  # the service's answer: its status and message say what to fix
        print(f"specserve: error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_USAGE if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else EXIT_FAILURE
    except KeyboardInterrupt:
        print("specserve: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def what_to_fix(exc: Exception) -> str:
    """The one line a user's error gets: as it says, or for a file it may not read, what to do."""
    if isinstance(exc, PermissionError) and exc.filename:
        return (f"permission denied on {exc.filename}: give the user running specserve access to it (read for "
                f"models and zoos, write for what it builds under SPECSERVE_HOME, {specserve_home()})")
    return str(exc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specserve", description="Distributed speculative decoding on Ray: task-aligned drafts, target replicas, a gRPC router.",
        epilog=SECURITY_EPILOG,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens (INFO level)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    generate = commands.add_parser("generate", help="generate text from a prompt",
                                   description="Generate text, with speculative decoding unless --speculation off.",
                                   epilog=SECURITY_EPILOG)
    where = generate.add_mutually_exclusive_group()
    where.add_argument("--address", metavar="HOST:PORT", help="send the request to a running `specserve serve`")
    where.add_argument("--local", action="store_true",
                       help="run the models in this process (the default when no --address is given)")
    _add_zoo_argument(generate, "(local mode)")
    generate.add_argument("--prompt", required=True, help="the text to continue")
    generate.add_argument("--timeout", type=float, help="deadline in seconds (--address mode; default: none)")
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
    generate.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    generate.set_defaults(run=_run_generate)

    zoo = commands.add_parser("zoo", help="the built-in model zoo").add_subparsers(dest="zoo_command", required=True, metavar="ACTION")
    build = zoo.add_parser("build", help="build (or reuse) a zoo of a target and its distilled drafts",
                           description="Train a tokenizer and a target on text every machine has, distill one draft per task "
                                       "and a general one, and write a manifest with held-out perplexity and acceptance rates.")
    build.add_argument("--preset", default="demo", help="tiny (seconds), demo (3-17 min on 2 CPU cores) or bench (30-60 min there) (default: %(default)s)")
    build.add_argument("--out", type=Path, help="directory (default: $SPECSERVE_HOME/zoo/PRESET, SPECSERVE_HOME defaulting to ~/.cache/specserve)")
    build.set_defaults(run=_run_zoo_build)

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
    distill.set_defaults(run=_run_distill)

    _add_classifier_commands(commands)

    serve_cmd = commands.add_parser(
        "serve", help="run the service: an embedded Ray cluster (or an existing one) with the Serve app",
        description="Start an embedded local Ray cluster (one target device and two draft devices as custom "
                    "resources) or attach to one with --address, deploy the Serve config, print the address "
                    "clients use once the service is ready, and run until Ctrl-C or SIGTERM.",
        epilog=SECURITY_EPILOG)
    serve_cmd.add_argument("--config", type=Path, help="Serve config file (default: deploy/serve_config.yaml)")
    serve_cmd.add_argument("--address", help="an existing Ray cluster (e.g. ray://host:10001 or auto); default: embedded")
    serve_cmd.add_argument("--port", type=int, help="the client API's gRPC port (default: the config's router.port)")
    serve_cmd.add_argument("--zoo", help="serve this zoo preset or directory instead of the config's models.zoo")
    add_model_arguments(serve_cmd)
    serve_cmd.add_argument("--http-port", type=_http_port, metavar="PORT|off",
                           help=f"the OpenAI-compatible HTTP API's port, or off to turn it off (default: the config's "
                                f"router.http_port, {DEFAULT_HTTP_PORT} unless set there)")
    serve_cmd.add_argument("--priors", metavar="FILE", help="a profile from `specserve validate` the routing policy "
                                                            "starts from (acceptance per task and draft)")
    serve_cmd.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                           help="embedded cluster: where Prometheus scrapes the specserve_ metrics (Ray exports them "
                                "as ray_specserve_*) (default: %(default)s)")
    serve_cmd.set_defaults(run=_run_serve)

    stats = commands.add_parser("stats", help="print a running service's statistics (GetStats)", epilog=SECURITY_EPILOG)
    stats.add_argument("--address", required=True, metavar="HOST:PORT", help="the service's client address")
    stats.add_argument("--json", action="store_true", help="print JSON instead of tables")
    stats.set_defaults(run=_run_stats)

    demo = commands.add_parser("demo", help="build the demo zoo and show speculative decoding per task",
                               description="Build or reuse the demo zoo, start the service on an embedded cluster, "
                                           "decode held-out prompts of every task over gRPC with and without "
                                           "speculation, print what each draft achieved, and stop the cluster.")
    _add_zoo_argument(demo)
    demo_where = demo.add_mutually_exclusive_group()
    demo_where.add_argument("--in-process", action="store_true", help="run the models in this process instead")
    demo_where.add_argument("--address", metavar="HOST:PORT", help="use a running service (serving the same zoo)")
    demo.add_argument("--prompts", type=int, default=4, help="held-out prompts per task (default: %(default)s)")
    demo.add_argument("--max-tokens", type=int, default=64, help="(default: %(default)s)")
    demo.add_argument("--k", type=int, default=DEFAULT_K, help="(default: %(default)s)")
    demo.set_defaults(run=_run_demo)
    _add_bench_command(commands)
    validate.add_parser(commands)
    return parser


def _add_bench_command(commands: argparse._SubParsersAction) -> None:
    from specserve.bench.settings import BenchSettings

    d = BenchSettings()  # the defaults, defined once there
    bench = commands.add_parser(
        "bench", help="benchmark speed, acceptance, overhead, a peer and load; write a report",
        description="On the bench zoo and an embedded cluster (or --address): per task alpha, tokens per pass, "
                    "greedy speedup over target-only with the Leviathan bound; each proposer alone (the task's "
                    "draft, prompt lookup, suffix decoding, their token tree) and the policy's choice; the service "
                    "against the in-process engine; Hugging Face assisted generation on the same models; routed "
                    "against general drafts; 1-32 concurrent clients, AUTO against OFF, batching off and "
                    "transformers' batching as peers; sampling; each component's memory. Writes report.md, "
                    "results.json and PNG plots under OUT/<timestamp>/ and prints a summary. A real pretrained "
                    "model: python -m specserve.bench.real_model --target DIR_OR_GGUF.")
    bench.add_argument("--zoo", default=d.zoo, help="a zoo preset name or a zoo directory (default: %(default)s; "
                                                    "a preset is built on first use, the bench zoo in ~45 minutes)")
    bench.add_argument("--out", type=Path, default=d.out, help="results directory (default: %(default)s)")
    bench.add_argument("--address", metavar="HOST:PORT", help="benchmark a running service serving the same zoo")
    bench.add_argument("--prompts", type=int, default=d.prompts, help="held-out prompts per task (default: %(default)s)")
    bench.add_argument("--repeats", type=int, default=d.repeats, help="passes over the prompts (default: %(default)s)")
    bench.add_argument("--warm-up", type=int, default=d.warm_up,
                       help="routed requests per task before measuring (default: %(default)s)")
    bench.add_argument("--max-tokens", type=int, default=d.max_tokens, help="(default: %(default)s)")
    bench.add_argument("--k", type=int, default=d.k, help="k of the fixed-k paths (default: %(default)s)")
    bench.add_argument("--temperatures", type=_floats, default=d.temperatures, metavar="T,T",
                       help="sampling temperatures (default: %(default)s)")
    bench.add_argument("--sampled-prompts", type=int, default=d.sampled_prompts,
                       help="prompts per task and temperature (default: %(default)s)")
    bench.add_argument("--concurrency", type=_ints, default=d.concurrency, metavar="N,N",
                       help="concurrent clients per load level (default: %(default)s)")
    bench.add_argument("--load-requests", type=int, default=d.load_requests,
                       help="requests per load level and mode (default: %(default)s)")
    bench.add_argument("--no-peer", action="store_true", help="skip Hugging Face assisted generation")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                       help="override a field of the embedded service's config (deploy/serve_config.yaml args), "
                            "e.g. router.policy.k_max=16 (repeatable; VALUE is YAML)")
    bench.add_argument("--rerender", type=Path, metavar="RUN_DIR",
                       help="measure nothing: derive a past run's figures, plots and report again from its results.json")
    bench.set_defaults(run=_run_bench)


def _dotted_overrides(items: list[str]) -> dict:
    """["router.policy.k_max=16"] -> {"router": {"policy": {"k_max": 16}}}; the service's config
    validation then refuses unknown keys and bad values with its usual message."""
    import yaml

    overrides: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        *parents, leaf = key.split(".")
        node = overrides
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return overrides


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _http_port(text: str) -> int | str:
    if text == "off":
        return text
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number or off, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535 (0: any free port), got {port}")
    return port


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _add_classifier_commands(commands: argparse._SubParsersAction) -> None:
    classifier = commands.add_parser("classifier", help="the task classifier for requests that name no task").add_subparsers(
        dest="classifier_command", required=True, metavar="ACTION")
    train = classifier.add_parser(
        "train", help="train a task classifier from a zoo's corpora and/or your labelled prompts",
        description="Train the classifier the router resolves task-less requests with (naive Bayes over hashed "
                    "words and character n-grams): on prompt-like slices of the zoo's training documents, plus "
                    "labelled examples, which may teach it new tasks. Prints its accuracy on the zoo's held-out "
                    "prompts. Serve it with router.policy.classifier in the Serve config.")
    train.add_argument("--zoo", help=f"a zoo preset name or a zoo directory (default: {DEFAULT_ZOO}; with "
                                     "--no-corpora, none, and no held-out report)")
    train.add_argument("--labelled", action="extend", nargs="+", default=[], metavar="FILE.jsonl",
                       help='JSONL files, one {"text": ..., "task": ...} object per line (repeatable)')
    train.add_argument("--no-corpora", action="store_true", help="train on the --labelled examples alone")
    train.add_argument("--out", required=True, type=Path, metavar="PATH", help="the .npz file to write")
    train.set_defaults(run=_run_classifier_train)

    predict = classifier.add_parser("predict", help="print the task of a text and the classifier's confidence",
                                    description="Classify TEXT as the router would a request without a task.")
    _add_zoo_argument(predict, "whose classifier to use ")
    predict.add_argument("--classifier", type=Path, metavar="PATH", help="use this .npz instead of the zoo's")
    predict.add_argument("--json", action="store_true", help="print one JSON object with every task's probability")
    predict.add_argument("text", metavar="TEXT", help="the prompt to classify")
    predict.set_defaults(run=_run_classifier_predict)


def _add_zoo_argument(parser: argparse.ArgumentParser, note: str = "") -> None:
    parser.add_argument("--zoo", default=DEFAULT_ZOO, help=f"a zoo preset name or a zoo directory {note}(default: %(default)s)")


def _run_generate(args: argparse.Namespace) -> int:
    args.task, task_table = split_choice(args.task, "--task")
    args.draft, draft_sources = split_choice(args.draft, "--draft")
    models = own_models(args.target, draft_sources, task_table)
    if args.address:
        if models.given:
            raise ValueError("--target and --draft/--task NAME=... load models in this process (--local); a running "
                             "service (--address) serves its own")
        return _generate_remote(args)
    from specserve.workers.request import GenerationParams

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

    from .local import open_zoo, zoo_engine

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

    from .client import FINISH_NAMES, SpecServeClient

    speculation = {"auto": pb.SPECULATION_AUTO, "on": pb.SPECULATION_ON, "off": pb.SPECULATION_OFF}[args.speculation]
    request = pb.GenerateRequest(prompt=args.prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                 top_p=args.top_p, top_k=args.top_k, stop=args.stop, task=args.task or "",
                                 draft=args.draft or "", speculation=speculation)
    for name in ("seed", "k"):
        if getattr(args, name) is not None:
            setattr(request, name, getattr(args, name))
    client = SpecServeClient(args.address)
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
    alpha = s.accepted_tokens / (s.accepted_tokens + s.rejections) if s.accepted_tokens + s.rejections else 0.0
    print(f"[{FINISH_NAMES[last.finish_reason]}; task {s.task} ({s.task_source}); draft {s.draft or 'none'} "
          f"({s.route}, k {s.k}); alpha {alpha:.2f}; "
          f"{(s.accepted_tokens + s.target_passes) / max(s.target_passes, 1):.2f} tokens per target pass; "
          f"seed {s.seed}]", file=sys.stderr)
    return 0


def _run_serve(args: argparse.Namespace) -> int:
    from .bringup import sigterm_as_interrupt, start_service, wait_forever

    logging.getLogger("specserve").setLevel(logging.INFO)  # a server says what it is doing
    sigterm_as_interrupt()  # from here on, also while starting: never leave an embedded cluster behind
    overrides = _serve_overrides(args)
    print("starting specserve (Ray cluster, Serve app, model loading)...", file=sys.stderr, flush=True)
    service = start_service(args.config, address=args.address, port=args.port, overrides=overrides,
                            metrics_port=args.metrics_port)
    http = f"; OpenAI API: http://{service.http_address}/v1" if service.http_address else "; OpenAI API off"
    print(f"specserve listening on {service.address} (gRPC: specserve.v1.SpecServe, grpc.health.v1, reflection)"
          f"{http}; Ctrl-C to stop", flush=True)
    try:
        wait_forever()
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a repeated SIGTERM must not cut the clean-up short
        print("specserve: shutting down", file=sys.stderr, flush=True)
    finally:
        service.stop()
    return 0


def _serve_overrides(args: argparse.Namespace) -> dict:
    """The config file's settings the flags replace."""
    from .bringup import merge_into

    models = own_models(args.target, args.draft, args.task)
    if args.zoo and models.target:
        raise ValueError("--zoo and --target both name the target: give one")
    overrides = {"models": {"zoo": args.zoo}} if args.zoo else {}
    merge_into(overrides, models.overrides())
    if args.http_port is not None:
        merge_into(overrides, {"router": {"http_port": None if args.http_port == "off" else args.http_port}})
    if args.priors:
        merge_into(overrides, {"models": {"priors": args.priors}})
    return overrides


def _run_stats(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from .client import SpecServeClient

    stats = SpecServeClient(args.address).stats()
    if args.json:
        print(json.dumps(MessageToDict(stats, preserving_proto_field_name=True)))
        return 0
    print(f"requests in flight {stats.requests_in_flight}; queued {stats.requests_queued}; "
          f"rejected (over the limit) {stats.requests_rejected}")
    print("Per task, its decision (draft '-': the task, and its target-only requests), then each allowed draft;")
    print("k at the current load (k1: with one session per pass), and what a step of k costs in target steps:")
    print(f"{'task':<8} {'draft':<8} {'requests':>8} {'proposed':>9} {'accepted':>9} {'tok/pass':>8} {'alpha':>6} "
          f"{'c':>5} {'k':>2} {'k1':>2} {'cost':>5} {'speedup':>7} {'scored':>7} decision")
    for t in stats.tasks:
        decision = f"{t.decision}: {t.reason}" if t.reason else t.decision
        print(f"{t.task:<8} {t.draft or '-':<8} {t.requests:>8} {t.proposed_tokens:>9} {t.accepted_tokens:>9} "
              f"{t.tokens_per_pass:>8.2f} {t.alpha:>6.2f} {t.cost_ratio:>5.2f} {t.k:>2} {t.unloaded_k:>2} "
              f"{t.step_cost:>5.2f} {t.expected_speedup:>7.2f} {t.scored_tokens:>7} {decision}")
    _print_batches(stats)
    print(f"{'worker':<22} {'kind':<6} {'address':<22} {'node':<12} {'sessions':>8} models")
    for w in stats.workers:
        print(f"{w.worker_id:<22} {w.kind:<6} {w.address:<22} {w.node_id[:12]:<12} {w.live_sessions:>8} "
              f"{', '.join(w.models)}")
    return 0


def _print_batches(stats) -> None:
    """The passes the latest steps ran in, and what the policy prices a step at under that load."""
    print("Batches (latest steps; a pass of n sessions counts once per session):")
    print(f"{'kind':<6} {'steps':>6} {'sessions/pass mean':>18} {'p50':>5} {'tokens/pass mean':>16} {'p50':>5} "
          f"{'queue ms mean':>13} {'p50':>6}")
    for p in stats.passes:
        print(f"{p.kind:<6} {p.steps:>6} {p.mean_sessions:>18.1f} {p.p50_sessions:>5.0f} {p.mean_tokens:>16.1f} "
              f"{p.p50_tokens:>5.0f} {p.mean_queue_seconds * 1e3:>13.2f} {p.p50_queue_seconds * 1e3:>6.2f}")
    load = stats.load
    fit = (f"a target pass takes {load.pass_fixed_seconds * 1e3:.2f} ms + {load.pass_seconds_per_token * 1e3:.3f} ms "
           f"per token" if load.pass_fixed_seconds or load.pass_seconds_per_token else "no pass-time fit yet")
    print(f"policy load: {load.sessions:.1f} sessions per pass{', target saturated' if load.saturated else ''}; {fit}")


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


def _run_classifier_train(args: argparse.Namespace) -> int:
    from specserve.workers.classifier import TaskClassifier
    from specserve.workers.zoo.task_classifier import held_out_examples, read_labelled, train_from_corpora, zoo_corpora

    from .local import open_zoo

    if args.no_corpora and not args.labelled:
        raise ValueError("--no-corpora needs --labelled FILE.jsonl: there would be nothing to train on")
    if args.out.is_dir() or not args.out.parent.is_dir():
        raise ValueError(f"--out {args.out} must be a file in an existing directory")
    labelled = [example for path in args.labelled for example in read_labelled(path)]
    # The zoo's corpora are trained on unless --no-corpora; its held-out prompts are reported on either way.
    zoo_name = args.zoo or (None if args.no_corpora else DEFAULT_ZOO)
    zoo = open_zoo(zoo_name) if zoo_name else None
    corpora = zoo_corpora(zoo) if zoo else {}
    if args.no_corpora:
        classifier = TaskClassifier.train(labelled)
    else:
        classifier = train_from_corpora(corpora, zoo.manifest["seed"], labelled)
    classifier.save(args.out)
    counts = ", ".join(f"{task} {n}" for task, n in classifier.examples.items())
    print(f"task classifier written to {args.out} (training examples: {counts})")
    held_out = {task: held_out_examples(corpora[task]) for task in classifier.tasks if task in corpora}
    if held_out:
        print(f"{'task':<10} {'held-out':>8} {'accuracy':>8} {'mean confidence':>15}")
    for task, examples in held_out.items():
        predictions = [classifier.predict(text) for text, _ in examples]
        accuracy = sum(p.task == task for p in predictions) / len(predictions)
        confidence = sum(p.confidence for p in predictions) / len(predictions)
        print(f"{task:<10} {len(predictions):>8} {accuracy:>8.3f} {confidence:>15.3f}")
    return 0


def _run_classifier_predict(args: argparse.Namespace) -> int:
    from specserve.workers.zoo.task_classifier import load_task_classifier

    from .local import open_zoo

    zoo = None if args.classifier else open_zoo(args.zoo)
    classifier = load_task_classifier(args.classifier, zoo)
    if classifier is None:
        raise ValueError(f"zoo {args.zoo!r} has neither a classifier nor corpora to train one from; give --classifier")
    prediction = classifier.predict(args.text)
    if args.json:
        print(json.dumps({"task": prediction.task, "confidence": prediction.confidence,
                          "scores": classifier.scores(args.text)}))
    else:
        print(f"{prediction.task} {prediction.confidence:.3f}")
    return 0


def _run_distill(args: argparse.Namespace) -> int:
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


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.prompts < 1 or args.max_tokens < 1:
        raise ValueError(f"--prompts and --max-tokens must be >= 1, got {args.prompts} and {args.max_tokens}")
    if not args.verbose:  # the table is the output; Serve's progress lines are noise beside it
        logging.getLogger("ray.serve").setLevel(logging.WARNING)

    run_demo(args.zoo, prompts_per_task=args.prompts, max_tokens=args.max_tokens, k=args.k,
             in_process=args.in_process, address=args.address)
    return 0


def _run_bench(args: argparse.Namespace) -> int:
    from specserve.bench.run import rerender, run_bench
    from specserve.bench.settings import BenchSettings

    if args.rerender:
        if not (args.rerender / "results.json").is_file():
            raise ValueError(f"{args.rerender} has no results.json: give the directory of a past run")
        rerender(args.rerender)
        return 0
    settings = BenchSettings(zoo=args.zoo, out=args.out, prompts=args.prompts, repeats=args.repeats,
                             warm_up=args.warm_up, max_tokens=args.max_tokens, k=args.k, temperatures=args.temperatures,
                             sampled_prompts=args.sampled_prompts, concurrency=args.concurrency,
                             load_requests=args.load_requests, address=args.address, peer=not args.no_peer,
                             service_overrides=_dotted_overrides(args.overrides))
    if args.address and args.overrides:
        raise ValueError("--set configures the embedded service; a running one (--address) keeps its own config")
    if not args.verbose:  # the progress bar and the summary are the output
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    run_bench(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
