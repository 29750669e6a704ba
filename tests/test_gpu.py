"""The GPU suite (`make test-gpu`, marker ``gpu``): skipped, and counted as skipped, without CUDA.

On a CUDA device: greedy identity of speculation against the target alone in float32, bfloat16 and
float16 over the zoo's held-out prompts (every divergence is reported with its logit margin, and
must be one rounding explains: tests/divergence.py), the same for sessions batched in shared passes,
the lossless sampling test on CUDA, and the KV pool on device memory.

The zoo is ``SPECSERVE_GPU_ZOO`` when set (a built zoo's directory: the demo or bench zoo), else
the tiny zoo the other tests build. With ``SPECSERVE_GPU_REPORT`` set to a folder, each test writes
its numbers there as JSON (``make gpu-check`` collects them with the bench's report).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from divergence import first_divergence, summary
from specserve.workers.sampling import SamplingParams
from specserve.workers.engine import SpecEngine
from specserve.workers.kv_pool import Budget, KVPool, KVShape, PoolFull
from specserve.workers.loading import ModelSpec, load_model, load_tokenizer, resolve_dtype
from specserve.workers.proposer_kinds import NGRAM, SUFFIX, TREE
from specserve.workers.prompt import encode_prompt
from specserve.workers.ragged_pass import use_pooled_attention
from specserve.workers.request import GenerationParams
from specserve.cluster.zoo.head import HEAD
from specserve.cluster.zoo.zoo import Zoo

from scheduled import decode_alone, decode_scheduled, verify_scheduled

# SPECSERVE_GPU_SUITE_DEVICE=cpu runs the suite on the CPU: a dry run of its code, not a GPU result.
DEVICE = os.environ.get("SPECSERVE_GPU_SUITE_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                 reason="no CUDA device here: the GPU suite runs with `make test-gpu` on a machine with one")]

# The file's order is the order a lease spends its minutes: the batched passes (CUDA graphs), the KV
# pool, sampling, then greedy identity per dtype (the rounding dtypes first: float32 passed on the H100).
DTYPES = ["bfloat16", "float16", "float32"]
PROMPTS_PER_TASK = 8
MAX_TOKENS = 48
K = 4


@pytest.fixture(scope="module")
def zoo(request) -> Zoo:
    path = os.environ.get("SPECSERVE_GPU_ZOO")
    return Zoo.open(Path(path).expanduser()) if path else request.getfixturevalue("tiny_zoo")


def report(name: str, numbers: dict) -> None:
    folder = os.environ.get("SPECSERVE_GPU_REPORT")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.json").write_text(json.dumps(numbers, indent=1))


def cuda_engine(zoo: Zoo, dtype: str) -> SpecEngine:
    drafts = {name: ModelSpec(str(zoo.root / zoo.manifest["drafts"][name]["path"]), dtype=dtype, device=DEVICE)
              for name in zoo.draft_names}
    return SpecEngine.load(ModelSpec(str(zoo.target_dir), dtype=dtype, device=DEVICE), drafts)


def proposers(zoo: Zoo, engine: SpecEngine, task: str) -> list[tuple[str, tuple[str, ...]]]:
    """The task's draft, the zoo's head, and a token tree of the draft with both draft-free ones."""
    own = zoo.default_draft(task)
    chosen = [(own, ()), (TREE, (own, NGRAM, SUFFIX))]
    return chosen + [(HEAD, ())] * (HEAD in engine.heads and own != HEAD)


def scheduled_sessions(zoo: Zoo, dtype: str, how: str) -> tuple[dict, list]:
    """Sixteen held-out prompts through one scheduler (``how``: "batched", target-only decode runs;
    "verified", proposals verified) against each decoded alone: the divergences' summary, with the
    graphs the scheduler captured, reported; and the divergences."""
    model = use_pooled_attention(load_model(ModelSpec(str(zoo.target_dir), dtype=dtype, device=DEVICE)))
    tokenizer = load_tokenizer(str(zoo.target_dir))
    prompts = [encode_prompt(tokenizer, p) for task in zoo.tasks for p in zoo.prompts(task)][:16]
    alone = decode_alone(model, prompts, 24)
    got, scheduler = decode_scheduled(model, prompts, 24) if how == "batched" else verify_scheduled(model, prompts, alone)
    divergences = [d for i, (prompt, a, b) in enumerate(zip(prompts, alone, got, strict=True))
                   if (d := first_divergence(model, prompt, a, b, how, i)) is not None]
    graphs = {"buckets": sorted(scheduler.graphs.buckets) if scheduler.graphs else [],
              "disabled": scheduler.graphs.disabled if scheduler.graphs else "no graphs (not CUDA)"}
    numbers = summary(divergences, len(prompts)) | {"graphs": graphs}
    report(f"{how}-{dtype}", numbers)
    return numbers, divergences


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sessions_batched_on_the_gpu_decode_what_they_decode_alone(zoo, dtype):
    """Sixteen sessions' target-only steps in shared passes (on CUDA, decode passes replayed from
    CUDA graphs) against each decoded alone."""
    numbers, divergences = scheduled_sessions(zoo, dtype, "batched")
    assert numbers["unexplained"] == 0, [d.row() for d in divergences if not d.explained]
    if DEVICE == "cuda":  # decode passes replayed CUDA graphs (workers/graphs.py), captured without failing
        assert numbers["graphs"]["disabled"] is None and numbers["graphs"]["buckets"], numbers["graphs"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sessions_verifying_proposals_in_graphed_passes_commit_what_they_decode_alone(zoo, dtype):
    """Sixteen sessions verify proposals of k = 1..5 (their own continuation, some wrong) in shared
    passes, each session padded to the pass's row bucket and replayed from its CUDA graph."""
    numbers, divergences = scheduled_sessions(zoo, dtype, "verified")
    assert numbers["unexplained"] == 0, [d.row() for d in divergences if not d.explained]
    if DEVICE == "cuda":  # verify passes of up to k + 1 rows a session replayed graphs
        graphs = numbers["graphs"]
        assert graphs["disabled"] is None and max(rows for _, rows, _ in graphs["buckets"]) >= 5, graphs


