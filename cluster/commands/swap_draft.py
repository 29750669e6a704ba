"""`specserve swap-draft` (or `swap-head`): a running service's draft pool serves a new version of a
draft model or an EAGLE-3 head, without a restart and without losing a request (cluster/pool.py
``swap_draft``)."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_APP = "specserve"  # deploy/serve_config.yaml's application name
SWAP_TIMEOUT_SECONDS = 300.0  # what the control deployment waits for every worker to load it


def register(commands: argparse._SubParsersAction) -> None:
    swap = commands.add_parser(
        "swap-draft", aliases=["swap-head"],
        help="serve a new version of a draft model or EAGLE-3 head in a running service, without a restart",
        description="Load the draft model at --model (or the EAGLE-3 head at --head) into every draft worker of a "
                    "running service as draft --draft: sessions opened from then on draft with it, those already "
                    "open finish on the version they opened with, and workers the pool starts later load it too. "
                    "A draft model's tokenizer must be the target's. The directory must be readable at the same "
                    "path on the draft workers' nodes (a shared volume on Kubernetes).")
    swap.add_argument("--draft", required=True, help="the draft's name in the service (e.g. eagle3, sql)")
    add_source_arguments(swap.add_mutually_exclusive_group(required=True))
    add_service_arguments(swap)
    swap.set_defaults(run=run)


def add_source_arguments(group: argparse._MutuallyExclusiveGroup) -> None:
    """--model or --head: the new version's directory (``source`` reads it)."""
    group.add_argument("--model", type=Path, help="the new version: a draft model directory (from `specserve "
                                                  "distill`), for a draft that is a model")
    group.add_argument("--head", type=Path, help="the new version: a speculators-format head directory (from "
                                                 "`specserve distill --method eagle3`), for a draft that is a head")


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the running service is: its Ray cluster and Serve application (``control`` finds it)."""
    parser.add_argument("--ray-address", default="auto",
                        help="the service's Ray cluster (default: %(default)s, the one on this machine)")
    parser.add_argument("--app", default=DEFAULT_APP, help="its Serve application name (default: %(default)s)")


def source(args: argparse.Namespace) -> Path:
    """The directory --model or --head names, checked as far as this machine can: a head directory
    for --head, a model's (config.json) for --model; the service checks the rest before loading it."""
    from specserve.workers.heads.format import is_head

    if args.head is not None:
        if not is_head(args.head):
            raise ValueError(f"--head {args.head}: not an EAGLE-3 head directory (no config.json with "
                             f"speculators_model_type eagle3); `specserve distill --method eagle3` writes one")
        return args.head.resolve()
    if is_head(args.model):
        raise ValueError(f"--model {args.model} is a head (an EAGLE-3 head, or a model that carries an MTP module): "
                         f"give it as --head")
    if not (args.model / "config.json").is_file():
        raise ValueError(f"--model {args.model}: no config.json there; `specserve distill` writes a draft model")
    return args.model.resolve()


def control(args: argparse.Namespace):
    """The running service's control deployment (its draft pool), as a Serve handle."""
    import ray
    from ray import serve

    from ..app import CONTROL_DEPLOYMENT
    from ..config import NAMESPACE

    if not ray.is_initialized():
        try:
            ray.init(address=args.ray_address, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
        except ConnectionError as exc:
            raise ValueError(f"no Ray cluster at --ray-address {args.ray_address}: {exc}") from None
    try:
        return serve.get_deployment_handle(CONTROL_DEPLOYMENT, app_name=args.app)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"no specserve application {args.app!r} on that cluster ({exc}); --app names it") from None


def answer(response, timeout: float):
    """A control call's result; a refusal (the pool's or a worker's) as a ValueError saying what to fix."""
    import ray

    try:
        return response.result(timeout_s=timeout)
    except ray.exceptions.RayTaskError as exc:  # (a RayTaskError is also a ValueError)
        raise ValueError(_what_was_refused(exc)) from None
    except TimeoutError:
        raise ValueError(f"no answer from the service in {timeout:.0f} s; it may still finish: check the control "
                         f"replica's log") from None


def run(args: argparse.Namespace) -> int:
    directory = source(args)
    swapped = answer(control(args).swap_draft.remote(args.draft, str(directory)), SWAP_TIMEOUT_SECONDS + 30)
    print(f"draft {args.draft} is now the one at {directory} on {', '.join(swapped)}; sessions open on the version "
          f"before finish on it")
    return 0


def _what_was_refused(exc: BaseException) -> str:
    """The message of the error at the bottom of Ray's chain (a worker's, under the pool's, under
    Serve's), without its traceback or class name."""
    while getattr(exc, "cause", None) is not None:
        exc = exc.cause
    lines = str(exc).strip().splitlines()
    if not lines:  # a bare error (a timeout on the control's side): its kind is all there is
        return f"{type(exc).__name__}: no answer in time; it may still finish: check the control replica's log"
    last = lines[-1]
    kind, _, message = last.partition(": ")
    return message if message and kind.isidentifier() and kind.endswith(("Error", "Exception")) else last
