"""Concurrent clients with mixed tasks: each level runs the same requests with speculation OFF and
AUTO, one mode after the other (the first mode alternates between levels), streaming every
request so that the time to the first token is what a client sees. Around each run the workers'
own batch counters (their Inspect RPC) say how many sessions and tokens their passes held.
``python -m specserve.bench.load`` runs this section alone (``__main__.py``)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from specserve.cluster.client import SpecServeClient
from specserve.proto.v1 import specserve_pb2 as pb

from ..decoders import decode_service_streamed
from ..faults import inspect
from ..samples import AUTO, OFF, OFF_UNBATCHED, Sample

MODES = (OFF, AUTO)
SPECULATION = {OFF: pb.SPECULATION_OFF, AUTO: pb.SPECULATION_AUTO, OFF_UNBATCHED: pb.SPECULATION_OFF}
PASS_COUNTERS = ("passes", "pass_tokens", "pass_sessions")  # WorkerState's, cumulative


def mixed_requests(prompts: dict[str, list[str]], count: int, distinct: int) -> list[tuple[str, int, str]]:
    """``count`` requests (task, prompt index, prompt) cycling over the first ``distinct`` prompts
    with tasks interleaved (code, sql, math, prose, code, ...), so every level asks for the same
    prompts whatever its size."""
    order = [(task, i, p) for i in range(max(map(len, prompts.values()))) for task, ps in prompts.items()
             if i < len(ps) for p in [ps[i]]]
    return list(itertools.islice(itertools.cycle(order[:distinct]), count))


def run_level(client: SpecServeClient, requests: list[tuple[str, int, str]], clients: int, path: str,
              max_tokens: int, done: Callable[[], None] = lambda: None) -> list[Sample]:
    """Every request once, ``clients`` at a time; ``started`` is seconds since the level began.
    ``path`` is OFF or AUTO (or OFF_UNBATCHED, OFF on a service with batching off)."""
    level_start = time.perf_counter()

    def one(item: tuple[str, int, str]) -> Sample:
        task, index, prompt = item
        request = pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens, speculation=SPECULATION[path])
        sample = Sample("load", task, path, index, concurrency=clients, started=time.perf_counter() - level_start)
        decode_service_streamed(client, request, sample)
        done()
        return sample

    with ThreadPoolExecutor(clients, thread_name_prefix="client") as pool:
        return list(pool.map(one, requests))


def worker_counters(client: SpecServeClient) -> dict[str, dict]:
    """Per worker (by id): its kind, pid, pass counters and KV pool, from its own Inspect RPC."""
    counters = {}
    for worker in client.stats().workers:
        try:
            state = inspect(worker.kind, worker.address)
        except grpc.RpcError:  # a dead worker's entry, until the registry drops it
            continue
        counters[worker.worker_id] = {"kind": worker.kind, "pid": state.pid, "gpu": state.resources.get("GPU", 0) > 0,
                                      **{c: getattr(state, c) for c in PASS_COUNTERS},
                                      "kv_pool_bytes": state.kv_pool_bytes, "kv_budget_bytes": state.kv_budget_bytes,
                                      "max_pass_sessions": state.max_pass_sessions}
    return counters


def pool_growth(before: dict[str, dict], after: dict[str, dict]) -> dict[int, int]:
    """By worker pid: the bytes its KV pools allocated in host memory between the two readings
    (arenas are allocated as sessions first need them, up to the pool's budget, and kept; a GPU
    worker's are in device memory, not in its resident set)."""
    return {c["pid"]: max(0, c["kv_pool_bytes"] - before[w]["kv_pool_bytes"]) for w, c in after.items()
            if w in before and not c["gpu"]}


def pass_record(path: str, clients: int, before: dict[str, dict], after: dict[str, dict]) -> dict:
    """What the workers' passes held during one run of a level, per kind: the counters' growth over
    the workers seen before and after it; the most sessions one pass of theirs has held and the
    largest KV pool against its budget (0 where a worker does not report them)."""
    record: dict = {"path": path, "clients": clients}
    for kind in ("target", "draft"):
        ids = [w for w, c in after.items() if c["kind"] == kind and w in before]
        record[kind] = {c: sum(max(0, after[w][c] - before[w][c]) for w in ids) for c in PASS_COUNTERS}
        record[kind]["max_pass_sessions"] = max((after[w]["max_pass_sessions"] for w in ids), default=0)
        record[kind]["kv_pool_of_budget"] = max((after[w]["kv_pool_bytes"] / after[w]["kv_budget_bytes"] for w in ids
                                                 if after[w]["kv_budget_bytes"]), default=0.0)
    return record


def reference_outputs(samples: list[Sample]) -> dict[tuple[str, int], list[int]]:
    """The target-only output of each prompt the load section asked for, by (task, prompt): the
    batching-off service's at its fewest clients (nothing to be batched with), or where that did
    not run, the service's OFF at its fewest."""
    for path in (OFF_UNBATCHED, OFF):
        runs = [s for s in samples if s.path == path]
        if runs:
            fewest = min(s.concurrency for s in runs)
            return {(s.task, s.prompt): s.token_ids for s in runs if s.concurrency == fewest}
    return {}
