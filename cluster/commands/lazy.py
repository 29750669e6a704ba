"""A command whose module is imported only when it runs (or shows its own ``--help``).

``specserve --help`` lists every command, and a command whose module imports torch or Ray at its
top (the benches: seconds each) would make that listing slow. Such a command registers as a stub
holding its one line of help and leaves its arguments unparsed; once chosen, its module is imported
and its own parser reads them, ``specserve NAME --help`` included. A ``script`` (a study or an
operator's tool that also runs as ``python -m``) parses and runs in its module's ``main(argv)``.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class LazyCommand:
    name: str
    module: str  # whose ``register(commands)`` adds the command's real parser (a script: ``main(argv)`` runs it)
    help: str  # its line in ``specserve --help`` (the real parser takes it from here too)
    script: bool = False

    def __call__(self, commands: argparse._SubParsersAction) -> None:
        """Registers the stub: an entry point's value may be a LazyCommand in place of a register."""
        commands.add_parser(self.name, help=self.help, add_help=False).set_defaults(lazy=self)

    def parse(self, argv: list[str], verbose: bool) -> argparse.Namespace:
        """The command's arguments (``argv``: what follows its name), read by its own parser."""
        if self.script:  # its own parser reads ``argv`` when it runs
            main = importlib.import_module(self.module).main
            return argparse.Namespace(run=lambda _: main(argv), verbose=verbose)
        parser = argparse.ArgumentParser(prog="specserve")
        importlib.import_module(self.module).register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args([self.name, *argv])
        args.verbose = verbose
        return args
