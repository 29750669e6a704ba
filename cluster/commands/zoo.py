"""`specserve zoo build`: build (or reuse) a zoo of a target and its distilled drafts."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    zoo = commands.add_parser("zoo", help="the built-in model zoo").add_subparsers(dest="zoo_command", required=True, metavar="ACTION")
    build = zoo.add_parser("build", help="build (or reuse) a zoo of a target and its distilled drafts",
                           description="Train a tokenizer and a target on text every machine has, distill one draft per task "
                                       "and a general one, and write a manifest with held-out perplexity and acceptance rates.")
    build.add_argument("--preset", default="demo", help="tiny (seconds), demo (6-17 min on 2 CPU cores) or bench (30-60 min there) (default: %(default)s)")
    build.add_argument("--out", type=Path, help="directory (default: $SPECSERVE_HOME/zoo/PRESET, SPECSERVE_HOME defaulting to ~/.cache/specserve)")
    build.set_defaults(run=run_build)


def run_build(args: argparse.Namespace) -> int:
    from specserve.cluster.zoo.build import build_zoo
    from specserve.cluster.zoo.presets import get_preset
    from specserve.cluster.zoo.zoo import default_zoo_dir

    preset = get_preset(args.preset)
    out = args.out or default_zoo_dir(preset.name)
    logging.getLogger("specserve").setLevel(logging.INFO)  # a build is long: say what each stage did
    zoo = build_zoo(preset, out)
    print(f"zoo {preset.name} ready at {zoo.root}")
    return 0