# Fewer than the CPU test's 20,000 (a GPU is lent for minutes): the bounds are computed for this N.
GPU_SAMPLES = int(os.environ.get("SPECSERVE_GPU_SAMPLES", "4000"))


def test_sampling_on_cuda_has_the_target_distribution():
    """The lossless sampling test's setting with both models on the GPU (acceptance runs on the
    host over the pass's logits): TV and chi-square against the target's exact distribution."""
    from test_lossless_sampling import (assert_same_distribution, exact_distribution, params_for, sample_distribution,
                                        tiny_model, word_tokenizer)

    tokenizer = word_tokenizer()
    sampling, k = SamplingParams(temperature=1.0, top_p=0.9), 2
    exact = exact_distribution(tiny_model(0), [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    engine = SpecEngine(tiny_model(0).to(DEVICE), tokenizer, {"d": tiny_model(1).to(DEVICE)})
    counts, alpha = sample_distribution(engine, params_for(sampling, k), GPU_SAMPLES, "d")
    report("sampling", {"samples": GPU_SAMPLES, "alpha": alpha, "counts": {" ".join(map(str, o)): n
                                                                          for o, n in counts.items()}})
    assert 0.05 < alpha < 0.98
    assert_same_distribution(exact, counts, GPU_SAMPLES)


def test_the_kv_pool_takes_device_memory_within_its_budget(zoo):
    model = load_model(ModelSpec(str(zoo.target_dir), device=DEVICE))
    shape = KVShape.of(model)
    assert shape.device.type == DEVICE and shape.dtype == resolve_dtype("auto", shape.device)  # bf16 on CUDA
    before = allocated()
    pool = KVPool(shape, Budget(1000 * shape.bytes_per_position), arena_positions=600)
    region = pool.take(500)
    assert pool.keys(region, 0).device.type == DEVICE
    if DEVICE == "cuda":
        assert allocated() - before >= 600 * shape.bytes_per_position
    with pytest.raises(PoolFull):
        pool.take(500)  # a second arena would pass the budget
    free, total = torch.cuda.mem_get_info() if DEVICE == "cuda" else (0, 0)
    report("kv-pool", {"bytes_per_position": shape.bytes_per_position, "free_bytes": free, "total_bytes": total})


def allocated() -> int:
    return torch.cuda.memory_allocated() if DEVICE == "cuda" else 0


def test_the_kv_budget_is_the_processes_share_of_the_card_less_its_models(zoo):
    """gpu_memory_utilization x gpus of the card's memory, less what this process already holds."""
    from specserve.workers.kv_pool import device_budget

    model = load_model(ModelSpec(str(zoo.target_dir), device=DEVICE))
    if DEVICE != "cuda":
        assert device_budget(64, 0.9, 1.0, model.device).limit_bytes == 64 * 2**20  # CPUs: kv_cache_mib
        return
    free, total = torch.cuda.mem_get_info()
    budget = device_budget(64, 0.5, 0.5, model.device)
    expected = min(0.25 * total - torch.cuda.memory_reserved(), free)
    assert abs(budget.limit_bytes - expected) < 2**20
    assert device_budget(64, None, 0.5, model.device).limit_bytes == 64 * 2**20
    report("kv-budget", {"total_bytes": total, "utilization_0.5_gpus_0.5_bytes": budget.limit_bytes})
    from specserve.workers.kv_pool import arena_positions

    shape = KVShape.of(model)  # on CUDA a pool's share is one arena: every session in the first (graphs)
    assert arena_positions(budget, shape, 2) == budget.limit_bytes // (2 * shape.bytes_per_position)


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_speculation_matches_the_target_alone_per_dtype(zoo, dtype):
    engine = cuda_engine(zoo, dtype)
    divergences, requests = [], 0
    for task in zoo.tasks:
        for prompt in zoo.prompts(task)[:PROMPTS_PER_TASK]:
            prompt_ids = encode_prompt(engine.tokenizer, prompt)
            expected = engine.generate(prompt_ids, GenerationParams(max_tokens=MAX_TOKENS, speculation=False)
                                       ).complete().token_ids
            for name, tree in proposers(zoo, engine, task):
                got = engine.generate(prompt_ids, GenerationParams(max_tokens=MAX_TOKENS, k=K), draft=name,
                                      members=tree).complete().token_ids
                if (found := first_divergence(engine.target, prompt_ids, expected, got, name, requests)) is not None:
                    divergences.append(found)
                requests += 1
    numbers = summary(divergences, requests)
    report(f"greedy-{dtype}", numbers)
    assert numbers["unexplained"] == 0, [d.row() for d in divergences if not d.explained]


def test_the_service_on_one_gpu_serves_what_the_target_alone_decodes(zoo):
    """The whole service on this machine's one GPU: the target replica and the draft workers as
    separate processes sharing it (fractional gpus, bench/device.py), greedy, each task's draft
    forced on; every divergence from the same request served target-only must be one rounding
    explains (the margin read off this process's copy of the target)."""
    pytest.importorskip("ray", reason="the service needs Ray, which this machine does not have")
    if DEVICE != "cuda":
        pytest.skip("the service's placement on a GPU needs CUDA (no dry run of this test)")
    from specserve.bench.device import placement
    from specserve.cluster.bringup import start_service
    from specserve.cluster.client import SpecServeClient
    from specserve.proto.v1 import specserve_pb2 as pb

    service = start_service(port=0, overrides={"models": {"zoo": str(zoo.root)}, **placement("cuda", draft_workers=2)})
    client = SpecServeClient(service.address)
    model = load_model(ModelSpec(str(zoo.target_dir), device="cuda"))  # bf16 on CUDA, as the replica
    tokenizer = load_tokenizer(str(zoo.target_dir))
    divergences, requests, accepted = [], 0, 0
    try:
        for task in zoo.tasks:
            for prompt in zoo.prompts(task)[:2]:
                fields = dict(prompt=prompt, max_tokens=32, task=task)
                alone = client.generate(pb.GenerateRequest(speculation=pb.SPECULATION_OFF, **fields), timeout=120)
                got = client.generate(pb.GenerateRequest(speculation=pb.SPECULATION_ON, draft=zoo.default_draft(task),
                                                         k=4, **fields), timeout=120)
                accepted += got.stats.accepted_tokens
                found = first_divergence(model, encode_prompt(tokenizer, prompt), list(alone.token_ids),
                                         list(got.token_ids), task, requests)
                divergences += [found] if found is not None else []
                requests += 1
    finally:
        client.close()
        service.stop()
    numbers = summary(divergences, requests) | {"accepted_tokens": accepted}
    report("service", numbers)
    assert accepted > 0, "the drafts should have had tokens accepted"
    assert numbers["unexplained"] == 0, [d.row() for d in divergences if not d.explained]
