"""The gathered attention (a pass's sessions in a few batched SDPA calls, the CUDA default) against
the per-session loop (the CPU default), in float64 so that only a real difference shows: the same
logits and the same cache for chains, prefill chunks, decode rows, verify steps, token trees and branches,
sessions spread over several arenas, with grouped-query attention."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specserve.workers.config import BatchingConfig
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.loading import ModelSpec, load_model
from specserve.workers.ragged_pass import GATHERED, Segment, run_pass, use_pooled_attention

from scheduled import decode_alone, decode_scheduled

ARENA = 96  # small arenas: the sessions below spread over several


def pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256)
    loop = LlamaForCausalLM(config).to(torch.float64).eval()
    return use_pooled_attention(loop, gathered=False), use_pooled_attention(copy.deepcopy(loop), gathered=True)


def passes(model, pool: KVPool) -> list[list[torch.Tensor]]:
    """Three passes over six sessions: prompts (one chunked), then mixed decode / verify / tree steps."""
    regions = [pool.take(n) for n in (40, 60, 40, 90, 30, 50)]
    gen = torch.Generator().manual_seed(1)
    prompt = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (12, 30, 7, 50, 3, 20)]
    first = run_pass(model, pool, [Segment(r, 0, p, 1) for r, p in zip(regions, prompt, strict=True)])
    second = run_pass(model, pool, [
        Segment(regions[0], 12, [5], 1),  # decode rows of different lengths
        Segment(regions[1], 30, [6], 1),
        Segment(regions[2], 7, [7, 8, 9, 10, 11], 5),  # verify steps of k = 4
        Segment(regions[3], 50, [1, 2, 3, 4, 5], 5),
        Segment(regions[4], 3, [9, 8, 7, 6], 4, parents=[-1, 0, 0, 1]),  # a token tree
        Segment(regions[5], 20, list(range(3, 30)), 2),  # a prefill chunk riding along
    ])
    third = run_pass(model, pool, [Segment(regions[0], 13, [4], 1), Segment(regions[3], 55, [7], 1),
                                   Segment(regions[1], 50, [3, 4], 2, fork=(20, 50))])  # a draft's branch
    return [first, second, third]


def test_gathered_attention_gives_the_loops_logits_and_cache():
    loop, gathered = pair()
    pools = [KVPool(KVShape.of(m), Budget(2**24), arena_positions=ARENA) for m in (loop, gathered)]
    expected, got = passes(loop, pools[0]), passes(gathered, pools[1])
    assert len(pools[1].arenas) > 1  # the sessions really were spread over arenas
    for want, have in zip(expected, got, strict=True):
        for a, b in zip(want, have, strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-10)
    for arena_a, arena_b in zip(pools[0].arenas, pools[1].arenas, strict=True):
        for a, b in zip(arena_a.keys + arena_a.values, arena_b.keys + arena_b.values, strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-10)


def test_cpu_models_loop_and_gpu_models_gather_by_default():
    loop, _ = pair()
    assert getattr(use_pooled_attention(loop), GATHERED) is False  # on the CPU the loop is faster


def test_sessions_batched_with_gathered_attention_decode_what_they_decode_alone(tiny_zoo):
    """The tiny zoo's target in float64: eight sessions through the scheduler, each decoding what
    it decodes alone with the loop."""
    model = load_model(ModelSpec(str(tiny_zoo.target_dir), dtype="float64"))
    gathered = use_pooled_attention(copy.deepcopy(model), gathered=True)
    loop = use_pooled_attention(model, gathered=False)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 300, (int(n),), generator=gen).tolist() for n in torch.randint(2, 60, (8,), generator=gen)]
    got, _ = decode_scheduled(gathered, prompts, 10, BatchingConfig(max_tokens_per_pass=64))
    assert got == decode_alone(loop, prompts, 10)


def test_a_pass_refuses_a_model_without_the_pooled_attention():
    """Any other attention ignores the pass's layout and would give wrong logits without a word."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32)).eval()
    pool = KVPool(KVShape.of(model), Budget(2**20))
    with pytest.raises(ValueError, match="use_pooled_attention"):
        run_pass(model, pool, [Segment(pool.take(8), 0, [1, 2], 1)])


@pytest.mark.parametrize("which", [0, 1], ids=["loop", "gathered"])
def test_a_branch_written_apart_gives_the_logits_of_the_chain_it_forks_into(which):
    """A segment with ``fork`` (a draft's branch, written past the sequence) attends to the slots
    before its fork and its own tokens only, at the positions of the chain it continues."""
    model = pair()[which]
    pool = KVPool(KVShape.of(model), Budget(2**24), arena_positions=ARENA)
    prompt = torch.randint(3, 97, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    region, chain = pool.take(60), pool.take(60)
    run_pass(model, pool, [Segment(region, 0, prompt, 1), Segment(chain, 0, prompt[:20] + [5], 1)])
    first = run_pass(model, pool, [Segment(region, 45, [5], 1, fork=(20, 45))])[0]
    second = run_pass(model, pool, [Segment(region, 46, [6, 7], 2, fork=(20, 45))])[0]
    expected = run_pass(model, pool, [Segment(chain, 21, [6, 7], 2)])[0]
    assert torch.allclose(first, run_pass(model, pool, [Segment(chain, 20, [5], 1)])[0], rtol=0, atol=1e-10)
    assert torch.allclose(second, expected, rtol=0, atol=1e-10)
