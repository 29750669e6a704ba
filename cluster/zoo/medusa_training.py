"""Distilling Medusa heads from a frozen target (Medusa-1: the backbone is not trained).

The training text is the EAGLE-3 head's (head_training.py: corpus windows, and the target's own
continuations and chat answers), and so are the target's features, of which the heads need only
the last hidden state h_j of each position. Head i (0-based) reads h_j and learns the target's own
distribution of the token i + 2 after j, softmax(lm_head(h_{j+i+1})): a KL loss per head, weighted
``decay ** i`` (Medusa's: later heads guess worse and should not dominate). Each head starts as the
target's output layer behind a residual block of zeros, so before training every head guesses what
the target guesses next, and learns from there.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from specserve.workers.heads.medusa import MedusaConfig, MedusaHeads

from .head_training import Features
from .presets import MedusaTraining
from .training import fit

log = logging.getLogger("specserve.heads")


def medusa_from_target(target_head: nn.Linear, hidden_size: int, settings: MedusaTraining) -> MedusaHeads:
    """New heads, each the target's output layer behind a residual block that starts at zero."""
    torch.manual_seed(settings.seed)
    heads = MedusaHeads(MedusaConfig(hidden_size, target_head.weight.shape[0], settings.num_heads, settings.num_layers))
    with torch.no_grad():
        for block, lm_head in zip(heads.blocks, heads.lm_heads, strict=True):
            for layer in block.layers:
                layer.weight.zero_()
                layer.bias.zero_()
            lm_head.weight.copy_(target_head.weight.float())
    return heads.float()


def medusa_loss(heads: MedusaHeads, last: torch.Tensor, target_logits: torch.Tensor, decay: float,
                agreement: bool = False) -> tuple[torch.Tensor, list[float]]:
    """(the weighted KL loss, each head's top-1 agreement with the target when asked) over a batch:
    last [B, n, H] hidden states, the target's logits from them [B, n, V]."""
    n = last.shape[1]
    total, agreed = 0.0, []
    for i in range(heads.config.num_heads):
        rows = n - 1 - i  # positions j whose token j + i + 2 has a target distribution (at j + i + 1)
        if rows < 1:
            break
        log_q = torch.log_softmax(heads.lm_heads[i](heads.blocks[i](last[:, :rows])).float(), -1)
        p = torch.softmax(target_logits[:, i + 1 :].float(), -1)
        kl = (p * (torch.log(p.clamp_min(1e-20)) - log_q)).sum(-1).mean()
        total = total + decay**i * kl
        if agreement:
            agreed.append(float((log_q.argmax(-1) == p.argmax(-1)).float().mean()))
    return total, agreed


def train_medusa(heads: MedusaHeads, features: Features, target_head: torch.Tensor, settings: MedusaTraining) -> float:
    """Random batches of ``features``' last hidden states; ``target_head``: the target's output
    weights [V, H]. Returns the last smoothed loss."""
    weights = target_head.float()
    batch = features.batches(settings.budget, settings.seed)

    def loss_at(step: int) -> torch.Tensor:
        last = features.last[batch(step)].float()
        with torch.no_grad():
            target_logits = last @ weights.T
        return medusa_loss(heads, last, target_logits, settings.decay)[0]

    return fit(heads, settings.budget, loss_at, desc="medusa heads")
