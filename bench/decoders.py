"""One decode on each path the benchmark compares, timed by the caller and returned as a Sample.

Service paths go over gRPC like any client's. In-process paths (our engine, HF assisted generation)
run on one device thread pinned to the core the target replica uses, with the same thread count, so
the comparison is between code paths, not between core allocations; the service's draft workers have
their own core, which is the point of the design.
"""

from __future__ import annotations

import time

import torch

from specserve.cluster.client import SpecServeClient
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.workers.engine import SpecEngine
from specserve.workers.prompt import encode_prompt
from specserve.workers.grpc_host import Device
from specserve.workers.request import GenerationParams
from specserve.cluster.zoo.zoo import GENERAL_DRAFT

from .samples import GENERAL, NGRAM, OFF, ROUTED, SUFFIX, TASK, TASK_ADAPTIVE, TREE, Sample


def service_request(path: str, prompt: str, task: str, draft: str, k: int, max_tokens: int,
                    temperature: float = 0.0, seed: int | None = None) -> pb.GenerateRequest:
    """The request each service path sends. ``draft`` is the task's own draft (TASK path)."""
    request = pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=temperature)
    if seed is not None:
        request.seed = seed
    if path == OFF:
        request.task, request.speculation = task, pb.SPECULATION_OFF
    elif path in (TASK, GENERAL):
        request.task, request.speculation, request.k = task, pb.SPECULATION_ON, k
        request.draft = draft if path == TASK else GENERAL_DRAFT
    elif path in (TASK_ADAPTIVE, NGRAM, SUFFIX, TREE):  # no k: the policy's, adapted per step by its schedule
        request.task, request.speculation = task, pb.SPECULATION_ON
        request.draft = draft if path == TASK_ADAPTIVE else path
    elif path != ROUTED:  # ROUTED: nothing but the prompt, as most clients send it
        raise ValueError(f"not a service path: {path}")
    return request


def fill_stats(sample: Sample, stats: pb.GenerateStats) -> Sample:
    sample.proposed, sample.accepted, sample.rejections = stats.proposed_tokens, stats.accepted_tokens, stats.rejections
    sample.drafted, sample.wasted = stats.drafted_tokens, stats.wasted_draft_tokens
    sample.lookaheads, sample.lookahead_hits, sample.branch_hits = stats.lookaheads, stats.lookahead_hits, stats.branch_hits
    sample.target_passes, sample.k, sample.draft = stats.target_passes, stats.k, stats.draft
    sample.draft_seconds, sample.verify_seconds = stats.draft_seconds, stats.verify_seconds
    sample.resolved_task = stats.task
    return sample


def decode_service(client: SpecServeClient, request: pb.GenerateRequest, sample: Sample) -> Sample:
    start = time.perf_counter()
    response = client.generate(request)
    sample.seconds = time.perf_counter() - start
    sample.token_ids = list(response.token_ids)
    sample.tokens = len(sample.token_ids)
    return fill_stats(sample, response.stats)


def decode_service_streamed(client: SpecServeClient, request: pb.GenerateRequest, sample: Sample) -> Sample:
    """As decode_service, streaming, so that the time to the first token is the client's."""
    start = time.perf_counter()
    stats = None
    for chunk in client.stream(request):
        if chunk.token_ids and sample.first_token_seconds is None:
            sample.first_token_seconds = time.perf_counter() - start
            sample.first_chunk_tokens = len(chunk.token_ids)
        sample.token_ids.extend(chunk.token_ids)
        if chunk.HasField("stats"):
            stats = chunk.stats
    sample.seconds = time.perf_counter() - start
    sample.tokens = len(sample.token_ids)
    return fill_stats(sample, stats) if stats is not None else sample


def decode_engine(engine: SpecEngine, device: Device, prompt: str, draft: str | None, k: int, max_tokens: int,
                  sample: Sample) -> Sample:
    def run() -> Sample:
        params = GenerationParams(max_tokens=max_tokens, k=k, speculation=draft is not None)
        start = time.perf_counter()
        done = engine.generate(prompt, params, draft=draft).complete()
        sample.seconds = time.perf_counter() - start
        sample.token_ids, sample.tokens, s = done.token_ids, len(done.token_ids), done.stats
        sample.proposed, sample.accepted, sample.rejections = s.proposed, s.accepted, s.rejections
        sample.drafted, sample.wasted = s.drafted, s.wasted
        sample.target_passes, sample.draft_seconds, sample.verify_seconds = s.target_passes, s.draft_seconds, s.verify_seconds
        sample.k, sample.draft = (k, draft) if draft else (0, "")
        return sample
    return device.executor.submit(run).result()


def decode_hf_assisted(engine: SpecEngine, device: Device, prompt: str, draft: str, max_tokens: int,
                       sample: Sample) -> Sample:
    """transformers' own assisted generation (``assistant_model``), greedy, with its default
    schedule (20 draft tokens, cut short by its adaptive confidence threshold)."""
    tokenizer = engine.tokenizer

    def run() -> Sample:
        ids = torch.tensor([encode_prompt(tokenizer, prompt)])
        start = time.perf_counter()
        with torch.inference_mode():
            out = engine.target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=engine.drafts[draft],
                                         do_sample=False, max_new_tokens=max_tokens,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        sample.seconds = time.perf_counter() - start
        new = out[0, ids.shape[1]:].tolist()
        # Our output leaves EOS out (it is a finish reason, not text): compare like with like.
        sample.token_ids = new[: new.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in new else new
        sample.tokens, sample.draft = len(sample.token_ids), draft
        return sample
    return device.executor.submit(run).result()
