"""``python -m specserve.bench.load``: the warm-up and the load section alone, a run of ``specserve
bench`` whose other sections are empty."""

from __future__ import annotations

import argparse
from pathlib import Path

from specserve.cluster.commands.common import comma_ints, dotted_overrides

from ..run import run_bench
from ..settings import BenchSettings


def main(argv: list[str] | None = None) -> int:
    """``python -m specserve.bench.load``: the warm-up and the load section alone (with batching
    off and the peers), written as a run of ``specserve bench`` whose other sections are empty."""
    d = BenchSettings()
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.load", description=main.__doc__)
    parser.add_argument("--zoo", default=d.zoo, help="a zoo preset name or directory (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=d.out, help="results directory (default: %(default)s)")
    parser.add_argument("--address", metavar="HOST:PORT", help="a running service (no batching-off run then)")
    parser.add_argument("--warm-up", type=int, default=d.warm_up, help="routed requests per task (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="(default: %(default)s)")
    parser.add_argument("--concurrency", type=comma_ints, default=d.concurrency, metavar="N,N", help="(default: %(default)s)")
    parser.add_argument("--load-requests", type=int, default=d.load_requests, help="(default: %(default)s)")
    parser.add_argument("--unbatched-levels", type=comma_ints, default=d.unbatched_levels, metavar="N,N",
                        help="levels also run with batching off (default: %(default)s)")
    parser.add_argument("--no-peers", action="store_true", help="skip transformers generate and generate_batch")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a field of the embedded service's config, e.g. target.batching.same_task_wait_ms=5")
    args = parser.parse_args(argv)
    run_bench(BenchSettings(zoo=args.zoo, out=args.out, address=args.address, warm_up=args.warm_up,
                            max_tokens=args.max_tokens, concurrency=args.concurrency, load_requests=args.load_requests,
                            unbatched_levels=args.unbatched_levels, load_peers=not args.no_peers, sections=("load",),
                            service_overrides=dotted_overrides(args.overrides)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
