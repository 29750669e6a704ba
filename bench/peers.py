"""The peers of the load section: transformers on the target model alone (no speculation), greedy,
in a process of its own pinned to the target replica's cores with its thread count (the same
``Device`` the replica runs on), so that the service and the peers compare on one device.

    static batch     ``generate`` over B prompts left-padded into one batch: the batch runs until
                     its longest member is done, then the next B prompts start
    generate_batch   transformers' continuous batching (paged attention, a scheduler that refills
                     the batch as requests finish), at most B requests per forward pass

A level runs the prompts the service's level ran, with B in the place of the service's clients.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig, PreTrainedModel

from specserve.workers.config import BatchingConfig
from specserve.workers.grpc_host import Device
from specserve.workers.loading import ModelSpec, load_model, load_tokenizer

from .samples import PEER_BATCH, PEER_STATIC

# generate_batch sizes its KV cache and its per-pass buffers from free GPU memory unless told; on a
# CPU that means all of RAM, and filling those buffers took seconds per call. It gets what the
# level needs, and the replica's own default limit on tokens per pass.
PAGE_TOKENS = 256  # transformers' default page size
MAX_TOKENS_PER_PASS = BatchingConfig().max_tokens_per_pass


@dataclass
class PeerDecode:
    index: int  # into the level's prompts
    token_ids: list[int]  # the continuation, EOS and what follows it left out (as the service sends it)
    started: float  # seconds from the level's start to when this request's batch (or the request) started
    seconds: float  # from `started` to its last token


class PeerError(RuntimeError):
    """A peer returned no complete output (generate_batch logs its failures instead of raising)."""


def until_eos(ids: list[int], eos_id: int | None) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one batch, shorter ones padded on the left so every row continues at the right edge."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [B, width]
    mask = torch.zeros_like(ids)  # [B, width], 1 on prompt tokens
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def static_batch(model: PreTrainedModel, prompts: list[list[int]], max_tokens: int, eos_id: int,
                 pad_id: int) -> list[list[int]]:
    """Greedy continuations of the prompts, decoded together as one padded batch."""
    ids, mask = left_padded(prompts, pad_id)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_tokens,
                             eos_token_id=eos_id, pad_token_id=pad_id)
    return [until_eos(row, eos_id) for row in out[:, ids.shape[1]:].tolist()]


def run_static(model: PreTrainedModel, prompts: list[list[int]], batch: int, max_tokens: int, eos_id: int,
               pad_id: int) -> list[PeerDecode]:
    """The prompts in batches of ``batch``, one batch after the other; a request's latency is its batch's."""
    start, decodes = time.perf_counter(), []
    for first in range(0, len(prompts), batch):
        began = time.perf_counter() - start
        outputs = static_batch(model, prompts[first:first + batch], max_tokens, eos_id, pad_id)
        seconds = time.perf_counter() - start - began
        decodes += [PeerDecode(first + i, out, began, seconds) for i, out in enumerate(outputs)]
    return decodes


def run_generate_batch(model: PreTrainedModel, prompts: list[list[int]], batch: int, max_tokens: int,
                       eos_id: int, pad_id: int) -> list[PeerDecode]:
    """Every prompt submitted at once to ``generate_batch``, at most ``batch`` in a forward pass. A
    request's time runs from its submission to its last token (the cache's set-up before that, and
    the manager's stop after it, are not counted)."""
    pages = math.ceil((max(map(len, prompts)) + max_tokens) / PAGE_TOKENS)
    batching = ContinuousBatchingConfig(page_size=PAGE_TOKENS, num_blocks=batch * pages + 1,
                                        max_batch_tokens=MAX_TOKENS_PER_PASS, max_requests_per_batch=batch)
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos_id, pad_token_id=pad_id)
    start = time.perf_counter()
    # No inference_mode here: its manager updates its buffers in place from another thread, which
    # inference tensors refuse; it runs its passes under no_grad itself.
    results = list(model.generate_batch(prompts, generation_config=config,
                                        continuous_batching_config=batching).values())  # in the prompts' order
    failed = [r.error for r in results if r.error is not None]
    if len(results) != len(prompts) or failed:
        raise PeerError(f"generate_batch finished {len(results) - len(failed)} of {len(prompts)} requests"
                        + (f"; first error: {failed[0]}" if failed else ""))
    return [PeerDecode(i, until_eos(list(r.generated_tokens), eos_id), r.created_time - start,
                       r.lifespan[1] - r.created_time) for i, r in enumerate(results)]


PEERS: dict[str, Callable[..., list[PeerDecode]]] = {PEER_STATIC: run_static, PEER_BATCH: run_generate_batch}


def measure_peers(model: PreTrainedModel, levels: dict[int, list[list[int]]], max_tokens: int, eos_id: int,
                  pad_id: int, peers: tuple[str, ...] = tuple(PEERS)) -> dict[str, dict[int, list[PeerDecode]] | str]:
    """Each peer at each level ({batch: the level's prompt ids}), after one untimed call that pays
    its first-call costs. A peer that fails anywhere gives its error message instead of decodes:
    it is reported as not run, never with partial numbers."""
    results: dict[str, dict[int, list[PeerDecode]] | str] = {}
    for name in peers:
        run = PEERS[name]
        try:
            run(model, next(iter(levels.values()))[:1], 1, max_tokens, eos_id, pad_id)
            results[name] = {batch: run(model, prompts, batch, max_tokens, eos_id, pad_id)
                             for batch, prompts in levels.items()}
        except Exception as exc:  # noqa: BLE001  (whatever stops a peer here is its result: reported, not raised)
            results[name] = f"{type(exc).__name__}: {exc}"
    return results


def measure_peers_pinned(target_dir: str, levels: dict[int, list[list[int]]], max_tokens: int, threads: int,
                         cpus: tuple[int, ...], peers: tuple[str, ...] = tuple(PEERS)) -> dict:
    """``measure_peers`` in a fresh process whose model thread runs on ``cpus`` with ``threads``
    torch threads, as a target replica's does; nothing of this process's (its models, its threads)
    runs beside it."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_pinned, target_dir, levels, max_tokens, threads, cpus, peers).result()


def _pinned(target_dir: str, levels: dict[int, list[list[int]]], max_tokens: int, threads: int,
            cpus: tuple[int, ...], peers: tuple[str, ...]) -> dict:
    def measure() -> dict:
        model = load_model(ModelSpec(target_dir, threads=threads))
        tokenizer = load_tokenizer(target_dir)
        pad_id = tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
        return measure_peers(model, levels, max_tokens, tokenizer.eos_token_id, pad_id, peers)

    device = Device(threads, cpus)
    try:
        return device.executor.submit(measure).result()
    finally:
        device.executor.shutdown()
