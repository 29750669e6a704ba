"""A draft's reduced vocabulary: the most frequent target tokens of its text (FR-Spec, Zhao et al.
2025; EAGLE-3's draft vocabulary is chosen the same way).

On a real model the output head is most of a small draft's cost (SmolLM2: 49,152 rows of 576, 28M
of its 135M parameters), and most of those rows are tokens a task's text never uses. An EAGLE-3
head is trained over its reduced vocabulary (workers/heads/). A standalone draft keeps its whole
head in training and cuts it at load: ``specserve_vocab.json`` beside its weights lists the target
ids it keeps, and ``load_model`` swaps its ``lm_head`` for a ``PrunedHead`` over those rows only.
The pruned head still answers logits over the whole vocabulary, -inf off its rows, so every
consumer (greedy argmax, the warped q a sample is drawn from, scoring) runs unchanged and q stays
the exact distribution the draft drew from: zero off the kept rows, which the rejection rule
handles like any token the draft never proposes.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import torch
from torch import nn

VOCAB_FILE = "specserve_vocab.json"  # {"ids": [target ids kept, ascending], "coverage": share of the text}
# By default: the fewest most frequent tokens holding this share of the text's tokens (rounded up
# to a multiple of VOCAB_ROUNDING), at most DEFAULT_MAX_VOCAB: the output head is most of a small
# draft's cost. On SmolLM2 (576 wide), a head's TTT step of 4 x 256 tokens took 1.0 s on 2 cores
# over 8,192 tokens and 1.9 s over 16,384.
DEFAULT_COVERAGE = 0.95
DEFAULT_MAX_VOCAB = 8192
VOCAB_ROUNDING = 256


def choose_vocabulary(tokens: torch.Tensor, vocab_size: int, size: int | None) -> tuple[torch.Tensor, float]:
    """(the draft vocabulary's target ids, ascending; the share of ``tokens`` it covers). ``size``
    None: by coverage (DEFAULT_COVERAGE). Ties go to the lower id; ids the text never uses fill a
    size larger than what it uses."""
    counts = Counter(tokens.flatten().tolist())
    ranked = sorted(counts, key=lambda token: (-counts[token], token))
    if size is None:
        total, held, size = sum(counts.values()), 0, 0
        while size < len(ranked) and held < DEFAULT_COVERAGE * total:
            held += counts[ranked[size]]
            size += 1
        size = min(vocab_size, DEFAULT_MAX_VOCAB, math.ceil(size / VOCAB_ROUNDING) * VOCAB_ROUNDING)
    if not 0 < size <= vocab_size:
        raise ValueError(f"the draft vocabulary must be 1..{vocab_size} tokens (the target's), got {size}")
    chosen = ranked[:size]
    chosen += [t for t in range(vocab_size) if t not in counts][: size - len(chosen)]  # unseen ids fill it up
    coverage = sum(counts[t] for t in chosen) / max(1, sum(counts.values()))
    return torch.tensor(sorted(chosen)), coverage


class PrunedHead(nn.Module):
    """An output head over ``ids`` only, answering full-vocabulary logits (-inf off ``ids``)."""

    def __init__(self, head: nn.Linear, ids: torch.Tensor) -> None:
        super().__init__()
        self.vocab_size = head.weight.shape[0]
        self.register_buffer("ids", ids.to(head.weight.device))
        self.weight = nn.Parameter(head.weight.detach()[self.ids].clone(), requires_grad=False)
        self.bias = None if head.bias is None else nn.Parameter(head.bias.detach()[self.ids].clone(),
                                                               requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kept = nn.functional.linear(hidden, self.weight, self.bias)
        logits = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.ids, kept)


def read_vocabulary(source: str) -> torch.Tensor | None:
    """The ids a draft directory's vocabulary file keeps, or None (no file: the whole vocabulary)."""
    path = Path(source) / VOCAB_FILE
    if not path.is_file():
        return None
    try:
        ids = torch.tensor(json.loads(path.read_text())["ids"], dtype=torch.long)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a draft vocabulary ({{\"ids\": [...]}}): {exc}") from None
    return ids


def write_vocabulary(out: str | Path, ids: torch.Tensor, coverage: float) -> None:
    (Path(out) / VOCAB_FILE).write_text(json.dumps({"ids": ids.tolist(), "coverage": round(coverage, 4)}))


def prune_head(model: nn.Module, ids: torch.Tensor) -> nn.Module:
    """``model`` with its output head cut to ``ids`` (checked against its vocabulary)."""
    head = model.get_output_embeddings()
    vocab_size = head.weight.shape[0]
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or ids.unique().numel() != ids.numel():
        raise ValueError(f"a draft vocabulary must be distinct ids in [0, {vocab_size}); got {ids.numel()} ids "
                         f"in [{int(ids.min()) if ids.numel() else '-'}, {int(ids.max()) if ids.numel() else '-'}]")
    model.set_output_embeddings(PrunedHead(head, ids))
    return model
