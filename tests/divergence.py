"""Where speculative greedy output parts from the target's own, and whether rounding explains it.

In float32 on a CPU, speculative greedy output is token-identical to the target alone (the tests
hold it to that). On a GPU, and in bfloat16 or float16 anywhere, the target's logits for one
position differ slightly with the shape of the pass that computes them: a verify pass over k + 1
tokens, a batch of other sessions' rows, or one token at a time each reduce in another order. Where
the target's two best tokens are closer than that difference, the argmax may flip, and the two
outputs part there; every engine that batches has this (vLLM and SGLang document it).

What separates such a flip from a bug is the margin: at the first position where the outputs part,
how much higher the target alone scored its own token than the one speculation committed. A flip is
*explained* when that margin is within twice the largest logit difference the same model shows on
the same tokens between two pass shapes (a whole-sequence pass against one token at a time): two
logits each moved by at most that much can swap only if they were that close. A divergence with a
larger margin is a bug.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass(frozen=True)
class Divergence:
    """The first position where a speculative output parted from the target's own."""

    proposer: str
    prompt: int  # index into the prompts checked
    position: int  # output token index
    margin: float  # target logit of its own token minus that of the committed one, at that position
    noise: float  # the largest logit difference between two pass shapes on this prompt's tokens

    @property
    def explained(self) -> bool:
        return self.margin <= 2 * self.noise

    def row(self) -> dict:
        return asdict(self) | {"explained": self.explained}


@torch.inference_mode()
def reference_logits(model: PreTrainedModel, prompt_ids: Sequence[int], tokens: Sequence[int]) -> tuple[torch.Tensor,
                                                                                                      torch.Tensor]:
    """The target's logits for each of ``tokens`` after ``prompt_ids``, two ways: one pass over the
    whole sequence, and one token at a time through a KV cache (how it decodes alone). Both
    [len(tokens), V] float32 on the CPU."""
    ids = list(prompt_ids) + list(tokens[:-1])
    wide = model(input_ids=torch.tensor([ids], device=model.device)).logits[0, len(prompt_ids) - 1:].float().cpu()
    cache = DynamicCache(config=model.config)

    def step(chunk: list[int]) -> torch.Tensor:  # [1, V]: the logits after ``chunk``
        out = model(input_ids=torch.tensor([chunk], device=model.device), past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
        return out.logits[0].float().cpu()

    steps = [step(list(prompt_ids))] + [step([token]) for token in tokens[:-1]]
    return wide, torch.cat(steps)


def first_divergence(model: PreTrainedModel, prompt_ids: Sequence[int], expected: Sequence[int], got: Sequence[int],
                     proposer: str, prompt: int) -> Divergence | None:
    """None when ``got`` equals ``expected`` (the target alone's tokens); else where and by how much."""
    if list(got) == list(expected):
        return None
    position = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
                    min(len(expected), len(got)))
    wide, sequential = reference_logits(model, prompt_ids, expected)
    noise = float((wide - sequential).abs().max())
    if position >= len(expected) or position >= len(got):  # one stopped (EOS) where the other went on
        return Divergence(proposer, prompt, position, float("inf"), noise)
    row = wide[position]
    return Divergence(proposer, prompt, position, float(row[expected[position]] - row[got[position]]), noise)


def summary(divergences: Sequence[Divergence], requests: int) -> dict:
    """The rate per request and the worst margins, for a report."""
    explained = [d for d in divergences if d.explained]
    return {"requests": requests, "diverged": len(divergences), "rate": len(divergences) / max(requests, 1),
            "explained": len(explained), "unexplained": len(divergences) - len(explained),
            "largest_margin": max((d.margin for d in divergences), default=0.0),
            "rows": [d.row() for d in divergences]}
