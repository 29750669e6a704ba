"""`specserve bench` on the command line. bench/ is the layer above cluster/, so the CLI does not
import it: pyproject.toml registers ``register`` under the ``specserve.commands`` entry point group,
which ``cluster/cli.py`` reads."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from specserve.cluster.commands.common import comma_floats, comma_ints, dotted_overrides
from specserve.workers.sim_device import PRESETS

from .settings import DEVICES, BenchSettings


def module_main(register_command: Callable[[argparse._SubParsersAction], None], command: str) -> None:
    """``python -m specserve.bench.<module> ARGS`` as ``specserve <command> ARGS``: the command's
    own parser, registered as the specserve command line registers it."""
    parser = argparse.ArgumentParser(prog=f"python -m specserve.bench.{command.replace('-', '_')}")
    register_command(parser.add_subparsers(required=True))
    args = parser.parse_args([command, *sys.argv[1:]])
    raise SystemExit(args.run(args))


def workload_arguments(parser: argparse.ArgumentParser, defaults, paths: dict, paths_help: str = "") -> None:
    """The options every workload bench through the service shares (``defaults``: its settings,
    with zoo, clients, paths, requests, max_tokens and out; ``paths``: the paths it knows)."""
    parser.add_argument("--zoo", default=defaults.zoo, help="a zoo preset name or directory (default: %(default)s)")
    parser.add_argument("--clients", type=comma_ints, default=defaults.clients, metavar="N,N",
                        help="concurrent clients per level (default: %(default)s)")
    parser.add_argument("--paths", type=lambda s: tuple(s.split(",")), default=defaults.paths, metavar="P,P",
                        help=f"of {', '.join(paths)}{paths_help} (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=defaults.requests,
                        help="per level and path (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="(default: %(default)s)")
    parser.add_argument("--out", type=Path, default=defaults.out, help="results directory (default: %(default)s)")
    sim_arguments(parser)


def sim_arguments(parser: argparse.ArgumentParser) -> None:
    """--sim and --set: the service's model processes on simulated devices, and its config's fields
    set one by one (``workload_overrides`` reads them)."""
    parser.add_argument("--sim", choices=tuple(PRESETS), metavar="PRESET",
                        help=f"every model process on a simulated device with this preset's timing "
                             f"({', '.join(PRESETS)}; workers/sim_device.py) (default: no simulation)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a field of the service's config, e.g. target.replicas=4 with --sim "
                             "(repeatable; VALUE is YAML; after --sim)")


def workload_overrides(args: argparse.Namespace) -> dict:
    """The service's config fields ``sim_arguments``' --sim and --set ask for, --set last."""
    from specserve.cluster.bringup import merge_into
    from specserve.cluster.commands.serve import sim_overrides

    overrides = sim_overrides(args.sim) if args.sim else {}
    merge_into(overrides, dotted_overrides(args.overrides))
    return overrides


def known_paths(asked: tuple[str, ...], paths: dict) -> tuple[str, ...]:
    unknown = set(asked) - set(paths)
    if unknown:
        raise ValueError(f"--paths takes {', '.join(paths)}; got {', '.join(sorted(unknown))}")
    return asked


def register(commands: argparse._SubParsersAction) -> None:
    """Adds `specserve bench` (the ``specserve.commands`` entry point named bench)."""
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
                    "model: specserve real-model --target DIR_OR_GGUF.")
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
    bench.add_argument("--temperatures", type=comma_floats, default=d.temperatures, metavar="T,T",
                       help="sampling temperatures (default: %(default)s)")
    bench.add_argument("--sampled-prompts", type=int, default=d.sampled_prompts,
                       help="prompts per task and temperature (default: %(default)s)")
    bench.add_argument("--concurrency", type=comma_ints, default=d.concurrency, metavar="N,N",
                       help="concurrent clients per load level (default: %(default)s)")
    bench.add_argument("--load-requests", type=int, default=d.load_requests,
                       help="requests per load level and mode (default: %(default)s)")
    bench.add_argument("--device", choices=DEVICES, default=d.device,
                       help="where the models run: cuda puts the target replica and the draft workers on this "
                            "machine's GPU as separate processes (fractional GPUs) and the in-process models "
                            "on it too; auto: cuda where present (default: %(default)s)")
    bench.add_argument("--sim", choices=tuple(PRESETS), metavar="PRESET",
                       help="the in-process engine and every model process of the service on simulated devices with "
                            f"this preset's timing ({', '.join(PRESETS)}; workers/sim_device.py); the peers "
                            "(transformers' generate, which nothing simulates) are left out (default: no simulation)")
    bench.add_argument("--no-peer", action="store_true", help="skip Hugging Face assisted generation")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                       help="override a field of the embedded service's config (deploy/serve_config.yaml args), "
                            "e.g. router.policy.k_max=16 (repeatable; VALUE is YAML)")
    bench.add_argument("--rerender", type=Path, metavar="RUN_DIR",
                       help="measure nothing: derive a past run's figures, plots and report again from its results.json")
    bench.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .run import rerender, run_bench

    if args.rerender:
        if not (args.rerender / "results.json").is_file():
            raise ValueError(f"{args.rerender} has no results.json: give the directory of a past run")
        rerender(args.rerender)
        return 0
    settings = BenchSettings(zoo=args.zoo, out=args.out, prompts=args.prompts, repeats=args.repeats,
                             warm_up=args.warm_up, max_tokens=args.max_tokens, k=args.k, temperatures=args.temperatures,
                             sampled_prompts=args.sampled_prompts, concurrency=args.concurrency,
                             load_requests=args.load_requests, address=args.address,
                             peer=not args.no_peer and args.sim is None, load_peers=args.sim is None,
                             service_overrides=dotted_overrides(args.overrides), device=args.device, sim=args.sim)
    if args.address and args.overrides:
        raise ValueError("--set configures the embedded service; a running one (--address) keeps its own config")
    if not args.verbose:  # the progress bar and the summary are the output
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    run_bench(settings)
    return 0
