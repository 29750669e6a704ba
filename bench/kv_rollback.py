"""What a rollback costs: moving the cache's length, against copying the kept prefix (what a cache
without views would have to do). Prints microseconds per call for a bench-sized target layout.

    .venv/bin/python bench/kv_rollback.py
"""

from __future__ import annotations

import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specserve.workers.kv_cache import CachedLM

REPEATS = 200


def main() -> None:
    torch.set_num_threads(1)
    config = LlamaConfig(vocab_size=4096, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=8, intermediate_size=1376, max_position_embeddings=2048)
    model = LlamaForCausalLM(config).eval()
    print(f"{'cached tokens':>13} {'rollback (us)':>14} {'copy of the kept prefix (us)':>29}")
    for length in (64, 256, 1024):
        lm = CachedLM(model)
        lm.extend(list(range(length + REPEATS)))
        start = time.perf_counter()
        for _ in range(REPEATS):  # REPEATS real rollbacks, one token each, down to `length`
            lm.rollback(lm.length - 1)
        rollback = (time.perf_counter() - start) / REPEATS * 1e6
        layers = lm.cache.layers
        copy = _per_call(lambda: [(layer.keys.clone(), layer.values.clone()) for layer in layers])
        print(f"{length:>13} {rollback:>14.1f} {copy:>29.1f}")


def _per_call(fn) -> float:
    start = time.perf_counter()
    for _ in range(REPEATS):
        fn()
    return (time.perf_counter() - start) / REPEATS * 1e6


if __name__ == "__main__":
    main()
