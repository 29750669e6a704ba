"""`specserve canary`: serve a new version of a draft model or EAGLE-3 head beside the one serving
now, on a share of its tasks' traffic; the service promotes it when its acceptance beats the old one's with the
stated confidence and rolls it back otherwise (cluster/canary.py, router/canary.py)."""

from __future__ import annotations

import argparse
import time

from specserve.router.canary import FINISHED, PROMOTE, ROLL_BACK, CanaryConfig, CanaryStatus

from .common import comma_list
from .swap_draft import SWAP_TIMEOUT_SECONDS, add_service_arguments, add_source_arguments, answer, control, source

DEFAULTS = CanaryConfig()
WAIT_POLL_SECONDS = 2.0


def register(commands: argparse._SubParsersAction) -> None:
    canary = commands.add_parser(
        "canary", help="serve a new draft version on a share of traffic; promoted or rolled back on its measured alpha",
        description="Load the draft model at --model (or the EAGLE-3 head at --head) into every draft worker of a "
                    "running service beside draft --draft, as version DRAFT@VERSION, and route --share of the draft's requests of --tasks to it. "
                    "At every --min-requests requests per arm the service tests the new version's alpha against "
                    "the old one's on the same traffic: promoted (the draft becomes the new version; sessions open "
                    "on the old one finish on it) once it is better with --confidence, rolled back once it is worse "
                    "with it or still undecided at --max-requests. `specserve stats` shows each canary; --promote "
                    "and --roll-back decide a running one now.")
    canary.add_argument("--draft", required=True, help="the draft's name in the service (e.g. eagle3, sql)")
    decision = canary.add_mutually_exclusive_group(required=True)
    add_source_arguments(decision)  # readable at this path on the draft workers' nodes
    decision.add_argument("--promote", action="store_const", const=PROMOTE, dest="decision",
                          help="promote the draft's running canary now")
    decision.add_argument("--roll-back", action="store_const", const=ROLL_BACK, dest="decision",
                          help="roll the draft's running canary back now")
    canary.add_argument("--version", default="", help="the version's tag (default: the directory's name)")
    canary.add_argument("--tasks", type=comma_list, default=(),
                        help="comma-separated tasks whose traffic it serves (default: every task of the draft)")
    canary.add_argument("--share", type=float, default=DEFAULTS.share,
                        help="of those requests, to the new version (default: %(default)s)")
    canary.add_argument("--confidence", type=float, default=DEFAULTS.confidence,
                        help="that a promoted version is better, over all looks (default: %(default)s)")
    canary.add_argument("--min-requests", type=int, default=DEFAULTS.min_requests,
                        help="requests per arm between looks (default: %(default)s)")
    canary.add_argument("--max-requests", type=int, default=DEFAULTS.max_requests,
                        help="requests per arm at the last look (default: %(default)s)")
    canary.add_argument("--wait", action="store_true", help="follow it until it is promoted or rolled back")
    add_service_arguments(canary)
    canary.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.decision is not None:
        if given := [flag for flag, value in (("--version", args.version), ("--tasks", args.tasks), ("--wait", args.wait))
                     if value]:
            raise ValueError(f"{', '.join(given)} go with --model or --head (a new canary), not with "
                             f"--{args.decision.replace(' ', '-')}")
        status = answer(control(args).end_canary.remote(args.draft, args.decision), 60)
        print(describe(status))
        return 0
    directory = source(args)
    config = CanaryConfig(args.share, args.confidence, args.min_requests, args.max_requests)  # says what to fix
    handle = control(args)
    status = answer(handle.start_canary.remote(args.draft, str(directory), args.version, tuple(args.tasks), config),
                    SWAP_TIMEOUT_SECONDS + 30)
    print(describe(status))
    if not args.wait:
        return 0
    said = describe(status)
    while status.state not in FINISHED:
        time.sleep(WAIT_POLL_SECONDS)
        status = next((s for s in answer(handle.canary_statuses.remote(), 60) if s.canary_id == status.canary_id),
                      None) or _forgotten(status)
        if describe(status) != said:
            said = describe(status)
            print(said, flush=True)
    return 0 if status.state != "failed" else 1


def _forgotten(status: CanaryStatus) -> CanaryStatus:
    raise ValueError(f"the service no longer knows canary {status.version} (its control deployment restarted?): "
                     f"`specserve stats` says what the draft serves now")


def describe(status: CanaryStatus) -> str:
    """One line: the canary's state, and its arms so far."""
    arms = (f"; alpha {status.canary.alpha:.3f} on {status.canary.requests} requests vs {status.base.alpha:.3f} on "
            f"{status.base.requests}, look {status.looks}/{status.config.looks}" if status.looks or status.base.requests
            else "")
    why = f" ({status.reason})" if status.reason else ""
    return (f"canary {status.version} of draft {status.draft} ({status.source}; {100 * status.config.share:.0f}% of "
            f"{', '.join(status.tasks)}): {status.state}{why}{arms}")
