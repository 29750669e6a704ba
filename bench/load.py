"""Concurrent clients with mixed tasks: each level runs the same requests with speculation OFF and
AUTO, one mode after the other (the first mode alternates between levels), streaming every
request so that the time to the first token is what a client sees."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from specserve.cluster.client import SpecServeClient
from specserve.proto.v1 import specserve_pb2 as pb

from .decoders import decode_service_streamed
from .samples import AUTO, OFF, Sample

MODES = (OFF, AUTO)


def mixed_requests(prompts: dict[str, list[str]], count: int) -> list[tuple[str, int, str]]:
    """(task, prompt index, prompt), tasks interleaved: code, sql, math, prose, code, ..."""
    order = [(task, i, p) for i in range(max(map(len, prompts.values()))) for task, ps in prompts.items()
             if i < len(ps) for p in [ps[i]]]
    return list(itertools.islice(itertools.cycle(order), count))


def run_level(client: SpecServeClient, requests: list[tuple[str, int, str]], clients: int, mode: str,
              max_tokens: int, done: Callable[[], None] = lambda: None) -> list[Sample]:
    """Every request once, ``clients`` at a time; ``started`` is seconds since the level began."""
    level_start = time.perf_counter()

    def one(item: tuple[str, int, str]) -> Sample:
        task, index, prompt = item
        request = pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens,
                                     speculation=pb.SPECULATION_OFF if mode == OFF else pb.SPECULATION_AUTO)
        sample = Sample("load", task, mode, index, concurrency=clients, started=time.perf_counter() - level_start)
        decode_service_streamed(client, request, sample)
        done()
        return sample

    with ThreadPoolExecutor(clients, thread_name_prefix="client") as pool:
        return list(pool.map(one, requests))
