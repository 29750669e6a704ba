"""Passes at bucketed shapes (workers/graphs.py), run eagerly or compiled on the CPU: the same
logits and cache as the eager pass, in float64, with padded sessions, rows and keys dropped unread,
for decode passes and (as captures take them on CUDA) verify steps, token trees, branches and
sessions of mixed row counts; passes of other shapes left to the eager pass. The capture itself
needs CUDA (tests/test_gpu.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specserve.workers.batching import Scheduler
from specserve.workers.config import BatchingConfig
from specserve.workers.graphs import WARM_UP_BUCKETS, PassGraphs
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.loading import gemv_layout
from specserve.workers.ragged_pass import Segment, run_pass, use_pooled_attention

from scheduled import decode_alone, decode_scheduled, verify_scheduled


def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512)
    return use_pooled_attention(LlamaForCausalLM(config).to(torch.float64).eval())


def test_bucketed_decode_passes_give_the_eager_passes_logits_and_cache():
    eager_model = model()
    graphed_model = copy.deepcopy(eager_model)
    pools = [KVPool(KVShape.of(m), Budget(2**24)) for m in (eager_model, graphed_model)]
    graphs = PassGraphs(graphed_model, pools[1], capture=False)
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 60, 17]  # the second session crosses the 64-key bucket as it decodes
    regions = [[pool.take(100) for _ in lengths] for pool in pools]
    prompts = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in lengths]
    for m, pool, mine in zip((eager_model, graphed_model), pools, regions, strict=True):
        run_pass(m, pool, [Segment(r, 0, p, 1) for r, p in zip(mine, prompts, strict=True)])
    for step in range(8):
        sessions = 3 if step % 2 else 2  # buckets of 2 and 4 sessions, one row padded
        tokens = torch.randint(3, 97, (sessions,), generator=gen).tolist()
        want = run_pass(eager_model, pools[0], [Segment(regions[0][i], lengths[i] + step, [tokens[i]], 1)
                                                for i in range(sessions)])
        segments = [Segment(regions[1][i], lengths[i] + step, [tokens[i]], 1) for i in range(sessions)]
        assert graphs.shape(segments) == (2 if sessions == 2 else 4, 1, 128 if lengths[1] + step >= 64 else 64)
        got = graphs.run(segments)
        for a, b in zip(want, got, strict=True):
            assert a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-10)
        if sessions == 2:
            lengths[2] -= 1  # the third session sat this step out: it decodes at the same place next time
    assert set(graphs.buckets) == {(2, 1, 64), (4, 1, 64), (2, 1, 128), (4, 1, 128)}
    for region_a, region_b in zip(regions[0], regions[1], strict=True):
        for layer in range(2):
            a, b = pools[0].keys(region_a, layer), pools[1].keys(region_b, layer)
            assert torch.allclose(a, b, rtol=0, atol=1e-10)  # padded rows wrote only the scratch slot


def test_passes_of_other_shapes_are_left_to_the_eager_pass():
    m = model()
    pool = KVPool(KVShape.of(m), Budget(2**24), arena_positions=64)
    graphs = PassGraphs(m, pool, capture=False)  # a CPU's default: decode passes alone
    captured = PassGraphs(m, pool, capture=False, max_rows=16)  # what a capture takes
    region, far = pool.take(32), pool.take(50)  # the second lands in another arena
    assert far.arena == 1
    assert graphs.max_rows == 1 and PassGraphs(m, pool, capture=True).max_rows == 16
    assert graphs.shape([Segment(region, 4, [5], 1)]) == (1, 1, 64)
    assert graphs.shape([Segment(region, 4, [5, 6], 2)]) is None  # a verify step, on a CPU
    assert graphs.run([Segment(region, 4, [5, 6], 2)]) is None
    assert captured.shape([Segment(region, 4, [5, 6], 2)]) == (1, 2, 64)  # ... where captured
    assert captured.shape([Segment(region, 4, [5] * 10, 1)] * 3) == (4, 12, 64)
    assert captured.shape([Segment(region, 4, [5] * 17, 1)]) is None  # a longer prompt chunk
    assert captured.shape([Segment(region, 4, [5], 1)] * 64 + [Segment(region, 4, [5] * 16, 16)]) is None  # too wide
    for pool_graphs in (graphs, captured):
        assert pool_graphs.shape([Segment(region, 4, [5], 1, aux_layers=(1,))]) is None  # a head's hidden states
        assert pool_graphs.shape([Segment(far, 4, [5], 1)]) is None  # outside the first arena
        assert pool_graphs.shape([Segment(region, 4, [5], 1)] * 129) is None  # past the largest bucket


def test_a_scheduler_replaying_decode_passes_decodes_what_sessions_decode_alone():
    """Eight sessions' target-only runs through a scheduler whose decode passes go through the
    bucketed buffers (as on CUDA, run eagerly here), each against the session decoded alone."""
    m = model()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 97, (int(n),), generator=gen).tolist() for n in torch.randint(2, 40, (8,), generator=gen)]

    def buffered(scheduler: Scheduler) -> None:
        assert scheduler.graphs is None  # on a CPU passes run eagerly ...
        scheduler.graphs = PassGraphs(m, scheduler.pool, capture=False)  # ... unless a test asks for the buffers

    got, scheduler = decode_scheduled(m, prompts, 12, prepare=buffered)
    assert got == decode_alone(m, prompts, 12)
    assert scheduler.graphs.buckets  # decode passes did go through the buffers


# torch.compile on the CPU (~63 s on an AMD EPYC 2-core host): with the slow suite; the graphed
# (buffered) passes' identity above runs by default.
@pytest.mark.slow
def test_compiled_decode_passes_give_each_models_eager_logits_and_compile_nothing_after_warm_up():
    """Two models of one architecture (a draft worker's drafts), compiled: warm-up compiles the graphs,
    both models' passes at other buckets give their own eager logits (the weights are the graphs'
    inputs, not constants of the first model's), and nothing compiles after warm-up. The models have
    their CPU layout (``RowInvariantLinear``, as a worker loads them): its branch at MATRIX_ROWS rows
    made a pass of 3 sessions compile under load until warm-up took a bucket of 4."""
    import torch._dynamo.utils

    first = gemv_layout(model())
    torch.manual_seed(7)
    second = gemv_layout(use_pooled_attention(LlamaForCausalLM(first.config).to(torch.float64).eval()))
    gen = torch.Generator().manual_seed(2)
    checks = 0
    for m in (first, second):
        eager_model, eager_pool = copy.deepcopy(m), None
        pool = KVPool(KVShape.of(m), Budget(2**24))
        eager_pool = KVPool(KVShape.of(eager_model), Budget(2**24))
        graphs = PassGraphs(m, pool, capture=False, compiled=True)
        assert graphs.warm_up() > 0 and set(graphs.buckets) == set(WARM_UP_BUCKETS)
        pool.move(pool.take(4), [(0, 1)])  # the arenas warm-up created take in-place moves (an adoption)
        compiled_so_far = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        lengths = [70, 3, 140]  # buckets of 3 sessions (4) over 128 and 256 keys: neither warmed up
        prompts = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in lengths]
        regions = [[p.take(300) for _ in lengths] for p in (pool, eager_pool)]
        for mm, p, mine in ((m, pool, regions[0]), (eager_model, eager_pool, regions[1])):
            run_pass(mm, p, [Segment(r, 0, x, 1) for r, x in zip(mine, prompts, strict=True)])
        for step in range(4):
            tokens = torch.randint(3, 97, (3,), generator=gen).tolist()
            want = run_pass(eager_model, eager_pool, [Segment(regions[1][i], lengths[i] + step, [tokens[i]], 1)
                                                      for i in range(3)])
            got = graphs.run([Segment(regions[0][i], lengths[i] + step, [tokens[i]], 1) for i in range(3)])
            for a, b in zip(want, got, strict=True):
                # float64 sums fused in another order, then cast to float32: at most a last-place difference
                assert torch.allclose(a, b, rtol=2e-7, atol=1e-7)
                checks += 1
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiled_so_far
    assert checks == 24


def test_a_scheduler_with_compiled_decode_passes_decodes_what_sessions_decode_alone():
    m = model()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 97, (int(n),), generator=gen).tolist() for n in torch.randint(2, 40, (6,), generator=gen)]
    got, scheduler = decode_scheduled(m, prompts, 10, BatchingConfig(compiled=True))
    assert scheduler.graphs is not None and scheduler.graphs.compiled and scheduler.graphs.buckets
    assert got == decode_alone(m, prompts, 10)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_branch_beside_a_lookahead_runs_at_a_bucket_with_the_eager_passes_logits(compiled):
    """A draft pass with a branch (Segment.fork: written apart, past the lookahead's slots) beside
    another session's decode step: the branch row sees the slots before the fork and its own, at its
    chain's position, as the eager pass's mask says."""
    eager_model = model()
    graphed_model = copy.deepcopy(eager_model)
    pools = [KVPool(KVShape.of(m), Budget(2**24)) for m in (eager_model, graphed_model)]
    graphs = PassGraphs(graphed_model, pools[1], capture=False, compiled=compiled)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (20, 9)]
    regions = [[pool.take(64) for _ in prompts] for pool in pools]
    lookahead = torch.randint(3, 97, (3,), generator=gen).tolist()
    for m, pool, (mine, other) in zip((eager_model, graphed_model), pools, regions, strict=True):
        run_pass(m, pool, [Segment(mine, 0, prompts[0] + lookahead, 1), Segment(other, 0, prompts[1], 1)])
    seen, base = 21, 30  # the branch forks after the prompt and the lookahead's first token
    branch = torch.randint(3, 97, (3,), generator=gen).tolist()
    for i, token in enumerate(branch):
        step = [Segment(regions[0][0], base + i, [token], 1, fork=(seen, base)), Segment(regions[0][1], 9 + i, [token], 1)]
        want = run_pass(eager_model, pools[0], step)
        mine = [Segment(regions[1][0], base + i, [token], 1, fork=(seen, base)), Segment(regions[1][1], 9 + i, [token], 1)]
        assert graphs.shape(mine) == (2, 1, 64)
        got = graphs.run(mine)
        for a, b in zip(want, got, strict=True):
            assert torch.allclose(a, b, rtol=2e-7, atol=1e-7)  # compiled: a float32 last place at most


def test_a_compiler_that_fails_leaves_the_passes_to_the_eager_model():
    """No C++ compiler on the host, an operation inductor cannot lower: the pass still gives the
    eager logits, and later passes skip the compiler."""
    eager_model = model()
    graphed_model = copy.deepcopy(eager_model)
    pools = [KVPool(KVShape.of(m), Budget(2**24)) for m in (eager_model, graphed_model)]
    graphs = PassGraphs(graphed_model, pools[1], capture=False)

    def broken(**_):
        raise RuntimeError("InductorError: no working C++ compiler found")

    graphs.forward = broken  # as a compiled forward whose compile fails
    regions = [pool.take(16) for pool in pools]
    for m, pool, region in zip((eager_model, graphed_model), pools, regions, strict=True):
        run_pass(m, pool, [Segment(region, 0, [5, 6, 7], 1)])
    want = run_pass(eager_model, pools[0], [Segment(regions[0], 3, [8], 1)])
    got = graphs.run([Segment(regions[1], 3, [8], 1)])
    assert torch.allclose(want[0], got[0], rtol=0, atol=1e-10) and graphs.forward is graphed_model


def test_verify_steps_token_trees_and_mixed_rows_run_at_a_bucket_with_the_eager_passes_logits():
    """What a capture takes on CUDA, checked on the buffers in float64: sessions adding 1 to 6 tokens
    in one pass (decode steps, verify steps of several k, a token tree, a prompt chunk wanting one
    row's logits, a branch), each padded to the pass's row bucket, give the eager pass's logits,
    and the cache the eager pass writes (padded rows write the scratch slot only)."""
    eager_model = model()
    graphed_model = copy.deepcopy(eager_model)
    pools = [KVPool(KVShape.of(m), Budget(2**24)) for m in (eager_model, graphed_model)]
    graphs = PassGraphs(graphed_model, pools[1], capture=False, max_rows=16)
    gen = torch.Generator().manual_seed(5)
    lengths = [7, 30, 12, 50, 3, 20]
    prompts = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in lengths]
    regions = [[pool.take(128) for _ in lengths] for pool in pools]
    for m, pool, mine in zip((eager_model, graphed_model), pools, regions, strict=True):
        run_pass(m, pool, [Segment(r, 0, p, 1) for r, p in zip(mine, prompts, strict=True)])

    def tokens(n: int) -> list[int]:
        return torch.randint(3, 97, (n,), generator=gen).tolist()
    steps = [  # (session, tokens, logits, parents, fork) per pass
        [(0, tokens(5), 5, None, None), (1, tokens(5), 5, None, None)],  # two verify steps, k = 4
        [(0, tokens(1), 1, None, None), (1, tokens(3), 3, None, None), (2, tokens(6), 6, None, None)],
        [(3, tokens(5), 5, [-1, 0, 0, 1, -1], None), (4, tokens(2), 2, None, None)],  # a tree beside a chain
        [(5, tokens(4), 1, None, None), (2, tokens(1), 1, None, None)],  # a prompt chunk's last row
        [(5, tokens(2), 2, None, (22, 40)), (0, tokens(2), 2, None, None)],  # a branch of two rows
    ]
    at = list(lengths)
    for step in steps:
        made = []
        for pool_regions in regions:
            made.append([Segment(pool_regions[i], at[i] if fork is None else fork[1], t, logits, parents, fork=fork)
                         for i, t, logits, parents, fork in step])
        want = run_pass(eager_model, pools[0], made[0])
        assert graphs.shape(made[1])[1] == max(len(t) for _, t, _, _, _ in step)
        got = graphs.run(made[1])
        for a, b in zip(want, got, strict=True):
            assert a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-10)
        for i, t, _, parents, fork in step:
            if fork is None:
                at[i] += len(t) if parents is None else 0  # a tree's slots are rewritten by the next pass
    assert {rows for _, rows, _ in graphs.buckets} == {5, 6, 4, 2}
    for n, (region_a, region_b) in enumerate(zip(regions[0], regions[1], strict=True)):
        for layer in range(2):
            for read in (pools[0].keys, pools[0].values):
                a, b = read(region_a, layer), (pools[1].keys if read == pools[0].keys else pools[1].values)(region_b, layer)
                assert torch.allclose(a, b, rtol=0, atol=1e-10), n  # padded rows wrote only the scratch slot


def test_a_scheduler_verifying_proposals_in_bucketed_passes_commits_what_the_target_alone_decodes():
    """Six sessions verify proposals of k = 1..5 (their own greedy continuation, some wrong) through
    a scheduler whose passes go through the buffers at every row count (as a capture takes them on
    CUDA): each commits the tokens the target alone decodes."""
    m = model()
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 97, (int(n),), generator=gen).tolist() for n in torch.randint(2, 40, (6,), generator=gen)]
    expected = decode_alone(m, prompts, 16)

    def buffered(scheduler: Scheduler) -> None:
        scheduler.graphs = PassGraphs(m, scheduler.pool, capture=False, max_rows=16)

    got, scheduler = verify_scheduled(m, prompts, expected, prepare=buffered)
    assert got == expected
    assert max(rows for _, rows, _ in scheduler.graphs.buckets) >= 5
