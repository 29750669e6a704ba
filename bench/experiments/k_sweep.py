"""Greedy speedup through the service at fixed k, the task's own draft, against target-only.

For each held-out prompt, target-only and every k run back to back; outputs are checked against
the target's; medians of the per-prompt speedups. Shows where a longer k stops paying.

    python -m specserve.bench.experiments.k_sweep [--zoo bench] [--tasks sql,math,code] [--ks 2,4,8,12,16]
        [--prompts 6] [--address HOST:PORT]
"""

from __future__ import annotations

import argparse
import statistics
import time

from specserve.bench.prompts import load_prompts
from specserve.cluster.bringup import start_service
from specserve.cluster.client import READY_TIMEOUT_SECONDS, SpecServeClient
from specserve.cluster.local import open_zoo
from specserve.cluster.zoo.zoo import Zoo
from specserve.proto.v1 import specserve_pb2 as pb


def sweep(client: SpecServeClient, zoo: Zoo, tasks: list[str], ks: list[int], prompts: int,
          max_tokens: int) -> dict[str, dict[int, float]]:
    """Per task and k, the median over ``prompts`` held-out prompts of target-only seconds over
    speculative seconds; prints each task's row as it is done."""
    by_task = load_prompts(zoo).by_task

    def decode(prompt: str, task: str, k: int | None) -> tuple[float, list[int]]:
        request = pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens, task=task,
                                     speculation=pb.SPECULATION_OFF if k is None else pb.SPECULATION_ON)
        if k is not None:
            request.k, request.draft = k, zoo.default_draft(task)
        start = time.perf_counter()
        response = client.generate(request)
        return time.perf_counter() - start, list(response.token_ids)

    print(f"{'task':<6}" + "".join(f"{f'k={k}':>8}" for k in ks))
    speedups = {}
    for task in tasks:
        decode(by_task[task][-1], task, ks[0])  # warm-up
        ratios: dict[int, list[float]] = {k: [] for k in ks}
        for prompt in by_task[task][:prompts]:
            off_seconds, off_ids = decode(prompt, task, None)
            for k in ks:
                seconds, ids = decode(prompt, task, k)
                if ids != off_ids:
                    raise RuntimeError(f"{task} k={k}: output differs from the target's")
                ratios[k].append(off_seconds / seconds)
        speedups[task] = {k: statistics.median(r) for k, r in ratios.items()}
        print(f"{task:<6}" + "".join(f"{s:>7.2f}x" for s in speedups[task].values()), flush=True)
    return speedups


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.experiments.k_sweep",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", default="bench", help="zoo preset or directory (default: %(default)s)")
    parser.add_argument("--tasks", default="sql,math,code", help="(default: %(default)s)")
    parser.add_argument("--ks", default="2,4,8,12,16", help="(default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=6, help="per task (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=96, help="(default: %(default)s)")
    parser.add_argument("--address", metavar="HOST:PORT", help="a running service serving the same zoo "
                                                                "(default: start one on the zoo)")
    args = parser.parse_args(argv)
    zoo = open_zoo(args.zoo)
    service = None if args.address else start_service(port=0, overrides={"models": {"zoo": str(zoo.root)}})
    client = SpecServeClient(args.address or service.address)
    try:
        if args.address:
            client.wait_ready(READY_TIMEOUT_SECONDS, say=print)
        sweep(client, zoo, args.tasks.split(","), [int(k) for k in args.ks.split(",")], args.prompts, args.max_tokens)
    finally:
        client.close()
        if service is not None:
            service.stop()


if __name__ == "__main__":
    main()
