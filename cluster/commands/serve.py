"""`specserve serve`: the service on an embedded Ray cluster (or an existing one) until Ctrl-C or
SIGTERM; flags replace settings of the Serve config file."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from specserve.router.config import DEFAULT_HTTP_PORT
from specserve.workers.sim_device import PRESETS

from ..config import DEFAULT_METRICS_PORT
from ..model_args import add_model_arguments, own_models, pair_of
from .common import SECURITY_EPILOG, dotted_overrides


def register(commands: argparse._SubParsersAction) -> None:
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
    serve_cmd.add_argument("--http-port", type=http_port, metavar="PORT|off",
                           help=f"the OpenAI-compatible HTTP API's port, or off to turn it off (default: the config's "
                                f"router.http_port, {DEFAULT_HTTP_PORT} unless set there)")
    serve_cmd.add_argument("--router-replicas", type=int, metavar="N",
                           help="router processes sharing the client ports (SO_REUSEPORT), for when one router's CPU "
                                "caps the service (default: the config's router.replicas, 1 unless set there)")
    serve_cmd.add_argument("--priors", metavar="FILE", help="a profile from `specserve validate` the routing policy "
                                                            "starts from (acceptance per task and draft)")
    serve_cmd.add_argument("--on-replica", metavar="NAME,NAME", type=lambda s: [n for n in s.split(",") if n],
                           help="drafts that are heads fed by the target's hidden states (an MTP module: draft mtp) "
                                "the target replicas serve, drafting after each verify pass, instead of the draft pool "
                                "(config models.on_replica)")
    serve_cmd.add_argument("--quantize", action="append", default=[], metavar="DRAFT=int8",
                           help="serve a draft model with int8 weights (a quarter of float32's bytes; the output stays "
                                "the target's, only alpha may move; repeatable; config models.quantize)")
    serve_cmd.add_argument("--sim", choices=tuple(PRESETS), metavar="PRESET",
                           help=f"run every model process on a simulated device with this preset's timing "
                                f"({', '.join(PRESETS)}): the models' math real, each pass held for the accelerator's "
                                "time; a timing model for measuring the host path, not for serving "
                                "(config target.device / draft_pool.device: sim)")
    serve_cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                           help="override a field of the Serve config, e.g. target.batching.overlap=false or "
                                "draft_pool.sim.alignment='{code: {sql: 0.3}}' (repeatable; VALUE is YAML; applied "
                                "after every other flag)")
    serve_cmd.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                           help="embedded cluster: where Prometheus scrapes the specserve_ metrics (Ray exports them "
                                "as ray_specserve_*) (default: %(default)s)")
    serve_cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..bringup import sigterm_as_interrupt, start_service, wait_forever

    logging.getLogger("specserve").setLevel(logging.INFO)  # a server says what it is doing
    sigterm_as_interrupt()  # from here on, also while starting: never leave an embedded cluster behind
    overrides = _serve_overrides(args)
    print("starting specserve (Ray cluster, Serve app, model loading)...", file=sys.stderr, flush=True)
    service = start_service(args.config, address=args.address, port=args.port, overrides=overrides,
                            metrics_port=args.metrics_port)
    http = f"; OpenAI API: http://{service.http_address}/v1" if service.http_address else "; OpenAI API off"
    # Printed once the health service says SERVING: the drafts are up, requests get speculation.
    print(f"specserve listening on {service.address} (ready, speculation on; gRPC: specserve.v1.SpecServe, "
          f"grpc.health.v1, reflection){http}; Ctrl-C to stop", flush=True)
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
    from ..bringup import merge_into

    models = own_models(args.target, args.draft, args.task)
    if args.zoo and models.target:
        raise ValueError("--zoo and --target both name the target: give one")
    overrides = {"models": {"zoo": args.zoo}} if args.zoo else {}
    merge_into(overrides, models.overrides())
    if args.http_port is not None:
        merge_into(overrides, {"router": {"http_port": None if args.http_port == "off" else args.http_port}})
    if args.priors:
        merge_into(overrides, {"models": {"priors": args.priors}})
    if args.on_replica:
        merge_into(overrides, {"models": {"on_replica": args.on_replica}})
    if args.router_replicas is not None:
        merge_into(overrides, {"router": {"replicas": args.router_replicas}})
    if args.quantize:
        quantized = dict(pair_of(value, "--quantize", "DRAFT=int8") for value in args.quantize)
        merge_into(overrides, {"models": {"quantize": quantized}})
    if args.sim:
        merge_into(overrides, sim_overrides(args.sim))
    merge_into(overrides, dotted_overrides(args.overrides))
    return overrides


def sim_overrides(preset: str) -> dict:
    """Every model process of the service on a simulated device with ``preset``'s timing."""
    return {kind: {"device": "sim", "sim": {"preset": preset}} for kind in ("target", "draft_pool")}


def http_port(text: str) -> int | str:
    if text == "off":
        return text
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number or off, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535 (0: any free port), got {port}")
    return port

