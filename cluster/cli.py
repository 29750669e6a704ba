"""The `specserve` command line.

Every command validates its input through the same typed configs the service uses, so a bad flag
is answered with the same one-line message a gRPC client would get, and a non-zero exit. Each
command registers its own parser (``commands/``); a package above this layer adds its commands
through the ``specserve.commands`` entry point group (bench's ``specserve bench``), so that nothing
here imports it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib.metadata import entry_points

import grpc
from pydantic import ValidationError

from specserve.workers.load_errors import ModelLoadError
from specserve.cluster.zoo.zoo import specserve_home

from .commands import canary, classifier, demo, distill, generate, plan, serve, stats, swap_draft, validate, zoo
from .commands.common import SECURITY_EPILOG

EXIT_USAGE = 2  # what argparse uses for bad arguments; ours match it
EXIT_FAILURE = 1  # the service failed or is unreachable
EXIT_INTERRUPTED = 130
COMMANDS = (generate, zoo, distill, classifier, serve, stats, swap_draft, canary, demo, validate, plan)  # in the order --help lists them
ENTRY_POINTS = "specserve.commands"  # name = the command, value = its register(commands) or a LazyCommand


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    lazy = getattr(args, "lazy", None)
    if lazy is not None:  # its module is imported now, and its own parser reads the rest
        args = lazy.parse(rest, args.verbose)
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from transformers.utils import logging as hf_logging  # here, not above: `--help` stays under a second

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
    if isinstance(exc, ValidationError):  # a config (its file, or a flag over it): each field and what is wrong
        wrong = "; ".join(f"{'.'.join(str(part) for part in error['loc']) or 'the config'}: "
                          f"{error['msg'].removeprefix('Value error, ')}" for error in exc.errors())
        return f"the configuration is invalid: {wrong} (fix the config file or the flag that sets it)"
    return str(exc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specserve", description="Distributed speculative decoding on Ray: task-aligned drafts, target replicas, a gRPC router.",
        epilog=SECURITY_EPILOG,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens (INFO level)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(commands)
    for entry in sorted(entry_points(group=ENTRY_POINTS), key=lambda entry: entry.name):
        entry.load()(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
