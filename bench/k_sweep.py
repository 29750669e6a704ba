"""Greedy speedup through the service at fixed k, the task's own draft, against target-only.

For each held-out prompt, target-only and every k run back to back; outputs are checked against
the target's; medians of the per-prompt speedups. Shows where a longer k stops paying.

    .venv/bin/python bench/k_sweep.py [--zoo bench] [--tasks sql,math,code] [--ks 2,4,8,12,16] [--prompts 6]
"""

from __future__ import annotations

import argparse
import statistics
import time

from specserve.bench.prompts import load_prompts
from specserve.cluster.bringup import start_service
from specserve.cluster.client import SpecServeClient
from specserve.cluster.local import open_zoo
from specserve.proto.v1 import specserve_pb2 as pb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", default="bench", help="zoo preset or directory (default: %(default)s)")
    parser.add_argument("--tasks", default="sql,math,code", help="(default: %(default)s)")
    parser.add_argument("--ks", default="2,4,8,12,16", help="(default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=6, help="per task (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=96, help="(default: %(default)s)")
    args = parser.parse_args()
    zoo = open_zoo(args.zoo)
    prompts = load_prompts(zoo).by_task
    ks = [int(k) for k in args.ks.split(",")]
    service = start_service(port=0, overrides={"models": {"zoo": str(zoo.root)}})
    client = SpecServeClient(service.address)

    def decode(prompt: str, task: str, k: int | None) -> tuple[float, list[int]]:
        request = pb.GenerateRequest(prompt=prompt, max_tokens=args.max_tokens, task=task,
                                     speculation=pb.SPECULATION_OFF if k is None else pb.SPECULATION_ON)
        if k is not None:
            request.k, request.draft = k, zoo.default_draft(task)
        start = time.perf_counter()
        response = client.generate(request)
        return time.perf_counter() - start, list(response.token_ids)

    try:
        print(f"{'task':<6}" + "".join(f"{f'k={k}':>8}" for k in ks))
        for task in args.tasks.split(","):
            decode(prompts[task][-1], task, ks[0])  # warm-up
            ratios: dict[int, list[float]] = {k: [] for k in ks}
            for prompt in prompts[task][: args.prompts]:
                off_seconds, off_ids = decode(prompt, task, None)
                for k in ks:
                    seconds, ids = decode(prompt, task, k)
                    assert ids == off_ids, f"{task} k={k}: output differs from the target's"
                    ratios[k].append(off_seconds / seconds)
            print(f"{task:<6}" + "".join(f"{statistics.median(r):>7.2f}x" for r in ratios.values()), flush=True)
    finally:
        client.close()
        service.stop()


if __name__ == "__main__":
    main()
