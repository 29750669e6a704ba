"""The target's logprobs of the output (workers/logprobs.py), in process: whichever proposer
drafted a token (a draft, the EAGLE-3 head, a token tree, prompt lookup), greedy or sampled, its
logprob is the one a plain forward of the target gives at that position, one per output token."""

from __future__ import annotations

import pytest
import torch

from specserve.workers.sampling import SamplingParams
from specserve.workers.logprobs import token_logprobs
from specserve.workers.prompt import encode_prompt
from specserve.workers.request import GenerationParams

TOKENS = 16


def plain_logprobs(engine, prompt: str, output: list[int]) -> torch.Tensor:
    """[len(output), V]: the target's log-softmax at each output position, from one plain forward."""
    ids = encode_prompt(engine.tokenizer, prompt)
    with torch.no_grad():
        logits = engine.target(torch.tensor([ids + output])).logits[0, len(ids) - 1 : -1]
    return torch.log_softmax(logits.float(), -1)


@pytest.mark.parametrize("proposer", [{}, {"draft": "sql"}, {"draft": "eagle3"}, {"draft": "ngram"},
                                      {"draft": "tree", "members": ("sql", "general")},
                                      {"draft": "cascade", "members": ("sql",)}],
                         ids=["target-only", "draft", "head", "ngram", "tree", "cascade"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_each_output_tokens_logprob_is_the_targets_own(tiny_engine, tiny_zoo, proposer, sampling):
    prompt = tiny_zoo.prompts("sql")[1]
    params = GenerationParams(max_tokens=TOKENS, speculation=bool(proposer), logprobs=3, sampling=sampling, seed=7)
    done = tiny_engine.generate(prompt, params, **proposer).complete()
    expected = plain_logprobs(tiny_engine, prompt, done.token_ids)
    chosen = expected[torch.arange(len(done.token_ids)), torch.tensor(done.token_ids)]
    assert len(done.logprobs) == len(done.token_ids)
    assert done.logprobs.chosen == pytest.approx(chosen.tolist(), abs=1e-4)
    assert done.logprobs.top_ids == expected.topk(3, -1).indices.tolist()


def test_a_stop_string_keeps_the_logprobs_of_the_tokens_kept(tiny_engine, tiny_zoo):
    prompt = tiny_zoo.prompts("sql")[1]
    whole = tiny_engine.generate(prompt, GenerationParams(max_tokens=TOKENS, speculation=False, logprobs=0)).complete()
    stop = whole.text[len(whole.text) // 2 :][:3]
    cut = tiny_engine.generate(prompt, GenerationParams(max_tokens=TOKENS, speculation=False, logprobs=0,
                                                        stop=(stop,))).complete()
    assert len(cut.logprobs) == len(cut.token_ids) < len(whole.token_ids)
    assert cut.logprobs.chosen == whole.logprobs.chosen[: len(cut.token_ids)]
    assert cut.logprobs.top_ids == [[]] * len(cut.token_ids)  # no alternatives asked for


def test_logprobs_are_read_off_the_rows_that_predicted_each_token():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    got = token_logprobs(logits, [1, 0], top=2)
    expected = torch.log_softmax(logits, -1)
    assert got.chosen == pytest.approx([expected[0, 1].item(), expected[1, 0].item()])
    assert got.top_ids == [[2, 1], [0, 1]] or got.top_ids == [[2, 1], [0, 2]]
    with pytest.raises(ValueError, match="logprobs must be 0..20"):
        GenerationParams(logprobs=21)
