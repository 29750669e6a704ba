"""How to run many sessions' steps in one pass: the choice behind ``workers/kv_pool.py``, measured.

For B sessions each holding ``--cached`` positions in a KV pool and adding q tokens (1: a
target-only step; k + 1: a verify step), one pass is timed four ways on a model of the bench zoo's
target shape (random weights: timing only), on one thread like a replica:

    ragged      what workers run on a CPU: the sessions' tokens packed into one row; each layer
                writes a session's keys and values into its pool region and attends over a view of it
    gathered    what workers run on a GPU: the same packed row, but each layer writes every
                session's keys in one operation and attends the sessions in one SDPA call per
                (arena, row count) over keys gathered into a padded batch
    padded      a batch of B rows over a padded cache: every pass first gathers the sessions'
                regions into [B, heads, cached, head_dim] (what a pool needs without a ragged
                attention: the copy the pool avoids), then one forward with a padding mask
    one by one  batching off, as a worker with ``max_sessions_per_pass`` 1 runs it: B ragged
                passes of one session each

    python -m specserve.bench.experiments.batched_pass [--sessions 1,4,16,32] [--cached 160] [--core 1]
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.ragged_pass import Segment, run_pass, use_pooled_attention

BENCH_TARGET = dict(vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                    num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024)


def timed(fn, repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1000


def prefilled(model, sessions: int, cached: int, q: int):
    """A pool holding ``sessions`` regions of ``cached`` positions each, with room for q more."""
    pool = KVPool(KVShape.of(model), Budget(2**32))
    regions = [pool.take(cached + q) for _ in range(sessions)]
    run_pass(model, pool, [Segment(r, 0, list(range(3, 3 + cached)), 0) for r in regions])
    return pool, regions


def ragged(model, sessions: int, cached: int, q: int):
    pool, regions = prefilled(model, sessions, cached, q)
    segments = [Segment(r, cached, list(range(5, 5 + q)), q) for r in regions]
    return lambda: run_pass(model, pool, segments)


def gathered(model, sessions: int, cached: int, q: int):
    model = use_pooled_attention(copy.deepcopy(model), gathered=True)
    return ragged(model, sessions, cached, q)


def padded(model, sessions: int, cached: int, q: int):
    """The sessions' regions, gathered into one padded batch cache every pass."""
    pool, regions = prefilled(model, sessions, cached, q)
    mask = torch.ones(sessions, cached + q, dtype=torch.long)
    ids = torch.full((sessions, q), 5)

    def one_pass():
        cache = DynamicCache()
        for layer in range(model.config.num_hidden_layers):
            keys = torch.stack([pool.keys(r, layer)[:, :cached] for r in regions])  # the gather: [B, H, cached, D]
            values = torch.stack([pool.values(r, layer)[:, :cached] for r in regions])
            cache.update(keys, values, layer)
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=q)
    return one_pass


def one_by_one(model, sessions: int, cached: int, q: int):
    pool, regions = prefilled(model, sessions, cached, q)
    segments = [Segment(r, cached, list(range(5, 5 + q)), q) for r in regions]

    def passes():
        for segment in segments:
            run_pass(model, pool, [segment])
    return passes


WAYS = {"ragged": ragged, "gathered": gathered, "padded": padded, "one by one": one_by_one}


def measure(model, sessions: int, cached: int, q: int, repeats: int) -> dict[str, float]:
    """Median milliseconds of one pass over ``sessions`` sessions, each way."""
    return {name: timed(way(model, sessions, cached, q), repeats) for name, way in WAYS.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.experiments.batched_pass", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default="1,4,16,32", help="sessions per pass (default: %(default)s)")
    parser.add_argument("--cached", type=int, default=160, help="positions each session holds (default: %(default)s)")
    parser.add_argument("--queries", default="1,4", help="tokens each session adds (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--core", type=int, default=None, help="pin to this core (default: unpinned)")
    args = parser.parse_args(argv)
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = use_pooled_attention(LlamaForCausalLM(LlamaConfig(**BENCH_TARGET)).eval())
    print(f"one pass, ms (per session); {args.cached} cached positions each; 1 thread"
          f"{f', core {args.core}' if args.core is not None else ''}")
    print(f"{'sessions':>8} {'q':>3}" + "".join(f" {name:>15}" for name in WAYS) + f" {'one by one / ragged':>20}")
    for q in map(int, args.queries.split(",")):
        for b in map(int, args.sessions.split(",")):
            ms = measure(model, b, args.cached, q, args.repeats)
            cells = " ".join(f"{m:7.1f} ({m / b:5.2f})" for m in ms.values())
            print(f"{b:>8} {q:>3} {cells} {ms['one by one'] / ms['ragged']:>20.2f}", flush=True)


if __name__ == "__main__":
    main()
