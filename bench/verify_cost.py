"""What a target pass costs by the number of tokens it verifies, in this process on one thread.

Leviathan et al.'s bound assumes a pass over k+1 tokens costs what a pass over one does (true on a
GPU until the batch fills it). This measures the ratio on this machine: passes of n tokens after a
100-token prefix, n interleaved so that machine noise hits every n alike; medians.

    .venv/bin/python bench/verify_cost.py [--zoo bench] [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specserve.cluster.local import open_zoo
from specserve.workers.kv_cache import CachedLM
from specserve.workers.loading import ModelSpec, load_model

TOKENS = (1, 2, 3, 5, 9, 17)
PREFIX = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", default="bench", help="zoo preset or directory (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=30, help="(default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the target replica runs
    model = load_model(ModelSpec(str(open_zoo(args.zoo).target_dir)))
    lm = CachedLM(model)
    lm.extend(torch.randint(3, 1000, (PREFIX,)).tolist())
    seconds: dict[int, list[float]] = {n: [] for n in TOKENS}
    for _ in range(args.reps):
        for n in TOKENS:
            ids = torch.randint(3, 1000, (n,)).tolist()
            start = time.perf_counter()
            lm.extend(ids, logits_wanted=n)
            seconds[n].append(time.perf_counter() - start)
            lm.rollback(PREFIX)
    one = statistics.median(seconds[1])
    print(f"{'tokens':>6} {'ms':>7} {'x one':>6} {'w':>6}")
    for n, values in seconds.items():
        ratio = statistics.median(values) / one
        w = (ratio - 1) / (n - 1) if n > 1 else 0.0
        print(f"{n:>6} {statistics.median(values) * 1000:>7.2f} {ratio:>6.2f} {w:>6.3f}")


if __name__ == "__main__":
    main()
